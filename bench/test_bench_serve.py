"""Serving (issue 32): where --fidelity exact spends its time, and the wall time of serve runs.

* ``test_rebinding_versus_building``: 16 decode-attention batches (32 requests) and 16 MoE layers (32 tokens) of a
  Qwen3-30B-A3B-shaped model on ``sn40l``, priced twice: built and lowered afresh for each, and through one
  template per shape rebound per piece (:mod:`stepsim.serve.layers`). Asserts the cycles are identical; reports
  build + lowering time per piece against the template's one build, the rebinding and the engine time.
* ``test_serve_wall_times``: the first ``STEPSIM_BENCH_SERVE_REQUESTS`` (default 40) requests of the Azure
  conversation trace on ``examples/qwen3-30b-a3b-4layers.json`` (Qwen3-30B-A3B's dimensions, 4 layers):
  ``--iteration-latency`` (the scheduler's own cost), ``--fidelity fast`` calibrating, the same again from the
  cached calibration, and ``--fidelity exact --jobs 2``; reports wall times and the fast run's TTFT / TPOT p50 and
  p99 against the exact run's, and its held-out step error. Asserts both engine-backed runs serve every request
  and the cached fast run repeats the calibrating one step for step.
* ``test_serve_fast_against_exact_on_mapped_layers``: requests 200-399 on the same shape with ``--schedule auto``
  (mapped layers, serve's default on ``sn40l``), exact and fast; asserts issue 41's targets for fast mode.

Nothing asserts on time.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import stepsim
from stepsim.base.hardware import PRESETS
from stepsim.models.presets import resolve_model
from stepsim.serve.exact import max_kv_rows
from stepsim.serve.layers import LayerRunner, LayerSpec, build, lowered
from stepsim.serve.routing import SyntheticRouting

MODEL = Path(__file__).resolve().parents[1] / "examples" / "qwen3-30b-a3b-4layers.json"
#: tests/serve: its stored exact runs (data/) and its request-window helper (serve_requests.py, on sys.path)
TESTS = Path(__file__).resolve().parents[1] / "tests" / "serve"
sys.path.insert(0, str(TESTS))


def test_rebinding_versus_building(bench_summary):
    from stepsim.analysis.deadlock import run_diagnosed

    spec = LayerSpec(resolve_model(str(MODEL)), PRESETS["sn40l"], max_kv_rows(40960))
    rng = np.random.default_rng(0)
    routing = SyntheticRouting(128, 8, 1, seed=0)
    pieces = [("decode", rng.integers(50, 4000, 32)) for _ in range(16)]
    pieces += [("ffn", routing.route(32)[:, 0, :]) for _ in range(16)]
    fresh_build = fresh_engine = 0.0
    fresh_cycles = []
    for kind, data in pieces:
        t0 = time.perf_counter()
        program = lowered(build(kind, data, spec), spec.hardware)
        t1 = time.perf_counter()
        fresh_cycles.append(int(run_diagnosed(program).cycles))
        fresh_build += t1 - t0
        fresh_engine += time.perf_counter() - t1
    runner = LayerRunner(spec)
    cycles = [runner.cycles(kind, data) for kind, data in pieces]
    assert cycles == fresh_cycles and runner.builds == 2 and runner.runs == 32
    n = len(pieces)
    bench_summary("serve: graph building vs engine (32 pieces)",
                  f"fresh: build+lower {fresh_build / n * 1e3:.1f} ms/piece, engine {fresh_engine / n * 1e3:.1f} "
                  f"ms/piece")
    bench_summary("serve: graph building vs engine (32 pieces)",
                  f"templates: {runner.builds} built in {runner.build_s:.2f} s, rebinding "
                  f"{runner.bind_s / n * 1e6:.0f} us/piece, engine {runner.engine_s / n * 1e3:.1f} ms/piece")


def test_serve_wall_times(shared_traces, bench_summary, tmp_path):
    requests = int(os.environ.get("STEPSIM_BENCH_SERVE_REQUESTS", "40"))
    trace = shared_traces / "azure" / "AzureLLMInferenceTrace_conv.csv"
    kw = dict(limit_requests=requests, calibration_cache=tmp_path / "cache")
    runs = {}
    for name, extra in (("iteration-latency 20 ms", dict(iteration_latency=0.02)),
                        ("fast, calibrating", dict(fidelity="fast", schedule="paper")),
                        ("fast, cached calibration", dict(fidelity="fast", schedule="paper")),
                        ("exact, --jobs 2", dict(fidelity="exact", schedule="paper", jobs=2))):
        t0 = time.perf_counter()
        runs[name] = stepsim.serve(str(MODEL), trace, **kw, **extra)
        wall = time.perf_counter() - t0
        s = runs[name].summary
        bench_summary(f"serve: {requests} requests of the conversation trace, Qwen3-30B-A3B x 4 layers, sn40l",
                      f"{name}: {wall:.1f} s, {s['iterations']} steps, TTFT p50 {s['ttft_s']['p50'] * 1e3:.2f} ms, "
                      f"TPOT p50 {s['tpot_s']['p50'] * 1e3:.3f} ms")
    fast, exact = runs["fast, cached calibration"].summary, runs["exact, --jobs 2"].summary
    assert fast["completed"] == exact["completed"] == requests  # (their schedules differ with their step times)
    assert runs["fast, cached calibration"].iterations.equals(runs["fast, calibrating"].iterations)
    diffs = ", ".join(f"{k[:-2]} {q} {(fast[k][q] / exact[k][q] - 1) * 100:+.2f} %"
                      for k in ("ttft_s", "tpot_s") for q in ("p50", "p99"))
    e = fast["fidelity"]["error"]
    bench_summary(f"serve: {requests} requests of the conversation trace, Qwen3-30B-A3B x 4 layers, sn40l",
                  f"fast vs exact: {diffs}; held-out step error p50 {e['iteration_p50'] * 100:.2f} %, p95 "
                  f"{e['iteration_p95'] * 100:.2f} %")


#: runs a command and prints its peak resident set (KiB, the largest of it and its waited-for descendants)
_PEAK = ("import resource, subprocess, sys; r = subprocess.run(sys.argv[1:]); "
         "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr); sys.exit(r.returncode)")


def _cli_run(args: list[str], env: dict) -> tuple[float, float, dict]:
    """``python -m stepsim serve ARGS --json`` in a fresh process: (wall s, peak resident MiB, summary)."""
    import json
    import subprocess
    import sys

    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", _PEAK, sys.executable, "-m", "stepsim", "serve", *args, "--json"],
                         env=env, check=True, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    return wall, int(done.stderr.strip().splitlines()[-1]) / 1024, json.loads(done.stdout)


def test_serve_whole_conversation_trace_fast(shared_traces, bench_summary, tmp_path):
    """Qwen3-30B-A3B (48 MoE layers, routed token by token) serving the whole Azure conversation trace
    (19,366 requests) in ``--fidelity fast --jobs 2``: calibrating (a fresh cache), then from the cached
    calibration; beside ``--iteration-latency`` at the fast run's mean step time (the scheduler's own cost on
    the same number of steps). Issue 32's targets: 30 s cached, 5 min calibrating, 4 GB peak. Asserts every
    request is served and the cached run repeats the calibrating one step for step (bytes)."""
    trace = shared_traces / "azure" / "AzureLLMInferenceTrace_conv.csv"
    env = dict(os.environ, STEPSIM_SERVE_CACHE=str(tmp_path / "cache"))
    section = "serve: the whole conversation trace (19,366 requests), Qwen3-30B-A3B (48 layers), sn40l"
    common = ["--model", "qwen3-30b-a3b", "--requests", str(trace)]
    runs = {}
    for name in ("calibrating", "cached"):
        runs[name] = _cli_run([*common, "--fidelity", "fast", "--schedule", "paper", "--jobs", "2", "--out",
                               str(tmp_path / name)], env)  # the paper's layers, as the numbers recorded before
        wall, peak, s = runs[name]
        bench_summary(section, f"--fidelity fast, {name}: {wall:.1f} s wall, peak {peak:.0f} MiB, "
                               f"{s['iterations']:,} steps, TTFT p50 {s['ttft_s']['p50']:.1f} s, "
                               f"TPOT p50 {s['tpot_s']['p50'] * 1e3:.2f} ms")
    from stepsim.serve.output import read_outputs

    _, iterations, _ = read_outputs(tmp_path / "cached")
    step = float(np.mean(iterations["duration_s"].to_numpy()))
    wall, peak, s = _cli_run([*common, "--iteration-latency", f"{step:.6f}", "--out", str(tmp_path / "constant")],
                             env)
    bench_summary(section, f"--iteration-latency {step * 1e3:.3f} ms: {wall:.1f} s wall, peak {peak:.0f} MiB, "
                           f"{s['iterations']:,} steps")
    assert runs["calibrating"][2]["completed"] == runs["cached"][2]["completed"] == 19366
    for name in ("requests.parquet", "iterations.parquet"):
        assert (tmp_path / "calibrating" / name).read_bytes() == (tmp_path / "cached" / name).read_bytes()


#: 200-request windows of the conversation trace: stored exact run (tests/serve/data) -> (first request, requests)
WINDOWS = {"conv200_exact": (0, 200), "conv400_exact": (200, 200)}


@pytest.mark.parametrize("stored", WINDOWS)
def test_serve_fast_against_exact_200_conversation_requests(stored, shared_traces, bench_summary, tmp_path):
    """Issue 32's accuracy target, with wall times: 200-request windows of the conversation trace (requests 0-199
    and 200-399) on the 4-layer Qwen3-30B-A3B shape, ``--fidelity exact --jobs 2`` (17-35 min each, with the
    machine's load) and ``--fidelity fast --jobs 2`` calibrating. Asserts the exact run's tables are the ones stored
    for tests/serve/test_fast_accuracy.py (value for value), and fast within 2 % of exact on TTFT and TPOT p50 / p99
    and within 5 % at p95 per held-out step: requests 0-199 fail on TTFT p50 (+3.89 %, docs/serving.md §10.6)."""
    from serve_requests import azure_window

    first, count = WINDOWS[stored]
    trace = azure_window(shared_traces / "azure" / "AzureLLMInferenceTrace_conv.csv", first, count,
                         tmp_path / "window.csv")
    env = dict(os.environ, STEPSIM_SERVE_CACHE=str(tmp_path / "cache"))
    section = (f"serve: requests {first}-{first + count - 1} of the conversation trace, Qwen3-30B-A3B x 4 layers, "
               "sn40l, fast vs exact")
    common = ["--model", str(MODEL), "--requests", str(trace), "--jobs", "2", "--schedule", "paper"]  # as stored
    summaries = {}
    for mode in ("fast", "exact"):
        wall, peak, summaries[mode] = _cli_run([*common, "--fidelity", mode, "--out", str(tmp_path / mode)], env)
        bench_summary(section, f"--fidelity {mode} --jobs 2: {wall:.1f} s wall, {summaries[mode]['iterations']:,} "
                               f"steps, load average {os.getloadavg()[0]:.1f} at its end")
    from stepsim.serve.output import read_outputs

    ran, kept = read_outputs(tmp_path / "exact"), read_outputs(TESTS / "data" / stored)
    assert ran[0].equals(kept[0]) and ran[1].equals(kept[1])  # the tables (the files' metadata name the trace's path)
    fast, exact = summaries["fast"], summaries["exact"]
    diffs = {f"{k[:-2]} {q}": fast[k][q] / exact[k][q] - 1 for k in ("ttft_s", "tpot_s") for q in ("p50", "p99")}
    e = fast["fidelity"]["error"]
    bench_summary(section, "fast vs exact: " + ", ".join(f"{k} {v * 100:+.2f} %" for k, v in diffs.items())
                  + f"; held-out step error p50 {e['iteration_p50'] * 100:.2f} %, p95 {e['iteration_p95'] * 100:.2f} %")
    assert all(abs(v) < 0.02 for v in diffs.values()) and e["iteration_p95"] < 0.05


def test_serve_fast_against_exact_on_mapped_layers(shared_traces, bench_summary, tmp_path):
    """Issue 41's target for fast mode on mapped layers (``--schedule auto``, serve's default on ``sn40l``): requests
    200-399 of the conversation trace on the 4-layer Qwen3-30B-A3B shape, ``--fidelity exact`` and ``--fidelity
    fast`` (calibrating, stepsim/serve/fast_mapped.py), both ``--jobs 2``. Asserts fast within 2 % of exact on TTFT
    and TPOT p50 / p99 and within 5 % at p95 per held-out step; reports both wall times (the mapper's search is
    cached in ``$STEPSIM_MAPPING_CACHE``: a cold cache adds the mapping of every bucket to the first run)."""
    from serve_requests import azure_window

    trace = azure_window(shared_traces / "azure" / "AzureLLMInferenceTrace_conv.csv", 200, 200,
                         tmp_path / "window.csv")
    env = dict(os.environ, STEPSIM_SERVE_CACHE=str(tmp_path / "cache"))
    section = "serve: requests 200-399 of the conversation trace, Qwen3-30B-A3B x 4 layers, sn40l, mapped layers"
    common = ["--model", str(MODEL), "--requests", str(trace), "--jobs", "2", "--schedule", "auto"]
    summaries = {}
    for mode in ("exact", "fast"):
        wall, peak, summaries[mode] = _cli_run([*common, "--fidelity", mode, "--out", str(tmp_path / mode)], env)
        bench_summary(section, f"--fidelity {mode} --jobs 2: {wall:.1f} s wall, {summaries[mode]['iterations']:,} "
                               f"steps, load average {os.getloadavg()[0]:.1f} at its end")
    fast, exact = summaries["fast"], summaries["exact"]
    assert fast["fidelity"]["schedule"] == exact["fidelity"]["schedule"] == "auto"
    diffs = {f"{k[:-2]} {q}": fast[k][q] / exact[k][q] - 1 for k in ("ttft_s", "tpot_s") for q in ("p50", "p99")}
    e = fast["fidelity"]["error"]
    bench_summary(section, "fast vs exact: " + ", ".join(f"{k} {v * 100:+.2f} %" for k, v in diffs.items())
                  + f"; held-out step error p50 {e['iteration_p50'] * 100:.2f} %, p95 {e['iteration_p95'] * 100:.2f} %"
                  + f", max {e['iteration_max'] * 100:.2f} %")
    assert all(abs(v) < 0.02 for v in diffs.values()) and e["iteration_p95"] < 0.05
