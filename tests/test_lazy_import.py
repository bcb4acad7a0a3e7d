"""stepsim.base.lazy_import.LazyModule: imported on first attribute read, transparent afterwards."""

import sys
import types

import pytest

from stepsim.base.lazy_import import LazyModule


def test_imported_on_first_read_then_replaced_in_stepsim_globals(tmp_path, monkeypatch):
    (tmp_path / "lazy_probe_module.py").write_text("VALUE = 42\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "lazy_probe_module", raising=False)
    proxy = LazyModule("lazy_probe_module")
    holder = types.ModuleType("stepsim._lazy_probe_holder")  # a stepsim module holding the stand-in
    other = types.ModuleType("elsewhere")  # a module outside stepsim: left alone
    holder.mod = other.mod = proxy
    monkeypatch.setitem(sys.modules, holder.__name__, holder)
    monkeypatch.setitem(sys.modules, other.__name__, other)

    assert "lazy_probe_module" not in sys.modules  # nothing imported by creating the stand-in
    assert proxy.VALUE == 42
    real = sys.modules["lazy_probe_module"]
    assert holder.mod is real and other.mod is proxy
    monkeypatch.setattr(real, "VALUE", 7)
    assert proxy.VALUE == 7  # reads go to the module itself, so a monkeypatch is seen
    assert repr(proxy) == "<lazily imported module 'lazy_probe_module'>"


def test_import_stepsim_stays_light_and_the_top_level_api_reads_each_name_on_first_use():
    """``from stepsim import simulate, ...`` (the top-level API): ``import stepsim`` imports none of numba, numpy,
    sympy, pyarrow, and each name is the object at its module path."""
    import subprocess

    code = ("import sys, stepsim; heavy = ('numba', 'numpy', 'sympy', 'pyarrow', 'stepsim.simulation', 'stepsim.graph');"
            "print(sorted(m for m in heavy if m in sys.modules)); print(sorted(n for n in dir(stepsim) if n in stepsim.API))")
    proc = subprocess.run([sys.executable, "-W", "error", "-c", code], capture_output=True, text=True, timeout=60)
    assert (proc.returncode, proc.stderr, proc.stdout) == (0, "", "[]\n['Graph', 'Hardware', 'System', 'Workload', "
                                                                  "'from_onnx', 'optimize', 'plan', 'serve', 'simulate']\n")

    import stepsim
    from stepsim import Graph, Hardware, System, Workload, from_onnx, optimize, plan, serve, simulate
    from stepsim.base.hardware import Hardware as hardware_class
    from stepsim.base.system import System as system_class
    from stepsim.frontend import from_onnx as from_onnx_function
    from stepsim.graph import Graph as graph_class
    from stepsim.simulation.simulate import simulate as simulate_function
    from stepsim.workloads.base import Workload as workload_class

    assert (simulate, Graph, Workload, from_onnx, Hardware, System) == (
        simulate_function, graph_class, workload_class, from_onnx_function, hardware_class, system_class)
    assert (serve, optimize, plan) == (sys.modules["stepsim.serve"], sys.modules["stepsim.optimize"],
                                       sys.modules["stepsim.plan"])  # callable packages
    assert stepsim.__all__ == ["__version__", "StepsimError", "simulate", "Graph", "Workload", "from_onnx", "serve",
                               "optimize", "plan", "Hardware", "System"]
    with pytest.raises(AttributeError, match="module 'stepsim' has no attribute 'simulation_result'"):
        stepsim.simulation_result
