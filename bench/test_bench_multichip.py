"""Scaling to many chips (issue 34): engine time of an 8- and a 16-chip Qwen3 MoE layer against the one-chip layer's.

Qwen3-30B-A3B on the shared B=64 trace (``expert_routing/qwen_b64/032_012.npz``, static tiling, tile_n 32):
the one-chip layer, and the expert-parallel layer on 8 fully connected chips (``--ep 8``: the batch sharded, all-to-all
dispatch and combine over 56 link units, 8 HBMs) with one region per expert and with one time-multiplexed region
per chip (``--regions 8``), load-balanced placement. Each program is lowered once and run warm; the engine times
(``EngineResult.wall_seconds``, the fastest of the rounds) are compared in the same run: the target is the 8-chip
layer within 10x of the one-chip layer's (read off the summary, not asserted); the regions case is compared both
with the plain one-chip layer and with the one-chip layer on the same 8 regions. Gates (asserted): every round
gives the same cycles and events, those of branch int (before the event loop reused its scans), and a run that
rescans at every decision (``reuse_scans=False``) gives them too.
"""

from __future__ import annotations

import pytest

from stepsim.base.hardware import Hardware
from stepsim.graph.lower import lower
from stepsim.kernels import api
from stepsim.workloads.config import workload_from_config

CASES = {"1 chip": {}, "8 chips": {"ep": 8, "placement": "load-balanced"},
         "8 chips, regions 8": {"ep": 8, "placement": "load-balanced", "regions": 8},
         "16 chips": {"ep": 16, "placement": "load-balanced"},
         "16 chips, regions 16": {"ep": 16, "placement": "load-balanced", "regions": 16}}
#: every case's baselines, measured in the same run: the plain one-chip layer, and for the regions case also the
#: one-chip layer with the same time-multiplexed regions
BASELINES = {"1 chip": [], "8 chips": [("1 chip", {})],
             "8 chips, regions 8": [("1 chip", {}), ("1 chip, regions 8", {"regions": 8})],
             "16 chips": [("1 chip", {})],
             "16 chips, regions 16": [("1 chip", {}), ("1 chip, regions 16", {"regions": 16})]}
#: gate: (cycles, events) of each case, the same as before the event loop reused its scans (branch int); the
#: 8-chip cases re-measured for the tile-first load-balanced placement (branch lbplace), with reuse_scans=False too
#: the 16-chip cases measured 2026-11-29 before the event loop kept each unit's decision time (commit 07418120)
COUNTS = {"1 chip": (616304, 24430), "8 chips": (108899, 56684), "8 chips, regions 8": (798776, 228861),
          "16 chips": (108579, 71055), "16 chips, regions 16": (405406, 249854)}


@pytest.fixture(scope="module", autouse=True)
def compiled():
    from stepsim.kernels.warm import warm_program

    api.run(warm_program())


def _engine_seconds(program, n: int, **kw):
    results = [api.run(program, **kw) for _ in range(n)]
    assert len({(r.cycles, r.events) for r in results}) == 1  # gate: deterministic
    return min(r.wall_seconds for r in results), results[0]


@pytest.mark.parametrize("case", list(CASES))
def test_eight_chip_moe_engine_time_against_one_chip(benchmark, bench_summary, shared_traces, rounds, case):
    """Also measured in the same run: the case with ``reuse_scans=False`` (every decision rescans the Links and
    EagerMerges, as the event loop did before issue 34's engine-speed work), whose counts must be the same."""
    trace = str(shared_traces / "expert_routing" / "qwen_b64" / "032_012.npz")

    def program_of(knobs):
        w = workload_from_config({"workload": "moe", "model": "qwen3-30b-a3b", "trace": trace, **knobs})
        return lower(w.graph, Hardware.preset(w.hardware), channel_depth=w.channel_depth)

    program = program_of(CASES[case])
    n = rounds(5)
    results = []
    benchmark.pedantic(lambda: results.append(_engine_seconds(program, n)), rounds=1, iterations=1)
    seconds, result = results[0]
    assert (result.cycles, result.events) == COUNTS[case]
    rescan_seconds, rescan = _engine_seconds(program, max(1, n // 2), reuse_scans=False)
    assert (rescan.cycles, rescan.events, rescan.hbm_requests) == (result.cycles, result.events,
                                                                   result.hbm_requests)
    info = dict(engine_s=seconds, cycles=result.cycles, events=result.events, scans=result.time_sensitive_scans,
                evaluations=result.time_sensitive_evaluations, rescan_engine_s=rescan_seconds,
                rescan_scans=rescan.time_sensitive_scans, rescan_evaluations=rescan.time_sensitive_evaluations)
    ratios = []
    for name, knobs in BASELINES[case]:
        base_seconds, base_result = _engine_seconds(program_of(knobs), n)
        info[f"ratio to {name}"] = seconds / base_seconds
        info[f"{name} engine_s"] = base_seconds
        info[f"{name} events"] = base_result.events
        ratios.append(f"{seconds / base_seconds:5.2f}x {name} ({base_seconds:.3f} s, {base_result.events:,} events)")
    benchmark.extra_info.update(info)
    bench_summary("multi-chip MoE engine time (target: 8 chips within 10x of 1 chip)",
                  f"{case:20s} engine {seconds:7.3f} s  {result.cycles:>11,} cycles {result.events:>9,} events "
                  f"{result.time_sensitive_scans:>7,} scans {result.time_sensitive_evaluations:>7,} decision times; "
                  f"every decision time at every decision {rescan_seconds:.3f} s ({rescan.time_sensitive_scans:,} "
                  f"scans, {rescan.time_sensitive_evaluations:,} times)" + "".join(f"\n    | {r}" for r in ratios))
