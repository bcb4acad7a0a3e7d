"""Run tasks in parallel: a local pool of warm worker processes here, or a Dask cluster (``dask_executor``);
:func:`stepsim.batch.executor_factory.make_executor` picks one.

Both executors take :class:`~stepsim.batch.grid.Task` s and yield ``(task, outcome)`` pairs as tasks finish
(outcome = :func:`stepsim.batch.tasks.run_task`'s dict). They keep at most ``2 * jobs`` tasks submitted at a
time, so a huge grid is never queued up front, a fail-fast stop has little to cancel, and a crash loses at
most the tasks in flight. Leaving the iteration early (fail-fast, Ctrl-C) cancels what is queued; the runner
then aborts the executor, which stops the running tasks too (local workers are terminated; they write nothing,
so a re-run simply picks those tasks up).
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import TYPE_CHECKING

from stepsim.base.errors import ConfigError, StepsimError
from stepsim.base.forkserver import start_fork_server
from stepsim.batch.tasks import caller_context, init_local_worker, run_task

if TYPE_CHECKING:
    from stepsim.batch.grid import Task

EXECUTORS = ("local", "dask")
#: tasks kept submitted per worker: one running plus one queued, so a worker never waits for the parent
IN_FLIGHT_PER_WORKER = 2
#: ``os.nice`` increment of :meth:`LocalExecutor.background`'s workers: the lowest priority
IDLE_NICENESS = 19


class WorkerLostError(StepsimError):
    """A worker process died (killed, out of memory, crashed) while it ran a task; the sweep cannot go on."""


def check_jobs(jobs) -> int:
    """``jobs`` if it is an int >= 1; else a ConfigError naming ``--jobs`` (0 does not mean "all CPUs": leave
    the flag out for that)."""
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ConfigError(f"--jobs must be an int >= 1 (leave it out to use every CPU: {default_jobs()}), "
                          f"got {jobs!r}")
    return jobs


def default_jobs() -> int:
    """CPUs this process may use (the affinity mask where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return max(len(os.sched_getaffinity(0)), 1)
    return max(os.cpu_count() or 1, 1)


class WindowedExecutor(ABC):
    """The submit / wait-for-one / refill loop both executors share; subclasses provide the verbs."""

    name = ""
    jobs = 1
    #: what a worker runs for a task's config; None: :func:`stepsim.batch.tasks.run_task` (a run record). A
    #: driver above batch (``stepsim.serve.sweep``) sets its own module-level function (picklable by reference)
    task_function = None

    @abstractmethod
    def _submit(self, task: Task):
        """Start ``task`` (``run_task(task.config)``) and return its future."""

    @abstractmethod
    def _wait_first(self, futures: list) -> Iterable:
        """Block until at least one of ``futures`` is done; return the done ones."""

    @abstractmethod
    def _outcome(self, future, task: Task, in_flight: int) -> dict:
        """The outcome dict of the done ``future`` of ``task`` (``in_flight`` = tasks submitted, for messages)."""

    @abstractmethod
    def close(self) -> None:
        """Cancel queued tasks, let running ones end, release the workers."""

    def abort(self) -> None:
        """Stop as soon as possible after an early stop (fail-fast, Ctrl-C, a lost worker): by default, close."""
        self.close()

    def _cancel(self, futures: list) -> None:
        for future in futures:
            future.cancel()

    def background(self, task: Task):
        """Start ``task`` at low priority, beside :meth:`imap_unordered`'s tasks, which it must not delay (a
        plan's offered runs between its waves' parts); its future, for :meth:`outcome`."""
        return self._submit(task)

    def outcome(self, future, task: Task, in_flight: int) -> dict:
        """The outcome of ``task``'s ``future`` (waiting for it; ``in_flight``: tasks submitted, for messages)."""
        return self._outcome(future, task, in_flight)

    def imap_unordered(self, tasks: Iterable[Task], *, in_flight: int | None = None) -> Iterator[tuple[Task, dict]]:
        """Yield ``(task, outcome)`` as tasks finish (completion order, not grid order).

        ``in_flight`` overrides the window of :data:`IN_FLIGHT_PER_WORKER` ``* jobs`` submitted tasks. A caller
        with a short, known task list and slow work between two results (``stepsim reproduce`` draws figures)
        submits them all, so the workers never wait for it.

        Raises
        ------
        WorkerLostError
            A worker died; the message names a task that was running and how many did not finish.
        """
        pending = iter(tasks)
        submitted: dict = {}
        limit = in_flight or IN_FLIGHT_PER_WORKER * self.jobs

        def refill():
            while len(submitted) < limit and (task := next(pending, None)) is not None:
                submitted[self._submit(task)] = task

        try:
            refill()
            while submitted:
                for future in self._wait_first(list(submitted)):
                    task = submitted.pop(future)
                    yield task, self._outcome(future, task, len(submitted) + 1)
                refill()
        finally:
            self._cancel(list(submitted))

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def describe(self) -> str:
        """One line for the summary: executor and worker count."""
        return f"{self.name}, {self.jobs} worker{'s' if self.jobs != 1 else ''}"


def local_worker_pool(jobs: int, *, warm_kernels: bool, niceness: int = 0) -> ProcessPoolExecutor:
    """``jobs`` worker processes forked from the fork server (started here unless a command started it earlier),
    each set up by :func:`stepsim.batch.tasks.init_local_worker` with this process's settings and folder, its CPU
    priority lowered by ``niceness`` (``os.nice``)."""
    return ProcessPoolExecutor(max_workers=jobs, mp_context=start_fork_server(warm_kernels=warm_kernels),
                               initializer=init_local_worker,
                               initargs=(warm_kernels, os.getpid(), caller_context(), niceness))


def kill_workers(pool: ProcessPoolExecutor) -> None:
    """Kill ``pool``'s workers mid-task (SIGKILL: they ignore SIGINT and SIGTERM, see
    :func:`stepsim.batch.tasks.init_local_worker`) and shut it down: after a stop their results would be dropped,
    and a task can take minutes, which Ctrl-C should not wait for."""
    # ProcessPoolExecutor has no public way to stop running tasks before Python 3.14 (terminate_workers)
    for process in list((getattr(pool, "_processes", None) or {}).values()):
        process.kill()
    pool.shutdown(wait=True, cancel_futures=True)


def close_pool(pool: ProcessPoolExecutor) -> None:
    """Shut ``pool`` down: at once when a signal is stopping the command (:func:`kill_workers`: a Ctrl-C must not
    wait for simulations or schedule searches of minutes), else after its running tasks (queued ones dropped)."""
    from stepsim.base.signals import stop_requested

    if stop_requested():
        kill_workers(pool)
    else:
        pool.shutdown(wait=True, cancel_futures=True)


class LocalExecutor(WindowedExecutor):
    """A pool of ``jobs`` worker processes on this machine, started once and reused for every task.

    Parameters
    ----------
    jobs : int
        Worker processes.
    warm_kernels : bool
        Load the engine kernels in each worker as it starts (simulate sweeps), so no task pays for it.
    """

    name = "local"

    def __init__(self, jobs: int, *, warm_kernels: bool):
        self.jobs = check_jobs(jobs)
        self._warm_kernels = warm_kernels
        self._pool = local_worker_pool(jobs, warm_kernels=warm_kernels)
        self._idle_pool = None  # background()'s workers, started on first use

    def background(self, task: Task):
        """Start ``task`` on ``jobs`` workers of their own at the lowest CPU priority (nice 19), so it takes only
        the CPU the pool's tasks leave idle (about 1.5 % of a CPU where both want it, Linux's weights) and all of
        it when they are done: a task waiting behind one started in a gap would wait for all of it (the full-size
        plan's searches took 20 s longer that way)."""
        if self._idle_pool is None:
            self._idle_pool = local_worker_pool(self.jobs, warm_kernels=self._warm_kernels, niceness=IDLE_NICENESS)
        return self._submit(task, self._idle_pool)

    def _submit(self, task: Task, pool: ProcessPoolExecutor | None = None):
        """Start ``task`` on ``pool`` (default: the pool's own workers)."""
        try:
            return (pool or self._pool).submit(self.task_function or run_task, task.config, task.force)
        except BrokenProcessPool as exc:  # a worker died between two submissions
            raise self._lost(task) from exc

    def _wait_first(self, futures: list) -> Iterable:
        done, _ = wait(futures, return_when=FIRST_COMPLETED)
        return sorted(done, key=futures.index)  # deterministic among futures finishing together

    def _outcome(self, future, task: Task, in_flight: int) -> dict:
        try:
            return future.result()
        except BrokenProcessPool as exc:
            raise self._lost(task) from exc

    @staticmethod
    def _lost(task: Task) -> WorkerLostError:
        # the pool cannot tell which task a dead worker was running: name the one whose result was awaited
        return WorkerLostError(
            f"a worker process died while the sweep ran (killed, out of memory or crashed); task {task.index} "
            f"({task.key}) and the other tasks in flight did not finish. Finished tasks are saved: run the same "
            f"sweep again to resume")

    def close(self) -> None:
        # cancel_futures: queued tasks are dropped; running ones finish (their results are not collected)
        for pool in (self._pool, self._idle_pool):
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)

    def abort(self) -> None:
        """Kill the workers mid-task: after a stop their results would be dropped, and a simulation can
        take minutes, which Ctrl-C should not wait for. Workers write nothing, so nothing is left half-written.
        """
        for pool in (self._pool, self._idle_pool):
            if pool is not None:
                kill_workers(pool)
