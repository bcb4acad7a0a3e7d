"""Expand a sweep into tasks, and find which tasks already have a result file (resume).

A task is a plain dict (``workload``, ``mode``, the fixed knobs, one value per axis): exactly what
``stepsim.records.run_config`` takes, and what is sent to a worker. Its identity is
``task_key(config)`` = the first 16 hex digits of :func:`stepsim.results.stable_hash` of the dict, and its
result file is ``<out>/<hive folders>/part-<key>.parquet``, the name
:func:`stepsim.results.write_partitioned` would give it. So "is this task done?" is "does a ``part-<key>``
file exist?", whatever the partition folders are, and a re-run of the same sweep skips exactly the tasks whose
file is there. Files are written atomically (temp file + rename), so a file that exists is complete.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from stepsim.errors import ConfigError
from stepsim.results import partition_dir, stable_hash
from stepsim.sweep.config import SweepSpec

#: hex digits of the config hash in a result file name (as stepsim.results.write_partitioned names files)
KEY_DIGITS = 16
RESULT_GLOB = "**/part-*.parquet"
#: temp files stepsim.results.atomic_output leaves behind only if its process was killed mid-write
TEMP_GLOB = "**/.part-*.tmp"


@dataclass(frozen=True)
class Task:
    """One point of the grid.

    Attributes
    ----------
    index : int
        Position in the grid (0-based, deterministic order).
    config : dict
        The plain task config sent to a worker.
    key : str
        ``task_key(config)``.
    """

    index: int
    config: dict
    key: str

    def label(self, keys: Iterable[str]) -> str:
        """``k=v`` pairs of the given keys (file paths shortened to their name), for messages and tables."""
        return " ".join(f"{k}={short_value(self.config[k])}" for k in keys)


def task_key(config: dict) -> str:
    """Identity of a task config: 16 hex digits of its stable hash (independent of key order)."""
    return stable_hash(config)[:KEY_DIGITS]


def expand(spec: SweepSpec) -> list[Task]:
    """The tasks of ``spec``, in a deterministic order.

    Each ``[axes]`` grid is the cartesian product of its axes in file order, the last axis varying fastest;
    grids follow one another; a grid with no axes is one task (the fixed knobs). Every task config is checked
    and completed by :func:`stepsim.workloads.config.normalize_config` (defaults filled in), then unset
    knobs are dropped, so the key of a task does not depend on whether a default was spelled out, and a knob
    added to stepsim later (unset by old sweeps) does not change old keys. A task that two grids both produce
    is kept once, at its first position.

    Raises
    ------
    ConfigError
        A task has a knob of the wrong type or value, or one its workload does not use (the message names the
        sweep file, the task and the key), or it lacks a ``partition_by`` key.
    """
    from stepsim.workloads.config import normalize_config

    tasks: list[Task] = []
    seen = set()
    for grid in spec.grids:
        names = list(grid)
        for values in itertools.product(*(grid[n] for n in names)):
            point = dict(zip(names, values))
            raw = {"workload": spec.workload, "mode": spec.mode, **spec.fixed, **point}
            label = " ".join(f"{k}={short_value(v)}" for k, v in point.items())
            source = f"{spec.source} (task {label})" if label else str(spec.source)
            config = {k: v for k, v in normalize_config(raw, source=source).items() if v is not None}
            missing = [k for k in spec.partition_by if k not in config]
            if missing:
                raise ConfigError(f"{source}: partition_by key {missing[0]!r} is not set for this task")
            key = task_key(config)
            if key not in seen:
                seen.add(key)
                tasks.append(Task(index=len(tasks), config=config, key=key))
    return tasks


def result_path(out: str | Path, task: Task, partition_by: Iterable[str]) -> Path:
    """Where ``task``'s result file goes: ``out/<k>=<v>/.../part-<key>.parquet`` (hive levels from its config)."""
    partition_by = tuple(partition_by)
    return partition_dir(out, task.config, partition_by) / f"part-{task.key}.parquet"


def existing_keys(out: str | Path) -> dict[str, Path]:
    """``{task key: result file}`` of every result file under ``out`` (any partition layout)."""
    out = Path(out)
    if not out.is_dir():
        return {}
    return {p.stem[len("part-"):]: p for p in sorted(out.glob(RESULT_GLOB))}


def stale_temp_files(out: str | Path) -> list[Path]:
    """Temp files of interrupted writes under ``out`` (their target file was never renamed into place)."""
    out = Path(out)
    return sorted(out.glob(TEMP_GLOB)) if out.is_dir() else []


def short_value(value) -> str:
    """A knob value for display: file paths by their name only."""
    if isinstance(value, str) and "/" in value:
        return Path(value).name
    return str(value)
