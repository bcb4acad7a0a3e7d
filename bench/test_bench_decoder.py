"""The decoder layer on the shared B=64 traces (issue 16): cycles, traffic and simulation time of
``stepsim run decoder --model qwen --routing ... --kv-lengths ...`` with every KV head and with one, beside its two
stages run alone (the MoE block as the ``moe`` workload, one head's attention as the ``attention`` workload with
the model's head dims). Asserted (deterministic): the layer takes at least as long as each stage alone and its
measured off-chip bytes equal the symbolic metric.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from stepsim.models.presets import resolve_model
from stepsim.simulation.simulate import simulate
from stepsim.workloads.attention.build import build_attention
from stepsim.workloads.decoder.build import build_decoder
from stepsim.workloads.moe.build import build_moe


@pytest.mark.parametrize("kv_heads", [None, 1], ids=["all-heads", "one-head"])
def test_decoder_b64(benchmark, rounds, bench_summary, shared_traces, kv_heads):
    kv = np.load(shared_traces / "kv_lengths" / "b64" / "conv_stdev0477_0271_0334.npy")
    routing = np.load(shared_traces / "expert_routing" / "qwen_b64" / "032_012.npz")["data"]
    qwen = resolve_model("qwen")
    runs = []

    def build_and_run():
        t0 = time.perf_counter()
        w = build_decoder(qwen, kv, routing, kv_heads=kv_heads)
        built = time.perf_counter() - t0
        runs.append((w, simulate(w), built))

    benchmark.pedantic(build_and_run, rounds=rounds(3), iterations=1, warmup_rounds=1)
    w, sim, _ = runs[-1]
    engine = min(r.sim_wall_s for _, r, _ in runs)
    build = min(b for _, _, b in runs)
    moe = simulate(build_moe(qwen.moe, routing))
    attention = simulate(build_attention(kv, "dynamic", head_dim=qwen.head_dim,
                                         query_per_kv_head=qwen.heads // qwen.kv_heads))
    assert sim.cycles >= max(moe.cycles, attention.cycles)
    assert sim.off_chip_bytes == w.metrics()["off_chip_bytes"]
    heads = w.params["kv_heads"]
    benchmark.extra_info.update(cycles=sim.cycles, engine_s=engine, build_s=build, moe_cycles=moe.cycles,
                                attention_cycles=attention.cycles)
    bench_summary("decoder layer (Qwen3-30B-A3B, shared B=64 traces)",
                  f"{heads} KV head(s): {sim.cycles:,} cycles, {sim.off_chip_bytes / 1e6:,.1f} MB off-chip; build "
                  f"{build:.2f} s, engine {engine:.3f} s; alone: MoE {moe.cycles:,}, one head's attention "
                  f"{attention.cycles:,} cycles")
