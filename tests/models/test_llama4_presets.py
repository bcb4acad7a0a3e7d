"""Llama 4 presets (issue 43): Scout and Maverick from their published config.json, counted against the published
109 B and 400 B totals, their layers (MoE every ``interleave_moe_layer_step``-th, a shared expert, chunked RoPE layers
and global NoPE layers) and KV bytes, and the one-line errors of every field they add."""

import json
from importlib import resources

import pytest

from stepsim.base.errors import ConfigError
from stepsim.cli import main
from stepsim.models.layers import LayerKind, layer_groups, layer_list
from stepsim.models.presets import PRESETS, parse_hf_config, resolve_model
from stepsim.serve.layer_list import describe_groups
from stepsim.serve.memory import KVPool, attention_parameters, ffn_parameters, kv_pools, model_memory, vision_parameters

D, V = 5120, 202048
#: q and o (40 heads of 128), k and v (8 KV heads of 128); no biases
ATTENTION = 2 * D * 40 * 128 + 2 * D * 8 * 128
#: Llama4VisionModel + the projector (vision_config: 34 layers of 1,408, MLP 5,632, patches 14 of a 336 image)
VISION = (3 * 14 * 14 * 1408 + 1408 + 577 * 1408 + 4 * 1408
          + 34 * (4 * (1408 * 1408 + 1408) + 2 * 1408 * 5632 + 5632 + 1408 + 4 * 1408)
          + 5632 * 4096 + 4096 * 4096 + 4096 * D)


def _published(name: str) -> dict:
    text = (resources.files("stepsim") / "data" / "models" / f"{name}.json").read_text(encoding="utf-8")
    cfg = json.loads(text)
    cfg.pop("stepsim")
    return cfg


def test_llama_4_scout_against_its_published_109b():
    m = resolve_model("llama-4-scout")
    assert m is PRESETS["llama-4-scout"] is resolve_model("Llama4-Scout")
    assert (m.hidden, m.layers, m.heads, m.kv_heads, m.head_dim, m.experts, m.top_k) == (D, 48, 40, 8, 128, 16, 1)
    assert (m.expert_intermediate, m.shared_experts, m.shared_intermediate, m.dense_intermediate) == (8192, 1, 8192,
                                                                                                      16384)
    assert all(m.layer_is_moe(i) for i in range(48))
    assert attention_parameters(m) == ATTENTION == 62_914_560
    # 16 routed experts and the shared one (gate, up, down of 5,120 x 8,192), the router
    assert ffn_parameters(m, True) == 17 * 3 * D * 8192 + D * 16 == 2_139_176_960
    assert VISION == 871_932_416
    memory = model_memory(m)
    text = 48 * (ATTENTION + 2 * D + 2_139_176_960) + 2 * V * D + D
    assert memory.parameters == text + VISION == 108_641_793_536
    assert abs(memory.parameters / 109e9 - 1) < 0.005  # 0.33 % under the published 109 B (1.13 % without vision)
    assert abs(text / 109e9 - 1) > 0.01
    # 12 NoPE layers keep every token, 36 chunked ones at most a chunk of 8,192
    assert (memory.kv_bytes_per_token, memory.chunked_kv_bytes_per_token) == (48 * 2048 * 2, 36 * 4096) == (196_608,
                                                                                                             147_456)
    assert memory.kv_bytes(10_000) == 12 * 4096 * 10_000 + 36 * 4096 * 8192 == 1_699_479_552
    assert memory.kv_bytes(100) == 196_608 * 100
    assert kv_pools(m) == (KVPool("full", 12, 49_152), KVPool("chunked", 36, 147_456, 8192))


def test_llama_4_maverick_against_its_published_400b():
    m = resolve_model("llama-4-maverick")
    assert (m.experts, m.top_k, m.interleave_moe_layer_step, m.attention_chunk_size) == (128, 1, 2, 8192)
    assert [m.layer_is_moe(i) for i in range(6)] == [False, True, False, True, False, True]
    assert ffn_parameters(m, False) == 3 * D * 16384
    memory = model_memory(m)
    layers = 48 * (ATTENTION + 2 * D) + 24 * 3 * D * 16384 + 24 * (129 * 3 * D * 8192 + D * 128)
    assert memory.parameters == layers + 2 * V * D + D + VISION == 401_583_781_376
    assert abs(memory.parameters / 400e9 - 1) < 0.005  # 0.40 % over the published 400 B
    assert memory.kv_bytes_per_token == 196_608


def test_the_layer_lists_of_the_frontier_models():
    scout = layer_list(resolve_model("llama-4-scout"))
    assert scout[:4] == (LayerKind("chunked", 8192, False, "moe", True),) * 3 + (
        LayerKind("full", None, False, "moe", True),)
    assert describe_groups(resolve_model("llama-4-maverick")) == [
        "layers 0, 2, .., 46 (24): chunked 8192 + dense", "layers 1, 5, .., 45 (12): chunked 8192 + moe (shared)",
        "layers 3, 7, .., 47 (12): full + moe (shared)"]
    assert describe_groups(resolve_model("deepseek-v3")) == ["layers 0-2 (3): mla + dense",
                                                             "layers 3-60 (58): mla + moe (shared)"]
    assert describe_groups(resolve_model("gpt-oss-20b")) == ["layers 0, 2, .., 22 (12): sliding 128 + sinks + moe",
                                                             "layers 1, 3, .., 23 (12): full + sinks + moe"]
    assert [(k.attention, len(i)) for k, i in layer_groups(resolve_model("qwen3-235b-a22b"))] == [("full", 94)]


def test_models_show_llama_4(capsys):
    assert main(["models", "show", "llama-4-maverick", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert {k: d[k] for k in ("parameters", "kv_bytes_per_token", "interleave_moe_layer_step", "attention_chunk_size",
                              "shared_intermediate", "dense_intermediate", "layer_list_features")} == {
        "parameters": 401_583_781_376, "kv_bytes_per_token": 196_608, "interleave_moe_layer_step": 2,
        "attention_chunk_size": 8192, "shared_intermediate": 8192, "dense_intermediate": 16384,
        "layer_list_features": ["chunked attention (36 of 48 layers)", "dense and MoE layers interleaved (MoE every 2 layers)"]}
    assert main(["models", "show", "llama4-scout"]) == 0
    assert capsys.readouterr().out.splitlines()[-3:] == [
        "parameters                108641793536", "attention chunks          8192 tokens on 36 of 48 layers",
        "layer-list features       chunked attention (36 of 48 layers) (served and planned layer group by layer group; run and map refuse them)"]


T = "text_config"
BAD = [
    (T, {"interleave_moe_layer_step": 0}, "text_config: field 'interleave_moe_layer_step' must be an integer >= 1, got 0"),
    (T, {"interleave_moe_layer_step": 49}, "text_config: field 'interleave_moe_layer_step' = 49 exceeds the 48 layers"),
    (T, {"moe_layers": [1, 3]}, "text_config: field 'moe_layers' lists [1, 3]; interleave_moe_layer_step = 2 makes "
                                "layers " + repr(list(range(1, 48, 2))) + " MoE"),
    (T, {"moe_layers": "odd"}, "text_config: field 'moe_layers' must be a list of integers in 0..47, got 'odd'"),
    (T, {"interleave_moe_layer_step": None}, "text_config: field 'moe_layers' needs 'interleave_moe_layer_step'"),
    (T, {"intermediate_size_mlp": None}, "text_config: field 'interleave_moe_layer_step' = 2 needs "
                                         "'intermediate_size_mlp' (the dense layers' FFN dimension)"),
    (T, {"intermediate_size_mlp": -1}, "text_config: field 'intermediate_size_mlp' must be an integer >= 1, got -1"),
    (T, {"attention_chunk_size": 0}, "text_config: field 'attention_chunk_size' must be an integer >= 1, got 0"),
    (T, {"no_rope_layers": [1, 0]}, "text_config: field 'no_rope_layers' lists 2 layers, expected 48 "
                                    "(num_hidden_layers)"),
    (T, {"no_rope_layers": [2] * 48}, "text_config: field 'no_rope_layers' must be a list of integers in 0..1, got "
                                      + repr([2] * 48)),
    (T, {"no_rope_layers": [], "no_rope_layer_interval": 0},
     "text_config: field 'no_rope_layer_interval' must be an integer >= 1, got 0"),
    (T, {"layer_types": ["full_attention"] * 48}, "text_config: fields 'attention_chunk_size' and 'layer_types' are "
                                                  "both set; expected one way of giving the layers' attention"),
    ("vision_config", {"hidden_size": "1408"}, "field 'vision_config.hidden_size' must be an integer in "
                                               "1..2,147,483,647, got '1408'"),
    ("vision_config", {"num_hidden_layers": None}, "field 'vision_config.num_hidden_layers' must be an integer in "
                                                   "1..2,147,483,647, got None"),
]


@pytest.mark.parametrize(("part", "change", "message"), BAD, ids=[f"{p}-{'-'.join(c)}" for p, c, _ in BAD])
def test_a_bad_llama_4_field_is_one_line_naming_the_file_and_the_field(tmp_path, capsys, part, change, message):
    cfg = _published("llama-4-maverick")
    cfg[part] = {k: v for k, v in {**cfg[part], **change}.items() if v is not None or k == "num_hidden_layers"}
    if part == T:
        with pytest.raises(ConfigError) as err:
            parse_hf_config(cfg, "c.json")
        assert str(err.value) == f"model file c.json: {message}"
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    assert main(["models", "show", str(path)]) == 2
    out, err = capsys.readouterr()
    assert (out, err) == ("", f"stepsim: error: model file {path}: {message}\n")


def test_no_rope_layers_default_to_every_fourth_layer_and_vision_needs_its_model_type():
    cfg = _published("llama-4-scout")
    del cfg[T]["no_rope_layers"]
    m = parse_hf_config(cfg, "c.json")
    assert m.layer_types == resolve_model("llama-4-scout").layer_types
    assert [i for i, t in enumerate(m.layer_types) if t == "full_attention"] == list(range(3, 48, 4))
    assert vision_parameters({"vision_config": {"model_type": "clip"}}, D, "c.json") == 0
    assert vision_parameters({}, D, "c.json") == 0
