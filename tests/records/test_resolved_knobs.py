"""A record stores the knob values its run used, not null for "the default": a metrics run's tile_f, a decoder's
FFN tile; run ids are those of the config as given (unchanged), and compare pairs the two spellings of one run."""

from __future__ import annotations

import json

import pytest

from stepsim.cli import main
from stepsim.results.records import RESOLVED_KNOBS, run_config

SCHEDULE = ("tiling", "tile_n", "tile_f", "tile_m", "regions", "strategy", "softmax", "compute_bw",
            "channel_depth", "kv_heads")


def _knobs(row: dict) -> dict:
    return {k: row[k] for k in SCHEDULE}


def test_the_resolved_knobs_are_the_schedule_knobs():
    assert RESOLVED_KNOBS == SCHEDULE + ("micro_batches",)  # a SwiGLU stack's (B / tile_m when unset)


def test_moe_and_swiglu_records_hold_the_values_their_params_say():
    static = run_config({"workload": "moe", "mode": "metrics"}).row
    assert _knobs(static) == {"tiling": "static", "tile_n": 32, "tile_f": 64, "tile_m": None, "regions": 8,
                              "strategy": None, "softmax": None, "compute_bw": 4096, "channel_depth": 2,
                              "kv_heads": None}
    params = json.loads(static["params"])
    assert {k: params[k] for k in ("tile_n", "tile_f", "regions", "compute_bw", "channel_depth")} == {
        k: static[k] for k in ("tile_n", "tile_f", "regions", "compute_bw", "channel_depth")}
    dynamic = run_config({"workload": "moe", "mode": "metrics", "tiling": "dynamic"}).row
    assert (dynamic["tile_n"], dynamic["compute_bw"]) == (None, 6400)  # dynamic tiling has no token tile
    swiglu = run_config({"workload": "swiglu", "mode": "metrics"}).row
    assert _knobs(swiglu) == {"tiling": None, "tile_n": 16, "tile_f": None, "tile_m": 16, "regions": None,
                              "strategy": None, "softmax": None, "compute_bw": 4096, "channel_depth": 1,
                              "kv_heads": None}
    attention = run_config({"workload": "attention", "mode": "metrics"}).row
    assert _knobs(attention) == {"tiling": None, "tile_n": None, "tile_f": None, "tile_m": None, "regions": 4,
                                 "strategy": "dynamic", "softmax": "plain", "compute_bw": 2048,
                                 "channel_depth": 1, "kv_heads": None}


@pytest.mark.traces
def test_a_decoder_records_the_ffn_tile_it_ran(shared_traces):
    config = {"workload": "decoder", "mode": "metrics", "model": "qwen",
              "routing": str(shared_traces / "expert_routing" / "qwen_b64" / "032_012.npz"),
              "kv_lengths": str(shared_traces / "kv_lengths" / "b64" / "conv_stdev0477_0271_0334.npy")}
    row = run_config(config).row
    assert _knobs(row) == {"tiling": "static", "tile_n": 32, "tile_f": 64, "tile_m": None, "regions": 128,
                           "strategy": "dynamic", "softmax": "plain", "compute_bw": 4096, "channel_depth": 2,
                           "kv_heads": 4}
    params = json.loads(row["params"])
    assert (params["tile_n"], params["regions"], params["ffn_regions"]) == (32, 128, 128)
    explicit = run_config({**config, "tile_n": 32, "regions": 128, "kv_heads": 4}).row
    assert _knobs(explicit) == _knobs(row)
    assert {k: v for k, v in explicit.items() if k.endswith("_bytes") or k == "flops"} == {
        k: v for k, v in row.items() if k.endswith("_bytes") or k == "flops"}


def test_run_ids_are_those_of_the_config_as_given():
    """Filling the record's columns leaves every run id as it was (resumed sweeps find their results)."""
    ids = {"cdfece4b71d7f13199c2d996f10b4f7363d6ffeab72212230f721cc1860b3761": {"workload": "moe", "mode": "metrics"},
           "5b5f06196304c0aff4c5ab0bb62e7b0ce5d2986afbc487683ffaf9292b8caf37": {"workload": "moe", "mode": "metrics",
                                                                               "tile_n": 32},
           "d79db79b0e3eb447fa3eddd53813f24ebf41ffb5a0ae0894afeaea99d06a749e": {"workload": "moe", "mode": "metrics",
                                                                               "tiling": "dynamic"},
           "6fed5037fd87b372ea76985f2dcc4518a7708dfb01fcf1ccd12d96a2953a5389": {"workload": "swiglu",
                                                                               "mode": "metrics"}}
    assert {run_config(config).row["run_id"]: config for config in ids.values()} == ids


def test_compare_pairs_a_default_given_and_left_out(tmp_path, capsys):
    assert main(["metrics", "moe", "--out", str(tmp_path / "implicit")]) == 0
    assert main(["metrics", "moe", "--tile-n", "32", "--tile-f", "64", "--out", str(tmp_path / "explicit")]) == 0
    capsys.readouterr()
    assert main(["compare", str(tmp_path / "implicit"), str(tmp_path / "explicit"), "--json"]) == 0
    [pair] = json.loads(capsys.readouterr().out)["pairs"]
    # before: "differs": {"tile_n": [null, 32], "tile_f": [null, 64]}
    assert (pair["config"], pair["differs"]) == (
        "workload=moe model=mixtral-8x7b tiling=static tile_n=32 tile_f=64 regions=8 compute_bw=4096 "
        "channel_depth=2 convention=published", {})
