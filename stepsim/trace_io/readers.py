"""Read traces from Arrow IPC, Parquet, STeP artifact ``.npz`` / ``.npy`` files and the Azure LLM CSV.

All readers stream: :func:`open_trace` resolves the trace kind and metadata from the file's schema (or name)
and returns a :class:`TraceStream` whose :meth:`~TraceStream.batches` yields validated record batches in the
normalized schema (:mod:`stepsim.trace_io.schemas`). :func:`read_trace` collects them into one table.

Row numbers in error messages are 0-based over the whole trace. For the Azure CSV, ``request_id`` is the
1-based data-row number (the first request is 1): that is the numbering of the STeP artifact's KV-length
windows, e.g. ``conv_stdev0987_3349_3364.npy`` holds the ``ContextTokens`` of requests 3349..3364 inclusive.
"""

from __future__ import annotations

import codecs
import csv
import os
import re
import zipfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from stepsim.base.errors import ConfigError, TraceError, TraceSchemaError, TraceValueError
from stepsim.base.files import refuse_special_file
from stepsim.trace_io.schemas import (
    DECODE_BATCHES,
    KNOWN_MODELS,
    NUM_EXPERTS_KEY,
    REQUESTS,
    ROUTING,
    SOURCE_KEY,
    TraceInfo,
    decode_metadata,
    trace_info,
)
from stepsim.trace_io.validate import check_schema, conform_batches

#: ``format=`` values accepted by :func:`read_trace` and ``stepsim trace import --format``
FORMATS = ("npz", "npy", "azure-csv", "arrow", "parquet")
_SUFFIX_FORMATS = {
    ".npz": "npz",
    ".npy": "npy",
    ".csv": "azure-csv",
    ".arrow": "arrow",
    ".feather": "arrow",
    ".ipc": "arrow",
    ".parquet": "parquet",
    ".pq": "parquet",
}
#: rows per streamed record batch: ~1-2 MB per column for a routing trace, small enough to bound memory,
#: large enough that per-batch Python overhead is negligible
DEFAULT_BATCH_ROWS = 1 << 16

#: Azure LLM inference trace columns and the types pyarrow parses them to. The timestamps have 7 fractional
#: digits (100 ns), which pyarrow's ISO-8601 parser accepts for timestamp[ns] but rejects for timestamp[us];
#: validation then converts to us and refuses to drop a non-zero 7th digit.
AZURE_COLUMNS = {"TIMESTAMP": pa.timestamp("ns"), "ContextTokens": pa.int64(), "GeneratedTokens": pa.int64()}
#: the normalized requests columns as the Azure CSV names them (error messages say the CSV's names)
AZURE_NAMES = {"arrival": "TIMESTAMP", "context_tokens": "ContextTokens", "generated_tokens": "GeneratedTokens"}

_NPZ_NAME = re.compile(r"^(\d+)_(\d+)\.npz$")
_NPY_NAME = re.compile(r"^(?P<trace>[A-Za-z0-9]+)_stdev(?P<stdev>\d+)_(?P<start>\d+)_(?P<end>\d+)\.npy$")
_MODEL_DIR = re.compile(r"^(?P<model>.+?)_b\d+$")


@dataclass
class TraceStream:
    """A trace opened for streaming.

    Attributes
    ----------
    info : TraceInfo
        Kind, source, metadata and routing shape.
    path : Path
        The file or folder.
    format : str
        One of :data:`FORMATS`.
    batch_rows : int
        Maximum rows per yielded batch.
    """

    info: TraceInfo
    path: Path
    format: str
    _raw: Callable[[], Iterable[pa.RecordBatch]]
    batch_rows: int = DEFAULT_BATCH_ROWS

    @property
    def schema(self) -> pa.Schema:
        """Normalized schema (with metadata) of the yielded batches."""
        return self.info.schema()

    def batches(self) -> Iterator[pa.RecordBatch]:
        """Yield validated, normalized record batches; raises a TraceError on the first bad row."""
        raw = _guarded(self.path, self.format, self._raw())
        return conform_batches(_rechunk(raw, self.batch_rows), self.info)

    __iter__ = batches

    def read_all(self) -> pa.Table:
        """All rows as one table (materializes the trace)."""
        return pa.Table.from_batches(list(self.batches()), schema=self.schema)


def one_line(exc: BaseException) -> str:
    """A library's error text as one line: pyarrow's messages span lines ("Invalid data\\nDeserializing page
    header failed."), and stepsim's errors are one line each; the lines are joined with "; "."""
    return "; ".join(line.strip() for line in str(exc).splitlines() if line.strip()) or type(exc).__name__


def _guarded(path: Path, fmt: str, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Re-raise pyarrow decoding errors met mid-stream (corrupt pages, truncated data) as TraceError."""
    it = iter(batches)
    while True:
        try:
            b = next(it)
        except StopIteration:
            return
        except (pa.ArrowException, OSError) as exc:
            raise TraceError(f"{path}: cannot read {fmt} data: {one_line(exc)}") from exc
        yield b


def _rechunk(batches: Iterable[pa.RecordBatch], rows: int) -> Iterator[pa.RecordBatch]:
    """Split batches larger than ``rows`` into zero-copy slices, so memory per step stays bounded."""
    for b in batches:
        if b.num_rows <= rows:
            yield b
        else:
            for off in range(0, b.num_rows, rows):
                yield b.slice(off, rows)


def detect_format(path: str | Path, format: str | None = None) -> str:
    """Return the trace format of ``path`` (given explicitly, or from its suffix or folder contents).

    Raises
    ------
    ConfigError
        ``format`` is not one of :data:`FORMATS`.
    TraceError
        The path does not exist or its format cannot be recognised.
    """
    p = Path(path)
    if format is not None:
        if format not in FORMATS:
            raise ConfigError(f"unknown trace format {format!r}; expected one of {', '.join(FORMATS)}")
        if not p.exists():
            raise TraceError(f"{p}: no such file or directory")
        refuse_special_file(p, TraceError, "a trace")
        return format
    if not p.exists():
        raise TraceError(f"{p}: no such file or directory")
    refuse_special_file(p, TraceError, "a trace")
    if p.is_dir():
        for pattern, fmt in (("*.npz", "npz"), ("*.npy", "npy"), ("**/*.parquet", "parquet"), ("**/*.arrow", "arrow")):
            if next(p.glob(pattern), None) is not None:
                return fmt
        raise TraceError(f"{p}: folder holds no .npz, .npy, .parquet or .arrow trace files")
    fmt = _SUFFIX_FORMATS.get(p.suffix.lower())
    if fmt is None:
        raise TraceError(
            f"{p}: cannot tell the trace format from suffix {p.suffix!r}; give the file one of the suffixes "
            f"{', '.join(sorted(_SUFFIX_FORMATS))} or give the format (stepsim trace ... --format, format= in Python: "
            f"one of {', '.join(FORMATS)})"
        )
    return fmt


# --- STeP artifact .npz routing files -------------------------------------------------------------------
#: the first bytes of a .npz (a zip archive: a first member, or the end record of an empty archive, which
#: numpy.savez() with no arrays writes) and of a .npy file
_NUMPY_MAGIC = {".npz": ((b"PK\x03\x04", b"PK\x05\x06"), "a NumPy .npz archive"),
                ".npy": ((b"\x93NUMPY",), "a NumPy .npy file")}


def load_numpy_file(p: Path, loader: Callable[[], np.ndarray]) -> np.ndarray:
    """Run ``loader`` on the NumPy file ``p``, with NumPy's failures said in terms of the file.

    NumPy reads a file without its magic bytes as a pickle ("contains pickled (object) data"), which is
    misleading for, say, a text file saved as .npz: the header is checked first.
    """
    magics, what = _NUMPY_MAGIC.get(p.suffix.lower(), (None, None))
    if magics is not None:
        try:
            with open(p, "rb") as fh:
                head = fh.read(len(magics[0]))
        except OSError as exc:
            raise TraceError(f"{p}: cannot read: {exc.strerror or exc}") from exc
        if head not in magics:
            raise TraceError(f"{p}: not {what} (its first bytes are {head!r}); save the array with numpy "
                             f"{'savez' if p.suffix.lower() == '.npz' else 'save'}")
    try:
        return loader()
    except ValueError as exc:
        if any(text in str(exc) for text in ("Object arrays cannot be loaded", "pickled", "Python objects")):
            raise TraceError(f"{p}: holds Python objects (an object-dtype array), not numbers; save an integer "
                             "(routing) or integer/float (KV lengths) array") from exc
        raise TraceError(f"{p}: cannot read NumPy file: {one_line(exc)}") from exc
    except (OSError, EOFError, zipfile.BadZipFile, KeyError) as exc:
        raise TraceError(f"{p}: cannot read NumPy file: {one_line(exc)}") from exc


def npz_routing_matrix(p: Path) -> np.ndarray:
    """The ``[batch, top_k]`` integer matrix ``data`` of a routing ``.npz`` file (TraceSchemaError naming the file
    when it is missing, of another rank or not integer)."""

    def load():
        with np.load(p, allow_pickle=False) as z:
            if "data" not in z.files:
                raise TraceSchemaError(f"{p}: no array 'data' (arrays: {', '.join(z.files) or 'none'})")
            return z["data"]

    data = load_numpy_file(p, load)
    if data.ndim != 2:
        raise TraceSchemaError(f"{p}: array 'data' has shape {list(data.shape)}, expected [batch, top_k]")
    if not np.issubdtype(data.dtype, np.integer):
        raise TraceSchemaError(f"{p}: array 'data' has dtype {data.dtype}, expected integer expert ids")
    return data


def _open_npz(p: Path, num_experts: int | None, model: str | None,
              labels: tuple[int, int] = (0, 0)) -> tuple[TraceInfo, Callable, pa.Schema]:
    """An artifact routing file, or a folder of them. A file's (iteration, layer) come from its name when it is
    ``<iteration>_<layer>.npz``, else from ``labels``; in a folder every name must follow the pattern (it orders
    the batches)."""
    files = sorted(p.glob("*.npz")) if p.is_dir() else [p]
    parsed = []
    for f in files:
        m = _NPZ_NAME.match(f.name)
        if m:
            parsed.append((f, int(m.group(1)), int(m.group(2))))
        elif not p.is_dir():
            npz_routing_matrix(f)  # content errors first
            parsed.append((f, int(labels[0]), int(labels[1])))
        else:
            npz_routing_matrix(f)
            raise TraceSchemaError(
                f"{p}: file {f.name!r}: a routing file in a folder must be named <iteration>_<layer>.npz (e.g. "
                f"008_010.npz; the names order the batches); a single file may have any name")
    if model is None:
        # the artifact's folders are named <model>_b<batch> (mixtral_b64, qwen_b64)
        folder = p.name if p.is_dir() else p.parent.name
        m = _MODEL_DIR.match(folder)
        if m and m.group("model").lower() in KNOWN_MODELS:
            model = m.group("model")
    first = npz_routing_matrix(parsed[0][0])
    k = first.shape[1]
    raw_schema = pa.schema(
        [
            ("iteration", pa.int32()),
            ("layer", pa.int32()),
            ("token", pa.int32()),
            ("expert_ids", pa.list_(pa.int64(), k)),
        ],
        metadata={SOURCE_KEY: p.name},
    )
    info = trace_info(raw_schema, p, kind=ROUTING, num_experts=num_experts, model=model, top_k=k)

    def raw() -> Iterator[pa.RecordBatch]:
        for f, it, layer in parsed:
            data = first if f == parsed[0][0] else npz_routing_matrix(f)
            if data.shape[1] != k:
                raise TraceSchemaError(f"{f}: array 'data' has {data.shape[1]} experts per token, expected top_k = {k}")
            b = data.shape[0]
            flat = np.ascontiguousarray(data, dtype=np.int64).ravel()
            yield pa.RecordBatch.from_arrays(
                [
                    pa.array(np.full(b, it, dtype=np.int32)),
                    pa.array(np.full(b, layer, dtype=np.int32)),
                    pa.array(np.arange(b, dtype=np.int32)),
                    pa.FixedSizeListArray.from_arrays(pa.array(flat), k),
                ],
                schema=raw_schema,
            )

    return info, raw, raw_schema


# --- STeP artifact .npy KV-length files ----------------------------------------------------------------
def parse_kv_name(name: str) -> dict[str, int | str] | None:
    """Parse ``<trace>_stdev<SSSS>_<start>_<end>.npy``.

    Returns
    -------
    dict or None
        ``trace`` (str), ``stdev`` (int, floor of the sample stdev in tokens), ``start`` and ``end`` (int,
        1-based inclusive request numbers); None when the name does not follow the convention.
    """
    m = _NPY_NAME.match(name)
    if not m:
        return None
    return {
        "trace": m.group("trace"),
        "stdev": int(m.group("stdev")),
        "start": int(m.group("start")),
        "end": int(m.group("end")),
    }


def _npy_vector(p: Path) -> tuple[np.ndarray, np.ndarray]:
    """KV lengths of one ``.npy`` file and the request ids its name implies."""
    v = load_numpy_file(p, lambda: np.load(p, allow_pickle=False))
    if v.ndim != 1:
        raise TraceSchemaError(f"{p}: array has shape {list(v.shape)}, expected a 1-D array of KV lengths")
    if not np.issubdtype(v.dtype, np.integer):
        raise TraceSchemaError(f"{p}: array has dtype {v.dtype}, expected integer KV lengths")
    name = parse_kv_name(p.name)
    if name is None:  # no window in the name: number the requests 1..B, like the CSV numbering
        ids = np.arange(1, len(v) + 1, dtype=np.int64)
    else:
        ids = np.arange(name["start"], name["end"] + 1, dtype=np.int64)
        if len(ids) != len(v):
            raise TraceValueError(
                f"{p}: row 0, column 'kv_lengths': the name's window {name['start']}..{name['end']} holds "
                f"{len(ids)} requests but the array has {len(v)} values"
            )
    return v.astype(np.int64, copy=False), ids


def _open_npy(p: Path) -> tuple[TraceInfo, Callable, pa.Schema]:
    files = sorted(p.glob("*.npy")) if p.is_dir() else [p]
    meta = {SOURCE_KEY: p.name}
    if not p.is_dir():
        name = parse_kv_name(p.name)
        if name is not None:
            meta.update(
                trace=str(name["trace"]),
                stdev_label=str(name["stdev"]),
                window_start=str(name["start"]),
                window_end=str(name["end"]),
            )
    raw_schema = pa.schema(
        [("batch_id", pa.int32()), ("request_ids", pa.list_(pa.int64())), ("kv_lengths", pa.list_(pa.int64()))],
        metadata=meta,
    )
    info = trace_info(raw_schema, p, kind=DECODE_BATCHES)

    def raw() -> Iterator[pa.RecordBatch]:
        for i, f in enumerate(files):
            v, ids = _npy_vector(f)
            yield pa.RecordBatch.from_arrays(
                [pa.array([i], pa.int32()), pa.array([ids], pa.list_(pa.int64())), pa.array([v], pa.list_(pa.int64()))],
                schema=raw_schema,
            )

    return info, raw, raw_schema


# --- Azure LLM inference CSV -----------------------------------------------------------------------------
def _csv_error(p: Path, exc: pa.ArrowInvalid, names: list[str]) -> TraceError:
    """Turn a pyarrow CSV error into a TraceError naming the row and column.

    With ``use_threads=False`` pyarrow reports ``Row #N`` (1-based line number, header = line 1); a
    conversion error also names the column index. When the line number is missing (other pyarrow
    versions) the first unconvertible row is found by bisection.
    """
    msg = str(exc)
    m_row = re.search(r"Row #(\d+)", msg)
    row = int(m_row.group(1)) - 2 if m_row else None
    m_conv = re.search(r"In CSV column #(\d+): .*?CSV conversion error to (\S+): (.*)$", msg)
    if m_conv:
        index = int(m_conv.group(1))  # the column's place in the file's header (not in AZURE_COLUMNS)
        col = names[index] if index < len(names) else f"#{index}"
        if row is None and col in AZURE_COLUMNS:
            row = _first_bad_csv_row(p, col)
        where = f"row {row}, " if row is not None else ""
        m_value = re.match(r"invalid value '(.*)'$", m_conv.group(3))
        what = (f"invalid value {m_value.group(1)!r} (expected {m_conv.group(2)})" if m_value else
                f"cannot convert to {m_conv.group(2)}: {m_conv.group(3)}")
        return TraceValueError(f"{p}: {where}column {col!r}: {what}")
    if row is not None:  # parse errors, e.g. a row with the wrong number of fields
        detail = re.sub(r"^.*Row #\d+: ", "", msg)
        return TraceValueError(f"{p}: row {row}: {detail}")
    if "Empty CSV file" in msg:  # a header without a line break after it: no rows
        return TraceValueError(f"{p}: empty trace (0 rows)")
    return TraceError(f"{p}: cannot read CSV: {msg}")


def _first_bad_csv_row(p: Path, col: str) -> int | None:
    """Find the first row of ``col`` that pyarrow cannot convert (error path only: rereads as strings)."""
    try:
        strings = pcsv.read_csv(
            p, convert_options=pcsv.ConvertOptions(column_types={col: pa.string()}, include_columns=[col])
        ).column(col)
    except pa.ArrowInvalid:
        return None
    target = AZURE_COLUMNS[col]

    def ok(n: int) -> bool:
        try:
            strings.slice(0, n).cast(target)
            return True
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return False

    # bisect on prefixes with pyarrow's own cast, so "bad" means exactly what the reader rejected
    lo, hi = 0, len(strings)
    if ok(hi):
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        if ok(mid + 1):
            lo = mid + 1
        else:
            hi = mid
    return lo


#: what the first bytes of a file that is not a UTF-8 CSV say it is, and what to do
_NOT_TEXT = ((b"\x1f\x8b", "is gzip-compressed; decompress it first (gunzip)"),
             (b"PK\x03\x04", "is a zip archive; extract the CSV first"),
             (b"PAR1", "is a Parquet file; name it .parquet"),
             (b"ARROW1", "is an Arrow IPC file; name it .arrow"),
             (b"\xff\xfe", "is UTF-16 text; save it as UTF-8"),
             (b"\xfe\xff", "is UTF-16 text; save it as UTF-8"))
#: bytes of a CSV checked to be text before pyarrow parses it
_TEXT_PROBE = 1 << 16


def check_csv_text(p: Path) -> list[str]:
    """Refuse a ``.csv`` that is not UTF-8 text before pyarrow parses it: pyarrow reads any bytes as a header
    (a gzip or binary file would be reported by its garbage "column names", or fail with a decoding traceback).
    Checks the first 64 KiB; an empty file is refused too. Returns the header's column names (as the file
    spells them, in its order)."""
    try:
        with open(p, "rb") as f:
            head = f.read(_TEXT_PROBE)
    except OSError as exc:
        raise TraceError(f"{p}: cannot read: {os.strerror(exc.errno) if exc.errno else exc}") from exc
    if not head:
        raise TraceValueError(f"{p}: empty file (0 bytes; expected a CSV header and rows)")
    for magic, what in _NOT_TEXT:
        if head.startswith(magic):
            raise TraceError(f"{p}: not a CSV text file: it {what}")
    try:
        # an incremental decoder: a multi-byte character cut by the 64 KiB probe is not an error
        codecs.getincrementaldecoder("utf-8")().decode(head, final=len(head) < _TEXT_PROBE)
        ok = b"\0" not in head
    except UnicodeDecodeError:
        ok = False
    if not ok:
        raise TraceError(f"{p}: not a CSV text file: its first bytes are not UTF-8 text ({head[:8]!r})")
    header = head.decode("utf-8", errors="replace").lstrip("\ufeff").splitlines()[0] if head.strip() else ""
    return next(csv.reader([header]), [])


def check_unique_columns(p: Path, names: list[str], what: str) -> None:
    """Refuse a header that names a column twice (pyarrow reads it, then cannot tell which one a name means:
    a KeyError traceback): one line naming the file, the column and its positions (1-based)."""
    seen: dict[str, int] = {}
    for i, name in enumerate(names, 1):
        if name in seen:
            raise TraceSchemaError(f"{p}: column {name!r} appears twice in the {what} (columns {seen[name]} and {i})")
        seen[name] = i


def _open_azure_csv(p: Path) -> tuple[TraceInfo, Callable, pa.Schema]:
    header = check_csv_text(p)
    check_unique_columns(p, header, "CSV header")
    raw_schema = pa.schema(
        [
            ("request_id", pa.int64()),
            ("arrival", pa.timestamp("ns")),
            ("context_tokens", pa.int64()),
            ("generated_tokens", pa.int64()),
        ],
        metadata={SOURCE_KEY: p.name},
    )
    info = replace(trace_info(raw_schema, p, kind=REQUESTS), column_names=AZURE_NAMES)

    def open_reader() -> pcsv.CSVStreamingReader:
        try:
            # use_threads=False makes pyarrow report line numbers in parse errors
            return pcsv.open_csv(
                p,
                read_options=pcsv.ReadOptions(use_threads=False),
                # only an empty cell is missing: 'nan', 'NA', 'null' are invalid values, said as written
                convert_options=pcsv.ConvertOptions(column_types=AZURE_COLUMNS, null_values=[""]),
            )
        except pa.ArrowInvalid as exc:
            raise _csv_error(p, exc, header) from exc

    # check the header before streaming so a wrong file fails fast, with its column names
    names = open_reader().schema.names
    missing = [c for c in AZURE_COLUMNS if c not in names]
    if missing:
        raise TraceSchemaError(
            f"{p}: missing column(s) {', '.join(missing)} in the CSV header (found: {', '.join(names)})"
        )

    def raw() -> Iterator[pa.RecordBatch]:
        reader = open_reader()
        row0 = 0
        while True:
            try:
                b = reader.read_next_batch()
            except StopIteration:
                return
            except pa.ArrowInvalid as exc:
                raise _csv_error(p, exc, header) from exc
            n = b.num_rows
            yield pa.RecordBatch.from_arrays(
                [
                    pa.array(np.arange(row0 + 1, row0 + n + 1, dtype=np.int64)),
                    b.column("TIMESTAMP"),
                    b.column("ContextTokens"),
                    b.column("GeneratedTokens"),
                ],
                schema=raw_schema,
            )
            row0 += n

    return info, raw, raw_schema


# --- Arrow IPC and Parquet --------------------------------------------------------------------------------
def _open_columnar(
    p: Path, fmt: str, num_experts: int | None, model: str | None, batch_rows: int
) -> tuple[TraceInfo, Callable, pa.Schema]:
    if p.is_dir():
        try:
            dataset = ds.dataset(p, format="parquet" if fmt == "parquet" else "ipc", partitioning="hive")
        except (pa.ArrowInvalid, OSError) as exc:
            raise TraceError(f"{p}: cannot open {fmt} dataset: {one_line(exc)}") from exc
        if not dataset.files:
            raise TraceError(f"{p}: dataset folder holds no {fmt} files")
        # the dataset schema comes from one fragment; take metadata from the first file in sorted order
        schema = dataset.schema
        if not schema.metadata:
            first = min(dataset.files)
            schema = schema.with_metadata(_file_schema(Path(first), fmt).metadata or {})
        info = trace_info(schema, p, num_experts=num_experts, model=model)
        check_schema(schema, info)
        cols = [c for c in info.schema().names if c in schema.names]
        return info, lambda: dataset.to_batches(columns=cols, batch_size=batch_rows), schema

    schema = _file_schema(p, fmt)
    check_unique_columns(p, schema.names, f"{fmt} schema")
    info = trace_info(schema, p, num_experts=num_experts, model=model)
    check_schema(schema, info)
    cols = [c for c in info.schema().names if c in schema.names]
    if fmt == "parquet":

        def raw() -> Iterator[pa.RecordBatch]:
            with pq.ParquetFile(p) as pf:
                yield from pf.iter_batches(batch_size=batch_rows, columns=cols)

    else:

        def raw() -> Iterator[pa.RecordBatch]:
            # read batch by batch through a plain file (not a memory map): each batch is read into memory and
            # released once consumed, so resident memory stays at about one batch however large the file
            with pa.OSFile(str(p)) as src:
                try:
                    reader = pa.ipc.open_file(src)
                    batches = (reader.get_batch(i) for i in range(reader.num_record_batches))
                except pa.ArrowInvalid:
                    src.seek(0)
                    batches = pa.ipc.open_stream(src)
                for b in batches:
                    yield b.select(cols)

    return info, raw, schema


def _file_schema(p: Path, fmt: str) -> pa.Schema:
    try:
        if fmt == "parquet":
            return pq.read_schema(p)
        with pa.memory_map(str(p)) as src:
            try:
                return pa.ipc.open_file(src).schema
            except pa.ArrowInvalid:
                src.seek(0)
                return pa.ipc.open_stream(src).schema
    except (pa.ArrowInvalid, OSError) as exc:
        raise TraceError(f"{p}: not a readable {fmt} file: {one_line(exc)}") from exc


# --- entry points -----------------------------------------------------------------------------------------
def open_trace(
    path: str | Path,
    format: str | None = None,
    num_experts: int | None = None,
    model: str | None = None,
    *,
    batch_rows: int = DEFAULT_BATCH_ROWS,
    npz_labels: tuple[int, int] = (0, 0),
) -> TraceStream:
    """Open a trace for streaming; checks format, schema version and metadata, not yet the rows.

    Parameters
    ----------
    path : str or Path
        A file (``.arrow``/``.feather``, ``.parquet``, ``.npz``, ``.npy``, ``.csv``) or a folder (of
        ``.npz`` / ``.npy`` files, or a hive-partitioned Parquet / Arrow dataset).
    format : str, optional
        One of :data:`FORMATS`; default from the suffix or the folder contents.
    num_experts : int, optional
        Routing traces: experts per layer, when the file does not say (``.npz``) or to check it.
    model : str, optional
        Routing traces: model name stored as metadata; a known name (:data:`KNOWN_MODELS`) also gives
        num_experts and top_k. For ``.npz`` files it defaults to the artifact folder name (``mixtral_b64``).
    batch_rows : int
        Maximum rows per streamed batch.
    npz_labels : (int, int)
        ``(iteration, layer)`` of a single ``.npz`` routing file whose name is not ``<iteration>_<layer>.npz``.

    Returns
    -------
    TraceStream
    """
    p = Path(path)
    fmt = detect_format(p, format)
    if fmt == "npz":
        info, raw, _ = _open_npz(p, num_experts, model, npz_labels)
    elif fmt == "npy":
        info, raw, _ = _open_npy(p)
    elif fmt == "azure-csv":
        if p.is_dir():
            raise TraceError(f"{p}: the azure-csv format reads one file, not a folder")
        info, raw, _ = _open_azure_csv(p)
    else:
        info, raw, _ = _open_columnar(p, fmt, num_experts, model, batch_rows)
    if info.kind != ROUTING and (num_experts is not None or model is not None):
        raise ConfigError(f"{p}: num_experts / model only apply to routing traces, this is a {info.kind} trace")
    return TraceStream(info=info, path=p, format=fmt, _raw=raw, batch_rows=batch_rows)


def read_trace(
    path: str | Path,
    format: str | None = None,
    num_experts: int | None = None,
    model: str | None = None,
    *,
    npz_labels: tuple[int, int] = (0, 0),
) -> pa.Table:
    """Read, validate and normalize a whole trace into one table.

    See :func:`open_trace` for the parameters. The result has the normalized schema of its kind
    (:mod:`stepsim.trace_io.schemas`) with ``stepsim.schema_version`` / ``stepsim.kind`` metadata.

    Raises
    ------
    TraceError
        (or its subclasses TraceSchemaError / TraceValueError) naming the file, row, column and value.
    """
    return open_trace(path, format, num_experts, model, npz_labels=npz_labels).read_all()


def _num_experts(table: pa.Table | pa.RecordBatch) -> int:
    meta = decode_metadata(table.schema)
    if NUM_EXPERTS_KEY not in meta:
        raise TraceSchemaError("routing table has no 'num_experts' metadata; pass num_experts=")
    return int(meta[NUM_EXPERTS_KEY])


def expert_counts(table: pa.Table | pa.RecordBatch, num_experts: int | None = None) -> np.ndarray:
    """Tokens routed to each expert: ``bincount(expert_ids, minlength=num_experts)``.

    Parameters
    ----------
    table : pyarrow.Table or RecordBatch
        A normalized routing trace.
    num_experts : int, optional
        Default: the table's ``num_experts`` metadata.

    Returns
    -------
    ndarray of int64, shape (num_experts,)
        Token-expert assignments per expert (tokens).
    """
    n = num_experts if num_experts is not None else _num_experts(table)
    col = table.column("expert_ids")
    chunks = col.chunks if isinstance(col, pa.ChunkedArray) else [col]
    counts = np.zeros(n, dtype=np.int64)
    for chunk in chunks:
        counts += np.bincount(chunk.flatten().to_numpy(), minlength=n)[:n]
    return counts


def routing_matrix(table: pa.Table | pa.RecordBatch, dtype=np.int64) -> np.ndarray:
    """Expert ids as a ``[tokens, top_k]`` array (int64 by default, like the artifact's ``data``)."""
    col = table.column("expert_ids")
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks() if col.num_chunks else pa.array([], col.type)
    k = col.type.list_size
    return col.flatten().to_numpy().astype(dtype).reshape(-1, k)


def validate_trace(
    path,
    format: str | None = None,
    num_experts: int | None = None,
    model: str | None = None,
    *,
    tile: int = 32,
):
    """Validate a trace file by streaming over its record batches; return its statistics.

    Memory is bounded by one record batch (:data:`~stepsim.trace_io.readers.DEFAULT_BATCH_ROWS` rows) plus
    the running aggregates, whatever the trace length.

    Parameters
    ----------
    path, format, num_experts, model
        As for :func:`stepsim.trace_io.readers.open_trace`.
    tile : int
        Sequence tile (tokens) for the KV-tile statistics of decode batches.

    Returns
    -------
    TraceSummary
        Row count, per-expert counts (routing) or length statistics.

    Raises
    ------
    TraceError
        The first problem found, naming file, row, column and value.
    """
    from stepsim.trace_io.summary import TraceSummary

    stream = open_trace(path, format, num_experts, model)
    return TraceSummary(stream.info, tile=tile).consume(stream.batches())
