"""``stepsim optimize decoder``: the decoder layer searched stage by stage (attention strategy, then the FFN grid
with the strategies stage 1 keeps), on a small Qwen3-like layer made here (no ../shared needed)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from stepsim.base.errors import ConfigError
from stepsim.cli import main
from stepsim.models.presets import resolve_model
from stepsim.optimize import optimize
from stepsim.optimize.space import DECODER_STRATEGIES, default_decoder_stages

#: a Qwen3-like MoE layer with small dims (D=64, 8 query and 2 KV heads of 16, 8 experts of 32, top-2)
CONFIG = {"model_type": "qwen3_moe", "hidden_size": 64, "intermediate_size": 128, "moe_intermediate_size": 32,
          "num_experts": 8, "num_experts_per_tok": 2, "num_attention_heads": 8, "num_key_value_heads": 2,
          "head_dim": 16, "num_hidden_layers": 2}


@pytest.fixture
def layer(tmp_path) -> dict:
    """The layer's knobs: the config.json, 16 skewed routed tokens and their KV lengths."""
    rng = np.random.default_rng(3)
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    skew = [0.3, 0.2, 0.15, 0.1, 0.1, 0.05, 0.05, 0.05]
    np.savez(tmp_path / "routing.npz", data=np.stack([rng.choice(8, 2, replace=False, p=skew) for _ in range(16)]))
    np.save(tmp_path / "kv.npy", rng.integers(1, 300, 16))
    return {"model": str(tmp_path / "config.json"), "routing": str(tmp_path / "routing.npz"),
            "kv_lengths": str(tmp_path / "kv.npy")}


def test_default_stages_of_a_moe_and_a_dense_layer(layer):
    """Stage 1: the three strategies with the FFN at the first point of stage 2's grid (dynamic tiles, the
    smallest tile_f, a region per expert); stage 2: the MoE grids of the layer's block (8 experts of 32, 16
    tokens). A dense layer's stage 2 is its FFN's tile_f (Llama-3.1-8B: divisors of 14336 between 32 and 256)."""
    stages = default_decoder_stages(resolve_model(layer["model"]), 16)
    assert stages == [
        ("attention", [{"strategy": DECODER_STRATEGIES, "tiling": ("dynamic",), "tile_f": (32,)}]),
        ("ffn", [{"tiling": ("dynamic",), "tile_f": (32,)},
                 {"tiling": ("dynamic",), "tile_f": (32,), "regions": (1, 2, 4)},
                 {"tiling": ("static",), "tile_n": (1, 2, 4, 8, 16), "tile_f": (32,)},
                 {"tiling": ("static",), "tile_n": (1, 2, 4, 8, 16), "tile_f": (32,), "regions": (1, 2, 4)}])]
    dense = default_decoder_stages(resolve_model("llama-3.1-8b"), 16)
    assert dense == [("attention", [{"strategy": DECODER_STRATEGIES, "tile_f": (32,)}]),
                     ("ffn", [{"tile_f": (32, 56, 64, 112, 128, 224, 256)}])]


def test_decoder_search_stage_by_stage_finds_the_front_of_what_it_searched(layer, tmp_path, serial,
                                                                          exhaustive_front):
    """Stage 1 simulates the 3 strategies; all three are on its front (coarse: least compute; interleave: least
    on-chip; dynamic: fewest cycles), so stage 2 searches the 24-point FFN grid with each: 72 candidates, of which
    stage 1's three are read back, not simulated again. The front found equals the exhaustive front of those 72,
    point for point, and every stage-2 candidate uses a kept strategy."""
    result = optimize("decoder", out=tmp_path / "opt", executor=serial, round_size=1, **layer)
    front, cycles = exhaustive_front(result)
    assert sorted((c.run_id, *c.objectives) for c in result.front) == front
    assert result.stages == [{"stage": "attention", "candidates": 3,
                              "kept_strategies": ["dynamic", "interleave", "coarse"]},
                             {"stage": "ffn", "candidates": 72}]
    assert {c.config["strategy"] for c in result.candidate_list} == set(DECODER_STRATEGIES)
    assert (result.candidates, result.pruned_symbolically, result.simulations, len(result.front)) == (72, 5, 67, 29)
    for c in result.candidate_list:
        if c.status == "simulated":
            assert c.lower_bound <= c.cycles == cycles[c.run_id], c.config
    assert result.recommended.config["strategy"] == "dynamic"


def test_decoder_cli_needs_kv_lengths_and_reports_stages(layer, tmp_path, capsys):
    with pytest.raises(ConfigError, match="stepsim optimize decoder needs the KV lengths of its decode batch"):
        optimize("decoder", out=tmp_path / "x", model=layer["model"], routing=layer["routing"])
    argv = ["optimize", "decoder", "--model", layer["model"], "--routing", layer["routing"], "--kv-lengths",
            layer["kv_lengths"], "--jobs", "2", "--out", str(tmp_path / "opt"), "--json", "--no-progress",
            "--space", str(_space(tmp_path))]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    # a space file is one stage, searched exactly
    assert report["stages"] == [{"stage": "space", "candidates": 2}]
    assert [p["config"]["strategy"] for p in report["pareto"]] == ["dynamic", "coarse"]


def _space(tmp_path):
    path = tmp_path / "space.toml"
    path.write_text('[axes]\nstrategy = ["dynamic", "coarse"]\ntiling = ["dynamic"]\ntile_f = [32]\n')
    return path
