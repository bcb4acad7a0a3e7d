"""Pick the executor a command asked for (``--executor local|dask``): :func:`make_executor`.

Apart from :mod:`stepsim.batch.executors` so that the Dask executor, which builds on the local one's windowing,
is imported only here and only when asked for (dask is an extra).
"""

from __future__ import annotations

from stepsim.base.errors import ConfigError
from stepsim.batch.executors import EXECUTORS, LocalExecutor


def make_executor(kind: str, *, jobs: int, warm_kernels: bool, address: str | None = None):
    """The executor ``kind`` (``local`` or ``dask``).

    Parameters
    ----------
    kind : str
        ``local``: a process pool here. ``dask``: the ``dask.distributed`` scheduler at ``address``, or a local
        cluster of ``jobs`` single-threaded worker processes on the loopback interface when no address is given.
    jobs : int
        Local workers (ignored with a Dask ``address``: the cluster decides).
    warm_kernels : bool
        Whether tasks simulate (then workers load the engine kernels once, at start).
    address : str, optional
        Dask scheduler address (``tcp://host:8786``).

    Raises
    ------
    ConfigError
        Unknown kind, ``address`` without ``dask``, dask not installed, or the scheduler cannot be reached.
    """
    if kind not in EXECUTORS:
        raise ConfigError(f"unknown executor {kind!r} (expected one of {', '.join(EXECUTORS)})")
    if kind == "local":
        if address is not None:
            raise ConfigError("--address is only for --executor dask")
        return LocalExecutor(jobs, warm_kernels=warm_kernels)
    try:
        from stepsim.batch.dask_executor import DaskExecutor
    except ImportError as exc:
        raise ConfigError(f"the dask executor needs dask.distributed ({exc}); install it with "
                          f"pip install 'stepsim[dist]' (or 'dask[distributed]')") from exc
    return DaskExecutor(address=address, jobs=jobs, warm_kernels=warm_kernels)
