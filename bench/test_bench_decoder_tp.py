"""Tensor parallelism of the decoder layer (issue 34): engine time of Qwen3-30B-A3B's decoder layer on 2 and 4 chips
(``--tp``, two all-reduces over the links) against the one-chip layer's.

Every KV head of Qwen3-30B-A3B on the shared B=64 traces (``expert_routing/qwen_b64/032_012.npz``,
``kv_lengths/b64/conv_stdev0477_0271_0334.npy``, static tiling), fully connected chips with the default links.
Each program is lowered once and run warm; the engine times (``EngineResult.wall_seconds``, the fastest of the
rounds) are compared in the same run (a ratio, read off the summary, not asserted: the N-chip layer has N copies
of the FFN's expert graph). Gates (asserted): the cycles pinned in tests/workloads/test_decoder_tensor_parallel.py,
the same cycles and events every round.
"""

from __future__ import annotations

import pytest

from stepsim.base.hardware import Hardware
from stepsim.graph.lower import lower
from stepsim.kernels import api
from stepsim.workloads.config import workload_from_config

#: knobs and the cycles pinned in tests/workloads/test_decoder_tensor_parallel.py
CASES = {"1 chip": ({}, 773297), "--tp 2": ({"tp": 2}, 408773), "--tp 4": ({"tp": 4}, 252287),
         "--tp 4 direct": ({"tp": 4, "algorithm": "direct"}, 248450)}


@pytest.fixture(scope="module", autouse=True)
def compiled():
    from stepsim.kernels.warm import warm_program

    api.run(warm_program())


def _engine_seconds(program, n: int):
    results = [api.run(program) for _ in range(n)]
    assert len({(r.cycles, r.events) for r in results}) == 1  # gate: deterministic
    return min(r.wall_seconds for r in results), results[0]


@pytest.mark.parametrize("case", list(CASES))
def test_tensor_parallel_decoder_engine_time_against_one_chip(benchmark, bench_summary, shared_traces, rounds,
                                                              case):
    traces = {"routing": str(shared_traces / "expert_routing" / "qwen_b64" / "032_012.npz"),
              "kv_lengths": str(shared_traces / "kv_lengths" / "b64" / "conv_stdev0477_0271_0334.npy")}

    def program_of(knobs):
        w = workload_from_config({"workload": "decoder", "model": "qwen3-30b-a3b", **traces, **knobs})
        return lower(w.graph, Hardware.preset(w.hardware), channel_depth=w.channel_depth)

    knobs, cycles = CASES[case]
    program = program_of(knobs)
    n = rounds(5)
    results = []
    benchmark.pedantic(lambda: results.append(_engine_seconds(program, n)), rounds=1, iterations=1)
    seconds, result = results[0]
    assert result.cycles == cycles  # gate
    ratio = base_seconds = None
    if knobs:
        base_seconds, base = _engine_seconds(program_of({}), n)
        ratio = seconds / base_seconds
        benchmark.extra_info.update(baseline_engine_s=base_seconds, baseline_events=base.events)
    benchmark.extra_info.update(engine_s=seconds, cycles=result.cycles, events=result.events, ratio=ratio)
    bench_summary("decoder --tp engine time (against the one-chip layer)",
                  f"{case:14s} engine {seconds:7.3f} s  {result.cycles:>9,} cycles {result.events:>10,} events"
                  + (f"  | {ratio:5.2f}x the one-chip layer ({base_seconds:.3f} s)" if ratio is not None else ""))
