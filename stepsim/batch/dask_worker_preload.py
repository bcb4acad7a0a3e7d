"""Imported by the worker processes of the Dask executor's local cluster, and only there (a Dask ``preload``):
the worker ignores SIGINT, and does not print a traceback when its scheduler is gone.

A Ctrl-C at the terminal reaches the whole foreground process group, the cluster's worker processes included.
stepsim stops on it and closes the cluster, which ends the workers; a worker that handled the signal itself would
print Dask's KeyboardInterrupt traceback (about 70 lines) under stepsim's one line. The worker's event loop runs
in its main thread, where ``dask_setup`` is called, so the disposition can be set there.

The local cluster's scheduler lives in the stepsim process, so a worker that cannot reach it during a heartbeat is
one whose stepsim is stopping: the worker then logs ``Failed to communicate with scheduler during heartbeat.`` with
the connection's traceback (seen once under stepsim's line at load 4-5, tests/sweep/test_dask_failures.py's
Ctrl-C test). That record is dropped; every other record of the worker is kept.
"""

import logging
import signal

#: the message of distributed.worker's heartbeat failure (``Worker.heartbeat``, an OSError reaching the scheduler)
HEARTBEAT_FAILED = "Failed to communicate with scheduler during heartbeat."


class SchedulerGone(logging.Filter):
    """Drops the worker's heartbeat-failure record (module docstring)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.msg != HEARTBEAT_FAILED


def dask_setup(worker) -> None:
    """Dask's preload hook: SIGINT ignored in this worker process (the cluster's close ends it), and no traceback
    when the scheduler is gone."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.getLogger("distributed.worker").addFilter(SchedulerGone())
