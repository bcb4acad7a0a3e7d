"""Serving on a system (issue 32/34): ``--fidelity exact --system ring-2`` with the sharded MoE block built once per
token count and rebound per step, against building it fresh for every step (the baseline, in the same run).

* ``test_sharded_rebinding_versus_building``: 16 one-token decode steps and 4 prefill steps (112 tokens) of the
  MoE block of ``examples/qwen3-30b-a3b-4layers.json`` (128 experts, top-8) on ``ring-2``, priced fresh
  (:meth:`stepsim.serve.layers.LayerRunner.fresh_cycles`) and through the templates (``LayerRunner.cycles``).
  Asserts the cycles are identical; reports build + lowering, rebinding and engine time per piece.
* ``test_serve_system_exact_wall_times``: whole serve runs, the docs/serving.md §13 example (3 requests) and a
  16-request window, with templates and with every sharded block built fresh (``LayerRunner.cycles`` patched to
  ``fresh_cycles``, the behaviour before); asserts the two runs' steps are identical, reports both wall times.

Nothing asserts on time.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

import stepsim
from stepsim.base.system import System
from stepsim.models.presets import resolve_model
from stepsim.serve.exact import max_kv_rows
from stepsim.serve.layers import LayerRunner, LayerSpec
from stepsim.serve.routing import SyntheticRouting
from stepsim.trace_io.requests import RequestTrace, write_requests

MODEL = Path(__file__).resolve().parents[1] / "examples" / "qwen3-30b-a3b-4layers.json"


def test_sharded_rebinding_versus_building(bench_summary):
    system = System.preset("ring-2")
    spec = LayerSpec(resolve_model(str(MODEL)), system.hardware, max_kv_rows(4096), system=system)
    routing = SyntheticRouting(128, 8, 1, seed=0)
    pieces = [routing.route(1)[:, 0, :] for _ in range(16)] + [routing.route(112)[:, 0, :] for _ in range(4)]
    fresh = LayerRunner(spec)
    fresh_cycles = [fresh.fresh_cycles("ffn", data) for data in pieces]
    bound = LayerRunner(spec)
    cycles = [bound.cycles("ffn", data) for data in pieces]
    assert cycles == fresh_cycles and (fresh.builds, bound.builds, bound.runs) == (20, 2, 20)
    n = len(pieces)
    section = "serve --system ring-2: the sharded MoE block, fresh vs template (20 pieces)"
    bench_summary(section, f"fresh: build+lower {fresh.build_s / n * 1e3:.1f} ms/piece, engine "
                           f"{fresh.engine_s / n * 1e3:.1f} ms/piece, total {fresh.build_s + fresh.engine_s:.2f} s")
    bench_summary(section, f"templates: {bound.builds} built in {bound.build_s:.2f} s, rebinding "
                           f"{bound.bind_s / n * 1e6:.0f} us/piece, engine {bound.engine_s / n * 1e3:.1f} ms/piece, "
                           f"total {bound.build_s + bound.bind_s + bound.engine_s:.2f} s; ratio "
                           f"{(fresh.build_s + fresh.engine_s) / (bound.build_s + bound.bind_s + bound.engine_s):.2f}x")


def _requests(path, arrival, prompt, output):
    n = len(arrival)
    return write_requests(RequestTrace(str(path), np.arange(n, dtype=np.int64), np.asarray(arrival, np.float64),
                                       np.asarray(prompt, np.int64), np.asarray(output, np.int64)), path)


def test_serve_system_exact_wall_times(bench_summary, tmp_path, monkeypatch):
    rng = np.random.default_rng(3)
    traces = {"§13 example (3 requests)": _requests(tmp_path / "ex.parquet", [0.0] * 3, [64, 32, 16], [4] * 3),
              "16 requests in 20 ms": _requests(tmp_path / "w16.parquet", np.sort(rng.uniform(0, 0.02, 16)),
                                                rng.integers(5, 200, 16), rng.integers(2, 16, 16))}
    section = "serve --system ring-2 --fidelity exact, examples/qwen3-30b-a3b-4layers.json"
    for name, trace in traces.items():
        walls, runs = {}, {}
        for mode in ("templates", "fresh"):  # templates first: one-time costs count against them
            with monkeypatch.context() as m:
                if mode == "fresh":  # the behaviour before: every sharded block built for its step
                    m.setattr(LayerRunner, "cycles", LayerRunner.fresh_cycles)
                t0 = time.perf_counter()
                runs[mode] = stepsim.serve(str(MODEL), trace, fidelity="exact", schedule="paper", system="ring-2")
                walls[mode] = time.perf_counter() - t0
        assert runs["fresh"].iterations.equals(runs["templates"].iterations)
        s = runs["templates"].summary
        bench_summary(section, f"{name}: {s['iterations']} steps, fresh {walls['fresh']:.2f} s, templates "
                               f"{walls['templates']:.2f} s, ratio {walls['fresh'] / walls['templates']:.2f}x")
