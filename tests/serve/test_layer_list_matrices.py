"""A heterogeneous model on mapped layers (serve's default on sn40l) prices its own weight matrices on the engine
(stepsim/serve/projections.py ``provider_projections``): an MLA layer group multiplies by q_a / kv_a, q_b, kv_b and o
(stepsim/models/layers.py ``mla_matrices``), not by the q/k/v and o of the multi-query attention its engine
model is; and the LM head is read by the first layer group only. Until 2026-11-26 every group priced the engine
model's matrices (an MLA layer of the narrow DeepSeek-V3 read 80.2 MB instead of 20.2 MB) and its own LM head."""

from __future__ import annotations

from pathlib import Path

from stepsim.models.layers import attention_parameters, mla_matrices
from stepsim.models.presets import resolve_model
from stepsim.serve.api import engine_provider, resolve_serving_hardware
from stepsim.serve.latency import IterationBatch
from stepsim.serve.layer_list import exact_layer_list, group_gate, group_seed

DATA = Path(__file__).resolve().parent / "data"
NARROW = str(DATA / "deepseek-v3-narrow-2layers.json")
OSS = str(DATA / "gpt-oss-20b-2layers.json")


def test_mla_matrices_are_the_layers_weights_and_split_their_heads():
    ds = resolve_model("deepseek-v3")  # d 7168, 128 heads, q rank 1536, kv rank 512, nope 128, rope 64, v 128
    assert mla_matrices(ds) == [("qkv_a", 7168, 1536 + 512 + 64), ("q_b", 1536, 128 * 192), ("kv_b", 512, 128 * 256),
                                ("o", 128 * 128, 7168)]
    # every weight of the attention but the two latents' norms (q rank + kv rank elements)
    assert sum(a * b for _, a, b in mla_matrices(ds)) == attention_parameters(ds) - 1536 - 512
    # tensor parallelism over 16 chips: the down-projections on every chip, the heads split
    assert mla_matrices(ds, 16) == [("qkv_a", 7168, 2112), ("q_b", 1536, 8 * 192), ("kv_b", 512, 8 * 256),
                                    ("o", 8 * 128, 7168)]
    # no query rank (DeepSeek-V2-Lite): the full q fused with kv_a
    lite = resolve_model(NARROW).__class__(**{**vars(resolve_model(NARROW)), "q_lora_rank": None})
    assert mla_matrices(lite)[0] == ("qkv_a", 2048, 16 * 192 + 512 + 64)
    assert sum(a * b for _, a, b in mla_matrices(lite)) == attention_parameters(lite) - 512


def _groups_pieces(path: str, vocab: int, batch: IterationBatch) -> tuple[list, list]:
    """Each layer group's streamed pieces of ``batch`` (exact, mapped, one sn40l) and the step's cycles."""
    model = resolve_model(path)
    hw = resolve_serving_hardware("sn40l")
    latency = exact_layer_list(model, lambda sub, g: engine_provider(
        sub, path, hw, None, seed=group_seed(0, g), max_model_len=4096, vocab=vocab, jobs=None, schedule="auto",
        gate=group_gate(model, sub)))
    try:
        cost = latency(batch)
        return [[s.name for s in group.inner.last_streamed] for _, _, group in latency.groups], cost.cycles
    finally:
        latency.close()


def test_an_mla_group_streams_its_own_matrices_and_one_group_the_lm_head():
    names, cycles = _groups_pieces(NARROW, 32000, IterationBatch([64], [1], 0, 1))  # a decode after 64 tokens
    assert names == [["layer 0 qkv_a", "layer 0 q_b", "layer 0 kv_b", "layer 0 decode attention", "layer 0 o",
                      "layer 0 ffn", "lm_head"],
                     ["layer 0 qkv_a", "layer 0 q_b", "layer 0 kv_b", "layer 0 decode attention", "layer 0 o",
                      "layer 0 router", "layer 0 ffn"]]
    # measured: 275,657 weight cycles (24,835 hidden) with the engine model's q/k/v / o and two LM heads
    assert (cycles["weights"], cycles["hidden"]) == (112697, 13467)


def test_a_sliding_and_full_model_reads_its_lm_head_once():
    names, _ = _groups_pieces(OSS, 201088, IterationBatch([64, 300], [1, 1], 0, 2))
    assert [[n for n in group if not n.startswith("layer 0")] for group in names] == [["lm_head"], []]
    assert names[1][:2] == ["layer 0 qkv", "layer 0 decode attention"]
