"""The sweep's rows and files: one row per task, ok or failed, in the record schema plus sweep columns.

A successful task's row is its :class:`~stepsim.records.RunResult` row; a failed task's row has the same
columns (:data:`stepsim.records.SCHEMA`), with its identity and knobs filled in and every measurement null.
Both get the :data:`SWEEP_COLUMNS`, so one dataset holds both and can be filtered on ``status`` and on the
knob columns alike. Files are named as :meth:`RunResult.write` names them (``part-<run_id[:16]>``; simulation
runs add ``_units-`` / ``_channels-`` counter files, written first so a row file implies its counters).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa

from stepsim._version import __version__
from stepsim.errors import ConfigError
from stepsim.records import SCHEMA, identity
from stepsim.results import partition_dir, provenance_metadata, read_results, write_parquet_atomic
from stepsim.sweep.grid import RESULT_GLOB, Task, result_path
from stepsim.workloads.config import normalize_config

#: columns added to every row: outcome, typed error (null when ok), wall time of the task in its worker
SWEEP_COLUMNS = pa.schema([
    pa.field("status", pa.string()), pa.field("error_type", pa.string()), pa.field("error_message", pa.string()),
    pa.field("error_traceback", pa.string()), pa.field("task_wall_s", pa.float64(), metadata={"unit": "s"}),
])
#: characters of an error message shown in the summary and in a fail-fast stop (the row keeps all of it)
MAX_MESSAGE_CHARS = 160
#: columns that measure wall-clock time (unit "s"): they differ between runs of the same task, so compare rows
#: without them (build_s, metrics_s, lower_s, compile_s, sim_wall_s, total_s, task_wall_s)
WALL_TIME_COLUMNS = tuple(f.name for schema in (SCHEMA, SWEEP_COLUMNS) for f in schema
                          if (f.metadata or {}).get(b"unit") == b"s")


def failed_row(task: Task) -> dict:
    """The record-schema row of a task that failed: identity and knobs set, measurements null."""
    row = dict.fromkeys(SCHEMA.names)
    row.update({k: v for k, v in normalize_config(task.config).items() if k in row})
    row.update(run_id=task.run_id, stepsim_version=__version__, trace_path=task.trace_path,
               trace_sha256=task.trace_sha256)
    return row


def row_table(task: Task, outcome: dict) -> pa.Table:
    """The one-row table of ``task``: its record row (or :func:`failed_row`) plus the sweep columns."""
    record = outcome["record"]
    table = record.to_arrow() if record is not None else pa.Table.from_pylist([failed_row(task)], schema=SCHEMA)
    values = {"status": outcome["status"], "error_type": outcome["error_type"],
              "error_message": outcome["error_message"], "error_traceback": outcome["error_traceback"],
              "task_wall_s": outcome["wall_s"]}
    for f in SWEEP_COLUMNS:
        table = table.append_column(f, pa.array([values[f.name]], type=f.type))
    return table


def write_task(out: Path, task: Task, outcome: dict, table: pa.Table, partition_by: Sequence[str]) -> Path:
    """Write ``task``'s files under ``out`` atomically; return the row file's path.

    ``table`` is :func:`row_table`'s. The partition keys become folder levels (values from the task config, so
    the path is known before the task runs) and are left out of the row file, as hive layouts expect. Schema
    metadata records provenance (stepsim version, the run's identity config and hash, the trace hash), as
    :meth:`RunResult.write` does.
    """
    record = outcome["record"]
    if record is not None:
        meta = record.provenance()
        if record.simulated:  # counters first: a row file that exists implies its counter files do
            folder = partition_dir(out, task.config, partition_by)
            write_parquet_atomic(record.unit_table(), folder / f"_units-{task.key}.parquet", meta)
            write_parquet_atomic(record.channel_table(), folder / f"_channels-{task.key}.parquet", meta)
    else:
        meta = provenance_metadata(identity(normalize_config(task.config), task.trace_sha256),
                                   trace_hash=task.trace_sha256)
    table = table.drop_columns([c for c in partition_by if c in table.column_names])
    return write_parquet_atomic(table, result_path(out, task, partition_by), meta)


def first_line(message: str | None, limit: int = MAX_MESSAGE_CHARS) -> str:
    """The first line of an error message, cut at ``limit`` characters (a deadlock lists every blocked unit;
    the full message is in the row's ``error_message``)."""
    if not message:
        return ""
    text = message.splitlines()[0]
    more = text != message
    if len(text) > limit:
        text, more = text[:limit].rstrip(), True
    return f"{text} [...]" if more else text


def read_sweep(out: str | Path, filter=None) -> pa.Table:
    """Read every row of the sweep output folder ``out`` (ok and failed), partition columns restored.

    The partition levels are read off the folder names (``workload=swiglu/...``), so the caller need not
    repeat the sweep file's ``partition_by``; their values come back as strings.

    Parameters
    ----------
    out : str or Path
        Output folder of ``stepsim sweep``.
    filter : pyarrow.compute.Expression, optional
        Row filter, e.g. ``pc.field("status") == "ok"``.

    Raises
    ------
    ConfigError
        No result file under ``out``.
    """
    out = Path(out)
    first = next(iter(sorted(out.glob(RESULT_GLOB))), None)
    if first is None:
        raise ConfigError(f"{out}: no sweep result files (part-*.parquet) found")
    partition_cols = [part.split("=", 1)[0] for part in first.relative_to(out).parent.parts]
    return read_results(out, partition_cols, filter=filter)
