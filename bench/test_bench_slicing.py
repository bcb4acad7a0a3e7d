"""The cost of running the engine in slices (Ctrl-C and progress between slices; issue 12): target < 3 %.

The same long program (Mixtral-8x7B B=1024, static tile 16, synthetic routing; its HBM served tick by tick so
the run takes seconds) runs in one engine call and in the default slices, in the same process, alternating, best
of ``rounds``. Both runs must agree exactly (asserted); the ratio of the best times is the overhead.
"""

from __future__ import annotations

from test_bench_hbm_scaling import synthetic_routing

from stepsim.graph.lower import lower
from stepsim.hardware import Hardware
from stepsim.kernels import api
from stepsim.workloads.models import moe_model
from stepsim.workloads.moe import build_moe


def test_slicing_overhead(benchmark, rounds, bench_summary, monkeypatch):
    from stepsim.kernels.warm import warm_program

    api.run(warm_program())
    w = build_moe(moe_model("mixtral-8x7b"), synthetic_routing(1024, 8, 2, seed=1024), tiling="static", tile_n=16)
    program = lower(w.graph, Hardware.preset(w.hardware), channel_depth=w.channel_depth)
    sliced, whole = [], []
    calls = []

    def run_both():
        slices = []
        sliced.append(api.run(program, hbm_closed_form=False, progress=lambda e, c: slices.append(e)))
        calls.append(len(slices) + 1)
        with monkeypatch.context() as m:
            m.setattr(api, "FIRST_SLICE_EVENTS", 1 << 62)
            whole.append(api.run(program, hbm_closed_form=False))

    benchmark.pedantic(run_both, rounds=rounds(5), iterations=1, warmup_rounds=0)
    a, b = sliced[0], whole[0]
    assert (a.cycles, a.events, a.fires, a.hbm_requests) == (b.cycles, b.events, b.fires, b.hbm_requests)
    assert (a.unit_counters == b.unit_counters).all() and (a.channel_counters == b.channel_counters).all()
    t_sliced = min(r.wall_seconds for r in sliced)
    t_whole = min(r.wall_seconds for r in whole)
    overhead = t_sliced / t_whole - 1
    benchmark.extra_info.update(sliced_s=t_sliced, whole_s=t_whole, overhead=overhead, slices=calls[0])
    bench_summary("engine slicing overhead", f"one call {t_whole:.3f} s, {calls[0]} slices {t_sliced:.3f} s: "
                                             f"overhead {100 * overhead:+.2f} % ({a.events:,} events)")
