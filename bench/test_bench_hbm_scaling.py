"""Engine time of MoE layers as experts and batch grow: the HBM model's cost follows due work, not units.

Two tables (issue 13), each for static tiling (16 tokens per tile) and dynamic tiling:

* **experts**: E = 8, 64, 128, 256, 512, 1024 at B=64, top-8, D=2048, F=768 (a synthetic routing trace with a
  skewed expert popularity, seeded);
* **batch**: Mixtral-8x7B (D=4096, F=14336, 8 experts, top-2) at B = 64, 256, 1024, 4096, 16384 (synthetic).
  Static tiling at B >= 1024 deadlocks on these traces with 2-deep FIFOs, so it runs with 1024-deep ones (the
  artifact's ``None``, as ``stepsim reproduce`` does for Qwen at B=1024).

Each case builds the layer, lowers it and runs the engine twice in the same process: with the HBM's closed form
(the default) and serving every tick one by one (``run(..., hbm_closed_form=False)``; the per-tick column, skipped
above ``PER_TICK_MAX_REQUESTS`` requests because it then takes minutes). Both runs must give identical results
(asserted, with the counters); the ratio per-tick / closed form is the closed form's gain in the same run.
``hbm_closed_form_ticks`` (and of those ``hbm_uneven_closed_form_ticks``, periods whose channels moved by
different amounts) are deterministic counts. Nothing asserts on time.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from stepsim.base.hardware import Hardware
from stepsim.graph.lower import lower
from stepsim.kernels import api
from stepsim.models.presets import moe_model
from stepsim.workloads.moe.build import build_moe

#: the per-tick run is skipped above this many HBM requests (about 20 ns each)
PER_TICK_MAX_REQUESTS = 200_000_000


@pytest.fixture(scope="module", autouse=True)
def compiled():
    from stepsim.kernels.warm import warm_program

    api.run(warm_program())


def synthetic_routing(tokens: int, experts: int, top_k: int, seed: int) -> np.ndarray:
    """[tokens, top_k] distinct experts per token, popularity drawn from a Dirichlet(0.5) (skewed, seeded)."""
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.full(experts, 0.5))
    keys = rng.random((tokens, experts)) ** (1.0 / p)  # Efraimidis-Spirakis: weighted sampling w/o replacement
    return np.argsort(-keys, axis=1)[:, :top_k].astype(np.int64)


def _case(benchmark, bench_summary, section, label, build):
    t0 = time.perf_counter()
    workload = build()
    build_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    program = lower(workload.graph, Hardware.preset(workload.hardware), channel_depth=workload.channel_depth)
    lower_s = time.perf_counter() - t0
    results = []
    benchmark.pedantic(lambda: results.append(api.run(program)), rounds=1, iterations=1, warmup_rounds=0)
    fast = results[0]
    per_tick_s = None
    if fast.hbm_requests <= PER_TICK_MAX_REQUESTS:
        slow = api.run(program, hbm_closed_form=False)
        assert (slow.cycles, slow.events, slow.fires, slow.bytes_read, slow.hbm_requests) == (
            fast.cycles, fast.events, fast.fires, fast.bytes_read, fast.hbm_requests)
        assert (slow.unit_counters == fast.unit_counters).all()
        assert (slow.channel_counters == fast.channel_counters).all()
        per_tick_s = slow.wall_seconds
    benchmark.extra_info.update(build_s=build_s, lower_s=lower_s, engine_s=fast.wall_seconds,
                                per_tick_engine_s=per_tick_s, cycles=fast.cycles, events=fast.events,
                                hbm_requests=fast.hbm_requests, closed_form_ticks=fast.hbm_closed_form_ticks,
                                uneven_closed_form_ticks=fast.hbm_uneven_closed_form_ticks)
    ratio = f"x{per_tick_s / fast.wall_seconds:6.1f}" if per_tick_s else "      -"
    per_tick = f"{per_tick_s:7.3f} s" if per_tick_s else "      - "
    bench_summary(section, f"{label:22s} build {build_s:6.2f} s  lower {lower_s:5.2f} s  engine {fast.wall_seconds:7.3f} s"
                           f"  per-tick {per_tick} {ratio}  total {build_s + lower_s + fast.wall_seconds:6.2f} s  |"
                           f" {fast.cycles:>12,} cycles {fast.hbm_requests:>12,} requests, closed-form ticks"
                           f" {fast.hbm_closed_form_ticks:>11,} ({fast.hbm_uneven_closed_form_ticks:,} uneven)")


@pytest.mark.parametrize("tiling", ["static", "dynamic"])
@pytest.mark.parametrize("experts", [8, 64, 128, 256, 512, 1024])
def test_engine_time_vs_experts(benchmark, bench_summary, experts, tiling):
    model = moe_model("custom", hidden=2048, intermediate=768, experts=experts, top_k=8)
    routing = synthetic_routing(64, experts, 8, seed=experts)
    _case(benchmark, bench_summary, "MoE engine time vs experts (B=64, top-8, D=2048, F=768)",
          f"E={experts:<5d} {tiling}",
          lambda: build_moe(model, routing, tiling=tiling, tile_n=16 if tiling == "static" else None))


@pytest.mark.parametrize("tiling", ["static", "dynamic"])
@pytest.mark.parametrize("batch", [64, 256, 1024, 4096, 16384])
def test_engine_time_vs_batch(benchmark, bench_summary, batch, tiling):
    routing = synthetic_routing(batch, 8, 2, seed=batch)
    depth = 1024 if tiling == "static" and batch >= 1024 else 2
    _case(benchmark, bench_summary, "Mixtral-8x7B engine time vs batch (synthetic routing)",
          f"B={batch:<6d} {tiling}",
          lambda: build_moe(moe_model("mixtral-8x7b"), routing, tiling=tiling,
                            tile_n=16 if tiling == "static" else None, channel_depth=depth))
