"""What a worker does: run one plain-dict task and return its result row (never raises for a task failure).

Workers receive plain dicts and return plain data (a small dict holding a one-row ``pyarrow.Table``), so the
same function serves a local process pool and a Dask cluster, and no jitted function ever crosses a process
boundary. The parent writes the row; a worker writes nothing, so a worker killed mid-task leaves no file.

Every row carries the sweep columns :data:`SWEEP_COLUMNS` beside the run's own result columns, and the task
config's knobs as columns when the run did not already report them, so failed rows (which have no result
columns) can be filtered by the same knob columns as successful ones.
"""

from __future__ import annotations

import signal
import time
import traceback

import pyarrow as pa

from stepsim.errors import StepsimError
from stepsim.results import canonical_json

OK = "ok"
FAILED = "failed"
#: columns every sweep row has: task identity, outcome, typed error, the config as canonical JSON, wall time
SWEEP_COLUMNS = ("task_id", "status", "error_type", "error_message", "error_traceback", "config", "task_wall_s")
#: columns that measure wall-clock time: they differ between runs of the same task (compare rows without them)
WALL_TIME_COLUMNS = ("task_wall_s", "sim_wall_s", "compile_s", "lower_s", "wall_s", "metrics_wall_s")


def run_task(config: dict, key: str) -> dict:
    """Run the task ``config`` (identity ``key``) and return its outcome.

    A :class:`StepsimError` (bad knob value, trace problem, deadlock, ...) becomes a ``failed`` row with the
    error's type and message. Any other exception is a stepsim bug, but one bad grid point should not cost
    the rest of a long sweep: it is recorded the same way, with its traceback in ``error_traceback``.

    Returns
    -------
    dict
        ``key``, ``status`` (``ok``/``failed``), ``error_type``, ``error_message``, ``wall_s`` (seconds) and
        ``table`` (the one-row result table, sweep columns included).
    """
    from stepsim.records import run_config

    start = time.perf_counter()
    error = None
    try:
        table = run_config(dict(config)).to_arrow()
    except StepsimError as exc:
        table, error = None, (type(exc).__name__, str(exc), None)
    except Exception as exc:  # noqa: BLE001 - recorded as a failed row, see the docstring
        name = type(exc).__name__ if type(exc).__module__ == "builtins" else \
            f"{type(exc).__module__}.{type(exc).__qualname__}"
        table, error = None, (name, str(exc), traceback.format_exc())
    wall_s = time.perf_counter() - start
    row = {"task_id": key, "status": OK if error is None else FAILED,
           "error_type": error and error[0], "error_message": error and error[1],
           "error_traceback": error and error[2], "config": canonical_json(config), "task_wall_s": wall_s}
    table = _with_sweep_columns(table, row, config)
    return {"key": key, "status": row["status"], "error_type": row["error_type"],
            "error_message": row["error_message"], "wall_s": wall_s, "table": table}


def _with_sweep_columns(table: pa.Table | None, row: dict, config: dict) -> pa.Table:
    """``table`` (or an empty one-row table) plus the sweep columns and the config knobs it lacks."""
    types = {"task_wall_s": pa.float64()}
    columns = {name: pa.array([row[name]], type=types.get(name, pa.string())) for name in SWEEP_COLUMNS}
    for key, value in config.items():
        columns.setdefault(key, pa.array([value]))
    if table is None:
        return pa.table(columns)
    for name, array in columns.items():
        if name not in table.column_names:
            table = table.append_column(name, array)
    return table


# --- worker start-up -----------------------------------------------------------------------------------
def load_kernels() -> None:
    """Load the engine kernels from numba's on-disk cache (compiling them if the cache is cold).

    Done once per worker process, so no task pays it and every task's ``compile_s`` is ~0, the same as in
    ``stepsim.simulate`` (which calls the same function the first time a process simulates).
    """
    from stepsim.kernels.api import _engine, _ensure_compiled

    _ensure_compiled(_engine())


def init_local_worker(warm_kernels: bool) -> None:
    """Initializer of a local pool worker: leave Ctrl-C to the parent, load the kernels if tasks simulate.

    Ctrl-C reaches every process of the terminal's process group; workers ignore it so the parent alone
    decides (it stops submitting, cancels queued tasks and lets running ones end), instead of each worker
    printing a KeyboardInterrupt traceback.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if warm_kernels:
        load_kernels()
