"""The sweep's result files: rows batched into part files, an index of finished tasks, old generations purged.

Layout under the output folder (hive folders from ``partition_by``)::

    <k>=<v>/.../part-<stem>.parquet       the rows (one per task, ok or failed) of one batch of tasks
    <k>=<v>/.../_units-<stem>.parquet     per-unit counters of the batch's simulation rows (``run_id`` column)
    <k>=<v>/.../_channels-<stem>.parquet  per-channel counters, likewise

A batch holds the tasks of one partition folder that finished within :data:`FLUSH_SECONDS` of each other, at
most ``batch_rows`` of them (:func:`batch_rows_for` sizes it so a grid writes about :data:`TARGET_FILES` part
files: a one-task batch for small sweeps, thousands of rows per file for a million-task sweep). ``stem`` is the
key (``run_id[:16]``) of the batch's first task, with ``-<n>`` appended if a file of that name exists, so a
one-task batch is named after its task as one-file-per-task sweeps named it.

Every file is written atomically (temp file + rename), the counter files before their part file, so a part
file that exists is complete and implies its counters. What is done is read from the rows themselves
(:class:`ResultIndex`: ``run_id`` and ``status`` columns), not from file names. At start the runner removes temp
files of a killed writer and counter files whose part file was never written (:func:`remove_leftovers`).

Two rows with the same task slot (:func:`stepsim.batch.grid.slot_key`: knobs as spelled) and different run
ids are two generations of one task (its trace or hardware file changed): the older rows are removed
(:meth:`ResultIndex.purge`) before any row of the new generation is written, so a folder never holds both.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from stepsim.base.files import VERSION_KEY, partition_dir, published_together, write_parquet_atomic
from stepsim.batch.grid import KEY_DIGITS, TEMP_GLOBS, Task, slot_key

ROW_PREFIX = "part-"
COUNTER_PREFIXES = ("_units-", "_channels-")
ROW_GLOB = f"**/{ROW_PREFIX}*.parquet"
#: about how many part files a grid writes (per partition folder, at most one per FLUSH_SECONDS besides)
TARGET_FILES = 256
#: the largest batch (rows per part file)
MAX_BATCH_ROWS = 20_000
#: a batch is written at the latest this long after its first row arrived (seconds)
FLUSH_SECONDS = 60.0
#: a batch is written once its counter tables hold this many rows (bounds the parent's memory)
MAX_BUFFERED_COUNTER_ROWS = 500_000


def batch_rows_for(tasks: int) -> int:
    """Rows per part file for a grid of ``tasks`` tasks: about :data:`TARGET_FILES` files, 1 for small grids."""
    return max(1, min(MAX_BATCH_ROWS, math.ceil(tasks / TARGET_FILES)))


def partition_values(out: Path, path: Path) -> dict[str, str]:
    """The hive ``k=v`` levels between ``out`` and the file ``path`` (values unescaped, as strings)."""
    values = {}
    for part in path.relative_to(out).parent.parts:
        key, _, value = part.partition("=")
        values[key] = unquote(value)
    return values


def row_files(out: Path) -> list[Path]:
    """Every part file under ``out``, sorted by path."""
    return sorted(out.glob(ROW_GLOB)) if out.is_dir() else []


def counter_path(part: Path, prefix: str) -> Path:
    """The counter file (``_units-`` / ``_channels-``) beside the part file ``part``."""
    return part.with_name(prefix + part.name[len(ROW_PREFIX):])


def remove_temp_files(out: Path, temp_globs: Iterable[str] = TEMP_GLOBS) -> list[Path]:
    """Delete the temp files of interrupted writes under ``out`` (files matching ``temp_globs``); return them."""
    temps = sorted(p for pattern in temp_globs for p in out.glob(pattern)) if out.is_dir() else []
    for path in temps:
        path.unlink(missing_ok=True)
    return temps


def remove_leftovers(out: Path, temp_globs: Iterable[str]) -> tuple[list[Path], list[Path]]:
    """Delete temp files of interrupted writes, and counter files without their part file (a writer killed
    between the two); return ``(temp files, counter files)`` removed."""
    temps = remove_temp_files(out, temp_globs)
    orphans = []
    for prefix in COUNTER_PREFIXES:
        for counters in sorted(out.glob(f"**/{prefix}*.parquet")) if out.is_dir() else []:
            if not counters.with_name(ROW_PREFIX + counters.name[len(prefix):]).exists():
                orphans.append(counters)
    for path in orphans:
        path.unlink(missing_ok=True)
    return temps, orphans


@dataclass
class Entry:
    """A finished task's row: where it is, its status, its slot."""

    path: Path
    status: str
    slot: str


@dataclass
class ResultIndex:
    """The rows already under an output folder: ``{task key: Entry}`` and ``{slot: {task keys}}``.

    A search that runs one sweep per round into the same folder (``stepsim optimize``) keeps its index, and
    each sweep calls :meth:`refresh` on it: only the part files added or changed since are read (a file is
    known by its path and its ``stat`` signature), so a search of n rounds reads each file once, not n times.
    The index is the same as a fresh :meth:`load` of the folder either way.
    """

    out: Path
    by_key: dict = field(default_factory=dict)
    by_slot: dict = field(default_factory=dict)
    #: {part file: (stat signature, [(task key, status, slot)] in row order)} as last read
    _files: dict = field(default_factory=dict, repr=False)

    @classmethod
    def load(cls, out: Path) -> ResultIndex:
        """Read the ``run_id``, ``status``, ``mode`` and knob columns of every part file under ``out``."""
        return cls(out).refresh()

    def refresh(self) -> ResultIndex:
        """Bring the index up to the part files under ``out`` now (return it): read the files that are new or
        whose ``stat`` signature changed since they were read (a rewrite is a rename of a new file, so a new
        inode), forget the files that are gone, and rebuild the maps in path order (a key in two files: the
        first one counts, as in :meth:`load`)."""
        files = {}
        for path in row_files(self.out):
            signature = _signature(path)  # before the read: a file replaced meanwhile is read again next time
            known = self._files.get(path)
            files[path] = known if known is not None and known[0] == signature \
                else (signature, _read_rows(self.out, path))
        self._files = files
        self.by_key, self.by_slot = {}, {}
        for path, (_, rows) in files.items():
            for key, status, slot in rows:
                if key in self.by_key:  # a copy left by a crash during a purge: the first one counts
                    continue
                self.by_key[key] = Entry(path, status, slot)
                self.by_slot.setdefault(slot, set()).add(key)
        return self

    def older_generations(self, task: Task) -> set:
        """Keys of rows of ``task``'s slot with another run id (the task's trace or hardware changed)."""
        return self.by_slot.get(task.slot, set()) - {task.key}

    def purge(self, keys: set) -> int:
        """Remove the rows (and counter rows) of ``keys`` from their files; return how many rows went.

        A file left without rows is deleted (part file first: counters without their part file are removed at
        the next start). Otherwise it is rewritten atomically under the same name.
        """
        by_file: dict[Path, set] = {}
        for key in keys:
            entry = self.by_key.pop(key, None)
            if entry is None:
                continue
            by_file.setdefault(entry.path, set()).add(key)
            self.by_slot.get(entry.slot, set()).discard(key)
        removed = 0
        for path, gone in sorted(by_file.items()):
            self._files.pop(path, None)  # rewritten or deleted below: the next refresh reads it again
            table = pq.read_table(path)
            keep = pc.invert(pc.is_in(pc.utf8_slice_codeunits(table["run_id"], 0, KEY_DIGITS),
                                      value_set=pa.array(sorted(gone))))
            kept = table.filter(keep)
            removed += table.num_rows - kept.num_rows
            if kept.num_rows == 0:
                path.unlink()
                for prefix in COUNTER_PREFIXES:
                    counter_path(path, prefix).unlink(missing_ok=True)
                continue
            write_parquet_atomic(kept, path)
            for prefix in COUNTER_PREFIXES:
                counters = counter_path(path, prefix)
                if counters.exists():
                    t = pq.read_table(counters)
                    mask = pc.invert(pc.is_in(pc.utf8_slice_codeunits(t["run_id"], 0, KEY_DIGITS),
                                              value_set=pa.array(sorted(gone))))
                    write_parquet_atomic(t.filter(mask), counters)
        return removed


def _signature(path: Path) -> tuple:
    """What tells a file from its replacement: device, inode, size, modification and change times (ns)."""
    st = path.stat()
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _read_rows(out: Path, path: Path) -> list[tuple[str, str, str]]:
    """``(task key, status, slot)`` of each row of the part file ``path`` under ``out``, in row order."""
    from stepsim.workloads.config import KNOBS

    names = pq.read_schema(path).names
    if "task_slot" in names:  # rows of this version say which task they are
        cols = pq.read_table(path, columns=["run_id", "status", "task_slot"]).to_pydict()
        triples = zip(cols["run_id"], cols["status"], cols["task_slot"])
    else:  # an older sweep's file: the slot from the knob columns and the folder names
        wanted = [c for c in ("run_id", "status", "mode", *KNOBS) if c in names]
        extra = partition_values(out, path)
        rows = pq.read_table(path, columns=wanted).to_pylist()
        triples = ((r["run_id"], r.get("status"), slot_key({**r, **extra})) for r in rows)
    return [(run_id[:KEY_DIGITS], status or "ok", slot) for run_id, status, slot in triples]


@dataclass
class _Batch:
    started: float
    tasks: list = field(default_factory=list)
    rows: list = field(default_factory=list)
    units: list = field(default_factory=list)
    channels: list = field(default_factory=list)
    counter_rows: int = 0
    provenance: dict = field(default_factory=dict)


class BatchWriter:
    """Collects finished tasks' rows per partition folder and writes them as batched part files.

    Parameters
    ----------
    out : Path
        Output folder.
    partition_by : sequence of str
        Hive levels (dropped from the row files, read back from the folder names).
    batch_rows : int
        Rows per part file (see :func:`batch_rows_for`).
    before_write : callable, optional
        Called before every file is written (the runner purges older generations there).
    flush_s : float
        Seconds after which a batch is written even if not full.
    """

    def __init__(self, out: Path, partition_by, batch_rows: int, *, before_write: Callable[[], None] | None = None,
                 flush_s: float = FLUSH_SECONDS):
        self.out = out
        self.partition_by = tuple(partition_by)
        self.batch_rows = batch_rows
        self.flush_s = flush_s
        self.before_write = before_write
        self._batches: dict[Path, _Batch] = {}
        self.files_written: list[Path] = []

    def folder(self, task: Task) -> Path:
        return partition_dir(self.out, task.config, self.partition_by)

    def add(self, task: Task, outcome: dict, table: pa.Table) -> None:
        """Buffer ``task``'s row (``table``: :func:`stepsim.batch.rows.row_table`) and its counters."""
        folder = self.folder(task)
        batch = self._batches.setdefault(folder, _Batch(started=time.monotonic()))
        batch.tasks.append(task)
        batch.rows.append(table.drop_columns([c for c in self.partition_by if c in table.column_names]))
        record = outcome.get("record")
        if len(batch.tasks) == 1:
            batch.provenance = record.provenance() if record is not None else {VERSION_KEY: _version()}
        if record is not None and record.simulated:
            batch.units.append(record.unit_table())
            batch.channels.append(record.channel_table())
            batch.counter_rows += batch.units[-1].num_rows + batch.channels[-1].num_rows
        if len(batch.rows) >= self.batch_rows or batch.counter_rows >= MAX_BUFFERED_COUNTER_ROWS:
            self._write(folder)
        self.write_due()

    def write_due(self) -> None:
        """Write the batches older than ``flush_s``."""
        now = time.monotonic()
        for folder in [f for f, b in self._batches.items() if now - b.started >= self.flush_s]:
            self._write(folder)

    def write_all(self) -> None:
        """Write every buffered batch (end of the sweep, or a stop); run ``before_write`` even if none."""
        if self.before_write is not None:
            self.before_write()
        for folder in list(self._batches):
            self._write(folder)

    def _write(self, folder: Path) -> None:
        batch = self._batches.pop(folder)
        if self.before_write is not None:
            self.before_write()
        stem = batch.tasks[0].key
        n = 0
        while (folder / f"{ROW_PREFIX}{stem}.parquet").exists():
            n += 1
            stem = f"{batch.tasks[0].key}-{n}"
        # one task: the run's full provenance (identity config and hash, trace hash); a batch: the version
        meta = batch.provenance if len(batch.tasks) == 1 else {VERSION_KEY: _version()}
        # the tables and the rows appear together (a full disk leaves none of them, not tables without rows)
        with published_together():
            for prefix, tables in (("_units-", batch.units), ("_channels-", batch.channels)):
                if tables:
                    write_parquet_atomic(pa.concat_tables(tables), folder / f"{prefix}{stem}.parquet", meta)
            path = write_parquet_atomic(pa.concat_tables(batch.rows), folder / f"{ROW_PREFIX}{stem}.parquet",
                                        meta)
        self.files_written.append(path)


def _version() -> str:
    from stepsim._version import __version__

    return __version__
