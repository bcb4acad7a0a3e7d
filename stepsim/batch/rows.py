"""The sweep's rows and files: one row per task, ok or failed, in the record schema plus sweep columns.

A successful task's row is its :class:`~stepsim.results.records.RunResult` row; a failed task's row has the same
columns (:data:`stepsim.results.records.SCHEMA`), with its identity and knobs filled in and every measurement null.
Both get the :data:`SWEEP_COLUMNS`, so one dataset holds both and can be filtered on ``status`` and on the
knob columns alike. How rows are batched into files: :mod:`stepsim.batch.store`.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from stepsim._version import __version__
from stepsim.base.errors import ConfigError
from stepsim.batch.columns import SWEEP_COLUMNS
from stepsim.batch.grid import Task
from stepsim.results.records import SCHEMA
from stepsim.workloads.config import normalize_config

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
              "task_wall_s": outcome["wall_s"], "task_slot": task.slot}
    for f in SWEEP_COLUMNS:
        table = table.append_column(f, pa.array([values[f.name]], type=f.type))
    return table


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
    repeat the sweep file's ``partition_by``; their values come back as strings. Reads one-file-per-task
    folders and batched ones alike (:mod:`stepsim.batch.store`). Never returns two generations of one task:
    when rows of one task slot (:func:`~stepsim.batch.grid.slot_key`) have different run ids (a folder that no
    sweep of this version cleaned after the task's trace or hardware file changed), only the rows of the most
    recently written file are kept; a run id is returned once.

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
    from stepsim.batch.store import partition_values, row_files

    out = Path(out)
    files = row_files(out)
    if not files:
        raise ConfigError(f"{out}: no sweep result files (part-*.parquet) found")
    partition_cols = list(partition_values(out, files[0]))
    tables, origins = [], []
    for path in files:
        table = pq.read_table(path)
        values = partition_values(out, path)
        for c in partition_cols:
            table = table.append_column(pa.field(c, pa.string()), pa.array([values.get(c)] * table.num_rows,
                                                                             pa.string()))
        tables.append(table)
        origins.append((path.stat().st_mtime_ns, path.as_posix()))
    table = pa.concat_tables(tables, promote_options="default")
    if not _one_generation(table):
        keep = _latest_generation(tables, origins)
        tables = [t.filter(pa.array(mask)) if not all(mask) else t for t, mask in zip(tables, keep)]
        table = pa.concat_tables(tables, promote_options="default")
    return table.filter(filter) if filter is not None else table


def _one_generation(table: pa.Table) -> bool:
    """Whether every row has a ``task_slot`` and the slots and run ids are all distinct (the fast, usual case)."""
    if "task_slot" not in table.column_names or table["task_slot"].null_count:
        return False
    n = table.num_rows
    return pc.count_distinct(table["task_slot"]).as_py() == n == pc.count_distinct(table["run_id"]).as_py()


def _latest_generation(tables: list, origins: list) -> list:
    """Per table, a keep-mask: each run id once, and per slot only the run id of the newest file."""
    from stepsim.batch.grid import slot_key
    from stepsim.workloads.config import KNOBS

    newest: dict[str, tuple] = {}  # slot -> (origin, run_id) of its newest row
    rows_of = []
    for table, origin in zip(tables, origins):
        columns = [c for c in ("run_id", "mode", *KNOBS) if c in table.column_names]
        rows = table.select(columns).to_pylist()
        rows_of.append(rows)
        for row in rows:
            slot = slot_key(row)
            if slot not in newest or origin > newest[slot][0]:
                newest[slot] = (origin, row["run_id"])
    seen = set()
    masks = []
    for rows in rows_of:
        mask = []
        for row in rows:
            ok = row["run_id"] not in seen and newest[slot_key(row)][1] == row["run_id"]
            seen.add(row["run_id"])
            mask.append(ok)
        masks.append(mask)
    return masks
