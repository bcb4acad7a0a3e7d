"""stepsim.base.files: atomic Parquet writes with provenance and units, partitioned result sets, hashes."""

from __future__ import annotations

import hashlib
import os
import stat

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from stepsim._version import __version__
from stepsim.base import files as results
from stepsim.base.errors import ConfigError, OutputError
from stepsim.base.files import (
    file_sha256,
    provenance_metadata,
    read_results,
    stable_hash,
    write_parquet_atomic,
    write_partitioned,
)

CONFIG = {"model": "qwen", "batch": 64, "tiling": {"tile_N": 32, "tile_F": 48}, "seed": 5}


def _row(model="qwen", tiling="32", cycles=562_945, on_chip=189_696):
    return pa.table(
        {
            "model": [model],
            "tiling": [tiling],
            "cycles": pa.array([cycles], pa.int64()),
            "on_chip_bytes": pa.array([on_chip], pa.int64()),
            "util_pct": pa.array([12.5], pa.float64()),
        }
    )


def test_stable_hash_is_canonical():
    a = {"b": 1, "a": [1, 2, {"y": 2, "x": 1}]}
    b = {"a": [1, 2, {"x": 1, "y": 2}], "b": 1}
    assert stable_hash(a) == stable_hash(b)
    assert stable_hash(a) == hashlib.sha256(b'{"a":[1,2,{"x":1,"y":2}],"b":1}').hexdigest()
    assert stable_hash({"n": np.int64(3), "f": np.float32(0.5)}) == stable_hash({"n": 3, "f": 0.5})
    assert stable_hash([1, 2]) != stable_hash([2, 1])
    with pytest.raises(ConfigError, match="cannot hash"):
        stable_hash({"x": float("nan")})
    with pytest.raises(ConfigError, match="cannot hash a value of type object"):
        stable_hash({"x": object()})


def test_file_sha256(tmp_path):
    p = tmp_path / "f.bin"
    data = os.urandom(3 * 1024 * 1024 + 17)
    p.write_bytes(data)
    assert file_sha256(p) == hashlib.sha256(data).hexdigest()
    assert file_sha256(p, chunk_bytes=1000) == hashlib.sha256(data).hexdigest()


def test_write_parquet_atomic_metadata_and_units(tmp_path):
    trace = tmp_path / "trace.bin"
    trace.write_bytes(b"routing")
    meta = provenance_metadata(CONFIG, trace=trace, seed=5)
    out = write_parquet_atomic(
        _row(), tmp_path / "sub" / "r.parquet", meta, units={"cycles": "cycles", "on_chip_bytes": "bytes"}
    )
    assert out == tmp_path / "sub" / "r.parquet"
    t = pq.read_table(out)
    assert t.to_pylist() == _row().to_pylist()
    m = t.schema.metadata
    assert m[b"stepsim.version"] == __version__.encode()
    assert m[b"stepsim.config_hash"] == stable_hash(CONFIG).encode()
    assert m[b"stepsim.config"] == b'{"batch":64,"model":"qwen","seed":5,"tiling":{"tile_F":48,"tile_N":32}}'
    assert m[b"stepsim.trace_hash"] == hashlib.sha256(b"routing").hexdigest().encode()
    assert m[b"stepsim.seed"] == b"5"
    assert t.schema.field("cycles").metadata == {b"unit": b"cycles"}
    assert t.schema.field("on_chip_bytes").metadata == {b"unit": b"bytes"}
    assert t.schema.field("util_pct").metadata is None
    # no temp files left, ordinary permissions
    assert sorted(p.name for p in (tmp_path / "sub").iterdir()) == ["r.parquet"]
    mode = stat.S_IMODE(out.stat().st_mode)
    assert mode == 0o666 & ~results._UMASK


def test_same_input_same_bytes(tmp_path):
    meta = provenance_metadata(CONFIG, seed=5)
    a = write_parquet_atomic(_row(), tmp_path / "a.parquet", meta)
    b = write_parquet_atomic(_row(), tmp_path / "b.parquet", meta)
    assert a.read_bytes() == b.read_bytes()


def test_units_for_unknown_column(tmp_path):
    with pytest.raises(ConfigError, match="unknown column"):
        write_parquet_atomic(_row(), tmp_path / "x.parquet", units={"nope": "s"})
    assert not list(tmp_path.iterdir())


def test_interrupted_write_leaves_no_partial_file(tmp_path, monkeypatch):
    target = tmp_path / "r.parquet"
    real_write = pq.write_table

    def write_then_crash(table, where, **kwargs):
        real_write(table.slice(0, 0), where, **kwargs)  # something is on disk...
        assert os.path.getsize(where) > 0
        raise KeyboardInterrupt("simulated crash mid-write")  # ...then the process is interrupted

    monkeypatch.setattr(pq, "write_table", write_then_crash)
    with pytest.raises(KeyboardInterrupt):
        write_parquet_atomic(_row(), target)
    assert list(tmp_path.iterdir()) == []  # neither the target nor a temp file

    # an existing result survives an interrupted overwrite untouched
    monkeypatch.setattr(pq, "write_table", real_write)
    write_parquet_atomic(_row(cycles=1), target)
    before = target.read_bytes()
    monkeypatch.setattr(pq, "write_table", write_then_crash)
    with pytest.raises(KeyboardInterrupt):
        write_parquet_atomic(_row(cycles=2), target)
    assert target.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["r.parquet"]


def test_interrupted_replace_leaves_no_temp(tmp_path, monkeypatch):
    def fail_replace(src, dst):
        raise OSError("disk gone")

    monkeypatch.setattr(os, "replace", fail_replace)
    with pytest.raises(OutputError) as info:  # an OS error while writing is one line naming the path (issue 31)
        write_parquet_atomic(_row(), tmp_path / "r.parquet")
    assert str(info.value) == f"cannot write {tmp_path / 'r.parquet'}: disk gone"
    assert list(tmp_path.iterdir()) == []


def test_partitioned_write_and_read(tmp_path):
    root = tmp_path / "results"
    configs = [
        ({"model": "qwen", "tile": 32}, _row("qwen", "32", 100)),
        ({"model": "qwen", "tile": "dynamic"}, _row("qwen", "dynamic", 90)),
        ({"model": "mixtral", "tile": 16}, _row("mixtral", "16", 300)),
        ({"model": "mixtral", "tile": 64}, _row("mixtral", "64", 200)),
    ]
    paths = [
        write_partitioned(row, root, config=cfg, units={"cycles": "cycles"}, metadata={"stepsim.seed": "5"})
        for cfg, row in configs
    ]
    for (cfg, row), p in zip(configs, paths):
        rel = p.relative_to(root).as_posix()
        assert rel == f"model={row['model'][0]}/tiling={row['tiling'][0]}/part-{stable_hash(cfg)[:16]}.parquet"
        one = pq.read_table(p)  # plain pyarrow: the partition columns live in the path, not the file
        assert one.column_names == ["cycles", "on_chip_bytes", "util_pct"]
        assert one.schema.metadata[b"stepsim.config_hash"] == stable_hash(cfg).encode()
        assert one.schema.metadata[b"stepsim.seed"] == b"5"
        assert one.schema.field("cycles").metadata == {b"unit": b"cycles"}

    t = read_results(root)
    assert t.num_rows == 4
    # sorted by path: model=mixtral/tiling=16, mixtral/64, qwen/32, qwen/dynamic
    assert t.select(["model", "tiling", "cycles"]).to_pylist() == [
        {"model": "mixtral", "tiling": "16", "cycles": 300},
        {"model": "mixtral", "tiling": "64", "cycles": 200},
        {"model": "qwen", "tiling": "32", "cycles": 100},
        {"model": "qwen", "tiling": "dynamic", "cycles": 90},
    ]
    assert t.schema.field("cycles").metadata == {b"unit": b"cycles"}
    q = read_results(root, filter=pc.field("model") == "qwen")
    assert sorted(q.column("cycles").to_pylist()) == [90, 100]

    # plain pyarrow.dataset over the folder with hive partitioning sees the same rows
    d = ds.dataset(root, format="parquet", partitioning="hive")
    assert d.count_rows() == 4
    assert sorted(d.to_table().column("cycles").to_pylist()) == [90, 100, 200, 300]


def test_partitioned_rewrite_is_idempotent(tmp_path):
    cfg = {"model": "qwen", "tile": 32}
    p1 = write_partitioned(_row(cycles=1), tmp_path, config=cfg)
    p2 = write_partitioned(_row(cycles=2), tmp_path, config=cfg)
    assert p1 == p2
    assert read_results(tmp_path).column("cycles").to_pylist() == [2]


def test_partition_values_are_escaped(tmp_path):
    p = write_partitioned(_row(model="qwen/30b a3b", tiling="dyn"), tmp_path)
    assert p.parent.parent.name == "model=qwen%2F30b%20a3b"
    assert read_results(tmp_path).column("model").to_pylist() == ["qwen/30b a3b"]


def test_partitioned_errors(tmp_path):
    two = pa.concat_tables([_row("qwen"), _row("mixtral")])
    with pytest.raises(ConfigError, match="partition column 'model' must hold exactly one non-null value"):
        write_partitioned(two, tmp_path)
    with pytest.raises(ConfigError, match="partition column 'tiling' is not in the result table"):
        write_partitioned(_row().drop_columns(["tiling"]), tmp_path)
    with pytest.raises(ConfigError, match="no result files"):
        read_results(tmp_path / "empty")


def test_read_results_unifies_columns(tmp_path):
    write_partitioned(_row("qwen", "32", 100), tmp_path, config={"a": 1})
    newer = _row("qwen", "64", 50).append_column("off_chip_bytes", pa.array([4096], pa.int64()))
    write_partitioned(newer, tmp_path, config={"a": 2})
    t = read_results(tmp_path)
    assert t.select(["tiling", "cycles", "off_chip_bytes"]).to_pylist() == [
        {"tiling": "32", "cycles": 100, "off_chip_bytes": None},
        {"tiling": "64", "cycles": 50, "off_chip_bytes": 4096},
    ]
