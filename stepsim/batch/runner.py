"""Run a sweep: expand, skip finished tasks, run the rest in parallel, write the rows in batched part files.

The parent process is the only writer: workers return rows, and the parent writes them in batches
(:mod:`stepsim.batch.store`), each file atomically (:func:`stepsim.base.files.write_parquet_atomic`: temp file,
fsync, rename). A file that exists is therefore complete, and "which tasks are done" is "which run ids have a
row" (:class:`~stepsim.batch.store.ResultIndex`). An interrupted sweep (Ctrl-C, SIGTERM, a killed worker, a
fail-fast stop) writes the rows it holds before it stops; a killed parent loses at most the rows of its
unwritten batches (at most :data:`~stepsim.batch.store.FLUSH_SECONDS` of work); running it again runs exactly
the tasks without a row. Temp files of a parent killed mid-write, and counter files whose part file was never
written, are removed at the next start, under a lock that keeps two sweeps from writing into one folder.

Grids of up to :data:`EAGER_TASKS` tasks are expanded (and every task checked) before anything runs; larger
ones are expanded lazily while they run, so a million-point grid starts at once. Grids larger than the
sweep file's ``max_tasks`` (default :data:`~stepsim.batch.config.DEFAULT_MAX_TASKS`) need ``yes=True``
(``--yes``).

A task whose trace or hardware file changed since its row was written has a new run id (the id hashes their
content); its old row is removed before the new one is written, so the folder never holds two generations.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq
from tqdm import tqdm

from stepsim.base.errors import ConfigError, StepsimError
from stepsim.base.signals import handlers, interrupts_raise, raise_if_stopped, reason
from stepsim.batch.config import DEFAULT_MAX_TASKS, SweepSpec
from stepsim.batch.executor_factory import make_executor
from stepsim.batch.executors import WorkerLostError, check_jobs, default_jobs
from stepsim.batch.grid import TEMP_GLOBS, Task, expand, iter_tasks
from stepsim.batch.rows import first_line, row_table
from stepsim.batch.store import BatchWriter, ResultIndex, batch_rows_for, remove_leftovers, remove_temp_files
from stepsim.batch.tasks import FAILED

#: grids up to this many points are expanded and checked before any task runs; larger ones lazily
EAGER_TASKS = DEFAULT_MAX_TASKS
#: tasks of the grid whose rows a report keeps (the summary's table)
HEAD_TASKS = 20
LOCK_NAME = ".stepsim-sweep.lock"


@dataclass
class SweepReport:
    """What a sweep did.

    Attributes
    ----------
    spec : SweepSpec
        The sweep file.
    out : Path
        Output folder.
    total : int
        Tasks of the grid (after dropping repeats), or, for a lazily expanded grid that stopped early, its
        point count (:attr:`SweepSpec.points`).
    head : list of Task
        The first :data:`HEAD_TASKS` tasks in grid order (the summary's table).
    outcomes : dict
        ``{task key: outcome}`` of the tasks run now: ``status``, ``error_type``, ``error_message``, ``wall_s``,
        and ``row`` (the written row as a dict, partition keys included) for the tasks of ``head``.
    skipped : dict
        ``{task key: part file}`` of the tasks that already had a row.
    skipped_status : dict
        ``{task key: "ok" | "failed"}`` recorded in those rows.
    removed_temp_files : list of Path
        Temp files of an interrupted earlier sweep, deleted.
    removed_counter_files : list of Path
        Counter files without their part file (a sweep killed between the two writes), deleted.
    superseded : int
        Rows of older generations of tasks (their trace or hardware file changed) removed.
    files_written : list of Path
        Part files written by this sweep.
    executor : str
        Executor description (empty when nothing had to run).
    wall_s : float
        Wall time of the whole sweep (seconds).
    """

    spec: SweepSpec
    out: Path
    total: int = 0
    head: list = field(default_factory=list)
    outcomes: dict = field(default_factory=dict)
    skipped: dict = field(default_factory=dict)
    skipped_status: dict = field(default_factory=dict)
    removed_temp_files: list = field(default_factory=list)
    removed_counter_files: list = field(default_factory=list)
    superseded: int = 0
    files_written: list = field(default_factory=list)
    executor: str = ""
    wall_s: float = 0.0
    _failed: list = field(default_factory=list, repr=False)

    @property
    def tasks(self) -> list:
        """The first tasks of the grid (:attr:`head`); the grid itself is never held in memory."""
        return self.head

    @property
    def ran(self) -> int:
        """Tasks run (and written) by this sweep."""
        return len(self.outcomes)

    @property
    def failed(self) -> list:
        """Tasks whose row says failed (run now, or recorded by an earlier sweep), in grid order."""
        return sorted(self._failed, key=lambda t: t.index)

    @property
    def not_run(self) -> int:
        """Tasks still without a row (the sweep stopped early)."""
        return max(self.total - self.ran - len(self.skipped), 0)

    def status(self, task: Task) -> str | None:
        """``ok`` / ``failed`` for a task with a row, None for one without."""
        if task.key in self.outcomes:
            return self.outcomes[task.key]["status"]
        return self.skipped_status.get(task.key)

    def row(self, task: Task) -> dict | None:
        """The result row of ``task`` (read back from its file when an earlier sweep wrote it)."""
        if task.key in self.outcomes:
            return self.outcomes[task.key].get("row")
        if task.key in self.skipped:
            table = pq.read_table(self.skipped[task.key])
            match = table.filter(pc.equal(table["run_id"], task.run_id))
            return match.to_pylist()[0] if match.num_rows else None
        return None


class SweepStopped(StepsimError):
    """The sweep stopped before every task had a row: fail-fast, a lost worker, or Ctrl-C.

    Attributes
    ----------
    reason : str
        ``fail-fast``, ``worker-lost``, ``interrupted`` (Ctrl-C / SIGINT) or ``terminated`` (SIGTERM).
    report : SweepReport
        What was done before the stop (those rows are written; a re-run resumes after them).
    """

    def __init__(self, reason: str, message: str, report: SweepReport):
        super().__init__(message)
        self.reason = reason
        self.report = report


def run_sweep(spec: SweepSpec, *, out: str | Path | None = None, executor="local", jobs: int | None = None,
              address: str | None = None, fail_fast: bool = False, retry_failed: bool = False,
              progress: bool = True, on_outcome: Callable[[Task, dict], None] | None = None,
              yes: bool = False, force: bool = False, index: ResultIndex | None = None) -> SweepReport:
    """Run every task of ``spec`` that has no row yet.

    Parameters
    ----------
    spec : SweepSpec
        The checked sweep file.
    out : str or Path, optional
        Output folder; default: the sweep file's ``out``.
    executor : str or executor object
        ``local`` (worker processes here) or ``dask``; or an executor object with ``imap_unordered``
        (for embedding and tests), which is used as is and not closed here.
    jobs : int, optional
        Workers, >= 1 (default: the CPUs this process may use).
    address : str, optional
        Dask scheduler address (``executor="dask"``); without one a local cluster is started.
    fail_fast : bool
        Stop at the first failed task (its row is written) with :class:`SweepStopped`.
    retry_failed : bool
        Run again the tasks whose recorded row says failed (default: they count as done).
    progress : bool
        Show a progress bar on stderr (tasks done, ETA, failures).
    on_outcome : callable, optional
        Called as ``on_outcome(task, outcome)`` after each outcome is taken in (its row may still be buffered).
    yes : bool
        Run a grid larger than ``max_tasks`` (``--yes``).
    force : bool
        Simulate the tasks the run-size estimate refuses (``--force``); without it each is a failed row whose
        error names the estimate (:mod:`stepsim.kernels.run_size`).
    index : ResultIndex, optional
        The index of ``out`` an earlier sweep into the same folder left (a search's rounds): refreshed here,
        reading only the part files added or changed since, and updated by this sweep; default: a fresh one.

    Returns
    -------
    SweepReport

    Raises
    ------
    ConfigError
        No output folder, bad ``jobs``, a grid larger than ``max_tasks`` without ``yes``, an invalid task
        config, or another sweep holds the folder's lock.
    SweepStopped
        Fail-fast stop, a worker died, Ctrl-C or SIGTERM; ``.report`` tells what was done.
    """
    start = time.perf_counter()
    if force:
        spec = replace(spec, force=True)
    out = Path(out) if out is not None else spec.out
    if out is None:
        raise ConfigError(f"{spec.source}: no output folder; set out = \"...\" in the sweep file or pass --out")
    if jobs is not None:
        check_jobs(jobs)
    if index is not None and index.out != out:
        raise ValueError(f"the index given is of {index.out}, not of the output folder {out}")
    check_size(spec, yes)
    tasks: Iterable[Task] = expand(spec) if spec.points <= EAGER_TASKS else iter_tasks(spec)
    _make_output_folder(out)  # after every task of an eager grid is checked: a bad value leaves no empty folder
    report = SweepReport(spec=spec, out=out, total=len(tasks) if isinstance(tasks, list) else spec.points)
    try:
        with _exclusive(out), interrupts_raise():
            temps, orphans = remove_leftovers(out, TEMP_GLOBS)
            report.removed_temp_files.extend(temps)
            report.removed_counter_files.extend(orphans)
            index = index.refresh() if index is not None else ResultIndex.load(out)
            _run(report, tasks, index, executor, jobs or default_jobs(), address, fail_fast, retry_failed,
                 progress, on_outcome)
    finally:  # also for a SweepStopped, whose report is printed
        report.wall_s = time.perf_counter() - start
    return report


def _make_output_folder(out: Path) -> None:
    """Create ``out`` (and check it takes files) before any task runs; a ConfigError naming it otherwise."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / f".stepsim-write-check-{os.getpid()}"
        probe.touch()
        probe.unlink()
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        if isinstance(exc, (FileExistsError, NotADirectoryError)):
            reason = "a file is in the way (the output is a folder)"
        raise ConfigError(f"cannot write the sweep's output folder {out} (--out / the sweep file's out): "
                          f"{reason}") from None


def check_size(spec: SweepSpec, yes: bool) -> None:
    """Refuse a grid larger than the file's ``max_tasks`` (default 10,000) unless ``yes``."""
    limit = spec.max_tasks if spec.max_tasks is not None else DEFAULT_MAX_TASKS
    if spec.points > limit and not yes:
        raise ConfigError(f"{spec.source}: the grid has {spec.points:,} points, more than "
                          f"{'max_tasks = ' if spec.max_tasks is not None else ''}{limit:,}; pass --yes to run it "
                          f"(or set max_tasks = {spec.points} in the sweep file); --dry-run lists the first tasks")


def _run(report: SweepReport, tasks: Iterable[Task], index: ResultIndex, executor, jobs: int, address,
         fail_fast: bool, retry_failed: bool, progress: bool, on_outcome) -> None:
    """Skip finished tasks, run the others on the executor, buffer and write their rows."""
    spec = report.spec
    to_purge: set = set()

    def purge() -> None:
        if to_purge:
            report.superseded += index.purge(to_purge)
            to_purge.clear()

    writer = BatchWriter(report.out, spec.partition_by, batch_rows_for(report.total), before_write=purge)
    bar = tqdm(total=report.total, desc="sweep", unit="task", disable=not progress, file=sys.stderr,
               dynamic_ncols=True)
    lazy = not isinstance(tasks, list)
    expanded = 0

    def pending() -> Iterator[Task]:
        nonlocal expanded
        for task in tasks:
            expanded += 1
            if len(report.head) < HEAD_TASKS:
                report.head.append(task)
            to_purge.update(index.older_generations(task))
            entry = index.by_key.get(task.key)
            if entry is not None:
                _check_layout(report.out, task, entry.path, spec.partition_by)
                if not (retry_failed and entry.status == FAILED):
                    report.skipped[task.key] = entry.path
                    report.skipped_status[task.key] = entry.status
                    if entry.status == FAILED:
                        report._failed.append(task)
                    bar.update(1)
                    continue
                to_purge.add(task.key)  # --retry-failed: its failed row goes before the new one is written
            yield task

    queue = pending()
    if not lazy:  # decide every skip (and purge) up front: exact counts, older generations known before writing
        queue = iter(list(queue))
    first = next(queue, None)
    runner = None
    owned = isinstance(executor, str)
    failures = 0
    stopped = True  # until the loop ends normally
    try:
        if first is not None:
            runner = make_executor(executor, jobs=jobs, warm_kernels=spec.mode != "metrics", address=address) \
                if owned else executor
            report.executor = runner.describe()
            for task, outcome in runner.imap_unordered(_chain(first, queue)):
                table = row_table(task, outcome)
                writer.add(task, outcome, table)
                kept = {k: v for k, v in outcome.items() if k not in ("record", "error_traceback")}
                if task.index < HEAD_TASKS:
                    kept["row"] = table.to_pylist()[0]
                report.outcomes[task.key] = kept
                if outcome["status"] == FAILED:
                    report._failed.append(task)
                    failures += 1
                bar.set_postfix(failed=failures, refresh=False)
                bar.update(1)
                if on_outcome is not None:
                    on_outcome(task, outcome)
                # a Ctrl-C whose KeyboardInterrupt a destructor or a Dask callback swallowed (this process only
                # waits here, it runs no engine slice that would raise it again): stop now, not after the last task
                raise_if_stopped()
                if fail_fast and outcome["status"] == FAILED:
                    raise SweepStopped(
                        "fail-fast", f"stopped at the first failed task (--fail-fast): task {task.index} "
                        f"({task.label(spec_axes(spec)) or task.key}): {outcome['error_type']}: "
                        f"{first_line(outcome['error_message'])}", report)
        stopped = False
    except WorkerLostError as exc:
        raise SweepStopped("worker-lost", str(exc), report) from exc
    except KeyboardInterrupt as exc:
        why = reason(exc)
        raise SweepStopped(why, f"{why}; {report.ran} of {_pending_count(report)} task(s) "
                           f"finished and saved; run the same sweep again to resume", report) from None
    finally:
        bar.close()
        held: list = []
        with _signals_deferred(held):  # a second Ctrl-C must not cut the last batch in half
            try:
                if owned and runner is not None and stopped:
                    runner.abort()
                elif owned and runner is not None:
                    runner.close()
            finally:
                writer.write_all()
                report.files_written = writer.files_written
                if stopped:  # every write is done: a temp file left now is an interrupted write's, never finished
                    report.removed_temp_files.extend(remove_temp_files(report.out))
        if lazy and not stopped:
            report.total = expanded
    if held:  # a signal arrived while the last rows were written: the sweep is complete, say so by stopping
        why = "terminated" if signal.SIGTERM in held else "interrupted"
        raise SweepStopped(why, f"{why}; {report.ran} of {_pending_count(report)} task(s) finished and "
                           f"saved; run the same sweep again to resume", report)


def _pending_count(report: SweepReport) -> int:
    """Tasks this sweep had to run (the grid minus those with a row)."""
    return report.total - len(report.skipped)


def _chain(first: Task, rest: Iterator[Task]) -> Iterator[Task]:
    yield first
    yield from rest


@contextmanager
def _signals_deferred(received: list):
    """Hold SIGINT / SIGTERM while the block runs (appending them to ``received``), so a write is not cut
    short; the caller decides what they mean afterwards."""
    def hold(signum, frame):
        received.append(signum)

    with handlers({signal.SIGINT: hold, signal.SIGTERM: hold}):
        yield


def spec_axes(spec: SweepSpec) -> list:
    """Every swept knob of ``spec`` (all grids), in file order."""
    return list(dict.fromkeys(k for grid in spec.grids for k in grid))


def _check_layout(out: Path, task: Task, found: Path, partition_by) -> None:
    """A finished task's row must be in the folder this sweep would write it to (else partition_by changed)."""
    from stepsim.base.files import partition_dir

    expected = partition_dir(out, task.config, tuple(partition_by)) / found.name
    if found != expected:
        raise ConfigError(f"{out}: task {task.index} has its result at {found.relative_to(out)}, not "
                          f"{expected.relative_to(out)}: the folder was written with another partition_by; "
                          f"keep the same partition_by for a folder, or write to another one")


def exclusive(out: Path):
    """Hold the sweep lock of folder ``out`` for a ``with`` block (a ConfigError when another sweep holds it);
    serving sweeps (``stepsim.serve.sweep``) take the same lock."""
    return _exclusive(out)


@contextmanager
def _exclusive(out: Path):
    """Hold an exclusive lock on ``out`` for the sweep (released by the OS if the process dies).

    Two sweeps writing into one folder would each take the other's temp files for leftovers of a crash.
    """
    try:
        import fcntl
    except ImportError:  # no advisory locks on this OS: rely on the user not to run two sweeps into one folder
        yield
        return
    with open(out / LOCK_NAME, "a+") as lock:
        try:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ConfigError(f"another stepsim sweep is writing into {out} (lock {out / LOCK_NAME} is held); "
                              f"wait for it to finish or choose another output folder") from None
        try:
            yield
        finally:
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)
