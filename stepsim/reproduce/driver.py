"""Run one experiment or all of them: plan, simulate, tabulate, write, plot.

>>> results = reproduce("validation", traces="../shared/traces", out="/tmp/repro")   # doctest: +SKIP
>>> results[0].details["pearson_cycles_vs_roofline"]                                   # doctest: +SKIP

Every experiment is planned before anything runs, so a traces folder missing something that any requested
experiment needs fails at once (:class:`~stepsim.reproduce.errors.TracesLayoutError`) instead of after minutes
of simulation. One :class:`~stepsim.reproduce.execute.Runner` (one worker pool) serves all experiments.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

import pyarrow as pa

from stepsim.base.errors import ConfigError
from stepsim.base.figures import require_matplotlib
from stepsim.base.files import published_together, trace_sha256
from stepsim.reproduce import dynamic_parallelization, dynamic_tiling, time_multiplexing, validation
from stepsim.reproduce.execute import Runner, check_jobs
from stepsim.reproduce.figures import PLOTTERS
from stepsim.reproduce.names import ALL, CHOICES
from stepsim.reproduce.output import write_headline, write_table

#: experiment name -> module (plan, build_table, headline, summary, NAME, STEM, JSON_KEYS)
EXPERIMENTS: dict[str, ModuleType] = {m.NAME: m for m in (dynamic_tiling, time_multiplexing,
                                                            dynamic_parallelization, validation)}
#: every key ``--json`` may print, in print order
JSON_KEYS = tuple(k for m in EXPERIMENTS.values() for k in m.JSON_KEYS)


@dataclass
class ExperimentResult:
    """What one experiment produced.

    Attributes
    ----------
    name : str
        Experiment name (``dynamic-tiling``, ...).
    table : pyarrow.Table
        The raw table (also written as Parquet and CSV).
    headline : dict
        The experiment's ``--json`` headline numbers (empty for validation).
    details : dict
        Everything behind the headline (reference tiles, per-batch geomeans, correlations, ...).
    summary : list of str
        Lines printed by the CLI.
    files : dict
        ``{"parquet", "csv", "headline", "figure"}`` -> written path (no ``figure`` when it was skipped).
    figure_note : str or None
        Why the figure was skipped (matplotlib missing), else None.
    simulations : int
        Configurations simulated.
    wall_s : float
        Seconds from the start of the simulations until this experiment's files and figure were written
        (planning excluded). Experiments share one worker pool and overlap, so these are finish times, not
        durations.
    """

    name: str
    table: pa.Table
    headline: dict
    details: dict
    summary: list
    files: dict = field(default_factory=dict)
    figure_note: str | None = None
    simulations: int = 0
    wall_s: float = 0.0


def experiment_names(experiment: str) -> list[str]:
    """The experiments ``experiment`` stands for (``all``: every one, in paper order).

    Raises
    ------
    ConfigError
        Unknown experiment name.
    """
    if experiment == ALL:
        return list(EXPERIMENTS)
    if experiment not in EXPERIMENTS:
        raise ConfigError(f"unknown experiment {experiment!r}; expected one of {', '.join(CHOICES)}")
    return [experiment]


def _provenance(module: ModuleType, points) -> dict:
    """What the written files record (``stepsim.config``): the experiment and the traces read (name -> SHA-256)."""
    traces = {}
    for p in points:
        path = p.config.get("trace")
        if path is not None:
            traces[f"{Path(path).parent.name}/{Path(path).name}"] = trace_sha256(path)
    return {"experiment": module.NAME, "traces": traces}


def apply_fifo_depths(plans: Mapping[str, list], files) -> list[str]:
    """Give the points each depths file was sized for (:func:`stepsim.workloads.config.matches_depths_file`) its
    ``fifo_depths`` key; one line per file saying which points use it. A file that fits no point is refused."""
    from stepsim.graph.depths_file import read_depths_file
    from stepsim.workloads.config import matches_depths_file

    lines = []
    for path in files:
        depths = read_depths_file(path)
        used = [(name, point) for name, points in plans.items() for point in points
                if matches_depths_file(depths, point.config)]
        if not used:
            raise ConfigError(f"--fifo-depths {path}: made for graph {depths.graph} (config {depths.config}), "
                              f"which no point of {', '.join(plans)} runs on these traces")
        for _, point in used:
            point.config["fifo_depths"] = str(path)
        lines.append(f"sized FIFOs from {path} (instead of uniform depths) for {len(used)} point(s): "
                     + ", ".join(sorted({f'{name} {point.labels.get("trace", "")}'.strip() for name, point in used})))
    return lines


def _import_matplotlib() -> None:
    """Import matplotlib now, before the worker pool starts: the pool's fork server is still loading the kernels
    (about 2 s after the command started), so this import (about half a second) costs no wall time here; later,
    during the first figure, it would compete with both workers for the two cores. Missing, it is the figures'
    business (they are skipped with a note)."""
    try:
        require_matplotlib()
    except ConfigError:
        pass


def reproduce(experiment: str, traces: str | Path, out: str | Path, *, jobs: int = 1,
              options: Mapping[str, Mapping] | None = None,
              progress: Callable[[str], None] | None = None, fifo_depths=(),
              force: bool = False) -> list[ExperimentResult]:
    """Run ``experiment`` (one name of :data:`CHOICES`) on the traces under ``traces``; write into ``out``.

    Parameters
    ----------
    experiment : str
        ``dynamic-tiling``, ``time-multiplexing``, ``dynamic-parallelization``, ``validation`` or ``all``.
    traces : path
        Folder laid out like ``../shared/traces`` (see :mod:`stepsim.reproduce.layout`).
    out : path
        Output folder (created): ``<stem>.parquet``, ``<stem>.csv``, ``<stem>_headline.json``, ``<stem>.png``
        per experiment (stems: ``dynamic_tiling``, ``time_multiplexing``, ``dynamic_parallelization``,
        ``validation``).
    jobs : int
        Worker processes for the simulations (1: this process).
    fifo_depths : sequence of paths
        ``stepsim size-fifos`` files: every point that builds the workload a file was sized for (same knobs, a
        trace it was sized on) runs with its depths; a file no point uses is a ConfigError.
    force : bool
        Simulate the points the run-size estimate refuses (:mod:`stepsim.kernels.run_size`); without it such
        a point fails the experiment with the estimate as its reason.
    options : mapping, optional
        ``{experiment name: keyword arguments of its plan()}``: reduced configurations (tile lists, region
        counts, models), used by the tests.
    progress : callable, optional
        Called with one line of text when an experiment starts.

    Returns
    -------
    list of ExperimentResult
        In paper order.

    Raises
    ------
    ConfigError
        Unknown experiment or option, bad ``jobs``.
    TracesLayoutError
        The traces folder lacks what an experiment needs (the message names the path).
    RunFailedError
        A simulation failed.
    """
    names = experiment_names(experiment)
    check_jobs(jobs)  # flags before the traces folder is read
    options = dict(options or {})
    unknown = sorted(set(options) - set(EXPERIMENTS))
    if unknown:
        raise ConfigError(f"options given for unknown experiment(s) {', '.join(unknown)}")
    out = Path(out)
    plans = {}
    for name in names:
        plan, kwargs = EXPERIMENTS[name].plan, dict(options.get(name, {}))
        try:
            inspect.signature(plan).bind(traces, **kwargs)
        except TypeError as exc:
            raise ConfigError(f"bad options for experiment {name!r}: {exc}") from None
        plans[name] = plan(traces, **kwargs)
    if progress:
        from stepsim.reproduce.layout import skipped_folders

        for folder, why in skipped_folders(traces):
            progress(f"skipped {folder}: {why}")
    for line in apply_fifo_depths(plans, fifo_depths):
        if progress:
            progress(line)
    if jobs > 1:
        _import_matplotlib()
    results = {}
    if progress:
        for name in names:
            progress(f"{name}: {len(plans[name])} simulations on {jobs} worker{'s' if jobs > 1 else ''}")
    start = time.perf_counter()
    with Runner(jobs, force) as runner:
        for name, records in runner.run_experiments(plans):
            module, points = EXPERIMENTS[name], plans[name]
            table = module.build_table(points, records)
            headline, details = module.headline(table)
            with published_together():  # an experiment's files appear together (a full disk leaves none)
                files = write_table(table, out, module.STEM, _provenance(module, points))
                files["headline"] = write_headline(out, module.STEM, name, headline, details)
                note = None
                try:
                    files["figure"] = PLOTTERS[module.STEM](table, details, out / f"{module.STEM}.png")
                except ConfigError as exc:  # matplotlib missing: the tables are still useful
                    note = f"figure skipped: {exc}"
            results[name] = ExperimentResult(name=name, table=table, headline=headline, details=details,
                                             summary=module.summary(table, headline, details), files=files,
                                             figure_note=note, simulations=len(points),
                                             wall_s=time.perf_counter() - start)
    return [results[name] for name in names]
