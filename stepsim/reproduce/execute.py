"""Run an experiment's configurations, in this process or on a pool of worker processes.

A configuration is a plain dict of :mod:`stepsim.workloads.config` knobs plus ``mode="simulate"``, run by
:func:`stepsim.results.records.run_config` (through :func:`stepsim.batch.tasks.run_task`, which turns a failure into
a value instead of an exception). With ``jobs > 1`` the configurations go to the sweep package's local
executor (:class:`stepsim.batch.executors.LocalExecutor`: warm forked workers, plain data in and out); one
pool serves every experiment of a ``reproduce all`` run. Results come back in plan order whatever the
completion order, so tables do not depend on ``jobs``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from stepsim.base.errors import ConfigError
from stepsim.batch.tasks import OK, run_task
from stepsim.reproduce.errors import RunFailedError
from stepsim.results.records import RunResult, run_identity


@dataclass(frozen=True)
class Point:
    """One configuration of an experiment.

    Attributes
    ----------
    labels : dict
        What the experiment's table records about the point beyond the run itself (model, trace file name,
        variance class, ...); also used to name the point in error messages.
    config : dict
        The :func:`stepsim.results.records.run_config` mapping (``mode`` is set to ``"simulate"`` when run).
    """

    labels: Mapping = field(default_factory=dict)
    config: Mapping = field(default_factory=dict)

    def describe(self) -> str:
        """``k=v`` pairs of the labels and the config's tiling / strategy knobs, for messages."""
        keys = ("tiling", "tile_m", "tile_n", "regions", "strategy")
        pairs = {**self.labels, **{k: self.config[k] for k in keys if self.config.get(k) is not None}}
        return " ".join(f"{k}={v}" for k, v in pairs.items())


def check_jobs(jobs) -> None:
    """``--jobs`` must be a positive int (ConfigError naming the flag)."""
    if not isinstance(jobs, int) or isinstance(jobs, bool) or jobs < 1:
        raise ConfigError(f"--jobs must be an int >= 1, got {jobs!r}")


def _records(experiment: str, points: Sequence[Point], outcomes: list[dict]) -> list[RunResult]:
    """The records of ``outcomes`` (one per point); RunFailedError naming the first failed point."""
    for point, outcome in zip(points, outcomes):
        if outcome["status"] != OK:
            raise RunFailedError(f"{experiment}: point {point.describe()} failed: "
                                 f"{outcome['error_type']}: {outcome['error_message']}")
    return [outcome["record"] for outcome in outcomes]


class Runner:
    """Runs lists of :class:`Point` s; a context manager that owns its worker pool (if any).

    Parameters
    ----------
    jobs : int
        1: run in this process. More: that many worker processes, started at the first
        :meth:`run_experiments`.
    force : bool
        Simulate the points the run-size estimate refuses (``--force``; else such a point fails, naming it).
    """

    def __init__(self, jobs: int = 1, force: bool = False):
        check_jobs(jobs)
        self.jobs = jobs
        self.force = force
        self._executor = None

    def run_experiments(self, plans: Mapping[str, Sequence[Point]]) -> Iterator[tuple[str, list[RunResult]]]:
        """Simulate every experiment's points; yield ``(experiment, records in the order of its points)`` as each
        experiment's last point finishes.

        With a worker pool, every point of every experiment is submitted at once (in plan order: the paper's
        large MoE experiments first, the many small points last, which keeps the pool's tail short), so the
        workers go on with the next experiment while the caller writes this one's files and figure; one
        experiment at a time left them idle during every figure and at every experiment's tail. Experiments
        then finish in any order; each one's records are still in the order of its points.

        Raises
        ------
        RunFailedError
            A point failed (the message names the experiment, the point and the error).
        WorkerLostError
            A worker process died.
        """
        configs = {name: [{**p.config, "mode": "simulate"} for p in points] for name, points in plans.items()}
        if self.jobs == 1:
            for name, points in plans.items():
                yield name, _records(name, points, [run_task(c, self.force) for c in configs[name]])
            return
        from stepsim.batch.executor_factory import make_executor
        from stepsim.batch.grid import Task

        owners, tasks = [], []
        for name, experiment_configs in configs.items():
            for i, config in enumerate(experiment_configs):
                owners.append((name, i))
                tasks.append(Task(index=len(tasks), config=config, run_id=run_identity(config)[0],
                                  force=self.force))
        outcomes = {name: [None] * len(c) for name, c in configs.items()}
        left = {name: len(c) for name, c in configs.items()}
        for name in [n for n, count in left.items() if count == 0]:
            yield name, []
        if self._executor is None:
            self._executor = make_executor("local", jobs=self.jobs, warm_kernels=True)
        for task, outcome in self._executor.imap_unordered(tasks, in_flight=len(tasks)):
            name, i = owners[task.index]
            outcomes[name][i] = outcome
            left[name] -= 1
            if left[name] == 0:
                yield name, _records(name, plans[name], outcomes[name])

    def close(self, *, abort: bool = False) -> None:
        """Stop the worker pool (if one was started); ``abort`` terminates running tasks instead of waiting."""
        if self._executor is not None:
            executor, self._executor = self._executor, None
            if abort:
                executor.abort()
            else:
                executor.close()

    def __enter__(self) -> Runner:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        # after a failure or Ctrl-C the remaining results are not wanted: do not wait for running simulations
        self.close(abort=exc_type is not None)
