"""The cost of timeline recording (issue 14): with recording on at most 3x the engine time of recording off.

Recording off is numba's ``tl=None`` specialization, in which every recording branch is pruned at compile time,
so it runs the same machine code as before recording existed; its cost against the engine before this change
is measured by an A/B run of the chain benchmark on the two commits (numbers in bench/README.md).

Here: the chain graph of ``test_bench_engine.py`` (depth 2, 1 M firings: every firing records a busy interval
and two FIFO changes, the worst case) and the Qwen3-30B-A3B B=64 static-32 MoE layer on its bundled trace (a
memory-bound layer: few records per engine event), each off and on in the same process, alternating, best of
``rounds``. Results with and without recording must agree exactly (asserted).
"""

from __future__ import annotations

import pytest
from test_bench_engine import chain_program

from stepsim.base.hardware import Hardware
from stepsim.graph.lower import lower
from stepsim.kernels import api
from stepsim.workloads.config import workload_from_config


def _qwen_program():
    w = workload_from_config({"workload": "moe", "model": "qwen", "tile_n": 32})
    return lower(w.graph, Hardware.preset(w.hardware), channel_depth=w.channel_depth)


@pytest.mark.parametrize("case", ["chain", "qwen-static32"])
def test_timeline_recording_cost(benchmark, rounds, bench_summary, case):
    program = chain_program(2, n_elements=1_000) if case == "chain" else _qwen_program()
    api.run(program, timeline=10)  # compile / load both specializations outside the timing
    off, on = [], []

    def run_both():
        off.append(api.run(program))
        on.append(api.run(program, timeline=10_000_000))

    benchmark.pedantic(run_both, rounds=rounds(5), iterations=1, warmup_rounds=1)
    a, b = off[0], on[0]
    assert (a.cycles, a.events, a.fires, a.bytes_read) == (b.cycles, b.events, b.fires, b.bytes_read)
    assert (a.unit_counters == b.unit_counters).all() and (a.channel_counters == b.channel_counters).all()
    t_off = min(r.wall_seconds for r in off)
    t_on = min(r.wall_seconds for r in on)
    records = int(b.timeline[0])
    benchmark.extra_info.update(off_s=t_off, on_s=t_on, ratio=t_on / t_off, records=records)
    bench_summary("timeline recording", f"{case}: {a.fires:,} firings, {records:,} records: off {t_off:.3f} s, "
                                        f"on {t_on:.3f} s: {t_on / t_off:.2f}x")
    assert t_on <= 3 * t_off, f"recording on costs {t_on / t_off:.2f}x the engine time (target <= 3x)"
