"""Serving tools (issue 32): the layers of a step on Dask against local workers, the Perfetto timeline and a
serving sweep.

* ``test_dask_layers_against_jobs``: ``--fidelity exact`` on the first ``STEPSIM_BENCH_SERVE_TOOLS_REQUESTS``
  (default 10) requests of the Azure conversation trace, ``examples/qwen3-30b-a3b-4layers.json``, with
  ``--jobs 1``, ``--jobs 2`` and ``--executor dask`` (a local cluster of one worker process per CPU); asserts the
  three write the same bytes; reports wall times and their ratio to ``--jobs 1``.
* ``test_timeline_of_the_whole_trace``: the whole conversation trace (19,366 requests) with
  ``--iteration-latency 0.02``, with and without ``--timeline``; reports the trace's size and what writing it
  adds; asserts it reads back with a track per request and a slice per step.
* ``test_serving_sweep``: ``examples/sweep_serve.toml`` (8 grid points of 500 requests) on 2 local workers;
  reports its wall time against one ``stepsim serve`` of a grid point in this process.

Nothing asserts on time.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import stepsim

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "examples" / "qwen3-30b-a3b-4layers.json"


def test_dask_layers_against_jobs(shared_traces, bench_summary, tmp_path):
    requests = int(os.environ.get("STEPSIM_BENCH_SERVE_TOOLS_REQUESTS", "10"))
    trace = shared_traces / "azure" / "AzureLLMInferenceTrace_conv.csv"
    title = f"serve tools: --fidelity exact, {requests} requests, Qwen3-30B-A3B x 4 layers"
    walls = {}
    for name, extra in (("--jobs 1", dict(jobs=1)), ("--jobs 2", dict(jobs=2)), ("--executor dask", dict(executor="dask"))):
        t0 = time.perf_counter()
        r = stepsim.serve(str(MODEL), trace, limit_requests=requests, max_batch_tokens=512, fidelity="exact", schedule="paper",
                          out=tmp_path / name.replace(" ", ""), **extra)
        walls[name] = time.perf_counter() - t0
        bench_summary(title, f"{name}: {walls[name]:.1f} s ({walls[name] / walls['--jobs 1']:.2f}x --jobs 1), "
                             f"{r.summary['iterations']} steps, {r.summary['fidelity']['simulations']} simulations")
    for name in ("requests.parquet", "iterations.parquet"):
        first = (tmp_path / "--jobs1" / name).read_bytes()
        assert all((tmp_path / d / name).read_bytes() == first for d in ("--jobs2", "--executordask"))


def test_timeline_of_the_whole_trace(shared_traces, bench_summary, tmp_path):
    from stepsim.serve.timeline import read_timeline

    trace = shared_traces / "azure" / "AzureLLMInferenceTrace_conv.csv"
    t0 = time.perf_counter()
    plain = stepsim.serve("qwen3-30b-a3b", trace, iteration_latency=0.02)
    t1 = time.perf_counter()
    stepsim.serve("qwen3-30b-a3b", trace, iteration_latency=0.02, timeline=tmp_path / "t.pftrace")
    t2 = time.perf_counter()
    tl = read_timeline(tmp_path / "t.pftrace")
    t3 = time.perf_counter()
    assert len(tl["slices"]["steps"]) == plain.summary["iterations"]
    assert sum(name.startswith("request ") for name, _ in tl["tracks"].values()) == plain.summary["requests"]
    size = (tmp_path / "t.pftrace").stat().st_size
    bench_summary("serve tools: --timeline, the whole conversation trace (19,366 requests), --iteration-latency 0.02",
                  f"without {t1 - t0:.1f} s, with {t2 - t1:.1f} s ({size / 1e6:.1f} MB, "
                  f"{plain.summary['iterations']:,} steps); read back in {t3 - t2:.1f} s")


def test_serving_sweep(shared_traces, bench_summary, tmp_path):
    from stepsim.serve.sweep import config_of, load_serve_sweep, run_serve_sweep

    spec = load_serve_sweep(ROOT / "examples" / "sweep_serve.toml")
    t0 = time.perf_counter()
    report = run_serve_sweep(spec, out=tmp_path / "sweep", jobs=2)
    t1 = time.perf_counter()
    assert len(report.ran) == report.total == 8 and not report.failed
    one = config_of(report.rows[0][1])
    t2 = time.perf_counter()
    stepsim.serve(**one)
    t3 = time.perf_counter()
    bench_summary("serve tools: examples/sweep_serve.toml (8 grid points x 500 requests)",
                  f"sweep on 2 local workers {t1 - t0:.1f} s; one grid point in this process {t3 - t2:.2f} s")
