"""``stepsim map``: the whole output for a small layer, its JSON, ``--out`` read back by ``run --schedule FILE`` (the
same cycles as ``--schedule auto``), and bad input as one line with exit status 2."""

from __future__ import annotations

import json
import shlex

import pytest

from stepsim.cli import main
from stepsim.mapping.schedule import Schedule, read_schedules

#: a Mixtral-shaped model small enough to map in seconds: D 64, F 128, 8 experts, top 2, 4 / 2 heads of 16
TINY = {"model_type": "mixtral", "hidden_size": 64, "intermediate_size": 128, "num_local_experts": 8,
        "num_experts_per_tok": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2}
#: the schedule the mapper chooses for TINY's MoE block at 24 tokens on sn40l, and its figures
TINY_FFN_24 = {"kind": "ffn", "knobs": {"tile_n": 8, "tile_f": 32, "lanes": 2, "regions": 8}, "cycles": 1407,
               "bound_cycles": 912, "off_chip_bytes": 500_832, "flops": 4_035_584, "compute_units": 1040,
               "memory_units": 92, "on_chip_bytes": 279_170,
               "candidates": {"simulated": 52, "pruned": 44, "infeasible": 0}}


@pytest.fixture
def tiny(tmp_path, monkeypatch):
    """The tiny model's config.json and a routing trace of 24 tokens (tests/small_routing.py), in the cwd; the
    mapping cache in a folder of its own."""
    from small_routing import write_small_routing

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("STEPSIM_MAPPING_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr("stepsim.mapping.mapper._MEMO", {})  # nothing mapped by an earlier test in this process
    (tmp_path / "tiny.json").write_text(json.dumps(TINY))
    write_small_routing(tmp_path)
    return tmp_path


def run(capsys, command: str):
    code = main(shlex.split(command))
    out, err = capsys.readouterr()
    return code, out, err


def test_map_prints_the_schedule_its_cycles_utilisation_units_and_search(tiny, capsys):
    code, out, err = run(capsys, "map ffn --model tiny.json --shape 24 --hardware sn40l")
    assert (code, err) == (0, "")
    assert out.splitlines() == [
        "ffn of tiny.json at 24 tokens on sn40l",
        "schedule     tile_n 8, tile_f 32, lanes 2, regions 8",
        "cycles       1,407 (lower bound 912)",
        "HBM          500,832 bytes, 22.2 % of 1,600 B/cycle",
        "compute      4,035,584 FLOPs, 0.4 % of 638,000 FLOPs/cycle",
        "units        1,040 of 1,040 compute, 92 of 1,040 memory; 279,170 bytes on chip",
        "search       52 simulated, 44 pruned by bounds, 0 infeasible",
    ]
    assert len(list((tiny / "cache").glob("*.json"))) == 1  # cached; --no-cache neither reads nor writes
    code, again, _ = run(capsys, "map ffn --model tiny.json --shape 24 --no-cache")
    assert (code, again) == (0, out)  # sn40l is the default hardware
    assert len(list((tiny / "cache").glob("*.json"))) == 1


def test_map_json_holds_the_schedule_and_its_utilisation(tiny, capsys, ffn24_cache):
    ffn24_cache(tiny)
    code, out, _ = run(capsys, "map ffn --model tiny.json --shape 24 --json")
    assert code == 0
    assert json.loads(out) == {"model": "tiny.json", "hardware": "sn40l", "shape": 24, **TINY_FFN_24,
                               "hbm_utilisation": 500_832 / 1407 / 1600,
                               "compute_utilisation": 4_035_584 / 1407 / 638_000}
    code, out, _ = run(capsys, "map decode --model tiny.json --shape 16 --json")
    record = json.loads(out)
    assert (code, record["kind"], record["knobs"], record["cycles"], record["candidates"]) == \
        (0, "decode", {"regions": 16}, 2469, {"simulated": 5, "pruned": 0, "infeasible": 0})


def test_map_out_is_a_schedule_file_that_run_reproduces(tiny, capsys, ffn24_cache):
    ffn24_cache(tiny)
    code, _, _ = run(capsys, "map ffn --model tiny.json --shape 24 --out ffn24.json")
    assert code == 0
    assert read_schedules(tiny / "ffn24.json") == {"ffn": Schedule.from_dict(TINY_FFN_24)}
    records = {}
    for schedule in ("auto", "ffn24.json", "paper"):
        code, out, _ = run(capsys, f"run moe --model tiny.json --trace routing.npz --hardware sn40l "
                                   f"--schedule {schedule} --json")
        assert code == 0
        records[schedule] = json.loads(out)
    auto, from_file, paper = records["auto"], records["ffn24.json"], records["paper"]
    assert auto["cycles"] == from_file["cycles"] == 1409  # the file's knobs are auto's: the same layer
    assert json.loads(from_file["params"])["schedule"] == {
        "source": "file ffn24.json", "kind": "ffn", "compute_units": 1040,
        "knobs": {"tile_n": 8, "tile_f": 32, "lanes": 2, "regions": 8}}
    assert auto["run_id"] == from_file["run_id"] != paper["run_id"]  # one schedule, one run id
    assert paper["cycles"] == 2168 and "schedule" not in json.loads(paper["params"])


#: (command line, exit status, the exact last line of stderr)
BAD = [
    ("map attention --model tiny.json --shape 1", 2,
     "stepsim map: error: argument kind: invalid choice: 'attention' (choose from 'ffn', 'decode', 'prefill', "
     "'projection')"),
    ("map ffn --model tiny.json --shape 0", 2, "stepsim: error: --shape must be an int >= 1 (tokens), got 0"),
    ("map decode --model tiny.json --shape -3", 2, "stepsim: error: --shape must be an int >= 1 (requests), got -3"),
    ("map ffn --model tiny.json --shape 65537", 2,
     "stepsim: error: --shape 65,537: at most 65,536 (a serving step's tokens or requests)"),
    ("map ffn --model tiny.json --shape 1 --hardware tpu", 2,
     "stepsim: error: --hardware must be a preset (sn40l, step-eval, step-hdl) or a .toml file, got 'tpu'"),
    ("map ffn --model tiny.json --shape 1 --hardware missing.toml", 2,
     "stepsim: error: cannot read hardware config missing.toml: [Errno 2] No such file or directory: "
     "'missing.toml'"),
    ("map ffn --model dense_no_ffn.json --shape 1", 2,
     "stepsim: error: model file dense_no_ffn.json: missing field 'intermediate_size' (a dense model: no "
     "num_local_experts / num_experts / n_routed_experts)"),
    ("map ffn --model nosuch --shape 1", 2,
     "stepsim: error: unknown model 'nosuch'; expected one of "
     "deepseek-moe-16b, deepseek-v3, gpt-oss-120b, gpt-oss-20b, llama-3.1-8b, llama-4-maverick, llama-4-scout, mixtral-8x7b, qwen3-235b-a22b, "
     "qwen3-30b-a3b (aliases deepseek, deepseek-r1, deepseekr1, deepseekv3, deepseekv316b, gptoss120b, gptoss20b, "
     "llama, llama4-maverick, llama4-scout, mixtral, mixtral8x7b, qwen, qwen235b, qwen3-235b, qwen30b) or a Hugging "
     "Face config.json path"),
    ("map ffn --shape 1", 2, "stepsim map: error: the following arguments are required: --model"),
    ("map ffn --model tiny.json --shape 1 --out .", 2, "stepsim: error: --out .: is a folder; give a file name"),
    ("map projection --model tiny.json --shape 1 --out p.json", 2,
     "stepsim: error: --out: projection schedules are mapped for serve's steps, not a run's layer (stepsim "
     "run|metrics --schedule FILE takes ffn, decode, prefill); use --json"),
    ("map projection --model tiny.json --shape 0", 2, "stepsim: error: --shape must be an int >= 1 (tokens), got 0"),
    ("map decode --model tiny.json --shape 8 --buckets --jobs 0", 2, "stepsim: error: --jobs must be an int >= 1, got 0"),
    ("map decode --model tiny.json --shape 8 --jobs 2", 2,
     "stepsim: error: --jobs maps buckets side by side: it needs --buckets"),
    ("map decode --model tiny.json --shape 8 --buckets --no-cache", 2,
     "stepsim: error: --buckets maps into the cache: it cannot take --no-cache"),
    ("map decode --model tiny.json --shape 8 --buckets --out b.json", 2,
     "stepsim: error: --out writes one schedule; with --buckets use --json"),
]


@pytest.mark.parametrize("command, status, last_line", BAD, ids=[c for c, _, _ in BAD])
def test_map_bad_input_is_one_line(tiny, capsys, command, status, last_line):
    (tiny / "dense_no_ffn.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 64,
                                                         "num_attention_heads": 4, "num_key_value_heads": 2,
                                                         "num_hidden_layers": 2}))
    try:
        code = main(shlex.split(command if "--out" in command else command + " --out s.json"))
    except SystemExit as exc:  # argparse's own errors
        code = exc.code
    out, err = capsys.readouterr()
    assert (code, out, err.splitlines()[-1]) == (status, "", last_line)
    assert "Traceback" not in err and not (tiny / "s.json").exists() and not (tiny / "cache").exists()


def test_map_projection_prints_every_weight_matrix_of_a_serving_step(tiny, capsys, monkeypatch):
    """``stepsim map projection``: the fused q/k/v (64 x (4 + 2 x 2) x 16), o, router (8 experts) and LM head
    (vocab 1,000) that a mapped serving step prices on the engine (stepsim.serve.projections), each mapped at 24
    tokens; --json holds the same schedules; a config without ``vocab_size`` (no LM head) is one line."""
    monkeypatch.setattr("stepsim.mapping.projection._MEMO", {})
    (tiny / "tinyv.json").write_text(json.dumps({**TINY, "vocab_size": 1000}))
    code, out, err = run(capsys, "map projection --model tinyv.json --shape 24")
    assert (code, err) == (0, "")
    assert out.splitlines() == [
        "projections of tinyv.json at 24 tokens on sn40l",
        "qkv          64 x 128 bf16 weights (16,384 bytes)",
        "schedule     tile_m 32, tile_f 32, lanes 4, k_parts 16",
        "cycles       160 (lower bound 91)",
        "HBM          36,864 bytes, 14.4 % of 1,600 B/cycle",
        "compute      585,728 FLOPs, 0.6 % of 638,000 FLOPs/cycle",
        "units        1,040 of 1,040 compute, 148 of 1,040 memory; 69,632 bytes on chip",
        "search       32 simulated, 88 pruned by bounds, 0 infeasible",
        "o            64 x 64 bf16 weights (8,192 bytes)",
        "schedule     tile_m 32, tile_f 32, lanes 2, k_parts 16",
        "cycles       157 (lower bound 91)",
        "HBM          20,480 bytes, 8.2 % of 1,600 B/cycle",
        "compute      292,864 FLOPs, 0.3 % of 638,000 FLOPs/cycle",
        "units        1,040 of 1,040 compute, 82 of 1,040 memory; 36,864 bytes on chip",
        "search       26 simulated, 54 pruned by bounds, 0 infeasible",
        "router       64 x 8 bf16 weights (1,024 bytes)",
        "schedule     tile_m 32, tile_f 32, lanes 1, k_parts 16",
        "cycles       147 (lower bound 91)",
        "HBM          12,288 bytes, 5.2 % of 1,600 B/cycle",
        "compute      146,432 FLOPs, 0.2 % of 638,000 FLOPs/cycle",
        "units        1,040 of 1,040 compute, 49 of 1,040 memory; 20,480 bytes on chip",
        "search       18 simulated, 42 pruned by bounds, 0 infeasible",
        "lm_head      64 x 1,000 bf16 weights (128,000 bytes)",
        "schedule     tile_m 32, tile_f 32, lanes 16, k_parts 8",
        "cycles       267 (lower bound 193)",
        "HBM          266,240 bytes, 62.3 % of 1,600 B/cycle",
        "compute      4,423,680 FLOPs, 2.6 % of 638,000 FLOPs/cycle",
        "units        1,040 of 1,040 compute, 280 of 1,040 memory; 266,240 bytes on chip",
        "search       27 simulated, 257 pruned by bounds, 0 infeasible",
    ]
    assert len(list((tiny / "cache").glob("*.json"))) == 4  # one cached schedule a matrix
    code, out, _ = run(capsys, "map projection --model tinyv.json --shape 24 --json")
    record = json.loads(out)
    assert (code, record["model"], record["hardware"], record["shape"]) == (0, "tinyv.json", "sn40l", 24)
    assert [(p["matrix"], p["d_in"], p["d_out"], p["kind"], p["knobs"], p["cycles"], p["off_chip_bytes"])
            for p in record["projections"]] == [
        ("qkv", 64, 128, "projection", {"tile_m": 32, "tile_f": 32, "lanes": 4, "k_parts": 16}, 160, 36_864),
        ("o", 64, 64, "projection", {"tile_m": 32, "tile_f": 32, "lanes": 2, "k_parts": 16}, 157, 20_480),
        ("router", 64, 8, "projection", {"tile_m": 32, "tile_f": 32, "lanes": 1, "k_parts": 16}, 147, 12_288),
        ("lm_head", 64, 1000, "projection", {"tile_m": 32, "tile_f": 32, "lanes": 16, "k_parts": 8}, 267, 266_240)]
    assert record["projections"][3]["hbm_utilisation"] == 266_240 / 267 / 1600
    code = main(["map", "projection", "--model", "tiny.json", "--shape", "24"])
    out, err = capsys.readouterr()
    assert (code, out, err) == (2, "", "stepsim: error: model file tiny.json: missing field 'vocab_size' (serving "
                                       "needs it for the weights' size)\n")


def test_map_buckets_maps_every_serving_bucket_into_the_cache(tiny, capsys, monkeypatch):
    """``--buckets``: every power of two up to the shape's bucket, one line each, side by side on ``--jobs`` worker
    processes (what a cold serve run would otherwise map one step at a time); ``prefill`` from one 32-row tile,
    ``projection`` every matrix at each bucket. The schedules are the ones ``stepsim map`` finds one at a time."""
    monkeypatch.setattr("stepsim.mapping.projection._MEMO", {})
    (tiny / "tinyv.json").write_text(json.dumps({**TINY, "vocab_size": 1000}))
    # the workers fork from a process-wide fork server, whose environment is the one it started with (here, or in an
    # earlier test of this process): never this test's cache, so the workers must be told the folder, not read it
    from stepsim.base.forkserver import start_fork_server

    monkeypatch.setenv("STEPSIM_MAPPING_CACHE", str(tiny / "elsewhere"))
    start_fork_server(warm_kernels=False)
    monkeypatch.setenv("STEPSIM_MAPPING_CACHE", str(tiny / "cache"))
    code, out, err = run(capsys, "map decode --model tinyv.json --shape 20 --buckets --jobs 2")
    assert (code, err) == (0, "")
    assert out.splitlines() == [
        "decode of tinyv.json on sn40l: every bucket up to 32 (6 schedules, 2 processes)",
        "      1  regions 1: 1,738 cycles, HBM 2.5 %",
        "      2  regions 2: 1,741 cycles, HBM 5.0 %",
        "      4  regions 4: 1,777 cycles, HBM 9.8 %",
        "      8  regions 8: 1,859 cycles, HBM 18.8 %",
        "     16  regions 16: 2,469 cycles, HBM 28.3 %",
        "     32  regions 32: 3,577 cycles, HBM 39.0 %",
    ]
    assert len(list((tiny / "cache").glob("*.json"))) == 6  # mapped by the workers, into the cache
    assert not (tiny / "elsewhere").exists()
    code, out, _ = run(capsys, "map decode --model tinyv.json --shape 16 --json")
    assert (code, json.loads(out)["cycles"]) == (0, 2469)  # the bucket's schedule, from the cache
    code, out, _ = run(capsys, "map projection --model tinyv.json --shape 3 --buckets")
    assert out.splitlines() == [
        "projection of tinyv.json on sn40l: every bucket up to 4 (12 schedules, 1 process)",
        "      1 64 x 128  tile_m 1, tile_f 32, lanes 4, k_parts 8: 95 cycles, HBM 11.2 %",
        "      1 64 x 64  tile_m 1, tile_f 32, lanes 2, k_parts 16: 87 cycles, HBM 6.2 %",
        "      1 64 x 8  tile_m 1, tile_f 32, lanes 1, k_parts 16: 81 cycles, HBM 3.4 %",
        "      1 64 x 1,000  tile_m 1, tile_f 32, lanes 32, k_parts 4: 181 cycles, HBM 46.7 %",
        "      2 64 x 128  tile_m 2, tile_f 32, lanes 4, k_parts 8: 96 cycles, HBM 11.5 %",
        "      2 64 x 64  tile_m 2, tile_f 32, lanes 2, k_parts 16: 89 cycles, HBM 6.3 %",
        "      2 64 x 8  tile_m 2, tile_f 32, lanes 1, k_parts 16: 83 cycles, HBM 3.5 %",
        "      2 64 x 1,000  tile_m 2, tile_f 32, lanes 32, k_parts 4: 183 cycles, HBM 47.7 %",
        "      4 64 x 128  tile_m 4, tile_f 32, lanes 4, k_parts 8: 100 cycles, HBM 11.8 %",
        "      4 64 x 64  tile_m 4, tile_f 32, lanes 2, k_parts 16: 92 cycles, HBM 6.6 %",
        "      4 64 x 8  tile_m 4, tile_f 32, lanes 1, k_parts 16: 88 cycles, HBM 3.6 %",
        "      4 64 x 1,000  tile_m 4, tile_f 32, lanes 32, k_parts 4: 188 cycles, HBM 49.2 %",
    ]
    code, out, _ = run(capsys, "map prefill --model tinyv.json --shape 40 --buckets --json")
    record = json.loads(out)
    assert (code, record["kind"], [(b["bucket"], b["knobs"], b["cycles"]) for b in record["buckets"]]) == (
        0, "prefill", [(32, {"regions": 2}, 338), (64, {"regions": 4}, 389)])


def test_the_buckets_of_a_serving_shape():
    """``--buckets``' jobs for the 4-layer Qwen3 shape (nothing mapped here): the FFN's 12 token buckets up to
    2,048, the prefill's from one 32-row tile, and the projections at each token bucket but the LM head (a row a
    sequence) only up to serve's default 128 sequences: 12 x 3 + 8."""
    from pathlib import Path

    from stepsim.cli.map import bucket_jobs
    from stepsim.models.presets import resolve_model

    model = resolve_model(str(Path(__file__).resolve().parents[2] / "examples" / "qwen3-30b-a3b-4layers.json"))
    assert bucket_jobs("ffn", 1500, model, None) == [("layer", "ffn", 1 << i) for i in range(12)]
    assert bucket_jobs("prefill", 100, model, None) == [("layer", "prefill", s) for s in (32, 64, 128)]
    assert bucket_jobs("decode", 1, model, None) == [("layer", "decode", 1)]
    jobs = bucket_jobs("projection", 2048, model, 151_936)
    assert len(jobs) == 44 and jobs[:4] == [("projection", 1, 2048, 5120), ("projection", 1, 4096, 2048),
                                            ("projection", 1, 2048, 128), ("projection", 1, 2048, 151_936)]
    assert [j[1] for j in jobs if j[3] == 151_936] == [1, 2, 4, 8, 16, 32, 64, 128]


@pytest.mark.parametrize("command", ["map ffn --model tiny.json --shape 24",
                                     "run moe --model tiny.json --trace routing.npz --hardware sn40l"])
def test_a_mapping_cache_that_cannot_be_one_is_refused_before_the_mapping(tiny, capsys, monkeypatch, command):
    """The schedule is saved in the mapping cache: a folder that is a file, or under one, was a traceback after the
    mapping's work (``map --no-cache`` saves nothing and does not look)."""
    from cache_folders import refuses_a_cache_folder_at_a_file

    refuses_a_cache_folder_at_a_file(shlex.split(command), "STEPSIM_MAPPING_CACHE", tiny / "routing.npz", capsys,
                                     monkeypatch)
    assert not (tiny / "cache").exists()


def test_ctrl_c_stops_map_buckets_and_its_workers_at_once(tmp_path):
    """Ctrl-C at a terminal (SIGINT to the whole process group) during ``map --buckets --jobs 2`` of Qwen3's FFN on
    an empty cache (searches of minutes each): one line and status 130 within seconds, no process of the group left
    and no schedule saved. The pool's workers used to catch the Ctrl-C as a failed search and take the next queued
    one while the command waited for them all (more than 2 minutes, seen by script). SIGTERM takes the same path
    (tests/serve/test_serve_bad_inputs.py sends it to an exact serve's workers)."""
    import os
    import sys

    from process_group import stopped_with_its_workers

    env = {**os.environ, "STEPSIM_MAPPING_CACHE": str(tmp_path / "cache")}
    command = [sys.executable, "-m", "stepsim", "map", "ffn", "--model", "qwen3-30b-a3b", "--shape", "256", "--buckets",
               "--jobs", "2"]
    assert stopped_with_its_workers(command, "SIGINT", cwd=tmp_path, env=env) == (
        130, "stepsim: interrupted\n", "ffn of qwen3-30b-a3b on sn40l: every bucket up to 256 (9 schedules, 2 processes)\n")
    assert list((tmp_path / "cache").glob("*")) == []
