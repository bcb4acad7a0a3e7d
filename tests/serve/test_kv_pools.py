"""KV pools by attention kind (issue 43): MLA's latent, full and sliding-window layers each their own pool, as
vLLM's hybrid KV cache manager keeps them, so a gpt-oss model's capacity and preemption follow its full layers."""

from __future__ import annotations

import pytest

import stepsim
from stepsim.base.errors import ConfigError
from stepsim.models.presets import resolve_model
from stepsim.serve.api import model_capacity
from stepsim.serve.kv_cache import kv_capacity, pooled_capacity, window_blocks
from stepsim.serve.memory import KVPool, kv_pools, model_memory
from stepsim.serve.system import system_kv_pools

SN40L_HBM = 64 * 2**30


def test_pools_by_attention_kind():
    # DeepSeek-V3: one latent pool, 61 x (512 + 64) x 2 bytes
    assert kv_pools(resolve_model("deepseek-v3")) == (KVPool("mla", 61, 70_272),)
    assert model_memory(resolve_model("deepseek-v3")).kv_bytes_per_token == 70_272
    # gpt-oss: 2 x 8 KV heads x 64 x 2 bytes = 2,048 per layer, half the layers slide over 128 tokens
    assert kv_pools(resolve_model("gpt-oss-20b")) == (KVPool("full", 12, 24_576), KVPool("sliding", 12, 24_576, 128))
    assert kv_pools(resolve_model("gpt-oss-120b")) == (KVPool("full", 18, 36_864),
                                                       KVPool("sliding", 18, 36_864, 128))
    assert kv_pools(resolve_model("qwen3-30b-a3b")) == (KVPool("full", 48, 48 * 2 * 4 * 128 * 2),)
    # on chips: KV heads shard (gpt-oss-120b's 8 over 8 chips: the same bytes), the latent is on every chip
    assert system_kv_pools(resolve_model("gpt-oss-120b"), 8) == kv_pools(resolve_model("gpt-oss-120b"))
    assert system_kv_pools(resolve_model("gpt-oss-120b"), 16)[0].bytes_per_token == 2 * 36_864  # heads replicated
    assert system_kv_pools(resolve_model("deepseek-v3"), 16) == (KVPool("mla", 61, 16 * 70_272),)


def test_sliding_layers_hold_their_window_and_the_blocks_count_the_full_layers():
    """gpt-oss-20b on one sn40l with vLLM's 128 sequences: the sliding pool holds 9 blocks of 16 tokens per
    sequence (127 tokens of window and the block being written), the rest of HBM is full-layer blocks."""
    model = resolve_model("gpt-oss-20b")
    memory = model_memory(model)
    assert window_blocks(128, 16) == 9 and window_blocks(129, 16) == 9 and window_blocks(130, 16) == 10
    capacity = model_capacity(model, memory, SN40L_HBM, 16, 128)
    sliding = 128 * 9 * 16 * 24_576
    assert capacity.sliding_pool_bytes == sliding == 452_984_832
    assert capacity.kv_bytes_per_token == 24_576
    assert capacity.num_blocks == (SN40L_HBM - memory.weight_bytes - sliding) // (16 * 24_576) == 67_232
    # every layer counted as full would hold about half the tokens
    assert kv_capacity(SN40L_HBM, memory.weight_bytes, memory.kv_bytes_per_token).num_blocks == 34_192
    # a model without sliding layers keeps its one pool
    qwen = resolve_model("qwen3-30b-a3b")
    q_memory = model_memory(qwen)
    assert model_capacity(qwen, q_memory, SN40L_HBM, 16, 128) == kv_capacity(SN40L_HBM, q_memory.weight_bytes,
                                                                              q_memory.kv_bytes_per_token)


def test_pool_errors_are_one_line():
    with pytest.raises(ConfigError, match=r"^every layer of the model slides: serving counts the blocks of its "
                                          r"full-attention layers, and it has none \(issue 43\)$"):
        pooled_capacity(SN40L_HBM, 0, [KVPool("sliding", 4, 8192, 4096)])
    with pytest.raises(ConfigError, match=r"^the sliding-window layers' KV pool \(0.45 GB: 128 sequences at their "
                                          r"window\) does not fit beside the weights \(41.83 GB\) in HBM \(42.00 GB\): "
                                          r"0.28 GB short; lower --max-seqs$"):
        memory = model_memory(resolve_model("gpt-oss-20b"))
        pooled_capacity(42_000_000_000, memory.weight_bytes, kv_pools(resolve_model("gpt-oss-20b")), 16, 128)


def test_serving_gpt_oss_at_a_constant_step_time(tmp_path):
    """The executors do not model sliding windows and sinks yet (--fidelity refuses); a constant step time needs
    only the KV accounting. Two requests of 1,500 + 300 tokens need 2 x 113 full-layer blocks at the end: 250
    blocks beside the sliding pool of 2 sequences hold them (no preemption), 220 do not (one). Counting every
    layer as full, the 250 blocks' bytes would hold 134 blocks of twice the size."""
    trace = tmp_path / "requests.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,1500,300\n"
                     "2023-11-16 18:15:46.6905900,1500,300\n")
    weights = model_memory(resolve_model("gpt-oss-20b")).weight_bytes
    sliding = 2 * 9 * 16 * 24_576
    seen = []
    for blocks in (251, 221):
        summary = stepsim.serve("gpt-oss-20b", trace, iteration_latency=0.01, max_seqs=2,
                                hbm_bytes=weights + sliding + blocks * 16 * 24_576).summary
        kv = summary["kv_cache"]
        seen.append((summary["completed"], summary["preemptions"], kv["num_blocks"], kv["max_blocks_used"],
                     kv["kv_bytes_per_token"], kv["sliding_pool_bytes"]))
    assert seen == [(2, 0, 251, 226, 24_576, 7_077_888), (2, 1, 221, 220, 24_576, 7_077_888)]
    assert (sliding + 251 * 16 * 24_576) // (16 * 49_152) == 134
