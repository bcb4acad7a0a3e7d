"""``stepsim optimize --max-chips`` over a stack of decoder layers of an MoE model: its FFN stage searches ``pp x ep``
(stepsim/optimize/chips.py ``stack_ep``; the stack: stepsim/workloads/decoder/pipeline_ep.py) with the decoder
layer's constraints on ``ep`` (it divides the KV heads or is a multiple of them, and divides the batch)."""

from __future__ import annotations

import json

import numpy as np

from stepsim.optimize import _default_stages
from stepsim.optimize.chips import PLACEMENTS, parallel_combos
from stepsim.workloads.config import normalize_config


def test_the_decoder_stack_s_combos_are_pp_x_ep_within_its_heads_and_batch():
    # 2 KV heads, 16 requests: ep 2, 4, 8 (multiples of the heads dividing the batch), never tp
    assert parallel_combos(("tp", "ep", "pp"), 8, experts=8, widths=(64,), batch=16, layers=2, heads=2,
                           stack_ep=True) == [{"ep": 2}, {"pp": 2}, {"ep": 4}, {"ep": 2, "pp": 2}, {"ep": 8},
                                              {"ep": 4, "pp": 2}]
    # 12 requests: ep 8 does not divide them
    assert {"ep": 8} not in parallel_combos(("tp", "ep", "pp"), 8, experts=8, widths=(64,), batch=12, layers=2,
                                            heads=2, stack_ep=True)


def test_the_decoder_stack_s_ffn_stage_searches_ep(tmp_path):
    """A 2-layer stack of an MoE model (8 experts, 2 KV heads, 16 requests) under 4 chips: the FFN stage holds,
    for each one-chip grid without regions, its copies with ep 2, pp 2, ep 4 and pp 2 x ep 2 (every placement with
    ep), each followed by its micro-batch copy (M = 2, 4, 8 where every chip's shard splits)."""
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "qwen3_moe", "hidden_size": 64, "intermediate_size": 128, "moe_intermediate_size": 64,
        "num_experts": 8, "num_experts_per_tok": 2, "num_attention_heads": 8, "num_key_value_heads": 2,
        "head_dim": 16, "num_hidden_layers": 2}))
    np.save(tmp_path / "kv.npy", np.arange(1, 17))
    cfg = normalize_config({"workload": "decoder", "model": str(tmp_path / "config.json"),
                            "kv_lengths": str(tmp_path / "kv.npy"), "mode": "metrics", "layers": 2})
    one_chip = [g for g in _default_stages(cfg)[1][1] if "micro_batches" not in g]
    ffn = _default_stages(cfg, max_chips=4)[1][1]
    expected = []
    for grid in one_chip:
        expected += [grid, {**grid, "micro_batches": (2, 4, 8)}]
    # M splits every chip's shard: 16 requests over ep 4 take M = 2, 4 (shards of 4 requests), not 8
    for combo, ms in (({"ep": 2}, (2, 4, 8)), ({"pp": 2}, (2, 4, 8)), ({"ep": 4}, (2, 4)),
                      ({"ep": 2, "pp": 2}, (2, 4, 8))):
        for grid in one_chip:
            copy = {**grid, **{k: (v,) for k, v in combo.items()}}
            if "ep" in combo:
                copy["placement"] = PLACEMENTS
            expected += [copy, {**copy, "micro_batches": ms}]
    assert ffn == expected
    assert sum("ep" in g for g in ffn) == 3 * 2 * len(one_chip) > 0  # 3 ep combos, each grid and its copy
