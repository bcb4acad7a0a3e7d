"""Run sweep tasks on a ``dask.distributed`` cluster (an optional dependency: ``pip install 'stepsim[dist]'``).

The tasks and outcomes are the same plain data the local pool uses (:func:`stepsim.batch.tasks.run_task`), so
the rows are identical whichever executor ran them; only wall-time columns differ. Workers need stepsim
installed (same version) and, for a cluster on other machines, the trace files at the same absolute paths.
The parent process writes every result file, so workers need no access to the output folder.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterable

from distributed import Client, KilledWorker, LocalCluster, wait
from distributed.diagnostics.plugin import WorkerPlugin

from stepsim.base.errors import ConfigError
from stepsim.batch.executors import WindowedExecutor, WorkerLostError, check_jobs
from stepsim.batch.grid import Task
from stepsim.batch.tasks import load_kernels, run_task

#: the module every worker process of the local cluster imports first (Ctrl-C ignored there)
WORKER_PRELOAD = "stepsim.batch.dask_worker_preload"
#: seconds to wait for a scheduler given by address before giving up with a ConfigError
CONNECT_TIMEOUT_S = 30
#: seconds the whole connection may take (Dask's timeout does not cover a peer that accepts and says nothing)
ANSWER_TIMEOUT_S = CONNECT_TIMEOUT_S + 5


class LoadKernels(WorkerPlugin):
    """Load the engine kernels once when a worker joins (including workers that join later)."""

    def setup(self, worker) -> None:
        load_kernels()


class DaskExecutor(WindowedExecutor):
    """Submit tasks to a Dask scheduler.

    Parameters
    ----------
    address : str, optional
        Scheduler address. Without one, a :class:`distributed.LocalCluster` is started on 127.0.0.1 (no
        dashboard) with ``jobs`` workers of one thread each, and closed with the executor.
    jobs : int
        Workers of the local cluster; with an address, the in-flight window is sized from the cluster's
        thread count instead.
    warm_kernels : bool
        Register a worker plugin that loads the engine kernels (simulate sweeps).
    processes : bool
        Local cluster only: worker processes (default) or threads of this process (light, for tests).
    """

    name = "dask"

    def __init__(self, *, address: str | None = None, jobs: int = 1, warm_kernels: bool = False,
                 processes: bool = True):
        check_jobs(jobs)
        self._cluster = None
        self._processes = processes
        if address is None:
            # one thread per worker process: building a workload (sympy, Python) holds the GIL, so threads would
            # take turns; processes use every CPU
            # tcp on loopback even for thread workers (whose default, in-process transport takes no host)
            # worker processes ignore Ctrl-C (stepsim.batch.dask_worker_preload): stepsim stops and closes them
            quiet = {"preload": [WORKER_PRELOAD]} if processes else {}
            self._cluster = LocalCluster(n_workers=jobs, threads_per_worker=1, processes=processes,
                                         host="127.0.0.1", protocol="tcp://", dashboard_address=None, **quiet)
            self._client = Client(self._cluster)
            self.jobs = jobs
        else:
            self._client = _connect(address)
            self.jobs = max(sum(self._client.nthreads().values()), 1)
        self.address = self._client.scheduler.address
        if warm_kernels:
            self._client.register_plugin(LoadKernels(), name="stepsim-load-kernels")

    @property
    def client(self) -> Client:
        """The cluster's client (for callers that submit their own functions: ``stepsim serve``'s layers)."""
        return self._client

    def _submit(self, task: Task, priority: int = 0):
        # pure=False: a re-submitted task must run again, not be served from the scheduler's memory
        return self._client.submit(self.task_function or run_task, task.config, task.force, pure=False,
                                   priority=priority)

    def background(self, task: Task):
        """Start ``task`` behind every other queued task (Dask's ``priority``: lower runs later); a worker that
        takes it runs it to the end, so a task submitted later may wait for it."""
        return self._submit(task, priority=-1)

    def _wait_first(self, futures: list) -> Iterable:
        done, _ = wait(futures, return_when="FIRST_COMPLETED")
        return sorted(done, key=futures.index)

    def _outcome(self, future, task: Task, in_flight: int) -> dict:
        try:
            return future.result()
        except KilledWorker as exc:
            raise WorkerLostError(
                f"Dask workers kept dying while running task {task.index} ({task.key}): {exc}; {in_flight} "
                f"submitted task(s) did not finish. Finished tasks are saved: run the same sweep again to "
                f"resume") from exc

    def _cancel(self, futures: list) -> None:
        if futures:
            self._client.cancel(futures)

    def close(self) -> None:
        self._client.close()
        if self._cluster is not None:
            self._cluster.close()

    def abort(self) -> None:
        """Kill the local cluster's worker processes mid-task, then close (as
        :meth:`stepsim.batch.executors.LocalExecutor.abort`): Dask closes a worker gracefully, after its running
        task, which Ctrl-C should not wait for (a sweep's interrupted run took 36 s to exit at load 2). Workers
        write nothing, so nothing is left half-written. A cluster at an address is not ours: only closed."""
        if self._cluster is not None and self._processes:
            nannies = list(self._cluster.workers.values())
            # a running nanny starts a new worker in place of one that exits (which, at load, imports stepsim and
            # loads the kernels for tens of seconds before the close can end it); a nanny closing gracefully
            # closes itself instead (distributed.nanny.Nanny._on_worker_exit)
            self._cluster.sync(_closing_gracefully, nannies)
            for nanny in nannies:
                pid = getattr(getattr(getattr(nanny, "process", None), "process", None), "pid", None)
                if pid:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
        self.close()

    def describe(self) -> str:
        if self._cluster is None:
            return f"dask ({self.address}), {_count(self.jobs, 'worker thread')}"
        return f"dask (local cluster), {_count(self.jobs, 'worker process' if self._processes else 'worker thread')}"


async def _closing_gracefully(nannies: list) -> None:
    """Mark ``nannies`` as closing (on the cluster's event loop, where they read it): they restart no worker."""
    for nanny in nannies:
        nanny.close_gracefully(reason="stepsim-abort")


def _connect(address: str) -> Client:
    """A client of the scheduler at ``address``. Whatever goes wrong is one ConfigError line naming the address:
    a malformed address (Dask raises ValueError), nothing listening (checked with a plain TCP connection first,
    so it is said at once rather than after Dask's retries), something that is not a Dask scheduler."""
    import socket

    from distributed.comm import parse_address, parse_host_port

    where = f"cannot connect to the Dask scheduler at {address}"
    try:
        scheme, location = parse_address(address)
        if scheme in ("tcp", "tls"):
            host, port = parse_host_port(location)
            socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S).close()
        return _within(lambda: Client(address, timeout=CONNECT_TIMEOUT_S), ANSWER_TIMEOUT_S,
                       f"no Dask scheduler answered within {ANSWER_TIMEOUT_S:g} s (something else listens there?)")
    except Exception as exc:  # noqa: BLE001 - a remote end's failure, said in one line (never Dask's traceback)
        text = "; ".join(line.strip() for line in str(exc).splitlines() if line.strip()) or type(exc).__name__
        raise ConfigError(f"{where}: {text}") from None


def _within(make, seconds: float, late: str):
    """``make()`` run on a daemon thread, waited for at most ``seconds`` (in short steps, so Ctrl-C stops the wait
    at once): Dask's own timeout does not cover a peer that accepts the connection and then says nothing a Dask
    scheduler would (an HTTP server: the client waits forever for a frame). Raises TimeoutError(``late``)."""
    import threading
    import time

    box: dict = {}

    def run() -> None:
        try:
            box["value"] = make()
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
            box["error"] = exc

    thread = threading.Thread(target=run, name="stepsim-dask-connect", daemon=True)
    thread.start()
    deadline = time.monotonic() + seconds
    while thread.is_alive() and time.monotonic() < deadline:
        thread.join(0.1)
    if "error" in box:
        raise box["error"]
    if "value" not in box:
        raise TimeoutError(late)
    return box["value"]


def _count(n: int, noun: str) -> str:
    """``1 worker process``, ``2 worker processes``, ``2 worker threads``."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}{'es' if noun.endswith('s') else 's'}"
