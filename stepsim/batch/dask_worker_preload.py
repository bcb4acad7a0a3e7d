"""Imported by the worker processes of the Dask executor's local cluster, and only there (a Dask ``preload``):
the worker ignores SIGINT.

A Ctrl-C at the terminal reaches the whole foreground process group, the cluster's worker processes included.
stepsim stops on it and closes the cluster, which ends the workers; a worker that handled the signal itself would
print Dask's KeyboardInterrupt traceback (about 70 lines) under stepsim's one line. The worker's event loop runs
in its main thread, where ``dask_setup`` is called, so the disposition can be set there.
"""

import signal


def dask_setup(worker) -> None:
    """Dask's preload hook: SIGINT ignored in this worker process (the cluster's close ends it)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
