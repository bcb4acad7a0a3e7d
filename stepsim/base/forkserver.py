"""The local worker pool's fork server: which start method, what it preloads, and starting it early.

Light on purpose (only :mod:`multiprocessing`): a command can start the fork server before it imports its own
heavy modules (sympy, pyarrow, matplotlib: about a second), so the server's preload (stepsim's modules and the
engine kernels, about two seconds) runs on another core meanwhile instead of after it. The pool
(:class:`stepsim.batch.executors.LocalExecutor`) forks its workers from the same, process-wide server.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.forkserver

#: modules the fork server imports once so forked workers start with them loaded (the worker code, the
#: record builder and the workloads, the engine module with numba, and sympy and pyarrow, which stepsim's modules
#: import on first use: stepsim.base.lazy_import)
FORKSERVER_PRELOAD = ("stepsim.batch.tasks", "stepsim.results.records", "stepsim.simulation.simulate", "stepsim.kernels.engine",
                      "sympy", "pyarrow.dataset", "pyarrow.parquet")
#: imported too for simulation sweeps: loads the engine kernels in the fork server (see that module)
FORKSERVER_WARM = "stepsim.batch.forkserver_preload"


def start_method() -> str:
    """Start method of local workers: ``forkserver`` where the OS has it, else ``spawn``.

    Not ``fork``: when the pool starts, the parent may already run other threads (tqdm's monitor thread,
    pyarrow's thread pool after reading existing results, a Dask client's event loop in the same program), and a
    forked child inherits every lock those threads held at that instant with no thread to release it, an
    occasional deadlock (Python 3.12 warns about exactly this). The numba engine starts no threads of its own,
    but that does not make the parent single-threaded. The fork server is a clean single-threaded process that
    forks the workers, which also starts them faster than ``spawn``: it imports stepsim (and, for simulation
    sweeps, loads the engine kernels) once, and every worker is forked with them in memory.
    """
    return "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"


def start_fork_server(*, warm_kernels: bool):
    """Start the fork server now, preloading :data:`FORKSERVER_PRELOAD` (and :data:`FORKSERVER_WARM` when
    ``warm_kernels``), and return the multiprocessing context local pools use.

    The server preloads in the background; whoever forks the first worker waits for it. Only the first call
    of a process decides the preload (the server is process-wide and keeps running); without a fork server
    (``spawn``) nothing starts here.
    """
    if warm_kernels:  # the workers compile the kernels on a cold cache: the command line's notice is due
        from stepsim.base.compile_notice import say_once

        say_once()
    context = multiprocessing.get_context(start_method())
    if context.get_start_method() == "forkserver":
        context.set_forkserver_preload([*FORKSERVER_PRELOAD, *([FORKSERVER_WARM] if warm_kernels else [])])
        multiprocessing.forkserver.ensure_running()
    return context
