"""Run a sweep: expand, skip finished tasks, run the rest in parallel, write one result file per task.

The parent process is the only writer: workers return rows, and the parent writes each as soon as it
arrives, atomically (:func:`stepsim.results.write_parquet_atomic`: temp file, fsync, rename). A result file
that exists is therefore complete, and "which tasks are done" is just "which ``part-<key>.parquet`` files
exist" (:func:`stepsim.sweep.grid.existing_keys`). An interrupted sweep (Ctrl-C, a killed worker, a killed
parent, a fail-fast stop) loses at most the tasks that were in flight; running it again runs exactly the
tasks without a file. Temp files of a parent killed mid-write are removed at the next start, under a lock
that keeps two sweeps from writing into the same folder at once.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow.parquet as pq
from tqdm import tqdm

from stepsim.errors import ConfigError, StepsimError
from stepsim.sweep.config import SweepSpec
from stepsim.sweep.executors import WorkerLostError, default_jobs, make_executor
from stepsim.sweep.grid import Task, existing_keys, expand, result_path, stale_temp_files
from stepsim.sweep.rows import first_line, row_table, write_task
from stepsim.sweep.tasks import FAILED, OK

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
    tasks : list of Task
        Every task of the grid, in grid order.
    outcomes : dict
        ``{task key: outcome}`` of the tasks run now: ``status``, ``error_type``, ``error_message``, ``wall_s``
        and ``row`` (the written row as a dict, partition keys included).
    skipped : dict
        ``{task key: result file}`` of the tasks that already had a result file.
    skipped_status : dict
        ``{task key: "ok" | "failed"}`` recorded in those files.
    removed_temp_files : list of Path
        Temp files of an interrupted earlier sweep that were deleted.
    executor : str
        Executor description (empty when nothing had to run).
    wall_s : float
        Wall time of the whole sweep (seconds).
    """

    spec: SweepSpec
    out: Path
    tasks: list
    outcomes: dict = field(default_factory=dict)
    skipped: dict = field(default_factory=dict)
    skipped_status: dict = field(default_factory=dict)
    removed_temp_files: list = field(default_factory=list)
    executor: str = ""
    wall_s: float = 0.0

    @property
    def ran(self) -> int:
        """Tasks run (and written) by this sweep."""
        return len(self.outcomes)

    @property
    def failed(self) -> list:
        """Tasks of the grid whose row says failed (run now, or recorded by an earlier sweep), grid order."""
        return [t for t in self.tasks if self.status(t) == FAILED]

    @property
    def not_run(self) -> int:
        """Tasks still without a result file (the sweep stopped early)."""
        return sum(1 for t in self.tasks if self.status(t) is None)

    def status(self, task: Task) -> str | None:
        """``ok`` / ``failed`` for a task with a row, None for one without."""
        if task.key in self.outcomes:
            return self.outcomes[task.key]["status"]
        return self.skipped_status.get(task.key)

    def row(self, task: Task) -> dict | None:
        """The result row of ``task`` (read back from its file when an earlier sweep wrote it)."""
        if task.key in self.outcomes:
            return self.outcomes[task.key]["row"]
        if task.key in self.skipped:
            return pq.read_table(self.skipped[task.key]).to_pylist()[0]
        return None


class SweepStopped(StepsimError):
    """The sweep stopped before every task had a row: fail-fast, a lost worker, or Ctrl-C.

    Attributes
    ----------
    reason : str
        ``fail-fast``, ``worker-lost`` or ``interrupted``.
    report : SweepReport
        What was done before the stop (those rows are written; a re-run resumes after them).
    """

    def __init__(self, reason: str, message: str, report: SweepReport):
        super().__init__(message)
        self.reason = reason
        self.report = report


def run_sweep(spec: SweepSpec, *, out: str | Path | None = None, executor="local", jobs: int | None = None,
              address: str | None = None, fail_fast: bool = False, retry_failed: bool = False,
              progress: bool = True, on_outcome: Callable[[Task, dict], None] | None = None) -> SweepReport:
    """Run every task of ``spec`` that has no result file yet.

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
        Workers (default: the CPUs this process may use).
    address : str, optional
        Dask scheduler address (``executor="dask"``); without one a local cluster is started.
    fail_fast : bool
        Stop at the first failed task (its row is written) with :class:`SweepStopped`.
    retry_failed : bool
        Run again the tasks whose recorded row says failed (default: they count as done).
    progress : bool
        Show a progress bar on stderr (tasks done, ETA, failures).
    on_outcome : callable, optional
        Called as ``on_outcome(task, outcome)`` after each row is written.

    Returns
    -------
    SweepReport

    Raises
    ------
    ConfigError
        No output folder, a task config is invalid, or another sweep holds the folder's lock.
    SweepStopped
        Fail-fast stop, a worker died, or Ctrl-C; ``.report`` tells what was done.
    """
    start = time.perf_counter()
    out = Path(out) if out is not None else spec.out
    if out is None:
        raise ConfigError(f"{spec.source}: no output folder; set out = \"...\" in the sweep file or pass --out")
    tasks = expand(spec)
    out.mkdir(parents=True, exist_ok=True)
    report = SweepReport(spec=spec, out=out, tasks=tasks)
    try:
        with _exclusive(out):
            for temp in stale_temp_files(out):
                temp.unlink(missing_ok=True)
                report.removed_temp_files.append(temp)
            done = existing_keys(out)
            for task in tasks:
                if task.key in done:
                    _check_layout(out, task, done[task.key], spec.partition_by)
                    status = _recorded_status(done[task.key])
                    if not (retry_failed and status == FAILED):
                        report.skipped[task.key] = done[task.key]
                        report.skipped_status[task.key] = status
            pending = [t for t in tasks if t.key not in report.skipped]
            if pending:
                _run_pending(report, pending, executor, jobs or default_jobs(), address, fail_fast, progress,
                             on_outcome)
    finally:  # also for a SweepStopped, whose report is printed
        report.wall_s = time.perf_counter() - start
    return report


def _run_pending(report: SweepReport, pending: list, executor, jobs: int, address, fail_fast: bool,
                 progress: bool, on_outcome) -> None:
    """Run ``pending`` on the executor, writing each row as it arrives; raise SweepStopped on an early stop."""
    spec = report.spec
    owned = isinstance(executor, str)
    bar = tqdm(total=len(pending), desc="sweep", unit="task", disable=not progress, file=sys.stderr,
               dynamic_ncols=True)
    runner = None
    failures = 0
    stopped = True  # until the loop ends normally
    try:
        runner = make_executor(executor, jobs=jobs, warm_kernels=spec.mode != "metrics", address=address) \
            if owned else executor
        report.executor = runner.describe()
        for task, outcome in runner.imap_unordered(pending):
            table = row_table(task, outcome)
            write_task(report.out, task, outcome, table, spec.partition_by)
            # keep the small row, not the record: its unit / channel tables are on disk now
            report.outcomes[task.key] = {**{k: v for k, v in outcome.items() if k != "record"},
                                         "row": table.to_pylist()[0]}
            failures += outcome["status"] == FAILED
            bar.set_postfix(failed=failures, refresh=False)
            bar.update(1)
            if on_outcome is not None:
                on_outcome(task, outcome)
            if fail_fast and outcome["status"] == FAILED:
                raise SweepStopped(
                    "fail-fast", f"stopped at the first failed task (--fail-fast): task {task.index} "
                    f"({task.label(spec_axes(spec)) or task.key}): {outcome['error_type']}: "
                    f"{first_line(outcome['error_message'])}", report)
        stopped = False
    except WorkerLostError as exc:
        raise SweepStopped("worker-lost", str(exc), report) from exc
    except KeyboardInterrupt:
        raise SweepStopped("interrupted", f"interrupted; {report.ran} of {len(pending)} task(s) finished and "
                           f"saved; run the same sweep again to resume", report) from None
    finally:
        bar.close()
        if owned and runner is not None and stopped:
            runner.abort()
        elif owned and runner is not None:
            runner.close()


def spec_axes(spec: SweepSpec) -> list:
    """Every swept knob of ``spec`` (all grids), in file order."""
    return list(dict.fromkeys(k for grid in spec.grids for k in grid))


def _check_layout(out: Path, task: Task, found: Path, partition_by) -> None:
    """A finished task's file must be where this sweep would write it (else partition_by changed)."""
    expected = result_path(out, task, partition_by)
    if found != expected:
        raise ConfigError(f"{out}: task {task.index} has its result at {found.relative_to(out)}, not "
                          f"{expected.relative_to(out)}: the folder was written with another partition_by; "
                          f"keep the same partition_by for a folder, or write to another one")


def _recorded_status(path: Path) -> str:
    """``ok`` / ``failed`` from a result file's status column (a file without one counts as ok)."""
    if "status" not in pq.read_schema(path).names:
        return OK
    column = pq.read_table(path, columns=["status"]).column(0)
    return column[0].as_py() if len(column) else OK


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
