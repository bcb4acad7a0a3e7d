"""The import paths of the last release (before the restructuring into layers) still work for one release: each
warns once with a DeprecationWarning naming the new path and gives the new module's objects themselves."""

from __future__ import annotations

import importlib
import sys
import warnings

import pytest

from stepsim.base.deprecated import MOVED, MOVED_NAMES, _Alias

#: the public names of the modules that became packages, as the last release defined them (``git show
#: db78d60^:stepsim/<module>.py``); ``stepsim.demo.register`` went to the CLI (stepsim.cli.demo)
OLD_NAMES = {
    "stepsim.results": "VERSION_KEY CONFIG_HASH_KEY CONFIG_KEY TRACE_HASH_KEY SEED_KEY canonical_json stable_hash "
                       "file_sha256 provenance_metadata with_units atomic_output write_parquet_atomic partition_dir "
                       "write_partitioned read_results",
    "stepsim.demo": "TILES demo_configs run_demo format_table plot",
    "stepsim.workloads.attention": "STRATEGIES SOFTMAX_FORMS COMPUTE_BW COARSE_BLOCK SPEC_MAX_N CHANNEL_DEPTH "
                                   "kv_metadata spec_max_n region_assignment attention_algorithmic_flops "
                                   "region_symbols assignment_bindings build_attention attention_stage region_units",
    "stepsim.workloads.decoder": "O_TILE build_decoder",
    "stepsim.workloads.moe": "STATIC_COMPUTE_BW DYNAMIC_COMPUTE_BW PACKING_COMPUTE_BW TIMESHARE_COMPUTE_BW "
                             "TIMESHARE_TILE_F DEFAULT_TILE_F DEFAULT_TILE_N algorithmic_flops build_moe moe_stage "
                             "idle_groups shared_ffn",
    "stepsim.workloads.program": "split_spec is_program_spec build_program",
    "stepsim.workloads.swiglu": "HDL_COMPUTE_BW HDL_PAR_DISPATCH swiglu_algorithmic_flops build_swiglu",
}


@pytest.fixture
def fresh_imports():
    """Forget every old path imported so far (and the attribute an import set on its parent), so each test sees
    the first import's warning; what the test imported under an old path is forgotten again afterwards."""

    def forget():
        for old in MOVED:
            sys.modules.pop(old, None)
            parent, _, child = old.rpartition(".")
            holder = sys.modules.get(parent)
            if holder is not None and isinstance(vars(holder).get(child), _Alias):
                delattr(holder, child)

    forget()
    yield
    forget()


def test_the_table_names_every_module_the_restructuring_moved():
    assert len(MOVED) == 47
    assert [old for old, new in MOVED.items() if old == new or importlib.util.find_spec(new) is None] == []


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_module_path_warns_with_the_new_one_and_reads_the_new_module(old, fresh_imports):
    new = importlib.import_module(MOVED[old])
    with pytest.warns(DeprecationWarning) as caught:
        alias = importlib.import_module(old)
    assert [str(w.message) for w in caught if w.category is DeprecationWarning][-1] == (
        f"{old} is deprecated and will be removed in the next release: use {MOVED[old]}")
    public = [name for name in dir(new) if not name.startswith("_")]
    assert public and all(getattr(alias, name) is getattr(new, name) for name in public)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once: a second import is the cached module, silent
        assert importlib.import_module(old) is alias


def test_from_old_module_import_name_names_the_users_line(fresh_imports):
    from stepsim.simulation.simulate import SimResult, simulate

    with pytest.warns(DeprecationWarning) as caught:
        from stepsim.simulate import SimResult as old_result
        from stepsim.simulate import simulate as old_simulate
    assert (old_simulate, old_result) == (simulate, SimResult)
    assert [(w.filename, w.category) for w in caught] == [(__file__, DeprecationWarning)]


def test_old_submodules_of_a_moved_package_import(fresh_imports):
    with pytest.warns(DeprecationWarning) as caught:
        import stepsim.sweep.config as old_config
    from stepsim.batch.config import load_sweep

    assert old_config.load_sweep is load_sweep
    assert [str(w.message).split(" is ")[0] for w in caught] == ["stepsim.sweep", "stepsim.sweep.config"]
    with pytest.raises(ModuleNotFoundError, match="stepsim.sweep.nothing"):
        importlib.import_module("stepsim.sweep.nothing")


def test_the_old_simulate_module_is_callable_as_the_function_the_top_level_exports(fresh_imports):
    from stepsim.graph import FP32, Graph, LinearOffChipLoad, LinearOffChipStore, Tensor

    with pytest.warns(DeprecationWarning):
        import stepsim.simulate  # noqa: F401 - the old path, as a script of the last release writes it
    g = Graph("call")
    LinearOffChipStore(g, LinearOffChipLoad(g, Tensor("x", (4, 4), FP32), tile=(4, 4), out_shape_tiled=(1, 1),
                                            stride=(1, 0)))
    from stepsim.simulation.simulate import simulate

    assert stepsim.simulate(g).cycles == simulate(g).cycles
    with pytest.raises(TypeError, match="stepsim.hardware is not callable"):
        with pytest.warns(DeprecationWarning):
            importlib.import_module("stepsim.hardware")()


@pytest.mark.parametrize("package", sorted(OLD_NAMES))
def test_a_package_that_replaced_a_module_forwards_the_old_modules_names(package, monkeypatch):
    module = importlib.import_module(package)
    new = importlib.import_module(MOVED_NAMES[package])
    for name in OLD_NAMES[package].split():
        monkeypatch.delitem(vars(module), name, raising=False)
        with pytest.warns(DeprecationWarning) as caught:
            value = getattr(module, name)
        assert value is getattr(new, name)
        assert [str(w.message) for w in caught] == [
            f"{package}.{name} is deprecated and will be removed in the next release: use {MOVED_NAMES[package]}.{name}"]
    with pytest.raises(AttributeError, match=f"module '{package}' has no attribute 'no_such_name'"):
        module.no_such_name
