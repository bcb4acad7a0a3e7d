"""KV capacity and preemption of the layer-list models (issue 43): MLA holds ``kv_lora_rank + qk_rope_head_dim``
values per token and layer, Llama 4's chunked layers at most a chunk (their own pool, as vLLM's
ChunkedLocalAttentionManager), so the counted blocks and the preemptions follow the latent and the global layers.
The runs price steps at a constant time: only the KV accounting is under test."""

from __future__ import annotations

from pathlib import Path

import stepsim
from stepsim.models.presets import resolve_model
from stepsim.serve.api import model_capacity
from stepsim.serve.kv_cache import kv_capacity, window_blocks
from stepsim.serve.memory import KVPool, kv_pools, model_memory

DATA = Path(__file__).resolve().parent / "data"
MAVERICK = str(DATA / "llama-4-maverick-2layers.json")
DEEPSEEK = str(DATA / "deepseek-v3-narrow-2layers.json")
SN40L_HBM = 64 * 2**30


def _two_requests(tmp_path) -> Path:
    """Two requests of 1,500 + 300 tokens: 113 blocks of 16 tokens each at the end, 226 together."""
    trace = tmp_path / "requests.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,1500,300\n"
                     "2023-11-16 18:15:46.6905900,1500,300\n")
    return trace


def _runs(model, trace, hbm_of_blocks) -> list:
    seen = []
    for blocks in (251, 221):
        s = stepsim.serve(model, trace, iteration_latency=0.01, max_seqs=2, hbm_bytes=hbm_of_blocks(blocks)).summary
        kv = s["kv_cache"]
        seen.append((s["completed"], s["preemptions"], kv["num_blocks"], kv["max_blocks_used"],
                     kv["kv_bytes_per_token"], kv.get("sliding_pool_bytes", 0)))
    return seen


def test_mla_counts_the_latent_and_preempts_by_it(tmp_path):
    """DeepSeek-V3 (narrow, 2 layers): 2 x (512 + 64) x 2 = 2,304 bytes per token, one pool; its 16 heads of
    128 + 64 keys and 128 values as GQA would hold 2 x 16 x (192 + 128) x 2 = 20,480 a layer."""
    model = resolve_model(DEEPSEEK)
    memory = model_memory(model)
    assert kv_pools(model) == (KVPool("mla", 2, 2304),)
    assert memory.kv_bytes_per_token == 2 * 576 * 2 == 2304
    capacity = model_capacity(model, memory, SN40L_HBM, 16, 128)
    assert capacity == kv_capacity(SN40L_HBM, memory.weight_bytes, 2304)
    assert capacity.num_blocks == (SN40L_HBM - memory.weight_bytes) // (16 * 2304) == 1_843_462
    seen = _runs(DEEPSEEK, _two_requests(tmp_path), lambda blocks: memory.weight_bytes + blocks * 16 * 2304)
    assert seen == [(2, 0, 251, 226, 2304, 0), (2, 1, 221, 220, 2304, 0)]


def test_llama_4_chunked_layers_hold_a_chunk_and_the_global_layers_are_counted(tmp_path):
    """Llama 4 Maverick (2 layers: chunked 8,192 dense, global MoE): each layer 2 x 8 x 128 x 2 = 4,096 bytes per
    token; the chunked pool holds 513 blocks a sequence (8,191 tokens and the block being written), the counted
    blocks are the global layer's."""
    model = resolve_model(MAVERICK)
    memory = model_memory(model)
    assert kv_pools(model) == (KVPool("full", 1, 4096), KVPool("chunked", 1, 4096, 8192))
    assert window_blocks(8192, 16) == 513
    capacity = model_capacity(model, memory, SN40L_HBM, 16, 128)
    chunked = 128 * 513 * 16 * 4096
    assert capacity.sliding_pool_bytes == chunked == 4_303_355_904
    assert (capacity.kv_bytes_per_token, capacity.num_blocks) == (4096, (SN40L_HBM - memory.weight_bytes - chunked)
                                                                  // (16 * 4096)) == (4096, 386_261)
    assert memory.kv_bytes(20_000) == 4096 * 20_000 + 4096 * 8192
    pool = 2 * 513 * 16 * 4096
    seen = _runs(MAVERICK, _two_requests(tmp_path), lambda blocks: memory.weight_bytes + pool + blocks * 16 * 4096)
    assert seen == [(2, 0, 251, 226, 4096, 67_239_936), (2, 1, 221, 220, 4096, 67_239_936)]
