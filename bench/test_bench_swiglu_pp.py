"""Pipeline parallelism of a SwiGLU stack (issue 34, ``--pp``): engine time of 8 layers on 2 and 4 chips against
the same 8-layer stack on one chip.

D = 256, F = 512, B = 64 in 4 micro-batches of 16 rows (the defaults), step-hdl chips, fully connected with the
default links (64 bytes/cycle, 500 cycles). Each program is lowered once and run warm; the engine times (the
fastest of the rounds) are compared in the same run (a ratio, read off the summary, not asserted: the pipeline's
graph is the one-chip stack's plus one Link per stage boundary). Gates (asserted): the cycles (pinned here; stages
of 4 and 2 layers, so not the one-layer-per-stage closed form of tests/workloads/test_swiglu_pipeline.py) and the
same cycles and events every round.
"""

from __future__ import annotations

import pytest

from stepsim.base.hardware import Hardware
from stepsim.graph.lower import lower
from stepsim.kernels import api
from stepsim.workloads.swiglu.build import build_swiglu

#: knobs and cycles
CASES = {"1 chip": ({}, 205359), "--pp 2": ({"pp": 2}, 166081), "--pp 4": ({"pp": 4}, 113045)}


@pytest.fixture(scope="module", autouse=True)
def compiled():
    from stepsim.kernels.warm import warm_program

    api.run(warm_program())


def _engine_seconds(program, n: int):
    results = [api.run(program) for _ in range(n)]
    assert len({(r.cycles, r.events) for r in results}) == 1  # gate: deterministic
    return min(r.wall_seconds for r in results), results[0]


def _program(knobs):
    w = build_swiglu(layers=8, **knobs)
    return lower(w.graph, Hardware.preset(w.hardware), channel_depth=w.channel_depth)


@pytest.mark.parametrize("case", list(CASES))
def test_pipeline_engine_time_against_one_chip(benchmark, bench_summary, rounds, case):
    knobs, cycles = CASES[case]
    program = _program(knobs)
    n = rounds(5)
    results = []
    benchmark.pedantic(lambda: results.append(_engine_seconds(program, n)), rounds=1, iterations=1)
    seconds, result = results[0]
    assert result.cycles == cycles  # gate
    ratio = base_seconds = None
    if knobs:
        base_seconds, base = _engine_seconds(_program({}), n)
        ratio = seconds / base_seconds
        benchmark.extra_info.update(baseline_engine_s=base_seconds, baseline_events=base.events)
    benchmark.extra_info.update(engine_s=seconds, cycles=result.cycles, events=result.events, ratio=ratio)
    bench_summary("swiglu --layers 8 --pp engine time (against the one-chip stack)",
                  f"{case:8s} engine {seconds:7.3f} s  {result.cycles:>9,} cycles {result.events:>10,} events"
                  + (f"  | {ratio:5.2f}x the one-chip stack ({base_seconds:.3f} s)" if ratio is not None else ""))
