"""Issue 42's faster replay: the whole Azure conversation trace (19,366 requests) replayed by the compiled loop
(:mod:`stepsim.serve.replay_compiled`) and by the Python reference (:func:`stepsim.serve.replay.replay_reference`)
side by side in one run, Qwen3-30B-A3B (48 layers) on ``sn40l``, vLLM's defaults:

* ``test_replay_side_by_side[constant]``: ``--iteration-latency 0.220090`` (fast's mean step on this trace);
* ``test_replay_side_by_side[fast]``: ``--fidelity fast`` from the calibration cache (``$STEPSIM_SERVE_CACHE``, else
  the default folder: the first run calibrates, minutes; every later one reads it);

each through ``stepsim.serve(..., out=DIR)`` twice, its replay timed (pytest-benchmark times the compiled one; the
reference once, for the ratio). Gate: every file both write is byte for byte the same (``summary.json`` but for
its ``wall_s``).
* ``test_replay_whole_process``: the same two commands as fresh ``python -m stepsim serve`` processes on the
  compiled loop: wall time and peak resident memory. Gate: peak under 1 GiB.

Targets (issue 42, not asserted: read them off the summary): the fast replay at most 3 s, the constant one at most
1 s.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

import stepsim
import stepsim.serve.api as api
from stepsim.serve import replay as replay_module

#: fast's mean step on the whole conversation trace (bench/README.md, calibration version 4)
STEP_S = 0.220090
MODES = {"constant": {"iteration_latency": STEP_S}, "fast": {"fidelity": "fast", "jobs": 2}}
SECTION = "replay: the whole conversation trace (19,366 requests), Qwen3-30B-A3B (48 layers), sn40l"


def _serve(monkeypatch, trace, out, kwargs, loop) -> tuple[float, float]:
    """``stepsim.serve`` with ``loop`` as its replay: (serve wall s, replay wall s)."""
    spent = []

    def timed(*args, **kw):
        t0 = time.perf_counter()
        result = loop(*args, **kw)
        spent.append(time.perf_counter() - t0)
        return result

    monkeypatch.setattr(api, "replay", timed)
    t0 = time.perf_counter()
    stepsim.serve("qwen3-30b-a3b", trace, out=out, **kwargs)
    return time.perf_counter() - t0, spent[-1]


def _same_files(a, b) -> None:
    names = sorted(p.name for p in a.iterdir())
    assert names == sorted(p.name for p in b.iterdir())
    for name in names:
        if name == "summary.json":
            x, y = (json.loads((d / name).read_text()) for d in (a, b))
            x.pop("wall_s"), y.pop("wall_s")
            assert x == y
        else:
            assert (a / name).read_bytes() == (b / name).read_bytes(), name


@pytest.mark.parametrize("mode", list(MODES))
def test_replay_side_by_side(shared_traces, bench_summary, benchmark, monkeypatch, tmp_path, mode):
    trace = shared_traces / "azure" / "AzureLLMInferenceTrace_conv.csv"
    kwargs = MODES[mode]
    if mode == "fast":  # calibrate once (or read the cache) outside the timings
        _serve(monkeypatch, trace, tmp_path / "warm", kwargs, replay_module.replay)
    from stepsim.serve.replay_compiled import warm

    warm()  # load (or compile) the kernel outside the timings
    old_serve, old_replay = _serve(monkeypatch, trace, tmp_path / "old", kwargs, replay_module.replay_reference)
    runs = []
    benchmark.pedantic(lambda: runs.append(_serve(monkeypatch, trace, tmp_path / f"new{len(runs)}", kwargs,
                                                  replay_module.replay)), rounds=1, iterations=1)
    new_serve, new_replay = runs[-1]
    _same_files(tmp_path / "old", tmp_path / f"new{len(runs) - 1}")
    load = os.getloadavg()[0]
    benchmark.extra_info.update(old_replay_s=old_replay, new_replay_s=new_replay, old_serve_s=old_serve,
                                new_serve_s=new_serve, load=load)
    bench_summary(SECTION, f"{mode}: replay {new_replay:.2f} s compiled vs {old_replay:.2f} s reference "
                           f"({old_replay / new_replay:.1f}x); whole serve() {new_serve:.1f} s vs {old_serve:.1f} s; "
                           f"files identical; load {load:.1f}")


def test_replay_whole_process(shared_traces, bench_summary, tmp_path):
    trace = shared_traces / "azure" / "AzureLLMInferenceTrace_conv.csv"
    peak_code = ("import resource, subprocess, sys; r = subprocess.run(sys.argv[1:]); "
                 "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr); "
                 "sys.exit(r.returncode)")
    common = ["--model", "qwen3-30b-a3b", "--requests", str(trace)]
    for mode, flags in (("fast", ["--fidelity", "fast", "--jobs", "2"]),
                        ("constant", ["--iteration-latency", f"{STEP_S:.6f}"])):
        t0 = time.perf_counter()
        done = subprocess.run([sys.executable, "-c", peak_code, sys.executable, "-m", "stepsim", "serve", *common,
                               *flags, "--out", str(tmp_path / mode), "--json"],
                              check=True, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        peak = int(done.stderr.strip().splitlines()[-1]) * 1024  # bytes (Linux reports KiB)
        summary = json.loads(done.stdout)
        bench_summary(SECTION, f"{mode}, whole process: {wall:.1f} s wall, peak {peak / 2**20:.0f} MiB, "
                               f"{summary['iterations']:,} steps, load {os.getloadavg()[0]:.1f}")
        assert summary["completed"] == 19366
        assert peak < 2**30
