"""``--executor dask``: the layer pieces of a step on a ``dask.distributed`` cluster (the ``dist`` extra).

The exact provider (:class:`stepsim.serve.exact.EngineLatency`) hands a step's pieces to :meth:`DaskLayers.run`,
which deals them round-robin into one Dask task per worker (:func:`~stepsim.serve.exact.layer_tasks`: a piece
takes milliseconds, about what a Dask task costs in scheduling, and one task per piece measured 12-27 % slower)
and puts the results back in the pieces' order, so a step's cycles never depend on which worker ran which piece:
the outputs are byte-identical to ``--jobs 1``.
Each worker keeps its own layer templates (built once per shape per worker, per thread for thread workers).

The cluster is the sweep's (:class:`stepsim.batch.dask_executor.DaskExecutor`): a local cluster of one
single-threaded worker process per CPU on the loopback interface, or the scheduler at ``address``.
"""

from __future__ import annotations

from stepsim.serve.exact import layer_tasks


class DaskLayers:
    """Run layer pieces on a Dask cluster.

    Parameters
    ----------
    executor : stepsim.batch.dask_executor.DaskExecutor
        The cluster's client.
    owned : bool
        Close ``executor`` with :meth:`close` (True when :func:`open_dask_layers` started it).
    """

    def __init__(self, executor, *, owned: bool):
        self.executor, self.owned = executor, owned

    def run(self, spec, tasks: list) -> list:
        """``layer_task(spec, kind, data)`` of every ``(kind, data)`` task, in the tasks' order."""
        client = self.executor.client
        shares = min(max(self.executor.jobs, 1), len(tasks))
        # pure=False: identical shares of two steps are two runs (a worker's counters are part of the result)
        futures = [client.submit(layer_tasks, spec, tasks[i::shares], pure=False) for i in range(shares)]
        results = [None] * len(tasks)
        for i, share in enumerate(client.gather(futures)):
            results[i::shares] = share
        return results

    def describe(self) -> str:
        """The executor's one line (``dask (local cluster), 2 worker processes``)."""
        return self.executor.describe()

    def close(self) -> None:
        if self.owned:
            self.executor.close()


def open_dask_layers(executor, address: str | None = None) -> DaskLayers:
    """The :class:`DaskLayers` for ``executor``: ``"dask"`` starts a local cluster (one worker process per CPU)
    or connects to ``address``; a :class:`~stepsim.batch.dask_executor.DaskExecutor` is used as given (and not
    closed)."""
    from stepsim.base.errors import ConfigError

    if executor == "dask":
        from stepsim.batch.executor_factory import make_executor
        from stepsim.batch.executors import default_jobs

        return DaskLayers(make_executor("dask", jobs=default_jobs(), warm_kernels=True, address=address),
                          owned=True)
    if hasattr(executor, "client"):
        if address is not None:
            raise ConfigError("--address is for --executor dask; a given executor already has its scheduler")
        return DaskLayers(executor, owned=False)
    raise ConfigError(f"--executor must be dask, got {executor!r}")
