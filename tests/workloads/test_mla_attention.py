"""The MLA decode attention kind (DeepSeek-V3's multi-head latent attention, absorbed): the graph's output equals
DeepSeek's absorbed formula and the expanded one on scaled-down dims, and a decode reads exactly the latent cache
(the symbolic bytes are the engine's)."""

from __future__ import annotations

import numpy as np
import pytest

from stepsim.base.errors import ArgumentError, ConfigError
from stepsim.simulation.simulate import simulate
from stepsim.workloads.config import workload_from_config
from stepsim.workloads.mla_attention.build import build_mla_attention, mla_flops
from stepsim.workloads.mla_attention.reference import mla_absorbed, mla_expanded, wkv_b
from stepsim.workloads.reference import check_outputs, make_inputs

LENGTHS = [5, 40, 17]
DIMS = dict(heads=4, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, tile_n=16)


def test_absorbed_graph_equals_deepseeks_absorbed_and_expanded_forms():
    w = build_mla_attention(LENGTHS, **DIMS)
    r = simulate(w, functional=True, inputs=make_inputs(w, seed=3))
    checks = check_outputs(w, r.inputs, r.outputs)
    assert checks["out"].passed and checks["out"].error < 0.004
    x = {k: np.asarray(v, np.float64) for k, v in r.inputs.items()}
    h, dn, dv, r_, max_n = 4, 16, 16, 32, w.params["max_n"]
    w_kv_b = wkv_b(x["w_uk"].reshape(h, dn, r_), x["w_uv"].reshape(h, dv, r_))
    assert w_kv_b.shape == (h * (dn + dv), r_)
    out = np.asarray(r.outputs["out"], np.float64)
    for b, length in enumerate(LENGTHS):
        rows, cache = slice(b * h, (b + 1) * h), slice(b * max_n, b * max_n + length + 1)
        args = (x["q_nope"][rows], x["q_pe"][rows], x["kv_cache"][cache], x["pe_cache"][cache], w_kv_b, dv)
        absorbed, expanded = mla_absorbed(*args), mla_expanded(*args)
        assert np.abs(absorbed - expanded).max() < 1e-12 * np.abs(expanded).max()  # associativity only
        assert np.abs(out[rows] - expanded).max() < 0.01 * np.abs(expanded).max()  # bf16 output, fp32 compute
        # DeepSeek's YaRN mscale ** 2 on the scale is both query halves scaled by it (how the graph takes it)
        m2 = (0.1 * np.log(40) + 1) ** 2
        scaled = mla_absorbed(args[0] * m2, args[1] * m2, *args[2:])
        assert np.abs(scaled - mla_expanded(*args, softmax_scale=m2 / np.sqrt(24))).max() < 1e-12


def test_a_decode_reads_the_latent_cache_and_the_metrics_are_the_engines():
    w = build_mla_attention(LENGTHS, **DIMS)
    tiles = 1 + 3 + 2  # ceil((L + 1) / 16)
    latent = tiles * 16 * (32 + 8) * 2
    assert (w.params["kv_tiles"], w.params["latent_cache_bytes"]) == (tiles, latent) == (6, 7680)
    reads = {op.tensor.name: v.off_chip_bytes for op, v in zip(w.graph.ops, w.op_values().values())
             if op.kind.endswith("Load") and v.off_chip_bytes}
    assert reads["kv_cache"] + reads["pe_cache"] == latent
    # queries, both absorbed weights once (on chip after), the latent cache, the masks, the output
    total = 3 * 4 * (16 + 8) * 2 + 2 * 4 * 16 * 32 * 2 + latent + 3 * 16 * 2 + 3 * 4 * 16 * 2
    m = w.metrics()
    flops = mla_flops(tiles, 3, **DIMS)
    assert (m["off_chip_bytes"], m["flops"], m["graph_flops"]) == (total, flops, flops) == (16928, 85584, 85584)
    r = simulate(w)
    assert r.off_chip_bytes == total and r.cycles == 616


def test_deepseek_v3_reads_576_values_per_token_and_layer():
    """The preset's dims through the run config: the bundled 16-request batch reads its latent tiles, each
    32 rows of (512 + 64) bf16 values."""
    w = workload_from_config({"workload": "mla_attention"})
    p = w.params
    assert (p["heads"], p["kv_lora_rank"], p["qk_rope_head_dim"], p["qk_nope_head_dim"], p["v_head_dim"]) == \
        (128, 512, 64, 128, 128)
    tiles = int(((w.trace["kv_lengths"] + 32) // 32).sum())
    assert p["latent_cache_bytes"] == tiles * 32 * 576 * 2 == 494 * 36_864
    reads = {op.tensor.name: v.off_chip_bytes for op, v in zip(w.graph.ops, w.op_values().values())
             if op.kind == "RandomOffChipLoad"}
    assert reads == {"kv_cache": 494 * 32 * 512 * 2, "pe_cache": 494 * 32 * 64 * 2}


def test_bad_shapes_and_models_are_one_line():
    with pytest.raises(ArgumentError, match=r"^kv_lora_rank must be a positive int, got 0$"):
        build_mla_attention([3], kv_lora_rank=0)
    with pytest.raises(ArgumentError, match=r"^max_n must be a multiple of tile_n=16 holding the longest request "
                                            r"\(48 rows\), got 40$"):
        build_mla_attention(LENGTHS, max_n=40, **DIMS)
    with pytest.raises(ConfigError, match=r"^model 'qwen3-30b-a3b' has no multi-head latent attention \(no "
                                          r"'kv_lora_rank' in .*\); the mla_attention workload needs an MLA model "
                                          r"such as deepseek-v3$"):
        workload_from_config({"workload": "mla_attention", "model": "qwen3-30b-a3b"})
