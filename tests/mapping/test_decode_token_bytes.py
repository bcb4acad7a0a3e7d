"""The bytes one decode token must read (``stepsim.mapping.roofline.decode_token_bytes``) of heterogeneous models:
each layer's own attention (MLA's low-rank projections) and FFN (dense, or top-k experts + shared experts + router),
not every expert; one-kind models as before (docs/validation.md's rooflines)."""

from __future__ import annotations

from stepsim.mapping.roofline import decode_token_bytes
from stepsim.models.presets import resolve_model


def test_deepseek_v3_reads_its_attention_its_top_8_experts_shared_expert_router_and_lm_head():
    m = resolve_model("deepseek-r1")  # DeepSeek-V3's shape
    d, heads = 7168, 128
    # MLA: q_a (d x 1536) + its norm, q_b (1536 x 128 x (128 + 64)), kv_a (d x (512 + 64)) + the latent's norm,
    # kv_b (512 x 128 x (128 + 128)), o (128 x 128 x d)
    mla = d * 1536 + 1536 + 1536 * heads * 192 + d * 576 + 512 + 512 * heads * 256 + heads * 128 * d
    assert mla == 187_107_328
    dense = 3 * d * 18432  # the 3 dense first layers' SwiGLU
    moe = 8 * 3 * d * 2048 + 3 * d * 2048 + d * 256 + 256  # top-8 experts, the shared expert, the router and its bias
    elements = 61 * mla + 3 * dense + 58 * moe + 129_280 * d + d  # + the LM head and the token's embedding row
    assert decode_token_bytes(m, 129_280) == 2 * elements == 73_249_487_872
    # 36.6 B weights a token, DeepSeek's published "37 B activated"; every expert would be 1.34 TB
    assert round(elements / 1e9, 1) == 36.6


def test_gpt_oss_counts_its_experts_biases_and_sinks():
    m = resolve_model("gpt-oss-20b")
    d, f, heads, kv, hd = 2880, 2880, 64, 8, 64
    attention = 2 * d * heads * hd + 2 * d * kv * hd + heads * hd + 2 * kv * hd + d + heads  # biases and sinks
    moe = 4 * (3 * d * f + 2 * f + d) + d * 32 + 32  # top-4 of 32 experts with their biases; router with its bias
    assert decode_token_bytes(m, 201_088) == 2 * (24 * (attention + moe) + 201_088 * d + d) == 7_216_338_048


def test_llama_4_maverick_alternates_dense_and_moe_layers():
    m = resolve_model("llama-4-maverick")
    d = 5120
    attention = 2 * d * 40 * 128 + 2 * d * 8 * 128
    dense, moe = 3 * d * 16384, 3 * d * 8192 + d * 128 + 3 * d * 8192  # MoE: top-1 expert, the router, shared expert
    assert decode_token_bytes(m, 202_048) == 2 * (48 * attention + 24 * dense + 24 * moe + 202_048 * d + d)


def test_one_kind_models_are_unchanged():
    # the numbers of tests/mapping/test_serving_bounds.py and docs/validation.md, every layer the same
    assert decode_token_bytes(resolve_model("llama-3.1-8b"), 128_256) == 15_009_325_056
    assert decode_token_bytes(resolve_model("qwen3-30b-a3b"), 151_936) == 6_083_317_760
