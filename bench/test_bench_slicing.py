"""The cost of running the engine in slices (Ctrl-C and progress between slices; issue 12): target < 3 %.

The engine chain graph of ``test_bench_engine.py`` (source -> 1000 Maps -> sink, depth 2) with 10,000 elements
(10 M firings, about a second) runs in one engine call and in the default slices, in the same process,
alternating, best of ``rounds``. Both runs must agree exactly (asserted); the ratio of the best times is the
overhead. Slices grow until one takes about ``SLICE_SECONDS``, so the per-call cost (tens of microseconds)
is paid a few times per second.
"""

from __future__ import annotations

from test_bench_engine import chain_program

from stepsim.kernels import api


def test_slicing_overhead(benchmark, rounds, bench_summary, monkeypatch):
    from stepsim.kernels.warm import warm_program

    api.run(warm_program())
    program = chain_program(2, n_elements=10_000)
    sliced, whole = [], []
    calls = []

    def run_both():
        slices = []
        sliced.append(api.run(program, progress=lambda e, c: slices.append(e)))
        calls.append(len(slices) + 1)
        with monkeypatch.context() as m:
            m.setattr(api, "FIRST_SLICE_EVENTS", 1 << 62)
            whole.append(api.run(program))

    benchmark.pedantic(run_both, rounds=rounds(5), iterations=1, warmup_rounds=1)
    a, b = sliced[0], whole[0]
    assert (a.cycles, a.events, a.fires) == (b.cycles, b.events, b.fires)
    assert (a.unit_counters == b.unit_counters).all() and (a.channel_counters == b.channel_counters).all()
    t_sliced = min(r.wall_seconds for r in sliced)
    t_whole = min(r.wall_seconds for r in whole)
    overhead = t_sliced / t_whole - 1
    benchmark.extra_info.update(sliced_s=t_sliced, whole_s=t_whole, overhead=overhead, slices=calls[0])
    bench_summary("engine slicing overhead", f"chain depth 2, {a.fires:,} firings: one call {t_whole:.3f} s, "
                                             f"{calls[0]} slices {t_sliced:.3f} s: overhead {100 * overhead:+.2f} %")
