"""Imported by the local pool's fork server, and only there: load the engine kernels once, before any fork.

The fork server (see :func:`stepsim.base.forkserver.start_method`) imports the modules named in its preload
list once, then forks every worker from itself, so each worker starts with the kernels already in memory
instead of loading them from numba's disk cache on its own (about a second of CPU per worker). With a cold
cache it matters more: the engine is compiled once here, not by every worker at the same time. Loading at
import time is this module's only purpose; nothing else imports it. Forking after the load is safe because the
engine starts no threads (no ``parallel=True`` kernels).

Each worker's initializer still calls :func:`stepsim.batch.tasks.load_kernels` (a no-op when the kernels came
with the fork), so a failure here costs only time: it is swallowed, because an exception would take the fork
server down, and the worker's own attempt reports it.

Afterwards everything loaded so far (about 200,000 objects of sympy, numba and stepsim) is moved to the
collector's permanent generation (``gc.freeze``, as the :mod:`gc` documentation advises before forking): the
workers' collections then never walk them, which also keeps the pages they share with the server from being
copied. In a ``stepsim reproduce`` run the workers' collections took 0.6 s before, 0.3 s after.
"""

import gc

from stepsim.base.lazy_import import import_all
from stepsim.batch.tasks import load_kernels
from stepsim.kernels.target import own_process

import_all()  # put sympy and pyarrow in place of their stand-ins once here, not in every worker
own_process()  # the pool's workers run only stepsim's kernels (stepsim.kernels.target)
try:
    load_kernels()
except Exception:  # noqa: BLE001, S110 - see the module docstring
    pass
gc.freeze()
