"""Shared fixtures: the real traces live in ``../shared/traces`` beside the repository, never inside it."""

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from shared_traces_folder import require_shared_traces

from stepsim.base.collector import tune_process

# The suite's processes collect garbage and cache sympy's expressions as the program does (stepsim.base.collector:
# the defaults' walks of every live object were a tenth to a fifth of the time of tests that build layers); the
# commands they start set it too. Before anything here imports sympy.
tune_process()

# Commands the tests start run in their own process, even when the user has a command server running
# (stepsim.cli.server_daemon): the tests of the server itself turn it back on for their own commands.
os.environ["STEPSIM_SERVER"] = "off"


#: the mapping cache's subfolders of simulated costs seeded beside the schedules (stepsim.serve.projections,
#: stepsim.serve.ffn_points: what a plan's or a fast calibration's processes would otherwise simulate each)
SEEDED_COSTS = ("projection-costs", "ffn-points")


def _seed_mapping_cache() -> None:
    """Start the test run with a private copy of tests/mapping_seeds as its mapping cache: the schedules the
    suite's ``--schedule auto`` shapes need and the costs its serving tests simulate (:data:`SEEDED_COSTS`), made
    once by today's code (tests/mapping_seeds/refresh.py; a seed
    whose sources changed is never used, and tests/mapping/test_mapping_seeds.py says so). A copy, so no test
    writes into the repository or the user's own cache; one copy for the run, named by
    ``STEPSIM_TEST_MAPPING_CACHE``, which the test workers and the commands the tests start inherit, so a shape
    one of them maps is mapped once. ``STEPSIM_TEST_MAPPING_CACHE=DIR`` set by the caller: that folder, seeded the
    same way and kept (to collect new seeds: ``python tests/mapping_seeds/refresh.py --add DIR``)."""
    folder = os.environ.get("STEPSIM_TEST_MAPPING_CACHE")
    if not folder:
        folder = tempfile.mkdtemp(prefix="stepsim-mapping-")
        os.environ["STEPSIM_TEST_MAPPING_CACHE"] = folder
        atexit.register(shutil.rmtree, folder, ignore_errors=True)  # the process that made it: pytest's main
    Path(folder).mkdir(parents=True, exist_ok=True)
    seeds = Path(__file__).parent / "mapping_seeds"
    for subfolder in SEEDED_COSTS:
        (Path(folder) / subfolder).mkdir(exist_ok=True)
    for seed in [*seeds.glob("*.json"), *(p for sub in SEEDED_COSTS for p in (seeds / sub).glob("*.json"))]:
        target = Path(folder) / seed.relative_to(seeds)
        if not target.exists():  # a worker of the run finds the copy made; whole files only (workers may race)
            part = target.with_name(f"{seed.name}.{os.getpid()}.part")
            shutil.copyfile(seed, part)
            os.replace(part, target)
    os.environ["STEPSIM_MAPPING_CACHE"] = folder


_seed_mapping_cache()


@pytest.fixture(scope="session")
def shared_traces() -> Path:
    """``../shared/traces``; tests that need it skip (with this reason) only when the folder is absent, and fail
    instead under CI (:mod:`shared_traces_folder`)."""
    return require_shared_traces()


@pytest.fixture
def qwen_b64_traces(shared_traces) -> dict[str, str]:
    """The decoder's shared Qwen3-30B-A3B B=64 inputs as config values: one layer's routing
    (``expert_routing/qwen_b64/032_012.npz``) and an Azure conversation window of KV lengths."""
    return {"routing": str(shared_traces / "expert_routing" / "qwen_b64" / "032_012.npz"),
            "kv_lengths": str(shared_traces / "kv_lengths" / "b64" / "conv_stdev0477_0271_0334.npy")}


def pytest_configure(config) -> None:
    """With ``-n`` (the suite on several workers), compile the engine's kernels once before the workers start
    (:mod:`kernel_warmup`): on a cold cache each worker would compile the same ones."""
    if hasattr(config, "workerinput") or not getattr(config.option, "numprocesses", None):
        return  # a worker (its controller warmed), or one process: its tests compile what they use, as before
    from kernel_warmup import warm_kernels

    warm_kernels()


def pytest_collection_modifyitems(config, items) -> None:
    """On a worker of ``pytest -n`` (``./run.sh test``): the test files longest first (:mod:`suite_order`), so the
    last files the workers take are short ones. The controller hands out files in this order only with
    ``--dist loadfile --no-loadscope-reorder`` (run.sh); one process keeps the collection's order."""
    if not hasattr(config, "workerinput"):
        return
    from suite_order import order_items, read_table

    items[:] = order_items(items, read_table())
