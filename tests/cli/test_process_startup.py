"""What a stepsim command does to its own process at start-up and exit (stepsim/kernels/target.py, stepsim/cli/__init__.py)."""

import json
import os
import subprocess
import sys

import pytest

#: run the command as the program (argv None), then report what the process holds
PROGRAM = """
import io, contextlib, gc, json, os, sys
sys.argv = ["stepsim", "run", "swiglu", "--json"]
from stepsim.cli import main
out = io.StringIO()
with contextlib.redirect_stdout(out):
    status = main()
print(json.dumps({"status": status, "scipy_linalg": "scipy.linalg" in sys.modules,
                  "registries": "numba.np.arraymath" in sys.modules,
                  "frozen": gc.get_freeze_count() > 0, "cycles": json.loads(out.getvalue())["cycles"],
                  "gc": gc.get_threshold(), "sympy_cache": os.environ.get("SYMPY_CACHE_SIZE"),
                  "sympy": "sympy" in sys.modules, "pyarrow": "pyarrow" in sys.modules}))
"""

#: run ``stepsim ARGS`` as the program; report which of the lazily imported packages it imported
IMPORTS = """
import io, contextlib, json, sys
sys.argv = ["stepsim", *json.loads(sys.argv[1])]
from stepsim.cli import main
with contextlib.redirect_stdout(io.StringIO()):
    status = main()
cache = sys.modules.get("sympy.core.cache")
print(json.dumps({"status": status, "sympy": "sympy" in sys.modules, "pyarrow": "pyarrow" in sys.modules,
                  "sympy_cache": cache and cache.SYMPY_CACHE_SIZE}))
"""

IN_PROCESS = """
import io, contextlib, gc, json, os, sys
from stepsim.cli import main
out = io.StringIO()
with contextlib.redirect_stdout(out):
    status = main(["run", "swiglu", "--json"])
print(json.dumps({"status": status, "scipy_linalg": "scipy.linalg" in sys.modules,
                  "cycles": json.loads(out.getvalue())["cycles"], "gc": gc.get_threshold(),
                  "sympy_cache": os.environ.get("SYMPY_CACHE_SIZE")}))
"""


def _run(code: str, *args: str, cwd=None) -> dict:
    """``code`` in a fresh Python, without the suite's ``SYMPY_CACHE_SIZE`` (tests/conftest.py sets it)."""
    env = {k: v for k, v in os.environ.items() if k != "SYMPY_CACHE_SIZE"}
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, check=True, cwd=cwd,
                          env=env)
    return json.loads(done.stdout.splitlines()[-1])


def test_a_command_loads_cached_kernels_light_and_freezes_before_exit():
    """On a warm cache neither numba's registries nor SciPy's linear algebra are imported (see
    tests/kernels/test_target.py for a miss), in a command or an in-process caller; the same cycles. The program
    sets the collector's thresholds and sympy's cache size (stepsim.base.collector); an in-process caller keeps
    CPython's and sympy's."""
    program = _run(PROGRAM)
    assert program == {"status": 0, "scipy_linalg": False, "registries": False, "frozen": True,
                       "cycles": program["cycles"], "gc": [50_000, 50, 1_000], "sympy_cache": "100000",
                       "sympy": False, "pyarrow": False}
    assert _run(IN_PROCESS) == {"status": 0, "scipy_linalg": False, "cycles": program["cycles"], "gc": [700, 10, 10],
                                "sympy_cache": None}


@pytest.mark.parametrize(("args", "sympy", "pyarrow"), [
    (["run", "swiglu"], False, False),  # static shapes only, the record printed
    (["run", "swiglu", "--out", "out"], False, True),  # Parquet written
    (["run", "moe", "--json"], True, True),  # token counts per expert are symbols; the routing trace is Arrow
])
def test_sympy_and_pyarrow_are_imported_only_when_used(tmp_path, args, sympy, pyarrow):
    """sympy (0.3-0.4 s) and pyarrow (0.1 s) are most of a short command's start-up; see stepsim/base/lazy_import.py.
    A sympy the command imports has the program's cache size (stepsim.base.collector)."""
    assert _run(IMPORTS, json.dumps(args), cwd=tmp_path) == {"status": 0, "sympy": sympy, "pyarrow": pyarrow,
                                                             "sympy_cache": 100_000 if sympy else None}
    assert (tmp_path / "out").is_dir() == ("--out" in args)


def test_a_local_pools_workers_collect_as_the_program_does():
    """The pool's workers (stepsim.batch.tasks.init_local_worker) take the program's collector thresholds
    (stepsim.base.collector), whatever their parent's, and their sympy (imported ahead by the forkserver) the
    cache size the suite's process, like the program's, set before it started them; so has this process's."""
    import gc

    import sympy.core.cache

    from stepsim.batch.executors import local_worker_pool

    assert sympy.core.cache.SYMPY_CACHE_SIZE == 100_000  # tests/conftest.py ran before anything imported sympy
    pool = local_worker_pool(1, warm_kernels=False)
    try:
        assert pool.submit(gc.get_threshold).result(timeout=120) == (50_000, 50, 1_000)
        size = "__import__('sympy.core.cache', fromlist=['cache']).SYMPY_CACHE_SIZE"
        assert pool.submit(eval, size).result(timeout=120) == 100_000
    finally:
        pool.shutdown()
