"""Validate trace record batches and conform them to the normalized schema, one batch at a time.

Validation streams: :func:`conform_batches` looks at one record batch at a time, with numpy/pyarrow.compute
vectorized checks, and keeps only a row counter between batches, so a 10-million-token trace validates in
memory bounded by the batch size. Every error names the file, the (0-based, trace-global) row, the column and
the offending value.

Checks
------
* columns present with acceptable types (any integer width for integer columns, list / large_list /
  fixed_size_list for list columns) -> :class:`~stepsim.base.errors.TraceSchemaError`;
* no nulls, no negative ids or lengths, values that fit the normalized type -> ``TraceValueError``;
* routing: every row has ``top_k`` experts, each id in ``[0, num_experts)``, no id twice in one token,
  gate weights finite and non-negative;
* decode batches: ``request_ids`` and ``kv_lengths`` of a row have equal lengths;
* requests: timestamps convert to microseconds without losing digits;
* the trace is not empty.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from stepsim.base.errors import TraceSchemaError, TraceValueError
from stepsim.trace_io.schemas import DECODE_BATCHES, REQUESTS, ROUTING, TraceInfo

#: integer columns per kind: name -> (target type, must be >= 0)
_INT_COLUMNS = {
    ROUTING: {"iteration": pa.int32(), "layer": pa.int32(), "token": pa.int32()},
    REQUESTS: {"request_id": pa.int64(), "context_tokens": pa.int32(), "generated_tokens": pa.int32()},
    DECODE_BATCHES: {"batch_id": pa.int32()},
}
#: list columns per kind: name -> element family ("int" or "float")
_LIST_COLUMNS = {
    ROUTING: {"expert_ids": "int", "gate_weights": "float"},
    REQUESTS: {},
    DECODE_BATCHES: {"request_ids": "int", "kv_lengths": "int"},
}


def _first(mask: np.ndarray) -> int:
    """Index of the first True in a boolean array (caller knows there is one)."""
    return int(np.argmax(mask))


def _is_list(t: pa.DataType) -> bool:
    return pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)


def _value_ok(t: pa.DataType, family: str) -> bool:
    if family == "int":
        return pa.types.is_integer(t)
    return pa.types.is_floating(t)


def check_schema(schema: pa.Schema, info: TraceInfo) -> None:
    """Check that ``schema`` has every column of ``info.kind`` with a type that can be conformed.

    Raises
    ------
    TraceSchemaError
        A column is missing or has a type stepsim cannot convert without guessing (e.g. float ids, strings).
    """
    src = info.source
    target = info.schema()
    for name in target.names:
        if name not in schema.names:
            raise TraceSchemaError(
                f"{src}: missing column {name!r} for a {info.kind} trace (columns: {', '.join(schema.names)})"
            )
    for name, want in _INT_COLUMNS[info.kind].items():
        t = schema.field(name).type
        if not pa.types.is_integer(t):
            raise TraceSchemaError(f"{src}: column {name!r} has type {t}, expected an integer type ({want})")
    if info.kind == REQUESTS:
        t = schema.field("arrival").type
        if not pa.types.is_timestamp(t):
            raise TraceSchemaError(f"{src}: column 'arrival' has type {t}, expected timestamp[us]")
    for name, family in _LIST_COLUMNS[info.kind].items():
        if name not in target.names:
            continue
        t = schema.field(name).type
        if not _is_list(t) or not _value_ok(t.value_type, family):
            raise TraceSchemaError(f"{src}: column {name!r} has type {t}, expected {target.field(name).type}")
        fixed = pa.types.is_fixed_size_list(t) and info.kind == ROUTING
        if fixed and info.top_k is not None and t.list_size != info.top_k:
            raise TraceSchemaError(
                f"{src}: column {name!r} has rows of length {t.list_size}, expected top_k = {info.top_k}"
            )


def _int_column(arr: pa.Array, name: str, want: pa.DataType, src: str, row0: int) -> pa.Array:
    """Check an integer column (no nulls, >= 0, fits ``want``) and cast it to ``want``."""
    if arr.null_count:
        i = _first(arr.is_null().to_numpy(zero_copy_only=False))
        raise TraceValueError(f"{src}: row {row0 + i}, column {name!r}: missing value (null)")
    v = arr.to_numpy()
    if len(v) and v.min() < 0:
        i = _first(v < 0)
        raise TraceValueError(f"{src}: row {row0 + i}, column {name!r}: negative value {v[i]}")
    hi = np.iinfo(want.to_pandas_dtype()).max
    if len(v) and v.max() > hi:
        i = _first(v > hi)
        raise TraceValueError(f"{src}: row {row0 + i}, column {name!r}: value {v[i]} does not fit {want}")
    return arr if arr.type == want else arr.cast(want)


def _list_column(arr: pa.Array, name: str, src: str, row0: int) -> tuple[np.ndarray, pa.Array]:
    """Split a list column into per-row lengths and its (null-free) flat values.

    Returns
    -------
    lengths : ndarray of int64, shape (rows,)
    values : pyarrow.Array
        The flattened elements (honours slicing of ``arr``).
    """
    if arr.null_count:
        i = _first(arr.is_null().to_numpy(zero_copy_only=False))
        raise TraceValueError(f"{src}: row {row0 + i}, column {name!r}: missing value (null list)")
    if pa.types.is_fixed_size_list(arr.type):
        lengths = np.full(len(arr), arr.type.list_size, dtype=np.int64)
    else:
        lengths = pc.list_value_length(arr).to_numpy().astype(np.int64, copy=False)
    values = arr.flatten()
    if values.null_count:
        j = _first(values.is_null().to_numpy(zero_copy_only=False))
        i, pos = _locate(lengths, j)
        raise TraceValueError(f"{src}: row {row0 + i}, column {name!r}: missing value (null) at position {pos}")
    return lengths, values


def _locate(lengths: np.ndarray, flat_index: int) -> tuple[int, int]:
    """Row and position within the row of a flat list element."""
    ends = np.cumsum(lengths)
    row = int(np.searchsorted(ends, flat_index, side="right"))
    start = int(ends[row - 1]) if row else 0
    return row, flat_index - start


def _routing(batch: pa.RecordBatch, info: TraceInfo, row0: int) -> list[pa.Array]:
    src, k, n_exp = info.source, info.top_k, info.num_experts
    target = info.schema()
    out = [_int_column(batch.column(c), c, t, src, row0) for c, t in _INT_COLUMNS[ROUTING].items()]

    ids = batch.column("expert_ids")
    lengths, flat = _list_column(ids, "expert_ids", src, row0)
    if len(lengths) and (lengths != k).any():
        i = _first(lengths != k)
        raise TraceValueError(f"{src}: row {row0 + i}, column 'expert_ids': {lengths[i]} experts, expected top_k = {k}")
    v = flat.to_numpy()
    # range check before any narrowing cast, so an id like 40000 is reported, not wrapped
    if len(v) and (v.min() < 0 or v.max() >= n_exp):
        j = _first((v < 0) | (v >= n_exp))
        i, pos = _locate(lengths, j)
        raise TraceValueError(
            f"{src}: row {row0 + i}, column 'expert_ids': expert id {v[j]} at position {pos} is out of range "
            f"[0, {n_exp})"
        )
    m = v.reshape(-1, k)
    # k(k-1)/2 vectorized column comparisons are cheaper than a per-row sort for the small k of MoE routers
    for a in range(k):
        for b in range(a + 1, k):
            same = m[:, a] == m[:, b]
            if same.any():
                i = _first(same)
                raise TraceValueError(
                    f"{src}: row {row0 + i}, column 'expert_ids': expert id {m[i, a]} appears twice "
                    f"(positions {a} and {b}) in one token"
                )
    want = target.field("expert_ids").type
    if ids.type == want:
        out.append(ids)
    else:
        out.append(pa.FixedSizeListArray.from_arrays(pa.array(v.astype(np.int16)), type=want))

    if info.gate_weights:
        gw = batch.column("gate_weights")
        g_len, g_flat = _list_column(gw, "gate_weights", src, row0)
        if len(g_len) and (g_len != k).any():
            i = _first(g_len != k)
            raise TraceValueError(
                f"{src}: row {row0 + i}, column 'gate_weights': {g_len[i]} weights, expected top_k = {k}"
            )
        g = g_flat.to_numpy().astype(np.float32, copy=False)
        bad = ~np.isfinite(g) | (g < 0)
        if bad.any():
            j = _first(bad)
            i, pos = _locate(g_len, j)
            raise TraceValueError(
                f"{src}: row {row0 + i}, column 'gate_weights': weight {g[j]} at position {pos} is not a "
                "finite non-negative number"
            )
        want = target.field("gate_weights").type
        out.append(gw if gw.type == want else pa.FixedSizeListArray.from_arrays(pa.array(g), type=want))
    return out


def _requests(batch: pa.RecordBatch, info: TraceInfo, row0: int) -> list[pa.Array]:
    src = info.source
    cols = {c: _int_column(batch.column(c), info.label(c), t, src, row0) for c, t in _INT_COLUMNS[REQUESTS].items()}
    ts = batch.column("arrival")
    arrival = info.label("arrival")
    if ts.null_count:
        i = _first(ts.is_null().to_numpy(zero_copy_only=False))
        raise TraceValueError(f"{src}: row {row0 + i}, column {arrival!r}: missing value (null)")
    unit = ts.type.unit
    raw = ts.cast(pa.int64()).to_numpy()
    if unit == "ns":
        # the Azure CSV has 7 fractional digits; only 100 ns multiples of 1000 survive a cast to us
        lossy = raw % 1000 != 0
        if lossy.any():
            i = _first(lossy)
            shown = pc.strftime(ts.slice(i, 1), format="%Y-%m-%d %H:%M:%S")[0].as_py()
            raise TraceValueError(
                f"{src}: row {row0 + i}, column {arrival!r}: timestamp {shown} has sub-microsecond digits "
                "that timestamp[us] cannot hold"
            )
        raw = raw // 1000
    elif unit == "ms":
        raw = raw * 1000
    elif unit == "s":
        raw = raw * 1_000_000
    arrival = pa.array(raw, type=pa.timestamp("us"))
    return [cols["request_id"], arrival, cols["context_tokens"], cols["generated_tokens"]]


def _decode_batches(batch: pa.RecordBatch, info: TraceInfo, row0: int) -> list[pa.Array]:
    src = info.source
    target = info.schema()
    out = [_int_column(batch.column("batch_id"), "batch_id", pa.int32(), src, row0)]
    r_len, r_flat = _list_column(batch.column("request_ids"), "request_ids", src, row0)
    k_len, k_flat = _list_column(batch.column("kv_lengths"), "kv_lengths", src, row0)
    if (r_len != k_len).any():
        i = _first(r_len != k_len)
        raise TraceValueError(
            f"{src}: row {row0 + i}, column 'kv_lengths': {k_len[i]} lengths for {r_len[i]} request_ids"
        )
    empty = k_len == 0
    if empty.any():
        i = _first(empty)
        raise TraceValueError(f"{src}: row {row0 + i}, column 'kv_lengths': empty batch (0 requests)")
    offsets = np.zeros(len(k_len) + 1, dtype=np.int32)
    np.cumsum(k_len, out=offsets[1:])
    for name, lengths, flat in (("request_ids", r_len, r_flat), ("kv_lengths", k_len, k_flat)):
        v = flat.to_numpy()
        if len(v) and v.min() < 0:
            j = _first(v < 0)
            i, pos = _locate(lengths, j)
            raise TraceValueError(f"{src}: row {row0 + i}, column {name!r}: negative value {v[j]} at position {pos}")
        want = target.field(name).type
        col = batch.column(name)
        if col.type == want:
            out.append(col)
        else:
            out.append(pa.ListArray.from_arrays(pa.array(offsets), pa.array(v.astype(np.int64)), type=want))
    return out


_CONFORMERS = {ROUTING: _routing, REQUESTS: _requests, DECODE_BATCHES: _decode_batches}


def conform_batch(batch: pa.RecordBatch, info: TraceInfo, row0: int = 0) -> pa.RecordBatch:
    """Validate one record batch and return it with the normalized schema of ``info``.

    Parameters
    ----------
    batch : pyarrow.RecordBatch
        Rows as read from the file (column types may be any acceptable width).
    info : TraceInfo
        Kind, source file and routing shape.
    row0 : int
        Trace-global index of the batch's first row, for error messages.

    Returns
    -------
    pyarrow.RecordBatch
        Same rows, normalized types, schema metadata of ``info``. Columns that already have the normalized
        type are passed through without a copy.
    """
    arrays = _CONFORMERS[info.kind](batch, info, row0)
    return pa.RecordBatch.from_arrays(arrays, schema=info.schema())


def conform_batches(
    batches: Iterable[pa.RecordBatch], info: TraceInfo, *, allow_empty: bool = False
) -> Iterator[pa.RecordBatch]:
    """Stream :func:`conform_batch` over ``batches``; raise if the trace has no rows.

    Raises
    ------
    TraceValueError
        On the first bad value, or at the end when no row was seen (unless ``allow_empty``).
    """
    row0 = 0
    for batch in batches:
        if batch.num_rows == 0:
            continue
        yield conform_batch(batch, info, row0)
        row0 += batch.num_rows
    if row0 == 0 and not allow_empty:
        raise TraceValueError(f"{info.source}: empty trace (0 rows)")


def validate_table(table: pa.Table, info: TraceInfo | None = None, source: str = "<table>") -> TraceInfo:
    """Validate an in-memory table; returns the resolved :class:`TraceInfo`.

    Parameters
    ----------
    table : pyarrow.Table
        A trace table (normally with stepsim schema metadata).
    info : TraceInfo, optional
        Known kind/shape; resolved from the table's schema metadata when omitted.
    source : str
        Name used in error messages.
    """
    from stepsim.trace_io.schemas import trace_info

    info = info or trace_info(table.schema, source)
    check_schema(table.schema, info)
    for _ in conform_batches(table.to_batches(), info):
        pass
    return info
