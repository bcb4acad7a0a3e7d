"""Sweep files: grid expansion (lists, ranges, trace globs, several grids) and typed errors naming key and file.

No task runs here: expansion only normalizes configs and hashes traces.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from stepsim.base.errors import ConfigError
from stepsim.batch.config import load_sweep, parse_sweep
from stepsim.batch.grid import expand


def write(folder: Path, text: str, name: str = "sweep.toml") -> Path:
    path = folder / name
    path.write_text(text)
    return path


def swiglu(tile_m: int, tile_n: int, mode: str = "simulate", **extra) -> dict:
    """A normalized SwiGLU task config (defaults filled in, unset knobs absent)."""
    return {"workload": "swiglu", "mode": mode, "tile_m": tile_m, "tile_n": tile_n, "convention": "published",
            **extra}


def test_small_sweep_expands_to_the_cartesian_product_last_axis_fastest(tmp_path):
    path = write(tmp_path, """
workload = "swiglu"
mode = "simulate"
out = "results"
[fixed]
compute_bw = 4096
[axes]
tile_m = [16, 32]
tile_n = {start = 16, stop = 65, factor = 2}
""")
    spec = load_sweep(path)
    tasks = expand(spec)
    assert spec.out == tmp_path / "results"
    assert spec.partition_by == ("workload",)
    assert spec.report == ("cycles", "off_chip_bytes")
    assert [t.index for t in tasks] == [0, 1, 2, 3, 4, 5]
    assert [t.config for t in tasks] == [
        swiglu(16, 16, compute_bw=4096), swiglu(16, 32, compute_bw=4096), swiglu(16, 64, compute_bw=4096),
        swiglu(32, 16, compute_bw=4096), swiglu(32, 32, compute_bw=4096), swiglu(32, 64, compute_bw=4096),
    ]
    # SwiGLU reads no trace; keys are the records' run_id prefix, all distinct
    assert {t.trace_path for t in tasks} == {None}
    assert len({t.key for t in tasks}) == 6
    assert all(t.key == t.run_id[:16] for t in tasks)


def test_expansion_is_deterministic_and_keys_do_not_depend_on_spelled_out_defaults(tmp_path):
    explicit = write(tmp_path, 'workload = "swiglu"\n[axes]\ntile_n = [32]\ntile_m = [16]\n', "a.toml")
    implicit = write(tmp_path, 'workload = "swiglu"\n[axes]\ntile_n = [32]\n', "b.toml")
    first, again = expand(load_sweep(explicit)), expand(load_sweep(explicit))
    assert [t.key for t in first] == [t.key for t in again]
    assert [t.key for t in expand(load_sweep(implicit))] == [first[0].key]
    assert first[0].config == swiglu(16, 32, mode="metrics")


@pytest.mark.parametrize("axis, values", [
    ("{start = 1, stop = 5, step = 1}", (1, 2, 3, 4)),
    ("{start = 16, stop = 4, step = -4}", (16, 12, 8)),
    ("{start = 8, stop = 128, factor = 2}", (8, 16, 32, 64)),
    ("{start = 8, stop = 129, factor = 4}", (8, 32, 128)),
    ("[64, 16, 32]", (64, 16, 32)),
])
def test_ranges_follow_python_range_with_exclusive_stop(tmp_path, axis, values):
    spec = load_sweep(write(tmp_path, f'workload = "swiglu"\n[axes]\ntile_n = {axis}\n'))
    assert spec.grids == ({"tile_n": values},)
    assert [t.config["tile_n"] for t in expand(spec)] == list(values)


def test_trace_glob_sweeps_every_matching_file_sorted_and_hashes_its_content(tmp_path):
    traces = tmp_path / "kv"
    traces.mkdir()
    for name, data in (("b16_high.npy", b"high"), ("b16_low.npy", b"low"), ("notes.txt", b"x")):
        (traces / name).write_bytes(data)
    (traces / "sub.npy").mkdir()  # folders never match, even with a matching name
    path = write(tmp_path, 'workload = "attention"\n[axes]\ntrace = {glob = "kv/*.npy"}\nstrategy = ["coarse"]\n')
    tasks = expand(load_sweep(path))
    high, low = (traces / "b16_high.npy").as_posix(), (traces / "b16_low.npy").as_posix()
    base = {"workload": "attention", "mode": "metrics", "strategy": "coarse", "softmax": "plain",
            "convention": "published"}
    assert [t.config for t in tasks] == [{**base, "trace": high}, {**base, "trace": low}]
    assert [t.trace_path for t in tasks] == [high, low]
    assert [t.trace_sha256 for t in tasks] == [hashlib.sha256(b"high").hexdigest(),
                                               hashlib.sha256(b"low").hexdigest()]


def test_trace_lists_are_relative_to_the_sweep_file_not_the_working_directory(tmp_path, monkeypatch):
    (tmp_path / "sweeps" / "traces").mkdir(parents=True)
    (tmp_path / "sweeps" / "traces" / "t.npy").write_bytes(b"t")
    path = write(tmp_path / "sweeps", 'workload = "attention"\n[fixed]\ntrace = "traces/t.npy"\n')
    monkeypatch.chdir(tmp_path)
    (task,) = expand(load_sweep(path))
    assert task.config["trace"] == (tmp_path / "sweeps" / "traces" / "t.npy").as_posix()


def test_several_axes_tables_run_one_after_the_other_and_drop_repeated_tasks(tmp_path):
    path = write(tmp_path, """
workload = "moe"
partition_by = ["workload", "tiling"]
[fixed]
model = "qwen3-30b-a3b"
[[axes]]
tiling = ["static"]
tile_n = [16, 32]
[[axes]]
tiling = ["dynamic"]
[[axes]]
tile_n = [32, 64]
""")
    tasks = expand(load_sweep(path))
    base = {"workload": "moe", "mode": "metrics", "model": "qwen3-30b-a3b", "convention": "published"}
    assert [t.config for t in tasks] == [
        {**base, "tiling": "static", "tile_n": 16}, {**base, "tiling": "static", "tile_n": 32},
        {**base, "tiling": "dynamic"}, {**base, "tiling": "static", "tile_n": 64},
    ]
    assert [t.index for t in tasks] == [0, 1, 2, 3]
    bundled = tasks[0].trace_path
    assert bundled.endswith("synthetic_routing_qwen_b64.arrow") and tasks[0].trace_sha256 is not None


def test_a_sweep_without_axes_is_one_task(tmp_path):
    tasks = expand(load_sweep(write(tmp_path, 'workload = "swiglu"\n[fixed]\ntile_n = 64\n')))
    assert [t.config for t in tasks] == [swiglu(16, 64, mode="metrics")]


KNOBS = ("model, hidden, intermediate, experts, top_k, trace, iteration, layer, batch_id, tiling, tile_n, tile_f, "
         "tile_m, regions, strategy, softmax, compute_bw, channel_depth, fifo_depths, hardware, convention, routing, "
         "kv_lengths, kv_heads, op, bytes, algorithm, system, ep, placement, tp, layers, pp, micro_batches, no_fuse, spill")


@pytest.mark.parametrize("text, message", [
    ('workload = "swiglu"\noutput = "x"\n',
     ("unknown key 'output' (did you mean 'out'?); known keys: workload, mode, out, partition_by, report, fixed, "
     "axes")),
    ('workload = "swiglu"\n[fixed]\ntile_nn = 3\n',
     f"unknown key 'tile_nn' in [fixed] (did you mean 'tile_n'?); known keys: {KNOBS}"),
    ('workload = "swiglu"\n[axes]\nbogus = [1]\n', f"unknown key 'bogus' in [axes]; known keys: {KNOBS}"),
    ('workload = "moe"\n[[axes]]\ntile_n = [16]\n[[axes]]\nmode = ["simulate"]\n',
     f"unknown key 'mode' in [[axes]] #2 (did you mean 'model'?); known keys: {KNOBS}"),
    ('workload = "swiglu"\n[axes]\ntile_n = {start = 1, stop = 5, stpe = 1}\n',
     "unknown key 'stpe' in [axes] tile_n (a range holds start, stop and step or factor; a file list holds glob)"),
    ('workload = "attention"\n[axes]\ntrace = {glob = "*.npy", recursive = true}\n',
     "unknown key 'recursive' in [axes] trace (a glob table holds only 'glob')"),
    ('workload = "swiglu"\nreport = ["cyclez"]\n',
     "report column 'cyclez' is not a result column (did you mean 'cycles'?)"),
    ('workload = "swiglu"\npartition_by = ["model"]\n',
     "partition_by key 'model' is not a key of the tasks (expected one of workload, mode)"),
    ('mode = "metrics"\n', "missing key 'workload' (one of moe, swiglu, attention, prefill_attention, mla_attention, mla_prefill, sliding_attention, decoder, collective)"),
    ('workload = "gemm"\n', "unknown workload 'gemm' (expected one of moe, swiglu, attention, prefill_attention, mla_attention, mla_prefill, sliding_attention, decoder, collective), "
     "or serve for a serving sweep"),
    ('workload = "swiglu"\nmode = "fast"\n', "mode must be one of metrics, simulate, functional, check, got 'fast'"),
    ('workload = "swiglu"\n[fixed]\ntile_n = 16\n[axes]\ntile_n = [16]\n',
     "key 'tile_n' is both in [fixed] and in [axes]; keep one"),
    ('workload = "swiglu"\n[fixed]\ntile_n = [16]\n', ("[fixed] tile_n must be a single value, got [16] "
                                                      "(sweep it under [axes])")),
    ('workload = "swiglu"\n[axes]\ntile_n = [16, 16]\n', "[axes] tile_n lists the value 16 twice"),
    ('workload = "swiglu"\n[axes]\ntile_n = []\n', "[axes] tile_n has no values"),
    ('workload = "swiglu"\n[axes]\ntile_n = {start = 1, stop = 5}\n',
     "[axes] tile_n: a range needs exactly one of 'step' and 'factor'"),
    ('workload = "swiglu"\n[axes]\ntile_n = {start = 1, stop = 5, step = 0}\n', "[axes] tile_n: range step must not be 0"),
    ('workload = "swiglu"\n[axes]\ntile_n = {start = 0, stop = 5, factor = 2}\n',
     "[axes] tile_n: a geometric range needs factor >= 2 and start >= 1, got start=0, factor=2"),
    ('workload = "swiglu"\n[axes]\ntile_n = {start = 1.5, stop = 5, step = 1}\n',
     "[axes] tile_n: range start must be an integer, got 1.5"),
    ('workload = "swiglu"\n[axes]\ntile_n = {glob = "*.npy"}\n',
     "[axes] tile_n: glob is only for file knobs (trace, hardware, fifo_depths, routing, kv_lengths)"),
])
def test_sweep_file_errors_name_the_file_and_the_key(tmp_path, text, message):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_sweep(path)
    assert str(info.value) == f"{path}: {message}"


@pytest.mark.parametrize("text, task, message", [
    ('workload = "swiglu"\n[axes]\ntiling = ["static"]\n', "tiling=static",
     "config key 'tiling' does not apply to workload 'swiglu' (it applies to: moe, decoder)"),
    ('workload = "swiglu"\n[axes]\ntile_n = [16, 0]\n', "tile_n=0", "config key 'tile_n' must be an int >= 1, got 0"),
    ('workload = "moe"\n[axes]\ntiling = ["static", "dynamic"]\ntile_n = [8]\n', "tiling=dynamic tile_n=8",
     ("config key 'tile_n' does not apply to tiling 'dynamic' (dynamic tiling packs each expert's tokens into one "
     "tile)")),
])
def test_knob_errors_found_at_expansion_name_the_file_the_task_and_the_key(tmp_path, text, task, message):
    path = write(tmp_path, text)
    spec = load_sweep(path)
    with pytest.raises(ConfigError) as info:
        expand(spec)
    assert str(info.value) == f"{path} (task {task}): {message}"


def test_glob_matching_nothing_and_invalid_toml_are_config_errors(tmp_path):
    path = write(tmp_path, 'workload = "attention"\n[axes]\ntrace = {glob = "nothing/*.npy"}\n')
    with pytest.raises(ConfigError) as info:
        load_sweep(path)
    assert str(info.value) == f"{path}: [axes] trace: glob 'nothing/*.npy' matches no file (relative to {tmp_path})"
    bad = write(tmp_path, 'workload = "swiglu\n', "bad.toml")
    with pytest.raises(ConfigError, match=r"bad\.toml: not valid TOML: "):
        load_sweep(bad)
    with pytest.raises(ConfigError) as info:
        load_sweep(tmp_path / "missing.toml")
    assert str(info.value) == f"sweep file not found: {tmp_path / 'missing.toml'}"


def test_parse_sweep_takes_already_parsed_data_with_a_source_label(tmp_path):
    spec = parse_sweep({"workload": "swiglu", "axes": {"tile_n": [16]}}, source=tmp_path / "inline.toml")
    assert spec.out is None and spec.grids == ({"tile_n": (16,)},) and spec.mode == "metrics"


def test_a_missing_trace_file_is_a_config_error_naming_the_sweep_file_and_task(tmp_path):
    path = write(tmp_path, 'workload = "attention"\n[axes]\ntrace = ["gone.npy"]\n')
    with pytest.raises(ConfigError) as info:
        expand(load_sweep(path))
    assert str(info.value).startswith(f"{path} (task trace=gone.npy): cannot read trace {tmp_path / 'gone.npy'}: ")
