"""Bad input, as a new user or a hostile tester gives it: one clear line naming the file / row / flag / key /
operator, exit status 2 (CLI) or a typed StepsimError (Python), never a traceback.

One table per interface. CLI cases run ``stepsim.cli.main`` in-process (fast) in a folder holding every malformed
file of ``bad_input_files.py``; each asserts the exit status and the exact last line of stderr.
"""

from __future__ import annotations

import shlex

import numpy as np
import pytest
from bad_input_files import write_bad_files

from stepsim.base.errors import ArgumentError, ConfigError, ShapeError, StepsimError
from stepsim.cli import main

E = "stepsim: error: "
RUN_USAGE = "stepsim run: error: "

#: (command line, exit status, the exact last line of stderr); ``{d}`` is the folder of bad files (the cwd)
CLI_CASES = [
    # --- traces: .npz routing files
    ("run moe --trace text.npz", 2,
     E + "text.npz: not a NumPy .npz archive (its first bytes are b'hell'); save the array with numpy savez"),
    ("run moe --trace object.npz", 2, E + "object.npz: holds Python objects (an object-dtype array), not numbers; "
                                          "save an integer (routing) or integer/float (KV lengths) array"),
    ("run moe --trace truncated.npz", 2, E + "truncated.npz: cannot read NumPy file: File is not a zip file"),
    ("run moe --trace empty.npz", 2, E + "empty.npz: no array 'data' (arrays: none)"),
    ("run moe --trace zero_rows.npz", 2, E + "zero_rows.npz: empty trace (0 rows)"),
    ("run attention --trace empty_kv.npy", 2, E + "empty_kv.npy: row 0, column 'kv_lengths': empty batch (0 requests)"),
    ("run moe --trace no_data.npz", 2, E + "no_data.npz: no array 'data' (arrays: ids)"),
    ("run moe --trace rank3.npz", 2, E + "rank3.npz: array 'data' has shape [2, 2, 2], expected [batch, top_k]"),
    ("run moe --trace floats.npz", 2, E + "floats.npz: array 'data' has dtype float32, expected integer expert ids"),
    ("run moe --trace out_of_range.npz", 2,
     E + "out_of_range.npz: row 0, column 'expert_ids': expert id 9 at position 1 is out of range [0, 8)"),
    ("run moe --trace duplicate.npz", 2, E + "duplicate.npz: row 0, column 'expert_ids': expert id 1 appears twice "
                                             "(positions 0 and 1) in one token"),
    ("run moe --trace folder_npz", 2,
     E + "folder_npz: file 'layer10.npz': a routing file in a folder must be named <iteration>_<layer>.npz (e.g. "
         "008_010.npz; the names order the batches); a single file may have any name"),
    ("run moe --trace missing.npz", 2, E + "missing.npz: no such file or directory"),
    ("run moe --model qwen --trace mixtral_b4/003_007.npz", 2,
     E + "mixtral_b4/003_007.npz: this routing trace is for 'mixtral' (8 experts), but the run's model has 128 "
         "experts; pass --model mixtral (or a trace of your model)"),
    ("run moe --iteration 5 --trace mixtral_b4/003_007.npz", 2,
     E + "mixtral_b4/003_007.npz: no rows for iteration=5 layer=None"),
    ("trace inspect text.npz", 2,
     E + "text.npz: not a NumPy .npz archive (its first bytes are b'hell'); save the array with numpy savez"),
    # --- traces: .npy KV lengths
    ("run attention --trace text.npy", 2,
     E + "text.npy: not a NumPy .npy file (its first bytes are b'hello'); save the array with numpy save"),
    ("run attention --trace object.npy", 2, E + "object.npy: holds Python objects (an object-dtype array), not "
                                                "numbers; save an integer (routing) or integer/float (KV lengths) array"),
    ("run attention --trace kv_2d.npy", 2, E + "kv_2d.npy: array has shape [4, 2], expected a 1-D array of KV lengths"),
    ("run attention --trace kv_negative.npy", 2,
     E + "kv_negative.npy: row 0, column 'kv_lengths': negative value -5 at position 1"),
    ("run moe --trace kv_negative.npy", 2,
     E + "kv_negative.npy: num_experts / model only apply to routing traces, this is a decode_batches trace"),
    ("run attention --batch-id 7", 2, None),  # bundled trace path: checked by fragment below
    # --- traces: Arrow, Parquet, Azure CSV
    ("run moe --trace garbage.arrow", 2,
     E + "garbage.arrow: not a readable arrow file: Expected to read 544501614 metadata bytes, but only read 12"),
    ("run moe --trace garbage.parquet", 2,
     E + "garbage.parquet: not a readable parquet file: Parquet magic bytes not found in footer. Either the file is "
         "corrupted or this is not a parquet file."),
    ("run moe --trace no_columns.parquet", 2,
     E + "no_columns.parquet: cannot tell the trace kind from columns ['foo']; expected an 'expert_ids' (routing), "
         "'context_tokens' (requests) or 'kv_lengths' (decode batches) column"),
    ("trace import requests.csv --out r.parquet", 2,
     E + "requests.csv: missing column(s) GeneratedTokens in the CSV header (found: TIMESTAMP, ContextTokens)"),
    ("trace import bad_row.csv --out r.parquet", 2,
     E + "bad_row.csv: row 1, column 'TIMESTAMP': invalid value 'not a time' (expected timestamp[ns])"),
    ("trace import garbage.arrow --out x.parquet", 2,
     E + "garbage.arrow: not a readable arrow file: Expected to read 544501614 metadata bytes, but only read 12"),
    ("trace import mixtral_b4/003_007.npz --out x.txt", 2,
     E + "output 'x.txt': suffix must be one of .arrow, .feather, .ipc, .parquet, .pq"),
    ("trace import missing.csv --out x.parquet", 2, E + "missing.csv: no such file or directory"),
    ("trace import mixtral_b4/003_007.npz --layer 2 --out x.parquet", 2,
     E + "--layer labels a single routing .npz file whose name is not <iteration>_<layer>.npz; mixtral_b4/003_007.npz "
         "is not one"),
    ("trace inspect folder_npz --iteration 1", 2,
     E + "--iteration labels a single routing .npz file whose name is not <iteration>_<layer>.npz; folder_npz is not "
         "one"),
    ("trace inspect duplicate.npz --layer -1", 2, "stepsim trace inspect: error: argument --layer: must be an int >= 0, "
                                                  "got -1"),
    ("trace inspect a_file", 2,
     E + "a_file: cannot tell the trace format from suffix ''; give the file one of the suffixes .arrow, .csv, "
         ".feather, .ipc, .npy, .npz, .parquet, .pq or give the format (stepsim trace ... --format, format= in Python: "
         "one of npz, npy, azure-csv, arrow, parquet)"),
    ("trace synth routing --model mixtral --tokens 99999999999 --seed 1 --out x.arrow", 2,
     E + "--tokens must be at most 2,147,483,647 (traces store int32 values), got 99999999999"),
    # --- trace synth
    ("trace synth routing --model mixtral --tokens 10 --seed -1 --out x.arrow", 2,
     "stepsim trace synth routing: error: argument --seed: must be an int >= 0, got -1"),
    ("trace synth routing --tokens 10 --seed 1 --out x.arrow", 2,
     E + "synth routing needs --num-experts and --top-k (or a known --model such as mixtral, qwen)"),
    ("trace synth routing --model mixtral --tokens 0 --seed 1 --out x.arrow", 2,
     E + "--tokens must be a positive integer, got 0"),
    ("trace synth kv --batch 0 --seed 1 --out x.arrow", 2, E + "--batch must be a positive integer, got 0"),
    # --- workload flags
    ("run moe --tile-n 0", 2, E + "--tile-n must be an int >= 1, got 0"),
    ("run moe --tile-n -3", 2, E + "--tile-n must be an int >= 1, got -3"),
    ("run moe --tile-n 99999999999999999999", 2,
     E + "--tile-n must be at most 2,147,483,647 (2**31 - 1), got 99999999999999999999"),
    ("sweep sweep_huge_value.toml --out s", 2,
     E + "sweep_huge_value.toml (task tile_m=2147483648): config key 'tile_m' must be at most 2,147,483,647 (2**31 - "
         "1), got 2147483648"),
    ("run moe --tile-n abc", 2, RUN_USAGE + "argument --tile-n: invalid int value: 'abc'"),
    ("run moe --tiling diagonal", 2,
     RUN_USAGE + "argument --tiling: invalid choice: 'diagonal' (choose from 'static', 'dynamic')"),
    ("run attention --strategy fastest", 2,
     RUN_USAGE + "argument --strategy: invalid choice: 'fastest' (choose from 'coarse', 'interleave', 'dynamic')"),
    ("run moe --regions 3", 2, E + "regions must divide the number of experts 8, got 3"),
    ("run moe --tile-f 5", 2, E + "tile_f must be a positive divisor of the intermediate size 14336, got 5"),
    ("run moe --hidden 64", 2, E + "--hidden only applies with model 'custom' (model is 'mixtral-8x7b')"),
    ("run moe --model gpt5", 2,
     E + "unknown model 'gpt5'; expected one of ['deepseek-moe-16b', 'deepseek-v3', 'gpt-oss-120b', 'gpt-oss-20b', "
         "'llama-4-maverick', 'llama-4-scout', 'mixtral-8x7b', 'qwen3-235b-a22b', 'qwen3-30b-a3b', 'custom'], an alias (deepseek, deepseek-r1, deepseekr1, "
         "deepseekv3, deepseekv316b, gptoss120b, gptoss20b, llama4-maverick, llama4-scout, mixtral, mixtral8x7b, qwen, qwen235b, qwen3-235b, "
         "qwen30b) or a Hugging Face config.json path"),
    ("run moe --model custom", 2, E + "model 'custom' needs --hidden, --intermediate, --experts, --top-k"),
    ("run moe --channel-depth 0", 2, E + "--channel-depth must be an int >= 1, got 0"),
    ("run moe --compute-bw 0", 2, E + "--compute-bw must be an int >= 1, got 0"),
    ("run swiglu --check", 2, E + "--check needs --functional (it compares the values a functional run stored)"),
    ("run moe --tiling dynamic --tile-n 16", 2, E + "--tile-n does not apply to tiling 'dynamic' (dynamic tiling "
                                                    "packs each expert's tokens into one tile)"),
    ("run moe --softmax stable", 2, E + "--softmax does not apply to workload 'moe' (it applies to: attention, "
                                        "prefill_attention, decoder)"),
    ("run moe --tile-m 16", 2, E + "--tile-m does not apply to workload 'moe' (it applies to: swiglu, prefill_attention, mla_prefill)"),
    ("metrics swiglu --tiling static", 2, E + "--tiling does not apply to workload 'swiglu' (it applies to: moe, "
                                              "decoder)"),
    ("run moe --iteration -1", 2, E + "--iteration must be an int >= 0, got -1"),
    ("run moe --layer -2", 2, E + "--layer must be an int >= 0, got -2"),
    # --- output destinations (checked before any work)
    ("run swiglu --out /proc/x", 2, E + "--out /proc/x: cannot write under /proc"),
    ("run swiglu --out a_file/x", 2, E + "--out a_file/x: a_file is a file, not a folder"),
    ("run swiglu --out a_file", 2, E + "--out a_file: is a file; give a folder (stepsim writes several files into it)"),
    ("run swiglu --out taken.parquet", 2,
     E + "--out taken.parquet: table file taken_units.parquet: is a folder; give a file name"),
    ("run swiglu --out a_file/x.parquet", 2, E + "--out a_file/x.parquet: a_file is a file, not a folder"),
    ("demo --out x.parquet", 2,
     E + "--out x.parquet: give a folder, not a .parquet file name (this command writes several files into it)"),
    ("reproduce all --traces traces_empty --out r.parquet", 2,
     E + "--out r.parquet: give a folder, not a .parquet file name (this command writes several files into it)"),
    ("metrics swiglu --out /proc/x", 2, E + "--out /proc/x: cannot write under /proc"),
    ("demo --out a_file", 2, E + "--out a_file: is a file; give a folder (stepsim writes several files into it)"),
    ("reproduce all --traces traces_empty --out a_file", 2,
     E + "--out a_file: is a file; give a folder (stepsim writes several files into it)"),
    ("trace synth kv --batch 4 --seed 1 --out a_file/k.arrow", 2, E + "--out a_file/k.arrow: a_file is a file, not "
                                                                      "a folder"),
    ("trace import mixtral_b4/003_007.npz --out a_file/t.parquet", 2,
     E + "--out a_file/t.parquet: a_file is a file, not a folder"),
    ("sweep sweep_ok.toml --out a_file", 2,
     E + "cannot write the sweep's output folder a_file (--out / the sweep file's out): a file is in the way (the "
         "output is a folder)"),
    ("sweep sweep_ok.toml --out /proc/x", 2, E + "--out /proc/x: cannot write under /proc"),
    ("sweep sweep_proc_out.toml", 2, E + "sweep_proc_out.toml: out /proc/sweep: cannot write under /proc"),
    # --- sweep files and flags
    ("sweep sweep_ok.toml --jobs 0", 2, None),  # names the machine's CPU count: fragment below
    ("sweep sweep_ok.toml --jobs -1", 2, None),
    ("sweep missing.toml", 2, E + "sweep file not found: missing.toml"),
    ("sweep sweep_syntax.toml", 2, E + "sweep_syntax.toml: not valid TOML: Expected ']' at the end of a table "
                                       "declaration (at line 1, column 6)"),
    ("sweep sweep_unknown.toml", 2,
     E + "sweep_unknown.toml: unknown key 'tile_mm' in [fixed] (did you mean 'tile_m'?); known keys: model, hidden, "
         "intermediate, experts, top_k, trace, iteration, layer, batch_id, tiling, tile_n, tile_f, tile_m, regions, "
         "strategy, softmax, compute_bw, channel_depth, fifo_depths, hardware, convention, routing, kv_lengths, "
         "kv_heads, op, bytes, algorithm, system, ep, placement, tp, layers, pp, micro_batches, no_fuse, spill"),
    ("sweep sweep_type.toml --out s", 2,
     E + "sweep_type.toml (task tile_m=big): config key 'tile_m' must be an int >= 1, got 'big'"),
    ("sweep sweep_huge.toml --out s", 2,
     E + "sweep_huge.toml: the grid has 20,000 points, more than 10,000; pass --yes to run it (or set max_tasks = "
         "20000 in the sweep file); --dry-run lists the first tasks"),
    ("sweep sweep_binary.toml", 2, E + "sweep_binary.toml: not valid TOML: 'utf-8' codec can't decode byte 0xff in "
                                       "position 0: invalid start byte"),
    ("sweep sweep_empty_axis.toml --out s", 2, E + "sweep_empty_axis.toml: [axes] tile_m has no values"),
    ("sweep sweep_no_workload.toml --out s", 2,
     E + "sweep_no_workload.toml: missing key 'workload' (one of moe, swiglu, attention, prefill_attention, mla_attention, mla_prefill, sliding_attention, decoder, collective)"),
    # --- hardware TOML files
    ("run swiglu --hardware missing.toml", 2, None),
    ("run swiglu --hardware step-fast", 2,
     E + "--hardware must be a preset (sn40l, step-eval, step-hdl) or a .toml file, got 'step-fast'"),
    ("run swiglu --hardware hw_syntax.toml", 2,
     E + "cannot read hardware config hw_syntax.toml: Invalid value (at line 1, column 16)"),
    ("run swiglu --hardware hw_unknown.toml", 2,
     E + "hw_unknown.toml: unknown hardware key 'hbm_chanels'; known keys: addr_offset, channel_depth, clock_hz, "
         "compute_units, hbm_capacity_bytes, hbm_channels, hbm_init_interval, hbm_latency, hbm_outstanding, "
         "hbm_start_up, memory_units, name, on_chip_capacity_bytes, peak_flops_per_cycle, pmu_bw"),
    ("run swiglu --hardware hw_negative.toml", 2,
     E + "hw_negative.toml: hardware 'step-eval': hbm_channels must be a positive int, got -4"),
    ("run swiglu --hardware hw_depth.toml", 2,
     E + "hw_depth.toml: hardware 'step-eval': channel_depth must be None or an int >= 1, got 0"),
    ("run swiglu --fifo-depths sweep_binary.toml", 2,
     E + "sweep_binary.toml: not a valid TOML file: 'utf-8' codec can't decode byte 0xff in position 0: invalid start "
         "byte"),
    ("run swiglu --hardware hw_huge.toml", 2,
     E + "hw_huge.toml: hardware 'step-eval': hbm_channels must be at most 2,147,483,647 (2**31 - 1), got "
         "99999999999999999999"),
    ("run swiglu --hardware hw_preset.toml", 2,
     E + "hw_preset.toml: unknown hardware preset 'step-fast'; known presets: sn40l, step-eval, step-hdl"),
    # --- reproduce
    ("reproduce fastest --traces traces_empty --out o", 2,
     E + "unknown experiment 'fastest'; expected one of dynamic-tiling, time-multiplexing, dynamic-parallelization, "
         "validation, all"),
    ("reproduce all --traces missing --out o", 2,
     E + "missing: traces folder not found (expected expert_routing/<mixtral|qwen>_b<B>/*.npz and "
         "kv_lengths/b<B>/<trace>_stdev<SSSS>_<start>_<end>.npy, as in ../shared/traces)"),
    ("reproduce all --traces traces_empty --out o", 2,
     E + "traces_empty/expert_routing: folder not found in the traces folder traces_empty (expected "
         "expert_routing/<mixtral|qwen>_b<B>/*.npz and kv_lengths/b<B>/<trace>_stdev<SSSS>_<start>_<end>.npy, as in "
         "../shared/traces)"),
    ("reproduce all --traces traces_empty --out o --jobs 0", 2, None),  # the same message as sweep's (below)
    # --- models and model files
    ("models show gpt5", 2,
     E + "unknown model 'gpt5'; expected one of "
         "deepseek-moe-16b, deepseek-v3, gpt-oss-120b, gpt-oss-20b, llama-3.1-8b, llama-4-maverick, llama-4-scout, mixtral-8x7b, qwen3-235b-a22b, "
         "qwen3-30b-a3b (aliases deepseek, deepseek-r1, deepseekr1, deepseekv3, deepseekv316b, gptoss120b, gptoss20b, "
         "llama, llama4-maverick, llama4-scout, mixtral, mixtral8x7b, qwen, qwen235b, qwen3-235b, qwen30b) or a Hugging "
     "Face config.json path"),
    ("models show config_bad.json", 2, E + "model file config_bad.json: not valid JSON: Expecting property name "
                                           "enclosed in double quotes (line 1, column 2)"),
    # MLA is read (issue 43): a latent rank without the per-head dimensions is refused
    ("models show config_mla.json", 2, E + "model file config_mla.json: missing field 'qk_nope_head_dim'"),
    ("models show config_missing.json", 2, E + "model file config_missing.json: missing field 'num_hidden_layers'"),
    ("run moe --model config_mla.json", 2, E + "model file config_mla.json: missing field 'qk_nope_head_dim'"),
    # --- timelines (checked before the run: nothing is simulated or written)
    ("run swiglu --timeline o/t.txt", 2,
     E + "--timeline o/t.txt: unknown trace format (use .json, .json.gz, .pftrace or .perfetto-trace)"),
    ("run swiglu --timeline-limit 100", 2, E + "--timeline-limit needs --timeline PATH"),
    ("run swiglu --timeline-min-dur 5", 2, E + "--timeline-min-dur needs --timeline PATH"),
    ("run swiglu --timeline o/t.json --timeline-limit 0", 2, E + "--timeline-limit 0: give a record count >= 1"),
    ("run swiglu --timeline o/t.json --timeline-min-dur -1", 2, E + "--timeline-min-dur -1: give cycles >= 0"),
    # --- values of the right type that mean nothing (issue 44); * each was accepted
    ("run moe --ep 1", 2, E + "--ep must be an int >= 2 (chips), got 1"),  # * another graph than the one-chip layer
    ("metrics moe --ep 1 --layers 2", 2, E + "--ep must be an int >= 2 (chips), got 1"),
    ("server start --idle-timeout nan", 2, E + "--idle-timeout must be a positive number of seconds, got nan"),  # *
    ("server start --wait inf", 2, E + "--wait must be a positive number of seconds, got inf"),
]

#: cases whose line holds a machine- or install-dependent part: (command line, fragments of the last line)
FRAGMENTS = {
    "run attention --batch-id 7": ["synthetic_kv_b16.arrow: no decode batch with --batch-id 7 (batch ids 0..0)"],
    "sweep sweep_ok.toml --jobs 0": [E + "--jobs must be an int >= 1 (leave it out to use every CPU: ", "got 0"],
    "sweep sweep_ok.toml --jobs -1": [E + "--jobs must be an int >= 1 (leave it out to use every CPU: ", "got -1"],
    "reproduce all --traces traces_empty --out o --jobs 0": [
        E + "--jobs must be an int >= 1 (leave it out to use every CPU: ", "got 0"],
    "run swiglu --hardware missing.toml": [E + "cannot read hardware config missing.toml: ", "No such file"],
}


@pytest.fixture
def bad_files(tmp_path, monkeypatch):
    write_bad_files(tmp_path)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize(("command", "status", "line"), CLI_CASES, ids=[c[0] for c in CLI_CASES])
def test_cli_bad_input(bad_files, capsys, command, status, line):
    try:
        code = main(shlex.split(command))
    except SystemExit as exc:  # argparse's own errors
        code = exc.code
    err = capsys.readouterr().err
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert code == status
    if line is None:
        assert all(fragment in last for fragment in FRAGMENTS[command]), last
    else:
        assert last == line
    assert [p for p in (*bad_files.glob("o/**/*"), *bad_files.glob("s/**/*")) if p.is_file()] == []  # nothing written


def _load(g, shape, tile):
    from stepsim.graph import BF16, LinearOffChipLoad, Tensor

    return LinearOffChipLoad(g, Tensor("x", shape, BF16), tile=tile, out_shape_tiled=(1, 1), stride=(1, 0))


def _routing(*row):
    return np.array([list(row)] * 4)


#: (name, callable, typed error, exact message)
API_CASES = [
    ("tensor-dtype", lambda G: G.Tensor("x", (4, 4), "float17"), ArgumentError,
     "tensor 'x': dtype must be one of bf16, fp16, fp32, int32, uint32, uint64, bool (a ScalarType such as "
     "stepsim.graph.BF16, or its name), got 'float17'"),
    ("tensor-1d", lambda G: G.Tensor("x", (4,), G.BF16), ArgumentError,
     "tensor 'x': shape must be at least 2-D with positive dims, got (4,)"),
    ("tensor-zero-dim", lambda G: G.Tensor("x", (4, 0), G.BF16), ArgumentError,
     "tensor 'x': shape must be at least 2-D with positive dims, got (4, 0)"),
    ("tensor-float-dim", lambda G: G.Tensor("x", (4, 2.5), G.BF16), ArgumentError,
     "tensor 'x': dim 1 of shape (4, 2.5) is 2.5, not an integer"),
    ("stream-negative-dim", lambda G: G.Stream(G.tile(G.FP32, 4, 4), (2, -1)), ArgumentError,
     "Stream<Tile[fp32](4, 4)>[2, -1]: entry 1 (rank 0) is -1; a dimension must be >= 0"),
    ("stream-no-dims", lambda G: G.Stream(G.tile(G.FP32, 4, 4), ()), ArgumentError,
     "Stream<Tile[fp32](4, 4)>: a stream shape needs at least one dimension, got ()"),
    ("stream-bool-dim", lambda G: G.Stream(G.tile(G.FP32, 4, 4), (True, 2)), ArgumentError,
     "Stream<Tile[fp32](4, 4)>[True, 2]: entry 0 (rank 1) is invalid: a dimension cannot be a bool, got True"),
    ("load-tile-does-not-divide", lambda G: _load(G.Graph("g"), (64, 256), (48, 256)), ShapeError,
     "LinearOffChipLoad_0: tile (48, 256) does not divide tensor 'x' of shape [64, 256] (last two dims must be "
     "multiples of the tile)"),
    ("moe-tiling", lambda G: G.build_moe(G.moe_model("mixtral"), _routing(0, 1), tiling="diagonal"), ArgumentError,
     "tiling must be 'static' or 'dynamic', got 'diagonal'"),
    ("moe-regions", lambda G: G.build_moe(G.moe_model("mixtral"), _routing(0, 1), regions=3), ArgumentError,
     "regions must divide the number of experts 8, got 3"),
    ("moe-expert-out-of-range", lambda G: G.build_moe(G.moe_model("mixtral"), _routing(0, 9)), ArgumentError,
     "routing: row 0 column 1: expert id 9 outside 0..7"),
    ("moe-top-k", lambda G: G.build_moe(G.moe_model("mixtral"), _routing(0, 1, 2)), ArgumentError,
     "routing: each token must pick top_k=2 experts, got 3 per row"),
    ("moe-model", lambda G: G.moe_model("gpt5"), ConfigError,
     "unknown model 'gpt5'; expected one of ['deepseek-moe-16b', 'deepseek-v3', 'gpt-oss-120b', 'gpt-oss-20b', "
     "'llama-4-maverick', 'llama-4-scout', 'mixtral-8x7b', 'qwen3-235b-a22b', 'qwen3-30b-a3b', 'custom'], an alias (deepseek, deepseek-r1, deepseekr1, "
     "deepseekv3, deepseekv316b, gptoss120b, gptoss20b, llama4-maverick, llama4-scout, mixtral, mixtral8x7b, qwen, qwen235b, qwen3-235b, qwen30b) or "
     "a Hugging Face config.json path"),
    ("attention-strategy", lambda G: G.build_attention(np.array([10, 20, 30, 40]), "fastest"), ArgumentError,
     "strategy must be one of 'dynamic', 'interleave', 'coarse'; got 'fastest'"),
    ("attention-negative-kv", lambda G: G.build_attention(np.array([10, -20, 30, 40])), ArgumentError,
     "kv_lengths[1] = -20 is negative (KV lengths count tokens)"),
    ("swiglu-tile", lambda G: G.build_swiglu(tile_m=0), ArgumentError, "tile_m must be a positive divisor of 64, got 0"),
    ("hardware-preset", lambda G: G.Hardware.preset("step-fast"), ConfigError,
     "unknown hardware preset 'step-fast'; known presets: sn40l, step-eval, step-hdl"),
    ("hardware-field", lambda G: G.Hardware.preset("step-eval", hbm_channels=0), ConfigError,
     "hardware 'step-eval': hbm_channels must be a positive int, got 0"),
    ("hardware-unknown-override", lambda G: G.Hardware.preset("step-eval", hbm_chanels=4), ConfigError,
     "overrides: unknown hardware key 'hbm_chanels'; known keys: addr_offset, channel_depth, clock_hz, "
     "compute_units, hbm_capacity_bytes, hbm_channels, hbm_init_interval, hbm_latency, hbm_outstanding, "
     "hbm_start_up, memory_units, name, on_chip_capacity_bytes, peak_flops_per_cycle, pmu_bw"),
    ("simulate-hardware", lambda G: G.simulate(G.build_swiglu(), "step-fast"), ConfigError,
     "unknown hardware preset 'step-fast'; known presets: sn40l, step-eval, step-hdl"),
    ("run-config-key", lambda G: G.run_config({"workload": "swiglu", "tile_mm": 4}), ConfigError,
     "unknown config key 'tile_mm' (did you mean 'tile_m'?); known keys: algorithm, batch_id, bytes, channel_depth, "
     "compute_bw, convention, ep, experts, fifo_depths, hardware, hidden, intermediate, iteration, kv_heads, "
     "kv_lengths, layer, layers, micro_batches, mode, model, no_fuse, op, placement, pp, program, regions, routing, "
     "softmax, spill, strategy, system, tile_f, "
     "tile_m, tile_n, tiling, top_k, tp, trace, workload"),
    ("run-config-too-large", lambda G: G.run_config({"workload": "moe", "channel_depth": 2**63}), ConfigError,
     "config key 'channel_depth' must be at most 2,147,483,647 (2**31 - 1), got 9223372036854775808"),
    ("run-config-mode", lambda G: G.run_config({"workload": "swiglu", "mode": "fast"}), ConfigError,
     "config key 'mode' must be one of 'metrics', 'simulate', 'functional', 'check', got 'fast'"),
    ("run-config-not-a-mapping", lambda G: G.run_config(["swiglu"]), ConfigError,
     "a config must be a mapping of knobs, got list"),
]


class _Api:
    """The public names the API cases use (imported once)."""

    def __init__(self):
        from stepsim import graph
        from stepsim.base.hardware import Hardware
        from stepsim.graph.dtypes import tile
        from stepsim.graph.stream import Stream
        from stepsim.models.presets import moe_model
        from stepsim.results.records import run_config
        from stepsim.simulation.simulate import simulate
        from stepsim.workloads.attention.build import build_attention
        from stepsim.workloads.moe.build import build_moe
        from stepsim.workloads.swiglu.build import build_swiglu

        self.__dict__.update(Tensor=graph.Tensor, Graph=graph.Graph, BF16=graph.BF16, FP32=graph.FP32, tile=tile,
                             Stream=Stream, Hardware=Hardware, run_config=run_config, simulate=simulate,
                             build_attention=build_attention, moe_model=moe_model, build_moe=build_moe,
                             build_swiglu=build_swiglu)


@pytest.mark.parametrize(("name", "call", "error", "message"), API_CASES, ids=[c[0] for c in API_CASES])
def test_python_api_bad_input(name, call, error, message):
    with pytest.raises(error) as exc:
        call(_Api())
    assert str(exc.value) == message
    assert isinstance(exc.value, StepsimError)


def test_the_table_holds_at_least_80_cases():
    assert len(CLI_CASES) + len(API_CASES) >= 80


@pytest.mark.slow
def test_functional_run_under_an_address_space_limit_is_an_arena_error(tmp_path):
    """``ulimit -v``: the functional run refuses before generating inputs (no MemoryError traceback)."""
    import resource
    import subprocess
    import sys

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (3 * 2**30, resource.RLIM_INFINITY))

    proc = subprocess.run([sys.executable, "-m", "stepsim", "run", "moe", "--functional"], cwd=tmp_path,
                          capture_output=True, text=True, preexec_fn=limit, timeout=600)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("stepsim: error: functional mode needs 5,378.00 MiB for its tensors alone (fp32) but only ")
    assert last.endswith("of memory is available to this process (free memory and ulimit -v); use smaller model "
                         "dimensions (e.g. stepsim.workloads.reference.small_moe_model)")


def test_a_static_tile_larger_than_the_batch_warns_in_one_line(capsys):
    assert main(["metrics", "moe", "--tile-n", "4096", "--json"]) == 0
    assert capsys.readouterr().err == (
        "stepsim: warning: tile_n 4096 is larger than the batch (64 tokens): every expert tile is mostly padding; "
        "tiles up to 64 give the same traffic with less on-chip memory\n")


#: a few table cases again as a user runs them (a new process: the real exit status, stderr and stdout)
SUBPROCESS_CASES = ["run moe --trace text.npz", "trace synth routing --model mixtral --tokens 10 --seed -1 --out x.arrow",
                    "run swiglu --out /proc/x", "sweep sweep_unknown.toml"]


@pytest.mark.parametrize("command", SUBPROCESS_CASES)
def test_cli_bad_input_in_a_new_process(bad_files, command):
    import subprocess
    import sys

    [(status, line)] = [(c[1], c[2]) for c in CLI_CASES if c[0] == command]
    proc = subprocess.run([sys.executable, "-m", "stepsim", *shlex.split(command)], cwd=bad_files,
                          capture_output=True, text=True, timeout=120)
    assert "Traceback" not in proc.stderr
    assert (proc.returncode, proc.stderr.strip().splitlines()[-1], proc.stdout) == (status, line, "")
