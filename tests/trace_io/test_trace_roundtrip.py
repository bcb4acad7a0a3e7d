"""import -> write -> read preserves every value and the metadata, for every kind and both output formats."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from stepsim.trace_io import (
    expert_counts,
    open_trace,
    read_trace,
    routing_matrix,
    synthetic_kv_batches,
    synthetic_routing,
    validate_trace,
    write_trace,
)
from stepsim.trace_io.writers import ROW_GROUP_ROWS

SUFFIXES = [".arrow", ".parquet"]


def _roundtrip(table: pa.Table, tmp_path, suffix: str, name="out") -> pa.Table:
    out = tmp_path / f"{name}{suffix}"
    assert write_trace(table, out) == table.num_rows
    back = read_trace(out)
    assert back.equals(table)  # values and types
    assert back.schema.metadata == table.schema.metadata
    assert back.schema.equals(table.schema, check_metadata=True)
    return back


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_artifact_routing_roundtrip(shared_traces, tmp_path, suffix):
    for sub, name in (("mixtral_b64", "008_010.npz"), ("qwen_b64", "032_012.npz")):
        src = shared_traces / "expert_routing" / sub / name
        t = read_trace(src)
        back = _roundtrip(t, tmp_path, suffix, name=sub)
        with np.load(src) as z:
            assert np.array_equal(routing_matrix(back), z["data"])
        assert np.array_equal(expert_counts(back), expert_counts(t))


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_azure_requests_roundtrip(conv_csv, conv_requests, tmp_path, suffix):
    back = _roundtrip(conv_requests, tmp_path, suffix)
    # the values equal pyarrow's own parse of the CSV (timestamps exactly, at microsecond resolution)
    import pyarrow.csv as pcsv

    raw = pcsv.read_csv(conv_csv)
    assert back.column("arrival").cast(pa.timestamp("ns")).equals(raw.column("TIMESTAMP").cast(pa.timestamp("ns")))
    assert back.column("context_tokens").to_pylist() == raw.column("ContextTokens").to_pylist()
    assert back.column("generated_tokens").to_pylist() == raw.column("GeneratedTokens").to_pylist()
    assert back.column("request_id").to_pylist() == list(range(1, 19_367))


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_kv_npy_folder_roundtrip(shared_traces, tmp_path, suffix):
    t = read_trace(shared_traces / "kv_lengths" / "b64")
    assert t.num_rows == 15
    back = _roundtrip(t, tmp_path, suffix)
    files = sorted((shared_traces / "kv_lengths" / "b64").glob("*.npy"))
    for row, f in zip(back.to_pylist(), files):
        assert row["kv_lengths"] == np.load(f).tolist()


def test_csv_seven_digit_timestamps_exact(tmp_path):
    p = tmp_path / "azure.csv"
    p.write_bytes(
        b"TIMESTAMP,ContextTokens,GeneratedTokens\r\n"
        b"2023-11-16 18:17:03.9799600,374,44\r\n"
        b"2023-11-16 18:17:04.0000010,5,6\r\n"
        b"2023-11-16 23:59:59.9999990,0,0"  # no final newline
    )
    t = read_trace(p)
    assert t.column("arrival").to_pylist() == [
        dt.datetime(2023, 11, 16, 18, 17, 3, 979960),
        dt.datetime(2023, 11, 16, 18, 17, 4, 1),
        dt.datetime(2023, 11, 16, 23, 59, 59, 999999),
    ]
    assert t.column("context_tokens").to_pylist() == [374, 5, 0]
    assert t.column("request_id").to_pylist() == [1, 2, 3]
    for suffix in SUFFIXES:
        _roundtrip(t, tmp_path, suffix, name="azure")


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_synthetic_roundtrip_with_gate_weights(tmp_path, suffix):
    t = synthetic_routing(500, 16, 4, seed=7, gate_weights=True, batch=100, layer=3)
    back = _roundtrip(t, tmp_path, suffix)
    assert back.column("gate_weights").type == pa.list_(pa.float32(), 4)
    assert back.column("iteration").to_pylist()[99:101] == [0, 1]
    kv = synthetic_kv_batches(16, seed=1, num_batches=3)
    _roundtrip(kv, tmp_path, suffix, name="kv")


def test_conversion_chain_is_byte_stable(shared_traces, tmp_path):
    """npz -> arrow -> parquet -> arrow: the two arrow files are byte-identical."""
    src = shared_traces / "expert_routing" / "qwen_b64" / "032_012.npz"
    s1 = open_trace(src)
    write_trace(s1.batches(), tmp_path / "a.arrow", schema=s1.schema)
    s2 = open_trace(tmp_path / "a.arrow")
    write_trace(s2.batches(), tmp_path / "b.parquet", schema=s2.schema)
    s3 = open_trace(tmp_path / "b.parquet")
    write_trace(s3.batches(), tmp_path / "c.arrow", schema=s3.schema)
    assert (tmp_path / "a.arrow").read_bytes() == (tmp_path / "c.arrow").read_bytes()


def test_foreign_parquet_is_conformed(tmp_path):
    """A metadata-less Parquet file with wider types is accepted given num_experts, and normalized."""
    foreign = pa.table(
        {
            "iteration": pa.array([1, 1, 1], pa.int64()),
            "layer": pa.array([2, 2, 2], pa.int64()),
            "token": pa.array([0, 1, 2], pa.int64()),
            "expert_ids": pa.array([[3, 1], [0, 2], [1, 3]], pa.list_(pa.int64())),
            "extra": pa.array(["a", "b", "c"]),
        }
    )
    p = tmp_path / "foreign.parquet"
    pq.write_table(foreign, p)
    t = read_trace(p, model="mixtral")
    assert t.schema.names == ["iteration", "layer", "token", "expert_ids"]
    assert t.schema.field("expert_ids").type == pa.list_(pa.int16(), 2)
    assert routing_matrix(t).tolist() == [[3, 1], [0, 2], [1, 3]]
    assert expert_counts(t).tolist() == [1, 2, 1, 2, 0, 0, 0, 0]
    assert t.schema.metadata[b"num_experts"] == b"8"


def test_hive_parquet_dataset(tmp_path):
    """A folder of Parquet files partitioned by layer reads as one trace (layer restored from the path)."""
    root = tmp_path / "ds"
    parts = []
    for layer in (0, 1):
        t = synthetic_routing(40, 8, 2, seed=layer, model="mixtral", layer=layer)
        parts.append(t)
        d = root / f"layer={layer}"
        d.mkdir(parents=True)
        pq.write_table(t.drop_columns(["layer"]), d / "part-0.parquet")
    back = read_trace(root)
    assert back.num_rows == 80
    assert sorted(set(back.column("layer").to_pylist())) == [0, 1]
    assert back.schema.metadata[b"num_experts"] == b"8"
    expected = np.concatenate([routing_matrix(p) for p in parts])
    got = routing_matrix(back)
    # dataset order follows the sorted file paths: layer=0 then layer=1
    assert np.array_equal(got, expected)
    assert ds.dataset(root, partitioning="hive").count_rows() == 80


def test_large_trace_regrouped_into_row_groups(tmp_path):
    n = ROW_GROUP_ROWS + 1000
    t = synthetic_routing(n, 8, 2, seed=3)
    out = tmp_path / "big.parquet"
    write_trace(t, out)
    md = pq.ParquetFile(out).metadata
    assert [md.row_group(i).num_rows for i in range(md.num_row_groups)] == [ROW_GROUP_ROWS, 1000]
    summary = validate_trace(out)
    assert summary.rows == n
    assert np.array_equal(summary.counts, expert_counts(t))


def test_unnamed_npy_numbers_requests_from_one(tmp_path):
    p = tmp_path / "batch.npy"
    np.save(p, np.array([5, 0, 7], dtype=np.int32))
    t = read_trace(p)
    assert t.to_pylist() == [{"batch_id": 0, "request_ids": [1, 2, 3], "kv_lengths": [5, 0, 7]}]
    assert t.schema.metadata[b"source"] == b"batch.npy"
    assert b"window_start" not in t.schema.metadata
