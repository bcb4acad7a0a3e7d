"""stepsim: fast simulation of Streaming Tensor Programs (STeP) on spatial dataflow accelerators.

The top-level API, each name imported on first use (so ``import stepsim`` stays light: no numba, sympy, pyarrow)::

    from stepsim import simulate, Graph, Workload, from_onnx, serve, optimize, plan, Hardware, System

Importing stepsim never compiles kernels; compilation happens on first simulation (cached on disk) or with
``stepsim cache warm``. The module paths of the last release (``stepsim.simulate``, ``stepsim.hardware``, ...)
still import, with a ``DeprecationWarning`` naming the new path (:mod:`stepsim.base.deprecated`).
"""

from stepsim._version import __version__
from stepsim.base import deprecated as _deprecated
from stepsim.base.errors import StepsimError

#: name -> (module, attribute); attribute None: the module itself (``serve``, ``optimize`` and ``plan`` are packages
#: callable as their function)
API = {
    "simulate": ("stepsim.simulation.simulate", "simulate"),
    "Graph": ("stepsim.graph.graph", "Graph"),
    "Workload": ("stepsim.workloads.base", "Workload"),
    "from_onnx": ("stepsim.frontend.lower", "from_onnx"),
    "serve": ("stepsim.serve", None),
    "optimize": ("stepsim.optimize", None),
    "plan": ("stepsim.plan", None),
    "Hardware": ("stepsim.base.hardware", "Hardware"),
    "System": ("stepsim.base.system.config", "System"),
}

__all__ = ["__version__", "StepsimError", *API]

_deprecated.install()


def __getattr__(name: str):
    """A name of the top-level API (:data:`API`), imported on first use."""
    if name in API:
        import importlib

        module, attribute = API[name]
        value = importlib.import_module(module)
        return value if attribute is None else getattr(value, attribute)
    raise AttributeError(f"module 'stepsim' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *API})
