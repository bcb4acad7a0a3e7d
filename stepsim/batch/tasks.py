"""What a worker does: run one plain-dict task and return its outcome (never raises for a task failure).

Workers receive plain dicts and return plain data (a small dict holding the :class:`~stepsim.results.records.RunResult`,
itself plain rows and Arrow tables), so the same function serves a local process pool and a Dask cluster, and
no jitted function ever crosses a process boundary. A worker writes nothing: the parent writes every file
(:mod:`stepsim.batch.rows`), so a worker killed mid-task leaves nothing half-written.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import traceback

from stepsim.base.collector import tune_process
from stepsim.base.errors import StepsimError

OK = "ok"
FAILED = "failed"


def run_task(config: dict, force: bool = False) -> dict:
    """Run the task ``config`` with :func:`stepsim.results.records.run_config` and return its outcome.

    ``force``: simulate even when the run-size estimate is over its limit (:mod:`stepsim.kernels.run_size`);
    without it such a task fails with the estimate as its reason.

    A :class:`StepsimError` (a value the builder refuses, a trace problem, a deadlock, ...) makes a ``failed``
    outcome with the error's type and message. Any other exception is a stepsim bug, but one bad grid point
    should not cost the rest of a long sweep: it is recorded the same way, with its traceback.

    Returns
    -------
    dict
        ``status`` (``ok``/``failed``), ``error_type``, ``error_message``, ``error_traceback`` (None unless the
        error is not a StepsimError), ``wall_s`` (seconds in this function) and ``record`` (the RunResult, None
        on failure).
    """
    from stepsim.results.records import run_config

    start = time.perf_counter()
    record = error_type = error_message = error_traceback = None
    try:
        record = run_config(dict(config), force=force)
    except StepsimError as exc:
        error_type, error_message = type(exc).__name__, str(exc)
    except Exception as exc:  # noqa: BLE001 - recorded as a failed row, see the docstring
        cls = type(exc)
        error_type = cls.__name__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
        error_message, error_traceback = str(exc), traceback.format_exc()
    return {"status": OK if record is not None else FAILED, "error_type": error_type,
            "error_message": error_message, "error_traceback": error_traceback,
            "wall_s": time.perf_counter() - start, "record": record}


# --- worker start-up -----------------------------------------------------------------------------------
def load_kernels() -> None:
    """Load the engine kernels from numba's on-disk cache (compiling them if the cache is cold).

    Done once per worker process, so no task pays for it (each task's ``compile_s`` is ~0): the same call
    :func:`stepsim.simulation.simulate.simulate` makes the first time a process simulates.
    """
    from stepsim.kernels.api import _engine, _ensure_compiled

    _ensure_compiled(_engine())


#: seconds between two checks that the sweep's parent process is still alive
PARENT_CHECK_S = 0.5


#: environment variables a local worker takes from the process that made its pool: stepsim's own settings
#: (mapping and calibration caches, ...), which stepsim reads when it uses them
CALLER_ENVIRONMENT_PREFIX = "STEPSIM_"


def caller_context() -> tuple[dict[str, str], str]:
    """What a local worker takes from the process making its pool (:func:`init_local_worker`): its
    ``STEPSIM_*`` environment variables and its working folder."""
    env = {k: v for k, v in os.environ.items() if k.startswith(CALLER_ENVIRONMENT_PREFIX)}
    return env, os.getcwd()


def _take_caller_context(context: tuple[dict[str, str], str]) -> None:
    """Make this worker's ``STEPSIM_*`` variables and working folder the caller's. A worker is forked from the
    process-wide fork server, whose environment and folder are those of the moment it started: a program (or
    test) that changed ``$STEPSIM_MAPPING_CACHE`` since had its plan's workers look up schedules in the old folder:
    after tests/mapping/test_map_cli.py's ``map --buckets --jobs 2`` in the same process, the two-worker test of
    tests/plan/test_plan_waves.py took 186 s instead of 2.4 s and priced with another calibration (232 s in a CI
    run)."""
    env, cwd = context
    for name in [k for k in os.environ if k.startswith(CALLER_ENVIRONMENT_PREFIX) and k not in env]:
        del os.environ[name]
    os.environ.update(env)
    try:
        os.chdir(cwd)
    except OSError:  # the caller's folder is gone: the worker stays in the fork server's
        pass


def init_local_worker(warm_kernels: bool, parent_pid: int | None = None,
                      context: tuple[dict[str, str], str] | None = None, niceness: int = 0) -> None:
    """Initializer of a local pool worker: take the caller's settings (``context``, from :func:`caller_context`),
    leave Ctrl-C and SIGTERM to the parent, exit when the parent is gone, load the kernels if tasks simulate.

    Ctrl-C (and a SIGTERM sent to the process group) reaches every process of the group; workers ignore them
    so the parent alone decides (it stops submitting, writes the rows it holds and stops the workers with
    SIGKILL: they write nothing), instead of each worker printing a KeyboardInterrupt traceback or dying
    before the parent has written what it holds. A parent killed with SIGKILL cannot stop its workers: each
    one watches ``parent_pid`` and exits when it is gone, so no worker outlives its sweep. The collector's
    thresholds are the program's (:mod:`stepsim.base.collector`). ``niceness``: how much to lower its CPU
    priority (``os.nice``; 0 keeps the parent's).
    """
    if niceness:
        os.nice(niceness)
    if context is not None:
        _take_caller_context(context)
    tune_process()  # a worker is stepsim's own process, as the program's (stepsim.base.collector)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if parent_pid is not None:
        threading.Thread(target=_exit_without_parent, args=(parent_pid,), name="stepsim-parent-watch",
                         daemon=True).start()
    if warm_kernels:
        load_kernels()


def _parent_alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, killed but not yet reaped, counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except FileNotFoundError:
        return False
    except OSError:  # no /proc: ask the OS whether the pid exists
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True


def _exit_without_parent(pid: int) -> None:
    while _parent_alive(pid):
        time.sleep(PARENT_CHECK_S)
    os._exit(1)
