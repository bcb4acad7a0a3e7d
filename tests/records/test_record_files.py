"""Records written with ``RunResult.write`` come back identical through Parquet, read_runs and pyarrow.dataset."""

import json

import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from stepsim.base.errors import ConfigError
from stepsim.base.files import file_sha256, stable_hash
from stepsim.cli import main
from stepsim.results.records import CHANNEL_SCHEMA, SCHEMA, UNIT_SCHEMA, read_runs, run_config
from stepsim.workloads.config import bundled_trace

CONFIGS = [
    {"workload": "swiglu", "tile_m": 16, "tile_n": 16, "mode": "simulate"},
    {"workload": "swiglu", "tile_m": 32, "tile_n": 64, "mode": "simulate"},
    {"workload": "attention", "strategy": "interleave"},
]


@pytest.fixture(scope="module")
def runs():
    return [run_config(c) for c in CONFIGS]


def _by_id(rows):
    return {r["run_id"]: r for r in rows}


def test_flat_write_round_trips_the_row_units_and_provenance(tmp_path, runs):
    run = runs[0]
    paths = run.write(tmp_path)
    stem = run.run_id[:16]
    assert paths == {"run": tmp_path / f"part-{stem}.parquet", "units": tmp_path / f"_units-{stem}.parquet",
                     "channels": tmp_path / f"_channels-{stem}.parquet"}
    table = pq.read_table(paths["run"])
    assert table.to_pylist() == [run.row]
    assert table.schema.equals(SCHEMA)  # field metadata (units) included
    assert table.schema.field("cycles").metadata == {b"unit": b"cycles"}
    meta = table.schema.metadata
    config = json.loads(meta[b"stepsim.config"])
    assert config == {"config": run.config, "trace_sha256": None}
    assert meta[b"stepsim.config_hash"].decode() == stable_hash(config) == run.run_id
    assert meta[b"stepsim.version"].decode() == run.row["stepsim_version"]
    assert pq.read_table(paths["units"]).to_pylist() == run.unit_table().to_pylist()
    assert pq.read_table(paths["units"]).schema.equals(UNIT_SCHEMA)
    assert pq.read_table(paths["channels"]).to_pylist() == run.channel_table().to_pylist()
    assert pq.read_table(paths["channels"]).schema.equals(CHANNEL_SCHEMA)
    assert pq.read_table(paths["units"]).schema.metadata[b"stepsim.config_hash"].decode() == run.run_id
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp files left


def test_metrics_run_writes_only_its_row_with_the_trace_hash(tmp_path, runs):
    run = runs[2]
    paths = run.write(tmp_path)
    assert list(paths) == ["run"] and sorted(p.name for p in tmp_path.iterdir()) == [paths["run"].name]
    meta = pq.read_table(paths["run"]).schema.metadata
    assert meta[b"stepsim.trace_hash"].decode() == file_sha256(bundled_trace("attention")) == run.row["trace_sha256"]


def test_partitioned_folder_reads_back_through_read_runs_and_pyarrow_dataset(tmp_path, runs):
    for run in runs:
        run.write(tmp_path, partition_cols=("workload", "mode"))
    run.write(tmp_path, partition_cols=("workload", "mode"))  # rewriting a run replaces its file
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("part-*.parquet")) == sorted(
        f"workload={r.row['workload']}/mode={r.row['mode']}/part-{r.run_id[:16]}.parquet" for r in runs)

    table = read_runs(tmp_path, ("workload", "mode"))
    assert table.num_rows == 3
    assert _by_id(table.to_pylist()) == _by_id(r.row for r in runs)  # partition columns come back as strings
    assert table.schema.field("off_chip_bytes").metadata == {b"unit": b"bytes"}

    # plain pyarrow.dataset discovery sees the rows only: the unit/channel files start with "_"
    dataset = ds.dataset(tmp_path, format="parquet", partitioning="hive")
    assert sorted(dataset.to_table(columns=["run_id"]).column("run_id").to_pylist()) == sorted(r.run_id for r in runs)
    simulated = dataset.to_table(filter=pc.field("mode") == "simulate")
    assert sorted(simulated.column("cycles").to_pylist()) == sorted(r.row["cycles"] for r in runs[:2])

    units = read_runs(tmp_path, ("workload", "mode"), kind="units")
    assert units.num_rows == sum(r.unit_table().num_rows for r in runs[:2])
    for run in runs[:2]:
        mine = units.filter(pc.field("run_id") == run.run_id)
        assert sum(mine.column("fires").to_pylist()) == run.row["fires"]
    channels = read_runs(tmp_path, ("workload", "mode"), kind="channels",
                         filter=pc.field("run_id") == runs[1].run_id)
    assert channels.drop_columns(["workload", "mode"]).to_pylist() == runs[1].channel_table().to_pylist()


def test_partition_on_a_null_column_is_refused(tmp_path, runs):
    with pytest.raises(ConfigError, match=r"partition column 'model' must hold exactly one non-null value"):
        runs[0].write(tmp_path, partition_cols=("model",))


def test_read_runs_names_the_missing_files_and_bad_kinds(tmp_path):
    with pytest.raises(ConfigError) as err:
        read_runs(tmp_path, kind="units")
    assert str(err.value) == f"{tmp_path}: no result files (_units-*.parquet) found"
    with pytest.raises(ConfigError, match="kind must be one of runs, units, channels, got 'rows'"):
        read_runs(tmp_path, kind="rows")


def test_run_cli_out_writes_the_record_and_counter_tables(tmp_path, capsys):
    assert main(["run", "swiglu", "--tile-m", "64", "--tile-n", "128", "--json", "--out", str(tmp_path)]) == 0
    captured = capsys.readouterr()
    row = json.loads(captured.out)
    stem = row["run_id"][:16]
    assert captured.err.splitlines() == [f"wrote run: {tmp_path / f'part-{stem}.parquet'}",
                                         f"wrote units: {tmp_path / f'_units-{stem}.parquet'}",
                                         f"wrote channels: {tmp_path / f'_channels-{stem}.parquet'}"]
    written = pq.read_table(tmp_path / f"part-{stem}.parquet").to_pylist()
    assert written == [row]
    units = pq.read_table(tmp_path / f"_units-{stem}.parquet")
    assert sum(units.column("fires").to_pylist()) == row["fires"]


def test_metrics_cli_out_writes_the_row(tmp_path, capsys):
    assert main(["metrics", "attention", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "wrote run: " in out and "off_chip_bytes_symbolic" in out
    assert read_runs(tmp_path).column("workload").to_pylist() == ["attention"]
