"""Request traces for serving replay: arrival time, prompt tokens and output tokens of every request.

Two inputs, one result (:class:`RequestTrace`, arrival in seconds):

* a ``requests`` trace as the other trace readers know it (:func:`stepsim.trace_io.readers.read_trace`): the
  Azure LLM inference CSV as shipped (``TIMESTAMP,ContextTokens,GeneratedTokens``, Windows line endings) or a
  Parquet / Arrow file of the normalized ``requests`` schema (``request_id``, ``arrival`` timestamp,
  ``context_tokens``, ``generated_tokens``). Arrival seconds count from the first row's timestamp (the first
  request arrives at 0 s), as ``vllm bench serve`` replays these traces;
* a Parquet / Arrow file of the serving request schema (:data:`SERVE_COLUMNS`): ``arrival_s`` (seconds, any
  float or integer type, used as given), ``prompt_tokens`` and ``output_tokens`` (integers), and optionally
  ``request_id`` (integer; default the 0-based row number). :func:`write_requests` writes it.

Every error is one line naming the file and the (0-based) row: a missing column, a null, a NaN or negative
arrival, an arrival beyond 2**32 s (epoch milli-, micro- or nanoseconds: :mod:`stepsim.base.ranges`; never
rebased), arrivals out of order (a trace is replayed in file order, so it must be sorted), a negative token
count, a count beyond int64 (an unsigned column), a prompt or output of 0 tokens (a serving engine refuses an
empty prompt and ``max_tokens`` 0), and a request id used twice. A file that is another format than its name
says (a Parquet file named ``.arrow``, a gzip'ed CSV) is named for what it is.
Nothing is ever shortened, clipped or reordered.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from stepsim.base.errors import TraceError, TraceSchemaError, TraceValueError
from stepsim.base.files import refuse_special_file
from stepsim.base.ranges import MAX_TIME_TEXT, first_beyond_time_range
from stepsim.trace_io.readers import detect_format, one_line, read_trace

#: columns of the serving request schema (name -> meaning), in file order after the optional ``request_id``
SERVE_COLUMNS = {"arrival_s": "arrival time (s)", "prompt_tokens": "prompt tokens", "output_tokens": "output tokens"}


#: the suffixes of a request trace (stepsim.trace_io.readers' formats a request trace can be)
REQUEST_SUFFIXES = (".csv", ".parquet", ".pq", ".arrow", ".feather", ".ipc")


@dataclass(frozen=True)
class RequestTrace:
    """Requests in arrival order.

    Attributes
    ----------
    source : str
        The file as named (error messages start with it).
    request_id : ndarray of int64
        Request ids (Azure: the 1-based data-row number; serving schema: the column, else the row number).
    arrival_s : ndarray of float64
        Arrival times (seconds), non-decreasing, >= 0.
    prompt_tokens, output_tokens : ndarray of int64
        Prompt length and output length of each request (tokens, >= 1).
    """

    source: str
    request_id: np.ndarray
    arrival_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray

    def __len__(self) -> int:
        return len(self.arrival_s)

    def head(self, n: int) -> RequestTrace:
        """The first ``n`` requests."""
        return RequestTrace(self.source, self.request_id[:n], self.arrival_s[:n], self.prompt_tokens[:n],
                            self.output_tokens[:n])

    def with_arrivals(self, arrival_s: np.ndarray) -> RequestTrace:
        """The same requests with other arrival times (seconds, same length, sorted)."""
        return RequestTrace(self.source, self.request_id, np.asarray(arrival_s, dtype=np.float64),
                            self.prompt_tokens, self.output_tokens)


def _first(mask: np.ndarray) -> int:
    return int(np.argmax(mask))


def check_requests(source: str, arrival_s: np.ndarray, prompt: np.ndarray, output: np.ndarray,
                   names: tuple[str, str, str]) -> None:
    """Check arrivals and token counts, naming the file, the row and the column of the first bad value.

    ``names`` are the arrival, prompt and output column names as the file spells them.
    """
    a, p, o = names
    bad = ~np.isfinite(arrival_s)
    if bad.any():
        i = _first(bad)
        raise TraceValueError(f"{source}: row {i}, column {a!r}: arrival {float(arrival_s[i])} is not a finite number")
    if (arrival_s < 0).any():
        i = _first(arrival_s < 0)
        raise TraceValueError(f"{source}: row {i}, column {a!r}: negative arrival {float(arrival_s[i])!r} s")
    i = first_beyond_time_range(arrival_s)
    if i is not None:  # a step would vanish in rounding (stepsim.base.ranges); never rebased: arrival_s is as given
        raise TraceValueError(f"{source}: row {i}, column {a!r}: arrival {float(arrival_s[i])!r} s is beyond "
                              f"{MAX_TIME_TEXT}; are the arrivals in epoch milli-, micro- or nanoseconds? give "
                              "seconds")
    back = np.diff(arrival_s) < 0
    if back.any():
        i = _first(back) + 1
        raise TraceValueError(f"{source}: row {i}, column {a!r}: arrival {float(arrival_s[i])!r} s is before the previous "
                              f"row's {float(arrival_s[i - 1])!r} s (requests must be sorted by arrival)")
    for col, values, what in ((p, prompt, "a prompt"), (o, output, "an output")):
        if (values < 0).any():
            i = _first(values < 0)
            raise TraceValueError(f"{source}: row {i}, column {col!r}: negative token count {values[i]}")
        if (values == 0).any():
            i = _first(values == 0)
            raise TraceValueError(f"{source}: row {i}, column {col!r}: {what} of 0 tokens (a request has at "
                                  "least 1)")


def _numeric(table: pa.Table, name: str, source: str, integer: bool) -> np.ndarray:
    col = table.column(name)
    kind = "an integer" if integer else "a numeric"
    ok = pa.types.is_integer(col.type) or (not integer and pa.types.is_floating(col.type))
    if not ok:
        raise TraceSchemaError(f"{source}: column {name!r} has type {col.type}, expected {kind} type")
    if col.null_count:
        i = _first(col.is_null().to_numpy(zero_copy_only=False))
        raise TraceValueError(f"{source}: row {i}, column {name!r}: missing value (null)")
    values = col.to_numpy()
    if integer:
        _fits_int64(source, name, values)
    return values.astype(np.int64 if integer else np.float64)


def _fits_int64(source: str, name: str, values: np.ndarray) -> None:
    """An unsigned column's values beyond int64 would wrap to negative counts (or ids) in the int64 arrays held:
    the first is a one-line error."""
    if values.dtype.kind == "u" and len(values) and values.max() > np.iinfo(np.int64).max:
        i = _first(values > np.iinfo(np.int64).max)
        raise TraceValueError(f"{source}: row {i}, column {name!r}: value {int(values[i])} does not fit int64")


def _checked(trace: RequestTrace) -> RequestTrace:
    """``trace`` after the checks of its values (:func:`check_requests`) and of its ids, a file's or one built in
    memory alike."""
    check_requests(trace.source, trace.arrival_s, trace.prompt_tokens, trace.output_tokens, tuple(SERVE_COLUMNS))
    _unique_ids(trace.source, trace.request_id, "request_id")
    return trace


def _unique_ids(source: str, rid: np.ndarray, column: str) -> None:
    """Request ids name a request in requests.parquet, the timeline and comparisons: two rows with one id would
    be told apart only by their row."""
    order = np.argsort(rid, kind="stable")
    same = np.flatnonzero(rid[order][1:] == rid[order][:-1])
    if len(same):
        first, second = sorted((int(order[same[0]]), int(order[same[0] + 1])))
        raise TraceValueError(f"{source}: row {second}, column {column!r}: request id {int(rid[second])} is also "
                              f"row {first}'s (request ids must be unique)")


def _read_serve_schema(path: Path, fmt: str, names: list[str]) -> RequestTrace:
    src = str(path)
    missing = [c for c in SERVE_COLUMNS if c not in names]
    if missing:
        raise TraceSchemaError(f"{src}: missing column(s) {', '.join(missing)} for a request trace (columns: "
                               f"{', '.join(names)}; expected arrival_s, prompt_tokens, output_tokens, or a "
                               "requests trace with context_tokens)")
    cols = [c for c in ("request_id", *SERVE_COLUMNS) if c in names]
    try:
        if fmt == "parquet":
            table = pq.read_table(path, columns=cols)
        else:
            with pa.OSFile(str(path)) as f:
                table = _open_ipc(f).read_all().select(cols)
    except (pa.ArrowException, OSError) as exc:
        raise TraceError(f"{src}: cannot read {fmt} data: {one_line(exc)}") from exc
    if table.num_rows == 0:
        raise TraceValueError(f"{src}: empty trace (0 rows)")
    arrival = _numeric(table, "arrival_s", src, integer=False)
    prompt = _numeric(table, "prompt_tokens", src, integer=True)
    output = _numeric(table, "output_tokens", src, integer=True)
    rid = (_numeric(table, "request_id", src, integer=True) if "request_id" in names
           else np.arange(table.num_rows, dtype=np.int64))
    return _checked(RequestTrace(src, rid, arrival, prompt, output))


def _open_ipc(f):
    """An Arrow IPC reader of ``f``: the file format (``.arrow``, Feather v2), else the stream format, as the
    trace readers take both."""
    try:
        return pa.ipc.open_file(f)
    except pa.ArrowInvalid:
        f.seek(0)
        return pa.ipc.open_stream(f)


#: the first bytes of each columnar format, to say what a misnamed file really is
_MAGIC = {"parquet": b"PAR1", "arrow": b"ARROW1"}


def _file_columns(path: Path, fmt: str) -> list[str]:
    try:
        if fmt == "parquet":
            return pq.read_schema(path).names
        with pa.OSFile(str(path)) as f:
            return _open_ipc(f).schema.names
    except (pa.ArrowException, OSError) as exc:
        with open(path, "rb") as f:
            head = f.read(8)
        other = next((k for k, magic in _MAGIC.items() if k != fmt and head.startswith(magic)), None)
        if other is not None:  # e.g. a Parquet file named .arrow
            raise TraceError(f"{path}: not a readable {fmt} file: it is a{'n' if other == 'arrow' else ''} {other} "
                             f"file; name it .{other}") from exc
        raise TraceError(f"{path}: not a readable {fmt} file: {one_line(exc)}") from exc


def read_requests(path: str | Path) -> RequestTrace:
    """Read a request trace (Azure CSV, a ``requests`` trace, or the serving request schema), checked.

    Raises
    ------
    TraceError
        (TraceSchemaError / TraceValueError) one line naming the file, the row and the column.
    """
    p = Path(path)
    refuse_special_file(p, TraceError, "a request trace")
    if not p.is_file():
        raise TraceError(f"{p}: no such file" if not p.exists() else f"{p}: a request trace is one file, not a folder")
    if p.suffix.lower() not in REQUEST_SUFFIXES:  # said for serve (detect_format's hint is stepsim trace's --format)
        hint = "; decompress it first" if p.suffix.lower() in (".gz", ".bz2", ".xz", ".zst", ".zip") else ""
        raise TraceError(f"{p}: a request trace is an Azure CSV (.csv), Parquet (.parquet, .pq) or Arrow (.arrow, "
                         f".feather, .ipc) file, not {p.suffix or 'a file without a suffix'!r}{hint}")
    fmt = detect_format(p)
    if fmt in ("arrow", "parquet"):
        names = _file_columns(p, fmt)
        if "context_tokens" not in names:
            return _read_serve_schema(p, fmt, names)
    elif fmt != "azure-csv":
        raise TraceError(f"{p}: a request trace is an Azure CSV, Parquet or Arrow file, not {fmt}")
    # the existing reader checks the CSV header, column types, nulls, negative counts and timestamp precision
    table = read_trace(p, format=fmt)
    if table.schema.metadata.get(b"stepsim.kind") != b"requests":
        raise TraceSchemaError(f"{p}: holds a {table.schema.metadata.get(b'stepsim.kind', b'?').decode()} trace, "
                               "not requests")
    us = table.column("arrival").cast(pa.int64()).to_numpy()
    arrival = (us - us[0]) / 1e6  # seconds from the first row, as vllm bench serve replays a trace
    prompt = table.column("context_tokens").to_numpy().astype(np.int64)
    output = table.column("generated_tokens").to_numpy().astype(np.int64)
    names = ("TIMESTAMP", "ContextTokens", "GeneratedTokens") if fmt == "azure-csv" else \
        ("arrival", "context_tokens", "generated_tokens")
    if (np.diff(us) < 0).any():  # name the timestamps, not seconds relative to a later row
        i = _first(np.diff(us) < 0) + 1
        raise TraceValueError(f"{p}: row {i}, column {names[0]!r}: arrival is {float((us[i - 1] - us[i]) / 1e6)!r} s before "
                              "the previous row's (requests must be sorted by arrival)")
    check_requests(str(p), arrival, prompt, output, names)
    rid = table.column("request_id").to_numpy().astype(np.int64)
    _unique_ids(str(p), rid, "request_id")
    return RequestTrace(str(p), rid, arrival, prompt, output)


def requests_of(requests: str | Path | RequestTrace) -> RequestTrace:
    """The requests of a trace file (:func:`read_requests`) or of a :class:`RequestTrace` built in memory, checked
    as a file's rows are (the source named in each error) and held as a file's are read (int64 ids and counts,
    float64 arrivals): :mod:`stepsim.plan` serves each replica's requests without writing them to a file."""
    if not isinstance(requests, RequestTrace):
        return read_requests(requests)
    t = requests
    columns = {"request_id": t.request_id, "arrival_s": t.arrival_s, "prompt_tokens": t.prompt_tokens,
               "output_tokens": t.output_tokens}
    held = []
    for name, column in columns.items():
        column = np.asarray(column)
        kinds = "iuf" if name == "arrival_s" else "iu"  # a count of 2.5 tokens is refused, not truncated
        if column.ndim != 1 or column.dtype.kind not in kinds:
            raise TraceSchemaError(f"{t.source}: column {name!r} must be a 1-d array of "
                                   f"{'numbers' if name == 'arrival_s' else 'integers'}, got {column.dtype} "
                                   f"of shape {column.shape}")
        _fits_int64(t.source, name, column)
        held.append(column.astype(np.float64 if name == "arrival_s" else np.int64, copy=False))
    if len({len(column) for column in held}) != 1:
        raise TraceSchemaError(f"{t.source}: the columns have different lengths "
                               f"({', '.join(f'{n} {len(c)}' for n, c in zip(columns, held))})")
    if not len(held[0]):
        raise TraceValueError(f"{t.source}: empty trace (0 rows)")  # as a file of no rows is refused
    return _checked(RequestTrace(t.source, *held))


def requests_sha256(requests: str | Path | RequestTrace) -> str:
    """What identifies a run's requests (a calibration's key, the outputs' metadata): a trace file's SHA-256, or
    for a :class:`RequestTrace` in memory the SHA-256 of its four columns as :func:`requests_of` holds them."""
    if not isinstance(requests, RequestTrace):
        from stepsim.base.files import file_sha256

        return file_sha256(requests)
    import hashlib

    trace, digest = requests_of(requests), hashlib.sha256(b"stepsim.RequestTrace")
    for column in (trace.request_id, trace.arrival_s, trace.prompt_tokens, trace.output_tokens):
        digest.update(np.ascontiguousarray(column).astype(column.dtype.newbyteorder("<"), copy=False).tobytes())
    return digest.hexdigest()


def write_requests(trace: RequestTrace, path: str | Path) -> Path:
    """Write ``trace`` in the serving request schema (``.parquet``, else Arrow IPC), atomically."""
    from stepsim.base.files import atomic_output

    table = pa.table({"request_id": pa.array(trace.request_id, pa.int64()),
                      "arrival_s": pa.array(trace.arrival_s, pa.float64()),
                      "prompt_tokens": pa.array(trace.prompt_tokens, pa.int32()),
                      "output_tokens": pa.array(trace.output_tokens, pa.int32())})
    p = Path(path)
    with atomic_output(p) as tmp:
        if p.suffix.lower() in (".parquet", ".pq"):
            pq.write_table(table, tmp)
        else:
            with pa.OSFile(str(tmp), "wb") as f, pa.ipc.new_file(f, table.schema) as w:
                w.write_table(table)
    return p
