"""Wall time of the paper's B=64 layers on the real traces: MoE (Mixtral-8x7B, Qwen3-30B-A3B) and attention.

MoE: static tiling with 16 and 64 tokens per tile, and dynamic tiling, on the first ``b64`` routing file of
each model in ``../shared/traces/expert_routing``. Attention: the coarse, interleave and dynamic strategies on
the first ``kv_lengths/b64`` window. Each case builds the workload once (``build_s``, reported, not part of the
benchmark) and then times :func:`stepsim.simulation.simulate.simulate` warm (kernels compiled before anything is timed).
:class:`~stepsim.simulation.simulate.SimResult` splits a call into lowering (``lower_s``: graph to engine program) and the
engine run (``sim_wall_s``); both are recorded in ``benchmark.extra_info`` (fastest round) and summarised at the
end. The target is a warm B=64 MoE configuration in under 5 s; nothing here asserts on time.
"""

from __future__ import annotations

import time

import pytest

from stepsim.models.presets import moe_model
from stepsim.simulation.simulate import simulate
from stepsim.trace_io.load import load_kv_lengths, load_routing

#: model preset -> its routing-trace folder under expert_routing/
MOE_TRACES = {"mixtral-8x7b": "mixtral_b64", "qwen3-30b-a3b": "qwen_b64"}
#: (tiling, tile_n) of the MoE experiments
MOE_CONFIGS = [("static", 16), ("static", 64), ("dynamic", None)]
ATTENTION_STRATEGIES = ["coarse", "interleave", "dynamic"]


@pytest.fixture(scope="module", autouse=True)
def compiled():
    """Compile / load the kernels before anything is timed (the targets are for warm runs)."""
    from stepsim.kernels import run
    from stepsim.kernels.warm import warm_program

    run(warm_program())


def _first(folder, pattern: str):
    files = sorted(folder.glob(pattern))
    if not files:
        pytest.skip(f"no {pattern} file in {folder}")
    return files[0]


def _time_simulate(benchmark, workload, n_rounds: int):
    """Benchmark warm ``simulate(workload)``; returns the SimResults and the wall time of each call."""
    results, walls = [], []

    def once():
        t0 = time.perf_counter()
        results.append(simulate(workload))
        walls.append(time.perf_counter() - t0)

    benchmark.pedantic(once, rounds=n_rounds, iterations=1, warmup_rounds=0)
    # the simulation is deterministic: every round must report the same cycles and events
    assert len({(r.cycles, r.events, r.fires) for r in results}) == 1
    return results, walls


def _record(benchmark, bench_summary, section, label, build_s, results, walls, **extra):
    best = min(range(len(walls)), key=walls.__getitem__)
    r = results[best]
    benchmark.extra_info.update(extra, build_s=build_s, simulate_s=walls[best], lower_s=r.lower_s,
                                sim_wall_s=r.sim_wall_s, compile_s=r.compile_s, warm_total_s=build_s + walls[best],
                                cycles=r.cycles, events=r.events, fires=r.fires,
                                off_chip_bytes_read=r.off_chip_bytes_read)
    line = (f"{label:34s} build {build_s:6.3f} s  lower {r.lower_s:6.3f} s  engine {r.sim_wall_s:6.3f} s  "
            f"build+simulate {build_s + walls[best]:6.3f} s  |  {r.cycles:>10,} cycles  {r.events:>7,} events")
    bench_summary(section, line)
    print("\n" + line)


@pytest.mark.traces
@pytest.mark.parametrize(("tiling", "tile_n"), MOE_CONFIGS, ids=["static16", "static64", "dynamic"])
@pytest.mark.parametrize("model_name", sorted(MOE_TRACES))
def test_moe_b64_wall_time(benchmark, rounds, bench_summary, shared_traces, model_name, tiling, tile_n):
    """Warm simulate() of one B=64 MoE layer; lowering and engine time reported separately."""
    from stepsim.workloads.moe.build import build_moe

    trace = _first(shared_traces / "expert_routing" / MOE_TRACES[model_name], "*.npz")
    model = moe_model(model_name)
    routing = load_routing(trace, model.experts)
    assert routing.shape[0] == 64
    t0 = time.perf_counter()
    workload = build_moe(model, routing, tiling=tiling, tile_n=tile_n)
    build_s = time.perf_counter() - t0
    results, walls = _time_simulate(benchmark, workload, rounds(3))
    label = f"{model_name} {tiling}{tile_n or ''}"
    _record(benchmark, bench_summary, "B=64 MoE, warm (target: each configuration < 5 s)", label, build_s,
            results, walls, model=model_name, tiling=tiling, tile_n=tile_n, trace=trace.name)


@pytest.mark.traces
@pytest.mark.parametrize("strategy", ATTENTION_STRATEGIES)
def test_attention_b64_wall_time(benchmark, rounds, bench_summary, shared_traces, strategy):
    """Warm simulate() of the B=64 decode attention."""
    from stepsim.workloads.attention.build import build_attention

    trace = _first(shared_traces / "kv_lengths" / "b64", "*.npy")
    kv_lengths = load_kv_lengths(trace, None)
    assert len(kv_lengths) == 64
    t0 = time.perf_counter()
    workload = build_attention(kv_lengths, strategy)
    build_s = time.perf_counter() - t0
    results, walls = _time_simulate(benchmark, workload, rounds(3))
    _record(benchmark, bench_summary, "B=64 attention, warm", f"attention {strategy}", build_s, results, walls,
            strategy=strategy, trace=trace.name)
