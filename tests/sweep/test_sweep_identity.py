"""A sweep resumes only results of the same run: the run id hashes what determines a result (hardware values
after its file, trace content, every knob, the timing-model version), never how a path is spelled; a folder
never holds, and read_sweep never returns, two generations of one task."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pyarrow.parquet as pq
from sweep_helpers import files_under

from stepsim.base import defaults
from stepsim.batch import expand, load_sweep, run_sweep
from stepsim.batch.rows import WALL_TIME_COLUMNS, read_sweep
from stepsim.results.records import run_config, run_identity
from stepsim.workloads.config import bundled_trace

SWIGLU_ON_A_HARDWARE_FILE = """
workload = "swiglu"
mode = "simulate"
out = "results"
[fixed]
hardware = "hw.toml"
[axes]
tile_m = [16, 64]
"""


def comparable(table) -> list:
    """Rows by (tile_m, run id) without wall-clock columns."""
    rows = table.drop_columns([c for c in WALL_TIME_COLUMNS if c in table.column_names]).to_pylist()
    return sorted(rows, key=lambda r: (str(r.get("tile_m")), r["run_id"]))


def test_editing_the_hardware_file_between_two_runs_resimulates_and_equals_a_fresh_run(sweep_file, tmp_path):
    # the scenario: SwiGLU over tile_m 16/64, the hardware file goes from 32 to 4 HBM channels
    hw = tmp_path / "hw.toml"
    hw.write_text('preset = "step-eval"\nhbm_channels = 32\n')
    spec = load_sweep(sweep_file(SWIGLU_ON_A_HARDWARE_FILE))
    first = run_sweep(spec, jobs=1, progress=False)
    assert first.ran == 2
    wide = {r["tile_m"]: r["cycles"] for r in read_sweep(spec.out).to_pylist()}
    assert wide == {16: 66_221, 64: 42_605}

    hw.write_text('preset = "step-eval"\nhbm_channels = 4\n')
    resumed = run_sweep(spec, jobs=1, progress=False)
    assert resumed.ran == 2 and not resumed.skipped and resumed.superseded == 2
    rows = read_sweep(spec.out).to_pylist()
    assert len(rows) == 2
    assert {r["tile_m"]: r["cycles"] for r in rows} == {16: 66_928, 64: 43_499}
    assert {r["hardware_name"] for r in rows} == {"step-eval+hbm_channels=4"}
    assert {r["hbm_bytes_per_cycle"] for r in rows} == {4 * 64 // 2}
    assert len(files_under(spec.out, "**/part-*.parquet")) == 2  # the old generation's files are gone
    assert len(files_under(spec.out, "**/_units-*.parquet")) == 2

    fresh = run_sweep(spec, out=tmp_path / "fresh", jobs=1, progress=False)
    assert fresh.ran == 2
    assert comparable(read_sweep(spec.out)) == comparable(read_sweep(tmp_path / "fresh"))
    assert run_sweep(spec, jobs=1, progress=False).ran == 0  # unchanged file: resumes


def test_a_regenerated_trace_under_the_same_name_replaces_its_rows(sweep_file, tmp_path):
    traces = tmp_path / "kv"
    traces.mkdir()
    np.save(traces / "b4.npy", np.array([100, 300, 200, 50], dtype=np.int64))
    spec = load_sweep(sweep_file('workload = "attention"\nout = "r"\n[fixed]\ntrace = "kv/b4.npy"\n'
                                 '[axes]\nstrategy = ["coarse", "dynamic"]\n'))
    first = run_sweep(spec, jobs=1, progress=False)
    old = {r["strategy"]: r["off_chip_bytes"] for r in read_sweep(spec.out).to_pylist()}
    np.save(traces / "b4.npy", np.array([900, 1300, 1200, 1050], dtype=np.int64))
    second = run_sweep(spec, jobs=1, progress=False)
    assert (first.ran, second.ran, second.superseded) == (2, 2, 2)
    rows = read_sweep(spec.out).to_pylist()
    assert len(rows) == 2  # not 4: one generation per task
    new = {r["strategy"]: r["off_chip_bytes"] for r in rows}
    assert all(new[s] > old[s] for s in old)
    assert {r["trace_sha256"] for r in rows} == {t.trace_sha256 for t in expand(spec)}


def test_read_sweep_keeps_the_newest_generation_of_a_folder_no_sweep_cleaned(sweep_file, tmp_path):
    # an older layout's folder holding two generations of one task: read_sweep returns the newest file's row
    traces = tmp_path / "kv"
    traces.mkdir()
    np.save(traces / "b4.npy", np.array([100, 300, 200, 50], dtype=np.int64))
    spec = load_sweep(sweep_file('workload = "attention"\nout = "r"\n[fixed]\ntrace = "kv/b4.npy"\n'))
    run_sweep(spec, jobs=1, progress=False)
    (old,) = spec.out.glob("**/part-*.parquet")
    keep = old.with_name("part-0000000000000000.parquet")
    shutil.copy(old, keep)
    old.unlink()
    os.utime(keep, ns=(1, 1))  # written long ago
    np.save(traces / "b4.npy", np.array([900, 1300, 1200, 1050], dtype=np.int64))
    row = run_config({"workload": "attention", "trace": str(traces / "b4.npy")})
    newer = spec.out / "workload=attention" / f"part-{row.run_id[:16]}.parquet"
    pq.write_table(_row_like(keep, row), newer)
    rows = read_sweep(spec.out).to_pylist()
    assert [r["run_id"] for r in rows] == [row.run_id]


def _row_like(template, record):
    """``record``'s row in the columns of the sweep row file ``template``."""
    import pyarrow as pa

    schema = pq.read_schema(template)
    values = {**record.row, "status": "ok"}
    return pa.Table.from_pylist([{n: values.get(n) for n in schema.names}], schema=schema)


def test_one_run_spelled_with_different_paths_has_one_run_id(tmp_path, monkeypatch):
    trace = bundled_trace("attention")
    copy = tmp_path / "copy.arrow"
    shutil.copy(trace, copy)
    monkeypatch.chdir(tmp_path)
    absolute = run_identity({"workload": "attention", "trace": str(copy)})
    relative = run_identity({"workload": "attention", "trace": "copy.arrow"})
    dotted = run_identity({"workload": "attention", "trace": "./../" + tmp_path.name + "/copy.arrow"})
    bundled = run_identity({"workload": "attention"})
    assert absolute[0] == relative[0] == dotted[0] == bundled[0]
    (tmp_path / "hw.toml").write_text('preset = "step-eval"\nhbm_channels = 8\n')
    (tmp_path / "sub").mkdir()
    shutil.copy(tmp_path / "hw.toml", tmp_path / "sub" / "other-name.toml")
    ids = {run_identity({"workload": "swiglu", "hardware": path})[0]
           for path in ("hw.toml", str(tmp_path / "hw.toml"), "sub/../hw.toml", "sub/other-name.toml")}
    assert len(ids) == 1
    # and the record agrees with the prediction, whichever spelling ran
    assert run_config({"workload": "attention", "trace": "copy.arrow"}).run_id == absolute[0]


def test_the_run_id_changes_with_the_hardware_values_and_the_timing_model_version(tmp_path, monkeypatch):
    hw = tmp_path / "hw.toml"
    hw.write_text('preset = "step-hdl"\n')
    config = {"workload": "swiglu", "hardware": str(hw), "mode": "simulate"}
    same_as_preset = run_identity(config)[0]
    assert same_as_preset == run_identity({**config, "hardware": "step-hdl"})[0]
    assert same_as_preset == run_identity({"workload": "swiglu", "mode": "simulate"})[0]  # the workload's preset
    hw.write_text('preset = "step-hdl"\nhbm_latency = 3\n')
    assert run_identity(config)[0] != same_as_preset
    hw.write_text('preset = "step-hdl"\n')
    monkeypatch.setattr(defaults, "TIMING_MODEL_VERSION", defaults.TIMING_MODEL_VERSION + 1)
    from stepsim.results import records

    monkeypatch.setattr(records, "TIMING_MODEL_VERSION", defaults.TIMING_MODEL_VERSION)
    assert run_identity(config)[0] != same_as_preset


def test_a_model_config_file_counts_by_its_content_not_its_path(tmp_path, monkeypatch):
    from importlib import resources

    shipped = resources.files("stepsim") / "data" / "models" / "mixtral-8x7b.json"
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "config.json").write_bytes(shipped.read_bytes())
    (tmp_path / "b.json").write_bytes(shipped.read_bytes())
    monkeypatch.chdir(tmp_path)
    base = {"workload": "moe", "tiling": "dynamic", "trace": bundled_trace("mixtral-8x7b")}
    ids = {run_identity({**base, "model": path})[0]
           for path in ("a/config.json", str(tmp_path / "a" / "config.json"), "b.json", "./a/../b.json")}
    assert len(ids) == 1
    (tmp_path / "b.json").write_text((tmp_path / "b.json").read_text().replace('"num_local_experts": 8',
                                                                               '"num_local_experts": 16'))
    assert run_identity({**base, "model": "b.json"})[0] not in ids
