"""``workload_from_config``: plain mappings build the same workloads as the CLI flags, and bad ones fail
with messages that name the key, the value and the source."""

import pytest

from stepsim.base.errors import ConfigError
from stepsim.cli import build_parser
from stepsim.cli.args import build_workload
from stepsim.workloads.config import KNOBS, KNOWN_KEYS, bundled_trace, normalize_config, workload_from_config

KNOWN = ("algorithm, batch_id, bytes, channel_depth, compute_bw, convention, ep, experts, fifo_depths, hardware, "
         "hidden, intermediate, iteration, kv_heads, kv_lengths, layer, layers, micro_batches, mode, model, no_fuse, "
         "op, placement, pp, program, regions, routing, softmax, spill, strategy, system, tile_f, tile_m, tile_n, "
         "tiling, top_k, tp, trace, workload")


def test_known_keys_are_the_cli_knobs_plus_mode():
    assert len(KNOBS) == 38 and KNOWN_KEYS == set(KNOBS) | {"mode"}  # 26 + op, bytes, algorithm, system, ep, placement, tp,
    # layers, pp, micro_batches, no_fuse, spill
    assert ", ".join(sorted(KNOWN_KEYS)) == KNOWN


def test_unknown_key_error_names_the_key_the_source_and_a_close_match():
    with pytest.raises(ConfigError) as err:
        workload_from_config({"workload": "moe", "tilling": "static"}, source="sweep.toml")
    assert str(err.value) == f"sweep.toml: unknown config key 'tilling' (did you mean 'tiling'?); known keys: {KNOWN}"
    with pytest.raises(ConfigError) as err:
        workload_from_config({"workload": "moe", "zzz": 1})
    assert str(err.value) == f"unknown config key 'zzz'; known keys: {KNOWN}"


@pytest.mark.parametrize("config, message", [
    ({}, "missing required config key 'workload' (one of moe, swiglu, attention, prefill_attention, mla_attention, mla_prefill, sliding_attention, decoder, collective, program)"),
    ({"workload": "mlp"}, "config key 'workload' must be one of 'moe', 'swiglu', 'attention', 'prefill_attention', 'mla_attention', 'mla_prefill', 'sliding_attention', 'decoder', 'collective', 'program', "
                          "got 'mlp'"),
    ({"workload": "swiglu", "tile_m": "16"}, "config key 'tile_m' must be an int >= 1, got '16'"),
    ({"workload": "swiglu", "tile_m": 16.0}, "config key 'tile_m' must be an int >= 1, got 16.0"),
    ({"workload": "swiglu", "tile_m": True}, "config key 'tile_m' must be an int >= 1, got True"),
    ({"workload": "swiglu", "tile_m": 0}, "config key 'tile_m' must be an int >= 1, got 0"),
    ({"workload": "moe", "iteration": -1}, "config key 'iteration' must be an int >= 0, got -1"),
    ({"workload": "moe", "tiling": "Static"}, "config key 'tiling' must be one of 'static', 'dynamic', got 'Static'"),
    ({"workload": "moe", "trace": ""}, "config key 'trace' must be a non-empty string, got ''"),
    ({"workload": "swiglu", "mode": "run"}, "config key 'mode' must be one of 'metrics', 'simulate', 'functional', 'check', got 'run'"),
    ({"workload": "moe", "tile_m": 16}, "config key 'tile_m' does not apply to workload 'moe' (it applies to: swiglu, prefill_attention, mla_prefill)"),
    ({"workload": "swiglu", "model": "qwen3-30b-a3b"},
     "config key 'model' does not apply to workload 'swiglu' (it applies to: moe, prefill_attention, mla_attention, mla_prefill, sliding_attention, decoder)"),
    ({"workload": "attention", "tile_n": 8},
     "config key 'tile_n' does not apply to workload 'attention' (it applies to: moe, swiglu, prefill_attention, mla_attention, mla_prefill, sliding_attention, decoder)"),
    ({"workload": "moe", "hidden": 8},
     "config key 'hidden' only applies with model 'custom' (model is 'mixtral-8x7b')"),
    ({"workload": "moe", "tiling": "dynamic", "tile_n": 8},
     "config key 'tile_n' does not apply to tiling 'dynamic' (dynamic tiling packs each expert's tokens into one tile)"),
    ({"workload": "swiglu", "hardware": "tpu"},
     "config key 'hardware' must be a preset (sn40l, step-eval, step-hdl) or a .toml file, got 'tpu'"),
])
def test_bad_values_name_the_key_and_the_value(config, message):
    with pytest.raises(ConfigError) as err:
        workload_from_config(config)
    assert str(err.value) == message
    with pytest.raises(ConfigError) as err:
        workload_from_config(config, source="grid.toml")
    assert str(err.value) == f"grid.toml: {message}"


def test_builder_refusals_become_config_errors_with_the_source():
    with pytest.raises(ConfigError) as err:
        workload_from_config({"workload": "swiglu", "tile_n": 7}, source="p3")
    assert str(err.value) == "p3: tile_n must be a positive divisor of 512, got 7"
    with pytest.raises(ConfigError) as err:
        workload_from_config({"workload": "moe", "model": "gpt"}, source="p4")
    assert str(err.value) == ("p4: unknown model 'gpt'; expected one of ['deepseek-moe-16b', 'deepseek-v3', "
                              "'gpt-oss-120b', 'gpt-oss-20b', 'llama-4-maverick', 'llama-4-scout', 'mixtral-8x7b', 'qwen3-235b-a22b', 'qwen3-30b-a3b', "
                              "'custom'], an alias (deepseek, deepseek-r1, deepseekr1, deepseekv3, deepseekv316b, "
                              "gptoss120b, gptoss20b, llama4-maverick, llama4-scout, mixtral, mixtral8x7b, qwen, qwen235b, qwen3-235b, qwen30b) or a "
                              "Hugging Face config.json path")


def test_custom_model_without_a_trace_asks_for_one():
    with pytest.raises(ConfigError) as err:
        workload_from_config({"workload": "moe", "model": "custom", "hidden": 64, "intermediate": 128,
                              "experts": 8, "top_k": 2}, source="c.toml")
    assert str(err.value) == "c.toml: no bundled trace for 'custom'; pass --trace PATH (config key 'trace')"


def test_a_config_that_is_not_a_mapping_is_refused():
    with pytest.raises(ConfigError, match=r"^s: a config must be a mapping of knobs, got list$"):
        workload_from_config(["moe"], source="s")


def test_normalize_fills_the_cli_defaults_and_nulls_and_is_idempotent():
    cfg = normalize_config({"workload": "moe", "tile_n": 8})
    assert list(cfg) == [*KNOBS, "mode"]
    assert (cfg["model"], cfg["tiling"], cfg["convention"], cfg["mode"]) == ("mixtral-8x7b", "static", "published",
                                                                             "metrics")
    assert cfg["tile_m"] is None and cfg["strategy"] is None and cfg["compute_bw"] is None
    assert normalize_config(cfg) == cfg
    swiglu = normalize_config({"workload": "swiglu"})
    assert (swiglu["tile_m"], swiglu["tile_n"], swiglu["model"], swiglu["tiling"]) == (16, 16, None, None)
    assert normalize_config({"workload": "attention"})["strategy"] == "dynamic"


@pytest.mark.parametrize("mode, softmax", [("metrics", "plain"), ("simulate", "plain"), ("functional", "stable"),
                                           ("check", "stable")])
def test_attention_softmax_defaults_to_stable_only_for_runs_with_values(mode, softmax):
    assert normalize_config({"workload": "attention", "mode": mode})["softmax"] == softmax
    assert normalize_config({"workload": "attention", "mode": mode, "softmax": "plain"})["softmax"] == "plain"
    built = workload_from_config({"workload": "attention", "mode": mode})
    assert built.params["softmax"] == softmax


def test_softmax_applies_to_attention_only_and_takes_two_values():
    with pytest.raises(ConfigError, match="config key 'softmax' does not apply to workload 'moe'"):
        normalize_config({"workload": "moe", "softmax": "stable"})
    with pytest.raises(ConfigError, match="config key 'softmax' must be one of 'plain', 'stable', got 'safe'"):
        normalize_config({"workload": "attention", "softmax": "safe"})


def test_none_means_unset():
    assert normalize_config({"workload": "swiglu", "tile_m": None, "hardware": None}) == \
        normalize_config({"workload": "swiglu"})


def test_mapping_builds_what_the_knobs_say():
    w = workload_from_config({"workload": "moe", "model": "qwen3-30b-a3b", "tile_n": 8, "tile_f": 48,
                              "compute_bw": 2048, "channel_depth": 4})
    assert (w.name, w.params["model"], w.params["tile_n"], w.params["tile_f"]) == ("moe", "qwen3-30b-a3b", 8, 48)
    assert (w.params["compute_bw"], w.channel_depth) == (2048, 4)
    a = workload_from_config({"workload": "attention", "strategy": "coarse", "channel_depth": 3})
    assert (a.params["strategy"], a.channel_depth, a.params["channel_depth"]) == ("coarse", 3, 3)
    custom = workload_from_config({"workload": "moe", "model": "custom", "hidden": 64, "intermediate": 128,
                                   "experts": 8, "top_k": 2, "tile_f": 64, "trace": bundled_trace("mixtral-8x7b")})
    assert (custom.params["hidden"], custom.params["intermediate"]) == (64, 128)


@pytest.mark.parametrize("kind, model", [("attention", None), ("prefill_attention", "qwen3-30b-a3b"),
                                         ("mla_attention", "deepseek-v3"), ("mla_prefill", "deepseek-v3"),
                                         ("sliding_attention", "gpt-oss-20b")])
def test_the_attention_kinds_take_the_depth_and_compute_knobs_over_their_experiments(kind, model):
    """The attention kinds build with their experiment's FIFO depth (1) and 2,048 FLOPs/cycle; the knobs override
    both, and the record says so (stepsim.workloads.config.apply_channel_depth, compute_bw_kwargs)."""
    cfg = {"workload": kind, **({"model": model} if model else {})}
    default, knobs = workload_from_config(cfg), workload_from_config({**cfg, "channel_depth": 3, "compute_bw": 1024})
    assert (default.channel_depth, default.params["channel_depth"], default.params["compute_bw"]) == (1, 1, 2048)
    assert (knobs.channel_depth, knobs.params["channel_depth"], knobs.params["compute_bw"]) == (3, 3, 1024)


@pytest.mark.parametrize("kind, model", [("prefill_attention", "qwen3-30b-a3b"), ("mla_prefill", "deepseek-v3")])
def test_a_prefill_of_a_request_without_tokens_is_one_line(tmp_path, kind, model):
    import numpy as np

    np.save(tmp_path / "kv.npy", np.array([5, 0, 7]))
    with pytest.raises(ConfigError, match=r"^request 1 has KV length 0: a prefill needs at least one token$"):
        workload_from_config({"workload": kind, "model": model, "trace": str(tmp_path / "kv.npy")})


@pytest.mark.parametrize("argv, config", [
    (["metrics", "swiglu", "--tile-m", "32", "--tile-n", "64"], {"workload": "swiglu", "tile_m": 32, "tile_n": 64}),
    (["metrics", "moe", "--model", "qwen3-30b-a3b", "--tiling", "dynamic", "--regions", "32"],
     {"workload": "moe", "model": "qwen3-30b-a3b", "tiling": "dynamic", "regions": 32}),
    (["run", "attention", "--strategy", "interleave", "--compute-bw", "1024"],
     {"workload": "attention", "strategy": "interleave", "compute_bw": 1024}),
])
def test_cli_flags_and_the_mapping_build_the_same_workload(argv, config):
    from_cli = build_workload(build_parser().parse_args(argv))
    from_map = workload_from_config(config)
    assert from_cli.params == from_map.params
    assert from_cli.bindings == from_map.bindings
    assert from_cli.metrics() == from_map.metrics()
