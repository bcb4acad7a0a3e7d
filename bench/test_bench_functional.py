"""Functional-mode throughput relative to timing mode on the MoE layer (issue: report the ratio).

The B=64 MoE layer of each model on its first real ``b64`` routing file, with the model's expert count and
top-k but scaled-down dims (D=256, F=512: full Mixtral weights are 1.4 G parameters, 5.6 GB as fp32, which
functional mode would have to hold), static tile 16 and dynamic tiling. Each case times the warm engine call
(``sim_wall_s``) of a timing run and of a functional run of the same program and reports
``functional / timing`` (the slowdown), both rates in firings per second, and the value-arena size. The
functional run must store what the NumPy reference computes (asserted: it is deterministic), and its timing
must equal timing mode's. Nothing here asserts on time.
"""

from __future__ import annotations

import time

import pytest

from stepsim.simulation.simulate import simulate
from stepsim.trace_io.load import load_routing
from stepsim.workloads.moe.build import build_moe
from stepsim.workloads.reference import check_outputs, make_inputs, small_moe_model

MOE_TRACES = {"mixtral-8x7b": "mixtral_b64", "qwen3-30b-a3b": "qwen_b64"}


@pytest.fixture(scope="module", autouse=True)
def compiled():
    """Compile / load both engine specializations before anything is timed."""
    from stepsim.kernels.api import _engine, _ensure_compiled

    _ensure_compiled(_engine())
    _ensure_compiled(_engine(), functional=True)


def _first(folder, pattern: str):
    files = sorted(folder.glob(pattern))
    if not files:
        pytest.skip(f"no {pattern} file in {folder}")
    return files[0]


@pytest.mark.traces
@pytest.mark.parametrize(("tiling", "tile_n"), [("static", 16), ("dynamic", None)], ids=["static16", "dynamic"])
@pytest.mark.parametrize("model_name", sorted(MOE_TRACES))
def test_functional_vs_timing_moe_b64(benchmark, rounds, bench_summary, shared_traces, model_name, tiling, tile_n):
    model = small_moe_model(model_name, hidden=256, intermediate=512)
    routing = load_routing(_first(shared_traces / "expert_routing" / MOE_TRACES[model_name], "*.npz"),
                           model.experts)
    workload = build_moe(model, routing, tiling=tiling, tile_n=tile_n)
    inputs = make_inputs(workload)
    timing = min((simulate(workload) for _ in range(rounds(3))), key=lambda r: r.sim_wall_s)
    results = []

    def once():
        results.append(simulate(workload, functional=True, inputs=inputs))

    t0 = time.perf_counter()
    benchmark.pedantic(once, rounds=rounds(3), iterations=1, warmup_rounds=0)
    wall = time.perf_counter() - t0
    func = min(results, key=lambda r: r.sim_wall_s)
    assert func.cycles == timing.cycles and func.events == timing.events
    assert all(c.passed for c in check_outputs(workload, inputs, func.outputs).values())
    ratio = func.sim_wall_s / timing.sim_wall_s
    benchmark.extra_info.update(model=model_name, tiling=tiling, tile_n=tile_n, timing_sim_wall_s=timing.sim_wall_s,
                                functional_sim_wall_s=func.sim_wall_s, slowdown=ratio,
                                timing_firings_per_s=timing.fires / timing.sim_wall_s,
                                functional_firings_per_s=func.fires / func.sim_wall_s,
                                arena_tiles=func.functional.arena_tiles, block_elems=func.functional.block_elems,
                                arena_bytes=func.functional.arena_bytes, rounds_wall_s=wall)
    line = (f"{model_name} {tiling}{tile_n or ''} (D=256, F=512)  timing {timing.sim_wall_s * 1e3:8.2f} ms  "
            f"functional {func.sim_wall_s * 1e3:8.2f} ms  slowdown x{ratio:6.1f}  |  "
            f"{func.fires / func.sim_wall_s / 1e6:6.2f} M firings/s with values, arena "
            f"{func.functional.arena_bytes / 2**20:6.1f} MiB")
    bench_summary("functional vs timing mode, B=64 MoE (scaled-down dims)", line)
    print("\n" + line)
