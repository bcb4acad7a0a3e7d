"""``stepsim models list | show`` and one set of model names in every command that takes ``--model``."""

import json

import numpy as np

from stepsim.batch.config import parse_sweep
from stepsim.batch.grid import expand
from stepsim.cli import build_parser, main
from stepsim.models.presets import PRESETS
from stepsim.trace_io.serving import synthetic_routed_experts
from stepsim.workloads.config import bundled_trace

MIXTRAL_FIELDS = {"model_type": "mixtral", "hidden_size": 4096, "intermediate_size": 14336, "num_local_experts": 8,
                  "num_experts_per_tok": 2, "num_attention_heads": 32, "num_key_value_heads": 8,
                  "num_hidden_layers": 32}


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_models_list_prints_every_preset_with_its_dimensions(capsys):
    code, out, err = run(capsys, "models", "list")
    assert code == 0 and err == ""
    assert out.splitlines() == [
        "name              type         D     F_expert  experts  top_k  shared  F_shared  F_dense  layers  heads  "
        "kv_heads  head_dim  aliases",
        "deepseek-moe-16b  deepseek     2048  1408      64       6      2       2816      10944    28      16     "
        "16        128       deepseek, deepseekv316b",
        "deepseek-v3       deepseek_v3  7168  2048      256      8      1       2048      18432    61      128    "
        "128       192       deepseek-r1, deepseekv3, deepseekr1",
        "gpt-oss-120b      gpt_oss      2880  2880      128      4      0       0         -        36      64     "
        "8         64        gptoss120b",
        "gpt-oss-20b       gpt_oss      2880  2880      32       4      0       0         -        24      64     "
        "8         64        gptoss20b",
        "llama-3.1-8b      llama        4096  -         0        0      0       0         14336    32      32     "
        "8         128       llama",
        "llama-4-maverick  llama4_text  5120  8192      128      1      1       8192      16384    48      40     "
        "8         128       llama4-maverick",
        "llama-4-scout     llama4_text  5120  8192      16       1      1       8192      16384    48      40     "
        "8         128       llama4-scout",
        "mixtral-8x7b      mixtral      4096  14336     8        2      0       0         -        32      32     "
        "8         128       mixtral, mixtral8x7b",
        "qwen3-235b-a22b   qwen3_moe    4096  1536      128      8      0       0         12288    94      64     "
        "4         128       qwen235b, qwen3-235b",
        "qwen3-30b-a3b     qwen3_moe    2048  768       128      8      0       0         6144     48      32     "
        "4         128       qwen, qwen30b",
        "D, F_*, head_dim in elements; F_shared is all shared experts together; '-' = none. "
        "stepsim models show NAME_OR_FILE for one model",
    ]
    code, out, _ = run(capsys, "models", "list", "--json")
    assert code == 0 and json.loads(out) == [m.as_dict() for m in PRESETS.values()]


def test_models_show_resolves_an_alias_and_explains_the_paper_dims(capsys):
    code, out, _ = run(capsys, "models", "show", "qwen", "--json")
    assert code == 0
    assert json.loads(out) == {
        "name": "qwen3-30b-a3b", "source": "stepsim/data/models/qwen3-30b-a3b.json", "model_type": "qwen3_moe",
        "hidden": 2048, "layers": 48, "heads": 32, "kv_heads": 4, "head_dim": 128, "experts": 128, "top_k": 8,
        "expert_intermediate": 768, "dense_intermediate": 6144, "shared_experts": 0, "shared_intermediate": 0,
        "aliases": ["qwen", "qwen30b"], "kind": "moe", "query_per_kv_head": 8, "moe_workload": "yes (routed experts)",
        "paper_attention": {"name": "qwen3-30b-a3b", "hidden": 2048, "head_dim": 64, "heads": 32, "kv_heads": 4},
        # issue 43's fields, at the values of a GQA model with full attention and softmax top-k routing
        "q_lora_rank": None, "kv_lora_rank": None, "qk_nope_head_dim": None, "qk_rope_head_dim": None,
        "v_head_dim": None, "n_group": 1, "topk_group": 1, "scoring_func": "softmax", "routed_scaling_factor": 1.0,
        "first_k_dense_replace": 0, "moe_layer_freq": 1, "layer_types": [], "sliding_window": None,
        "interleave_moe_layer_step": 0, "attention_chunk_size": None,
        "attention_bias": False, "attention_sinks": False, "router_bias": False, "expert_bias": False,
        "attention_kind": "gqa", "layer_list_features": [],
        # 48 layers x 2 x 4 KV heads x 128 x 2 B; the weights of stepsim.serve.memory
        "kv_bytes_per_token": 98_304, "sliding_kv_bytes_per_token": 0, "parameters": 30_532_110_336,
        "weight_bytes": 61_064_220_672}
    code, out, _ = run(capsys, "models", "show", "qwen")
    assert out.splitlines()[-5:] == ["moe workload              yes (routed experts)",
                                     "attention                 gqa",
                                     "KV bytes per token        98304",
                                     "parameters                30532110336",
                                     "paper attention runs      head_dim 64 (published 128)"]


def test_models_show_reads_a_config_file(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(MIXTRAL_FIELDS))
    code, out, _ = run(capsys, "models", "show", path)
    assert code == 0
    assert out.splitlines() == [
        f"name                      {path}",
        f"source                    {path}",
        "model_type                mixtral",
        "kind                      moe",
        "hidden (D, elements)      4096",
        "layers                    32",
        "attention heads           32",
        "KV heads                  8",
        "query heads per KV head   4",
        "head_dim (elements)       128",
        "routed experts            8",
        "top_k                     2",
        "expert FFN (F, elements)  14336",
        "shared experts            0",
        "shared FFN (elements)     0",
        "dense FFN (elements)      -",
        "aliases                   -",
        "moe workload              yes (routed experts)",
        "attention                 gqa",
        "KV bytes per token        131072",  # 32 layers x 2 x 8 KV heads x 128 x 2 B
        "parameters                -",  # the file has no vocab_size
    ]


def test_models_errors_are_one_line_with_status_2(tmp_path, capsys):
    code, out, err = run(capsys, "models", "show", "gpt")
    assert (code, out) == (2, "")
    assert err.startswith("stepsim: error: unknown model 'gpt'; expected one of deepseek-moe-16b, ")
    bad = tmp_path / "config.json"
    bad.write_text(json.dumps({**MIXTRAL_FIELDS, "kv_lora_rank": 512}))  # MLA without its head dimensions
    code, _, err = run(capsys, "models", "show", bad)
    assert code == 2
    assert err == f"stepsim: error: model file {bad}: missing field 'qk_nope_head_dim'\n"

    code, _, err = run(capsys, "metrics", "moe", "--model", bad)
    assert code == 2 and err == f"stepsim: error: model file {bad}: missing field 'qk_nope_head_dim'\n"


def test_metrics_and_run_accept_aliases_and_config_files(tmp_path, capsys):
    code, out, _ = run(capsys, "metrics", "moe", "--model", "qwen", "--tiling", "dynamic", "--json")
    assert code == 0
    by_alias = json.loads(out)
    code, out, _ = run(capsys, "metrics", "moe", "--model", "qwen3-30b-a3b", "--tiling", "dynamic", "--json")
    by_name = json.loads(out)
    assert by_alias["model"] == "qwen3-30b-a3b" and by_alias["run_id"] == by_name["run_id"]
    assert {k: v for k, v in by_alias.items() if not k.endswith("_s")} == {
        k: v for k, v in by_name.items() if not k.endswith("_s")}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(MIXTRAL_FIELDS))
    code, out, _ = run(capsys, "metrics", "moe", "--model", path, "--trace", bundled_trace("mixtral-8x7b"), "--json")
    from_file = json.loads(out)
    code, out, _ = run(capsys, "metrics", "moe", "--model", "mixtral", "--json")
    preset = json.loads(out)
    assert from_file["model"] == str(path) and preset["model"] == "mixtral-8x7b"
    for key in ("off_chip_bytes", "on_chip_bytes", "on_chip_bytes_active", "flops", "graph_flops"):
        assert from_file[key] == preset[key], key


def test_sweep_files_take_aliases_and_config_files_relative_to_the_sweep(tmp_path):
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "config.json").write_text(json.dumps(MIXTRAL_FIELDS))
    spec = parse_sweep({"workload": "moe", "fixed": {"tiling": "dynamic", "trace": bundled_trace("mixtral-8x7b")},
                        "axes": {"model": ["mixtral", "models/config.json"]}}, source=tmp_path / "sweep.toml")
    tasks = expand(spec)
    assert [t.config["model"] for t in tasks] == ["mixtral-8x7b", (tmp_path / "models" / "config.json").as_posix()]


def test_trace_commands_and_demo_take_the_same_names(tmp_path, capsys):
    # the bundled trace's metadata says 'mixtral'; the canonical name and the alias agree with it
    for name in ("mixtral-8x7b", "Mixtral", "mixtral"):
        code, out, err = run(capsys, "trace", "inspect", bundled_trace("mixtral-8x7b"), "--model", name, "--json")
        assert code == 0, err
        assert json.loads(out)["num_experts"] == 8
    code, _, err = run(capsys, "trace", "inspect", bundled_trace("mixtral-8x7b"), "--model", "qwen")
    assert code == 2 and "metadata model 'mixtral' conflicts with model 'qwen'" in err
    # a config file gives the routing shape to synth, and is checked against a trace's
    path = tmp_path / "config.json"
    path.write_text(json.dumps(MIXTRAL_FIELDS))
    out = tmp_path / "r.arrow"
    code, stdout, err = run(capsys, "trace", "synth", "routing", "--model", path, "--tokens", 16, "--seed", 3,
                            "--out", out)
    assert code == 0, err
    assert stdout == f"wrote {out}: synthetic routing, 16 tokens, 8 experts, top-2, seed 3\n"
    code, _, err = run(capsys, "trace", "synth", "routing", "--model", path, "--top-k", 3, "--tokens", 16,
                       "--seed", 3, "--out", out)
    assert (code, err) == (2, f"stepsim: error: --top-k 3 conflicts with --model {path} (top_k 2)\n")
    code, _, err = run(capsys, "trace", "inspect", bundled_trace("mixtral-8x7b"), "--model", path, "--num-experts", 4)
    assert (code, err) == (2, f"stepsim: error: --num-experts 4 conflicts with --model {path} (8 experts)\n")
    qwen_like = tmp_path / "qwen.json"
    qwen_like.write_text(json.dumps({**MIXTRAL_FIELDS, "num_experts_per_tok": 4}))
    code, _, err = run(capsys, "trace", "inspect", out, "--model", qwen_like)
    assert (code, err) == (2, f"stepsim: error: {out}: metadata model '{path}' conflicts with model '{qwen_like}'\n")
    plain = tmp_path / "plain.arrow"  # no model metadata: the file's top_k is checked against the config's
    np.save(tmp_path / "routed.npy", synthetic_routed_experts(16, 1, 8, 2, seed=3))
    assert run(capsys, "trace", "import-routed", tmp_path / "routed.npy", "--num-experts", 8, "--out", plain)[0] == 0
    code, _, err = run(capsys, "trace", "inspect", plain, "--model", qwen_like)
    assert (code, err) == (2, f"stepsim: error: {plain}: the trace has top_k = 2, but --model {qwen_like} says "
                              "num_experts_per_tok = 4\n")
    assert build_parser().parse_args(["demo", "--model", "qwen"]).model == "qwen3-30b-a3b"
