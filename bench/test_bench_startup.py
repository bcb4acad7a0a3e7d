"""Start-up costs: cold kernel compilation, cached start-up, and that importing stepsim compiles nothing.

Every measurement runs in a fresh ``python`` subprocess whose ``NUMBA_CACHE_DIR`` points at a temporary folder.
numba's cache locators try a user-provided ``NUMBA_CACHE_DIR`` first, so the engine's ``cache=True`` kernels are
then read from and written to that folder instead of ``stepsim/kernels/__pycache__``: "cold" really starts from an
empty cache, and the shared working tree's cache is neither used nor overwritten. (``stepsim.kernels.jit`` still
checks its source-hash stamp in ``__pycache__`` on import; that only ever deletes stale files there.)

* ``test_import_compiles_nothing`` (always runs, ~2 s): ``import stepsim`` and, separately, every public module
  down to ``stepsim.kernels.engine`` leave the cache folder empty and no numba dispatcher with a compiled
  signature. Hard asserts: this is behaviour, not timing.
* ``test_cold_compile``: ``import stepsim.kernels.api as a; a._ensure_compiled(a._engine())`` with an empty cache
  (the same work as ``stepsim cache warm`` minus running its warm-up program's result).
* ``test_cached_startup``: the same command again on the now-filled cache.

Both report the subprocess wall time (interpreter start-up included) and, measured inside the child, the time of
the import and of ``_ensure_compiled`` alone. The cold compile takes about a minute on the 2-core benchmark
machine, so these two only run with ``--benchmark-enable`` (or ``STEPSIM_BENCH_COLD=1``); the run-once CI mode
skips them to stay within its time budget.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

COMPILE_CHILD = """
import json, time
t0 = time.perf_counter()
import stepsim.kernels.api as a
t1 = time.perf_counter()
engine_run = a._engine()
t2 = time.perf_counter()
a._ensure_compiled(engine_run)
t3 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "engine_import_s": t2 - t1, "ensure_compiled_s": t3 - t2,
                  "signatures": len(engine_run.event_loop.signatures)}))
"""

#: what the import check imports: bare ``stepsim``, and everything a user or the CLI touches before simulating
IMPORT_SETS = {
    "stepsim": ["stepsim"],
    "all": ["stepsim", "stepsim.cli", "stepsim.simulation.simulate", "stepsim.kernels.program", "stepsim.kernels.reference",
            "stepsim.workloads.moe.build", "stepsim.workloads.attention.build", "stepsim.kernels", "stepsim.kernels.api",
            "stepsim.kernels.warm", "stepsim.kernels.engine"],
}

IMPORT_CHILD = """
import json, sys, time
t0 = time.perf_counter()
for name in {modules!r}:
    __import__(name)
t1 = time.perf_counter()
compiled = []
if "numba" in sys.modules:
    from numba.core.dispatcher import Dispatcher
    for name, module in list(sys.modules.items()):
        if name.startswith("stepsim"):
            compiled += [f"{{name}}.{{attr}}" for attr, obj in vars(module).items()
                         if isinstance(obj, Dispatcher) and obj.signatures]
print(json.dumps({{"import_s": t1 - t0, "numba_imported": "numba" in sys.modules, "compiled": compiled}}))
"""

#: the cache filled by test_cold_compile, reused by test_cached_startup
_STATE: dict[str, Path] = {}


def _child(code: str, cache_dir: Path) -> dict:
    """Run ``code`` in a fresh interpreter with ``NUMBA_CACHE_DIR=cache_dir``; its JSON line plus ``process_s``."""
    env = dict(os.environ, NUMBA_CACHE_DIR=str(cache_dir))
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - t0
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["process_s"] = elapsed
    return out


def _cache_files(cache_dir: Path) -> list[Path]:
    return [p for p in cache_dir.rglob("*") if p.is_file()]


@pytest.fixture
def cold_allowed(benchmark):
    if getattr(benchmark, "disabled", False) and os.environ.get("STEPSIM_BENCH_COLD") != "1":
        pytest.skip("cold compile takes ~1 min: runs with --benchmark-enable or STEPSIM_BENCH_COLD=1")


@pytest.mark.parametrize("which", sorted(IMPORT_SETS))
def test_import_compiles_nothing(tmp_path, bench_summary, which):
    """Importing stepsim (or any of its modules) compiles no kernel and writes nothing to numba's cache."""
    cache = tmp_path / "numba_cache"
    cache.mkdir()
    out = _child(IMPORT_CHILD.format(modules=IMPORT_SETS[which]), cache)
    line = (f"import {which:7s}: {out['import_s']:.2f} s in-process, {out['process_s']:.2f} s with interpreter; "
            f"numba imported: {out['numba_imported']}; compiled kernels: {len(out['compiled'])}")
    bench_summary("start-up", line)
    print("\n" + line)
    assert out["compiled"] == [], f"importing {which} compiled {out['compiled']}"
    assert _cache_files(cache) == [], f"importing {which} wrote to the numba cache: {_cache_files(cache)}"


def test_cold_compile(benchmark, cold_allowed, tmp_path_factory, bench_summary):
    """Compile every kernel from an empty cache (fills the cache that test_cached_startup reuses)."""
    runs = []

    def fresh_cache():
        cache = tmp_path_factory.mktemp("numba_cache_cold")
        runs.append({"cache": cache})
        return (cache,), {}

    def compile_cold(cache):
        runs[-1].update(_child(COMPILE_CHILD, cache))

    benchmark.pedantic(compile_cold, setup=fresh_cache, rounds=1, iterations=1, warmup_rounds=0)
    out = runs[-1]
    files = _cache_files(out["cache"])
    # the measurement only means "cold" if numba really used the redirected folder
    assert any(p.suffix == ".nbc" for p in files), f"NUMBA_CACHE_DIR was not used: {files[:5]}"
    _STATE["cache"] = out["cache"]
    benchmark.extra_info.update(process_s=out["process_s"], import_s=out["import_s"],
                                ensure_compiled_s=out["ensure_compiled_s"], cache_files=len(files),
                                cache_bytes=sum(p.stat().st_size for p in files))
    line = (f"cold compile   : {out['process_s']:6.1f} s process ({out['ensure_compiled_s']:.1f} s in "
            f"_ensure_compiled, {out['import_s']:.2f} s import); {len(files)} cache files")
    bench_summary("start-up", line)
    print("\n" + line)


def test_cached_startup(benchmark, rounds, cold_allowed, tmp_path_factory, bench_summary):
    """Start a fresh process and load every kernel from the cache test_cold_compile filled."""
    cache = _STATE.get("cache")
    if cache is None:  # run alone (-k): fill a cache first, untimed
        cache = tmp_path_factory.mktemp("numba_cache_cached")
        _child(COMPILE_CHILD, cache)
    before = {p: p.stat().st_mtime_ns for p in _cache_files(cache)}
    runs = []
    benchmark.pedantic(lambda: runs.append(_child(COMPILE_CHILD, cache)), rounds=rounds(3), iterations=1,
                       warmup_rounds=0)
    best = min(runs, key=lambda r: r["process_s"])
    # a cached start must load, not recompile: no cache file was rewritten
    after = {p: p.stat().st_mtime_ns for p in _cache_files(cache)}
    assert after == before, "the cached start-up recompiled (cache files changed)"
    benchmark.extra_info.update(process_s=best["process_s"], import_s=best["import_s"],
                                ensure_compiled_s=best["ensure_compiled_s"])
    line = (f"cached start-up: {best['process_s']:6.1f} s process ({best['ensure_compiled_s']:.1f} s in "
            f"_ensure_compiled, {best['import_s']:.2f} s import)")
    bench_summary("start-up", line)
    print("\n" + line)


#: what every simulating process pays for numba before loading a single cached kernel: importing it (numba's CPU
#: target registries are no longer part of it: stepsim.kernels.target loads cached kernels without them)
NUMBA_FLOOR = "import numba"


def test_warm_run_swiglu_whole_process(benchmark, rounds, bench_summary, tmp_path):
    """``stepsim run swiglu --json`` on a warm cache (the working tree's), whole process: in its own process
    (``STEPSIM_SERVER=off``) and through a command server (``stepsim server start``, in a private folder),
    against two baselines in the same run: a bare interpreter and the numba floor (NUMBA_FLOOR). Best of
    ``rounds``, alternating. Both ways must print the same record but for its wall times."""
    from stepsim.kernels.api import _engine, _ensure_compiled

    _ensure_compiled(_engine())  # the working tree's cache is warm before timing
    folder = tempfile.mkdtemp(prefix="stepsim-bench-", dir="/tmp")  # short: socket paths are limited; removed below
    served = dict(os.environ, STEPSIM_SERVER_DIR=folder, STEPSIM_SERVER="on")
    alone = dict(served, STEPSIM_SERVER="off")
    run = [sys.executable, "-m", "stepsim", "run", "swiglu", "--json"]
    commands = {"python": ([sys.executable, "-c", "pass"], alone),
                "numba floor": ([sys.executable, "-c", NUMBA_FLOOR], alone),
                "stepsim run swiglu": (run, alone), "stepsim run swiglu, server": (run, served)}
    best = {name: float("inf") for name in commands}
    outputs = {}

    def once():
        for name, (cmd, env) in commands.items():
            t0 = time.perf_counter()
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path)
            best[name] = min(best[name], time.perf_counter() - t0)
            assert proc.returncode == 0, proc.stderr
            outputs[name] = proc.stdout

    start = subprocess.run([sys.executable, "-m", "stepsim", "server", "start", "--idle-timeout", "600"],
                           env=served, cwd=tmp_path, capture_output=True, text=True)
    assert start.returncode == 0, start.stderr
    try:
        benchmark.pedantic(once, rounds=rounds(5), iterations=1, warmup_rounds=1)
    finally:
        subprocess.run([sys.executable, "-m", "stepsim", "server", "stop"], env=served, cwd=tmp_path)
        shutil.rmtree(folder, ignore_errors=True)
    records = [json.loads(outputs[name]) for name in ("stepsim run swiglu", "stepsim run swiglu, server")]
    assert [{k: v for k, v in r.items() if not k.endswith("_s")} for r in records] == [
        {k: v for k, v in records[0].items() if not k.endswith("_s")}] * 2
    run_s, server_s, floor_s = best["stepsim run swiglu"], best["stepsim run swiglu, server"], best["numba floor"]
    benchmark.extra_info.update({k.replace(" ", "_").replace(",", "") + "_s": v for k, v in best.items()})
    bench_summary("start-up", f"warm `stepsim run swiglu --json`: {run_s:.2f} s whole process, {server_s:.2f} s "
                              f"through `stepsim server`; bare python {best['python']:.2f} s; numba import "
                              f"{floor_s:.2f} s ({run_s / floor_s:.2f}x the floor)")
