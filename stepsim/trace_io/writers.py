"""Write normalized traces as Arrow IPC (``.arrow`` / ``.feather``) or Parquet, atomically and streaming.

Batches are written as they arrive, so converting a large trace never holds it whole in memory. The output
appears only when complete (:func:`stepsim.base.files.atomic_output`). Same batches in -> same bytes out: Arrow
IPC files are uncompressed (memory-mappable, zero-copy reads) and Parquet files use zstd with fixed row-group
sizes.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from stepsim.base.errors import ConfigError
from stepsim.base.files import atomic_output

#: output suffix -> format
OUTPUT_FORMATS = {".arrow": "arrow", ".feather": "arrow", ".ipc": "arrow", ".parquet": "parquet", ".pq": "parquet"}
#: rows per Parquet row group: ~1 M rows keeps row groups of a routing trace at a few MB compressed
ROW_GROUP_ROWS = 1 << 20


def output_format(path: str | Path) -> str:
    """``"arrow"`` or ``"parquet"`` from the suffix of ``path``.

    Raises
    ------
    ConfigError
        Any other suffix.
    """
    fmt = OUTPUT_FORMATS.get(Path(path).suffix.lower())
    if fmt is None:
        raise ConfigError(f"output {str(path)!r}: suffix must be one of {', '.join(sorted(OUTPUT_FORMATS))}")
    return fmt


def write_trace(data: pa.Table | Iterable[pa.RecordBatch], path: str | Path, schema: pa.Schema | None = None) -> int:
    """Write a trace table or a stream of record batches to ``path`` (format from its suffix).

    Parameters
    ----------
    data : pyarrow.Table or iterable of RecordBatch
        Normalized trace rows (e.g. ``open_trace(...).batches()``); consumed once, in order.
    path : str or Path
        ``.arrow`` / ``.feather`` / ``.ipc`` (Arrow IPC file) or ``.parquet`` / ``.pq``.
    schema : pyarrow.Schema, optional
        Schema with metadata; default ``data.schema`` (required for a batch iterator without ``.schema``).

    Returns
    -------
    int
        Rows written.
    """
    fmt = output_format(path)
    if schema is None:
        schema = getattr(data, "schema", None)
        if schema is None:
            raise ConfigError("write_trace needs schema= when data is a plain iterator of batches")
    batches = data.to_batches() if isinstance(data, pa.Table) else data
    rows = 0
    with atomic_output(path) as tmp:
        if fmt == "arrow":
            with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, schema) as writer:
                for b in batches:
                    writer.write_batch(b)
                    rows += b.num_rows
        else:
            with pq.ParquetWriter(tmp, schema, compression="zstd") as writer:
                pending: list[pa.RecordBatch] = []
                n = 0
                # regroup the stream into fixed-size row groups so the layout never depends on the input's
                # batch boundaries (and row groups are neither tiny nor unbounded)
                for b in batches:
                    pending.append(b)
                    n += b.num_rows
                    rows += b.num_rows
                    while n >= ROW_GROUP_ROWS:
                        table = pa.Table.from_batches(pending, schema=schema)
                        writer.write_table(table.slice(0, ROW_GROUP_ROWS), row_group_size=ROW_GROUP_ROWS)
                        rest = table.slice(ROW_GROUP_ROWS)
                        pending, n = rest.to_batches(), rest.num_rows
                if n:
                    writer.write_table(pa.Table.from_batches(pending, schema=schema), row_group_size=ROW_GROUP_ROWS)
    return rows
