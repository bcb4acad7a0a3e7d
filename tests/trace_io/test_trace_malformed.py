"""Malformed traces: each gives the right typed error, naming the file, the row and the column / value.

Every case writes its own broken file into ``tmp_path``. Row numbers are 0-based over the whole trace.
Schema-level problems (a column's type, the schema version, missing metadata) concern no single row; their
messages name the file and the column or metadata key and the offending value instead.
"""

from __future__ import annotations

import re

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from stepsim.base.errors import TraceError, TraceSchemaError, TraceValueError
from stepsim.trace_io import make_schema, read_trace, validate_trace
from stepsim.trace_io.readers import DEFAULT_BATCH_ROWS

CSV_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens"


# --- builders ------------------------------------------------------------------------------------------
def npz(tmp_path, data, name="003_007.npz", folder="mixtral_b4", **arrays):
    d = tmp_path / folder
    d.mkdir(exist_ok=True)
    p = d / name
    np.savez(p, **({"data": np.asarray(data, dtype=np.int64)} if data is not None else {}), **arrays)
    return p


def csv(tmp_path, rows, header=CSV_HEADER, name="requests.csv"):
    p = tmp_path / name
    p.write_bytes("\r\n".join([header, *rows]).encode())  # Azure style: CRLF, no final newline
    return p


def routing_table(ids, *, list_type=None, meta=None, gate=None, iteration=None):
    n = len(ids)
    cols = {
        "iteration": pa.array(iteration if iteration is not None else [0] * n, pa.int32()),
        "layer": pa.array([0] * n, pa.int32()),
        "token": pa.array(range(n), pa.int32()),
        "expert_ids": pa.array(ids, list_type or pa.list_(pa.int16(), 2)),
    }
    if gate is not None:
        cols["gate_weights"] = pa.array(gate, pa.list_(pa.float32(), 2))
    metadata = {"stepsim.schema_version": "1", "stepsim.kind": "expert_routing", "num_experts": "8", "top_k": "2"}
    metadata.update(meta or {})
    metadata = {k: v for k, v in metadata.items() if v is not None}
    return pa.table(cols).replace_schema_metadata(metadata)


def arrow_file(tmp_path, table, name="trace.arrow"):
    p = tmp_path / name
    with pa.OSFile(str(p), "wb") as sink, pa.ipc.new_file(sink, table.schema) as w:
        w.write_table(table)
    return p


def parquet_file(tmp_path, table, name="trace.parquet"):
    p = tmp_path / name
    pq.write_table(table, p)
    return p


def npy(tmp_path, values, name="conv_stdev0001_0011_0014.npy", dtype=np.int64):
    p = tmp_path / name
    np.save(p, np.asarray(values, dtype=dtype))
    return p


def batches_table(ids, kv):
    return pa.table(
        {
            "batch_id": pa.array(range(len(ids)), pa.int32()),
            "request_ids": pa.array(ids, pa.list_(pa.int64())),
            "kv_lengths": pa.array(kv, pa.list_(pa.int64())),
        }
    ).replace_schema_metadata({"stepsim.schema_version": "1", "stepsim.kind": "decode_batches"})


# --- cases: (id, builder(tmp_path) -> path, error type, fragments the message must contain) -------------
CASES = [
    ("npz-expert-out-of-range",
     lambda t: npz(t, [[0, 1], [2, 3], [4, 5], [6, 8]]),
     TraceValueError, ["row 3", "column 'expert_ids'", "expert id 8", "[0, 8)"]),
    ("npz-negative-expert",
     lambda t: npz(t, [[0, 1], [-1, 3]]),
     TraceValueError, ["row 1", "column 'expert_ids'", "expert id -1", "position 0"]),
    ("npz-duplicate-expert-in-token",
     lambda t: npz(t, [[0, 1], [2, 3], [5, 5]]),
     TraceValueError, ["row 2", "column 'expert_ids'", "expert id 5 appears twice"]),
    ("npz-wrong-top-k-for-model",
     lambda t: npz(t, [[0, 1, 2], [3, 4, 5]]),
     TraceSchemaError, ["column 'expert_ids'", "rows of length 3", "model 'mixtral'", "top_k = 2"]),
    ("npz-no-data-array",
     lambda t: npz(t, None, ids=np.zeros((2, 2))),
     TraceSchemaError, ["no array 'data'", "arrays: ids"]),
    ("npz-bad-file-name-in-folder",  # a single file may have any name; in a folder the names order the batches
     lambda t: npz(t, [[0, 1]], name="layer10.npz").parent,
     TraceSchemaError, ["a routing file in a folder must be named <iteration>_<layer>.npz", "'layer10.npz'"]),
    ("npz-text-file",
     lambda t: (t / "routing.npz").write_text("hello") and t / "routing.npz",
     TraceError, ["routing.npz: not a NumPy .npz archive", "save the array with numpy savez"]),
    ("npz-object-array",
     lambda t: np.savez(t / "obj.npz", data=np.array([{"a": 1}], dtype=object)) or t / "obj.npz",
     TraceError, ["obj.npz: holds Python objects (an object-dtype array), not numbers"]),
    ("npz-missing-num-experts",
     lambda t: npz(t, [[0, 1]], folder="unknownmodel_b2"),
     TraceSchemaError, ["missing metadata 'num_experts'"]),
    ("parquet-variable-row-length",
     lambda t: parquet_file(t, routing_table([[0, 1], [2, 3], [4, 5, 6]], list_type=pa.list_(pa.int64()))),
     TraceValueError, ["row 2", "column 'expert_ids'", "3 experts, expected top_k = 2"]),
    ("parquet-null-token-list",
     lambda t: parquet_file(t, routing_table([[0, 1], None, [4, 5]], list_type=pa.list_(pa.int64()))),
     TraceValueError, ["row 1", "column 'expert_ids'", "missing value (null list)"]),
    ("parquet-null-expert",
     lambda t: parquet_file(t, routing_table([[0, 1], [2, 3], [4, None]], list_type=pa.list_(pa.int64()))),
     TraceValueError, ["row 2", "column 'expert_ids'", "missing value (null) at position 1"]),
    ("arrow-float-expert-ids",
     lambda t: arrow_file(t, routing_table([[0.0, 1.0]], list_type=pa.list_(pa.float32(), 2))),
     TraceSchemaError, ["column 'expert_ids'", "fixed_size_list<item: float>[2]", "expected fixed_size_list<item: int16>[2]"]),
    ("arrow-string-iteration",
     lambda t: arrow_file(t, routing_table([[0, 1]]).set_column(0, "iteration", pa.array(["0"]))),
     TraceSchemaError, ["column 'iteration'", "type string", "expected an integer type (int32)"]),
    ("arrow-unknown-schema-version",
     lambda t: arrow_file(t, routing_table([[0, 1]], meta={"stepsim.schema_version": "99"})),
     TraceSchemaError, ["unknown schema version '99'", "stepsim.schema_version"]),
    ("arrow-missing-num-experts",
     lambda t: arrow_file(t, routing_table([[0, 1]], meta={"num_experts": None})),
     TraceSchemaError, ["missing metadata 'num_experts'"]),
    ("arrow-bad-num-experts",
     lambda t: arrow_file(t, routing_table([[0, 1]], meta={"num_experts": "eight"})),
     TraceSchemaError, ["metadata 'num_experts' = 'eight'"]),
    ("arrow-empty-trace",
     lambda t: arrow_file(t, routing_table([])),
     TraceValueError, ["empty trace (0 rows)"]),
    ("arrow-negative-iteration",
     lambda t: arrow_file(t, routing_table([[0, 1], [1, 2]], iteration=[0, -4])),
     TraceValueError, ["row 1", "column 'iteration'", "negative value -4"]),
    ("arrow-iteration-overflows-int32",
     lambda t: arrow_file(t, routing_table([[0, 1]]).set_column(0, "iteration", pa.array([2**31], pa.int64()))),
     TraceValueError, ["row 0", "column 'iteration'", "value 2147483648 does not fit int32"]),
    ("arrow-nan-gate-weight",
     lambda t: arrow_file(t, routing_table([[0, 1], [2, 3]], gate=[[0.5, 0.5], [float("nan"), 1.0]])),
     TraceValueError, ["row 1", "column 'gate_weights'", "weight nan at position 0"]),
    ("csv-negative-context",
     lambda t: csv(t, ["2023-11-16 18:17:03.9799600,10,5", "2023-11-16 18:17:04.0000000,11,5",
                       "2023-11-16 18:17:05.0000000,-5,5"]),
     TraceValueError, ["row 2", "column 'ContextTokens'", "negative value -5"]),
    ("csv-missing-value",
     lambda t: csv(t, ["2023-11-16 18:17:03.9799600,10,5", "2023-11-16 18:17:04.0000000,11,"]),
     TraceValueError, ["row 1", "column 'GeneratedTokens'", "missing value (null)"]),
    ("csv-not-a-number",
     lambda t: csv(t, ["2023-11-16 18:17:03.9799600,10,5", "2023-11-16 18:17:04.0000000,12,5",
                       "2023-11-16 18:17:04.5000000,abc,5"]),
     TraceValueError, ["row 2", "column 'ContextTokens'", "invalid value 'abc'"]),
    ("csv-short-row",
     lambda t: csv(t, ["2023-11-16 18:17:03.9799600,10,5", "2023-11-16 18:17:04.0000000,11"]),
     TraceValueError, ["row 1", "Expected 3 columns, got 2", "2023-11-16 18:17:04.0000000,11"]),
    ("csv-missing-column",
     lambda t: csv(t, ["2023-11-16 18:17:03.9799600,10"], header="TIMESTAMP,ContextTokens"),
     TraceSchemaError, ["missing column(s) GeneratedTokens", "found: TIMESTAMP, ContextTokens"]),
    ("csv-sub-microsecond-timestamp",
     lambda t: csv(t, ["2023-11-16 18:17:03.9799600,10,5", "2023-11-16 18:17:04.1234567,11,5"]),
     TraceValueError, ["row 1", "column 'TIMESTAMP'", "2023-11-16 18:17:04.123456700", "sub-microsecond"]),
    ("npy-negative-kv",
     lambda t: npy(t, [5, 6, -3, 7]),
     TraceValueError, ["row 0", "column 'kv_lengths'", "negative value -3 at position 2"]),
    ("npy-float-dtype",
     lambda t: npy(t, [5.0, 6.0, 7.0, 8.0], dtype=np.float64),
     TraceSchemaError, ["dtype float64", "expected integer KV lengths"]),
    ("npy-window-length-mismatch",
     lambda t: npy(t, [5, 6, 7]),
     TraceValueError, ["row 0", "column 'kv_lengths'", "window 11..14 holds 4 requests", "has 3 values"]),
    ("parquet-batch-length-mismatch",
     lambda t: parquet_file(t, batches_table([[1, 2], [3, 4, 5]], [[10, 20], [30, 40]])),
     TraceValueError, ["row 1", "column 'kv_lengths'", "2 lengths for 3 request_ids"]),
    ("parquet-null-kv-length",
     lambda t: parquet_file(t, batches_table([[1, 2], [3, 4]], [[10, 20], [30, None]])),
     TraceValueError, ["row 1", "column 'kv_lengths'", "missing value (null) at position 1"]),
]  # fmt: skip


@pytest.mark.parametrize(("builder", "error", "fragments"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_malformed_trace(tmp_path, builder, error, fragments):
    path = builder(tmp_path)
    with pytest.raises(error) as info:
        read_trace(path)
    msg = str(info.value)
    assert msg.startswith(f"{path}: "), msg  # names the file first
    for fragment in fragments:
        assert fragment in msg, f"{fragment!r} not in {msg!r}"
    # streaming validation reports the same error
    with pytest.raises(error, match=re.escape(msg)):
        validate_trace(path)


def test_at_least_fifteen_cases():
    assert len(CASES) >= 15
    assert len({c[0] for c in CASES}) == len(CASES)


def test_error_row_is_global_across_batches(tmp_path):
    """The bad row sits in the third streamed batch; its reported row is its index in the whole trace."""
    n = 2 * DEFAULT_BATCH_ROWS + 100
    ids = np.tile(np.array([[0, 1]], dtype=np.int16), (n, 1))
    bad = 2 * DEFAULT_BATCH_ROWS + 37
    ids[bad] = [3, 3]
    schema = make_schema("expert_routing", top_k=2, num_experts=8)
    table = pa.table(
        [
            pa.array(np.zeros(n, np.int32)),
            pa.array(np.zeros(n, np.int32)),
            pa.array(np.arange(n, dtype=np.int32)),
            pa.FixedSizeListArray.from_arrays(pa.array(ids.ravel()), 2),
        ],
        schema=schema,
    )
    p = parquet_file(tmp_path, table)
    with pytest.raises(TraceValueError, match=rf"row {bad}, column 'expert_ids': expert id 3 appears twice"):
        validate_trace(p)


def test_num_experts_conflict(tmp_path):
    p = npz(tmp_path, [[0, 1]])
    with pytest.raises(TraceSchemaError, match=r"this routing trace is for 'mixtral' \(8 experts\), but the run's "
                                               r"model has 16 experts; pass --model mixtral \(or a trace of your "
                                               r"model\)"):
        read_trace(p, num_experts=16)


def test_not_a_trace_file(tmp_path):
    p = tmp_path / "junk.parquet"
    p.write_bytes(b"not parquet at all")
    with pytest.raises(TraceError, match=rf"{re.escape(str(p))}: not a readable parquet file"):
        read_trace(p)
    q = tmp_path / "001_002.npz"
    q.write_bytes(b"not a zip")
    with pytest.raises(TraceError, match=rf"{re.escape(str(q))}: not a NumPy .npz archive \(its first bytes are "
                                         r"b'not '\); save the array with numpy savez"):
        read_trace(q)
    with pytest.raises(TraceError, match="no such file or directory"):
        read_trace(tmp_path / "missing.arrow")
    with pytest.raises(TraceError, match="cannot tell the trace format from suffix '.txt'"):
        (tmp_path / "x.txt").write_text("x")
        read_trace(tmp_path / "x.txt")


def test_csv_bad_row_bisection_fallback(tmp_path):
    """The fallback used when pyarrow's message has no line number finds the same row."""
    from stepsim.trace_io.readers import _first_bad_csv_row

    p = csv(tmp_path, ["2023-11-16 18:17:03.9799600,10,5", "2023-11-16 18:17:04.0,12,5", "2023-11-16 18:17:04.5,x,5"])
    assert _first_bad_csv_row(p, "ContextTokens") == 2
    assert _first_bad_csv_row(p, "GeneratedTokens") is None


def test_corrupt_and_truncated_files(tmp_path):
    from stepsim.trace_io import synthetic_routing, write_trace

    t = synthetic_routing(200_000, 8, 2, seed=1)
    good_pq, good_ipc = tmp_path / "good.parquet", tmp_path / "good.arrow"
    write_trace(t, good_pq)
    write_trace(t, good_ipc)

    data = bytearray(good_pq.read_bytes())
    third = len(data) // 3
    data[third : third + 2000] = bytes(b ^ 0xFF for b in data[third : third + 2000])
    bad = tmp_path / "corrupt.parquet"
    bad.write_bytes(bytes(data))
    with pytest.raises(TraceError, match=rf"{re.escape(str(bad))}: cannot read parquet data"):
        validate_trace(bad)

    cut = tmp_path / "cut.arrow"
    cut.write_bytes(good_ipc.read_bytes()[: good_ipc.stat().st_size // 2])
    with pytest.raises(TraceError, match=rf"{re.escape(str(cut))}: not a readable arrow file"):
        validate_trace(cut)


def test_npz_routing_file_under_any_name(tmp_path):
    """A single routing file needs no <iteration>_<layer>.npz name: it is labelled with the iteration and layer
    asked for (0/0 by default), and a name that has the pattern still gives the labels."""
    from stepsim.trace_io.load import load_routing

    data = [[0, 1], [2, 3], [1, 4]]
    p = npz(tmp_path, data, name="routing.npz")
    table = read_trace(p)
    assert set(zip(table["iteration"].to_pylist(), table["layer"].to_pylist())) == {(0, 0)}
    assert load_routing(p, 8, iteration=3, layer=2).tolist() == data
    named = npz(tmp_path, data, name="008_010.npz", folder="mixtral_b3")
    assert set(read_trace(named)["layer"].to_pylist()) == {10}
