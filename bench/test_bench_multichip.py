"""Scaling to many chips (issue 34): engine time of an 8-chip Qwen3 MoE layer against the one-chip layer's.

Qwen3-30B-A3B on the shared B=64 trace (``expert_routing/qwen_b64/032_012.npz``, static tiling, tile_n 32):
the one-chip layer, and the expert-parallel layer on 8 fully connected chips (``--ep 8``: the batch sharded, all-to-all
dispatch and combine over 56 link units, 8 HBMs) with one region per expert and with one time-multiplexed region
per chip (``--regions 8``), load-balanced placement. Each program is lowered once and run warm; the engine times
(``EngineResult.wall_seconds``, the fastest of the rounds) are compared in the same run: the target is the 8-chip
layer within 10x of the one-chip layer's (read off the summary, not asserted). Gate (asserted): every round gives
the same cycles and events.
"""

from __future__ import annotations

import pytest

from stepsim.base.hardware import Hardware
from stepsim.graph.lower import lower
from stepsim.kernels import api
from stepsim.workloads.config import workload_from_config

CASES = {"1 chip": {}, "8 chips": {"ep": 8, "placement": "load-balanced"},
         "8 chips, regions 8": {"ep": 8, "placement": "load-balanced", "regions": 8}}
#: the one-chip layer with time-multiplexed regions is the baseline of the regions case
BASELINES = {"1 chip": None, "8 chips": "1 chip", "8 chips, regions 8": "1 chip, regions 8"}


@pytest.fixture(scope="module", autouse=True)
def compiled():
    from stepsim.kernels.warm import warm_program

    api.run(warm_program())


def _engine_seconds(program, n: int):
    results = [api.run(program) for _ in range(n)]
    assert len({(r.cycles, r.events) for r in results}) == 1  # gate: deterministic
    return min(r.wall_seconds for r in results), results[0]


@pytest.mark.parametrize("case", list(CASES))
def test_eight_chip_moe_engine_time_against_one_chip(benchmark, bench_summary, shared_traces, rounds, case):
    trace = str(shared_traces / "expert_routing" / "qwen_b64" / "032_012.npz")

    def program_of(knobs):
        w = workload_from_config({"workload": "moe", "model": "qwen3-30b-a3b", "trace": trace, **knobs})
        return lower(w.graph, Hardware.preset(w.hardware), channel_depth=w.channel_depth)

    program = program_of(CASES[case])
    n = rounds(5)
    results = []
    benchmark.pedantic(lambda: results.append(_engine_seconds(program, n)), rounds=1, iterations=1)
    seconds, result = results[0]
    base = BASELINES[case]
    ratio = None
    if base is not None:
        base_knobs = {"regions": 8} if "regions" in case else {}
        base_seconds, base_result = _engine_seconds(program_of(base_knobs), n)
        ratio = seconds / base_seconds
        benchmark.extra_info.update(baseline_engine_s=base_seconds, baseline_cycles=base_result.cycles,
                                    baseline_events=base_result.events)
    benchmark.extra_info.update(engine_s=seconds, cycles=result.cycles, events=result.events, ratio=ratio)
    bench_summary("multi-chip MoE engine time (target: 8 chips within 10x of 1 chip)",
                  f"{case:20s} engine {seconds:7.3f} s  {result.cycles:>11,} cycles {result.events:>9,} events"
                  + (f"  | {ratio:5.2f}x the one-chip layer ({base_seconds:.3f} s, {base_result.events:,} events)"
                     if ratio is not None else ""))
