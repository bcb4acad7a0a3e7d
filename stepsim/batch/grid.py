"""Expand a sweep into tasks, lazily, and name each task twice: by its result and by its place in the sweep.

A task is a plain dict (``workload``, ``mode``, the fixed knobs, one value per axis): exactly what
:func:`stepsim.results.records.run_config` takes, and what is sent to a worker. Its identity is the record's
``run_id`` (:func:`stepsim.results.records.run_identity`): the hash of everything that determines its result (knobs,
resolved hardware values, FIFO depth, timing-model version, the trace's *content*), computed here before the
task runs. "Is this task done?" is "is there a row with its run id?" (:mod:`stepsim.batch.store`): a re-run
skips exactly those tasks, and runs again a task whose trace or hardware file changed. Its *slot*
(:func:`slot_key`: its knobs as spelled, paths included) stays the same across such changes, which is how the
rows of an older generation are found and replaced.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from stepsim.base.errors import ConfigError
from stepsim.base.files import stable_hash
from stepsim.batch.config import SweepSpec

#: hex digits of the run id in a task key (and in the name of a part file whose first row is that task)
KEY_DIGITS = 16
#: temp files stepsim.base.files.atomic_output leaves behind only if its process was killed mid-write (row files,
#: and the unit / channel counter files stepsim.results.records writes beside simulation rows)
TEMP_GLOBS = ("**/.part-*.tmp", "**/._units-*.tmp", "**/._channels-*.tmp")


@dataclass(frozen=True)
class Task:
    """One point of the grid.

    Attributes
    ----------
    index : int
        Position in the grid (0-based, deterministic order).
    config : dict
        The plain task config sent to a worker (normalized; unset knobs left out).
    run_id : str
        The record's ``run_id`` (:func:`stepsim.results.records.run_identity`).
    trace_path, trace_sha256 : str or None
        The trace the task reads (the bundled one when the config names none) and its content hash.
    """

    index: int
    config: dict
    run_id: str
    trace_path: str | None = None
    trace_sha256: str | None = None
    force: bool = False  # simulate even over the run-size estimate's limit (the sweep's --force)

    @property
    def slot(self) -> str:
        """The task's :func:`slot_key` (same for every generation of the task)."""
        return slot_key(self.config)

    @property
    def key(self) -> str:
        """The task's result-file key: ``run_id[:16]``."""
        return self.run_id[:KEY_DIGITS]

    def label(self, keys: Iterable[str]) -> str:
        """``k=v`` pairs of the given keys (file paths shortened to their name), for messages and tables."""
        return " ".join(f"{k}={short_value(self.config[k])}" for k in keys if k in self.config)


def expand(spec: SweepSpec) -> list[Task]:
    """The tasks of ``spec``, in a deterministic order (a list: :func:`iter_tasks` expands lazily).

    Each ``[axes]`` grid is the cartesian product of its axes in file order, the last axis varying fastest;
    grids follow one another; a grid with no axes is one task (the fixed knobs). Every task config is checked
    and completed by :func:`stepsim.workloads.config.normalize_config` (defaults filled in), then unset
    knobs are dropped, so a task does not depend on whether a default was spelled out, and a knob added to
    stepsim later (unset by old sweeps) does not change old configs. A task that two grids both produce is
    kept once, at its first position.

    Raises
    ------
    ConfigError
        A task has a knob of the wrong type or value, or one its workload does not use, or an unreadable trace
        (the message names the sweep file, the task and the key), or it lacks a ``partition_by`` key.
    """
    return list(iter_tasks(spec))


def iter_tasks(spec: SweepSpec) -> Iterator[Task]:
    """The tasks of :func:`expand`, one at a time: a million-point grid starts at once and is never held in
    memory (only the 16-hex keys of the tasks seen, to drop repeats across grids). A task is checked when it
    is reached, so a bad knob value deep in a huge grid stops the sweep there (finished rows are kept)."""
    from stepsim.results.records import identity_of_normalized
    from stepsim.workloads.config import normalize_config

    seen = set()
    index = 0
    for grid in spec.grids:
        names = list(grid)
        for values in itertools.product(*(grid[n] for n in names)):
            point = dict(zip(names, values))
            raw = {"workload": spec.workload, "mode": spec.mode, **spec.fixed, **point}
            label = " ".join(f"{k}={short_value(v)}" for k, v in point.items())
            source = f"{spec.source} (task {label})" if label else str(spec.source)
            normalized = normalize_config(raw, source=source)
            config = {k: v for k, v in normalized.items() if v is not None}
            missing = [k for k in spec.partition_by if k not in config]
            if missing:
                raise ConfigError(f"{source}: partition_by key {missing[0]!r} is not set for this task")
            try:  # the config is valid by now: what can fail is reading the trace or hardware file
                run_id, trace, trace_hash = identity_of_normalized(normalized)
            except ConfigError as exc:
                raise ConfigError(f"{source}: {exc}") from exc
            key = run_id[:KEY_DIGITS]
            if key not in seen:
                seen.add(key)
                yield Task(index=index, config=config, run_id=run_id, trace_path=trace, trace_sha256=trace_hash,
                           force=spec.force)
                index += 1


def slot_key(values: Mapping) -> str:
    """Which task of a sweep a config or a row is, whatever its result: a hash of its knobs and mode *as
    spelled* (paths as given, not their content), every value as a string (hive partition columns read back
    as strings). Two rows with one slot key and different run ids are two generations of one task (its trace
    or hardware file changed in between)."""
    from stepsim.workloads.config import KNOBS

    return stable_hash({k: str(values[k]) for k in (*KNOBS, "mode") if values.get(k) is not None})[:KEY_DIGITS]


def short_value(value) -> str:
    """A knob value for display: file paths by their name only."""
    if isinstance(value, str) and "/" in value:
        return Path(value).name
    return str(value)
