"""Output destinations checked before any work: a bad ``--out`` fails in milliseconds, not after a simulation.

:func:`check_out_dir` and :func:`check_out_file` raise :class:`~stepsim.base.errors.ArgumentError` with one line
naming the flag and what is wrong (a parent that is a file, a folder that is a file, no write permission, a
system folder such as ``/proc``) and create nothing. The writers themselves write to a temporary name and rename
it into place, so an interrupted command never leaves half a file.
"""

from __future__ import annotations

import os
from pathlib import Path

from stepsim.base.errors import ArgumentError


def _nearest_existing(path: Path) -> Path:
    """``path`` or its nearest ancestor that exists."""
    for candidate in (path, *path.parents):
        if candidate.exists():
            return candidate
    return Path(".")


def _check_creatable(path: Path, flag: str) -> None:
    """``path`` can be written: its nearest existing ancestor is a writable folder (files are replaced by
    renaming a temporary file in their folder, so an existing file's folder must be writable too)."""
    existing = _nearest_existing(path.parent)
    if not existing.is_dir():
        raise ArgumentError(f"{flag} {path}: {existing} is a file, not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ArgumentError(f"{flag} {path}: {existing} is not writable")
    check_not_pseudo(path, flag)


def check_not_pseudo(path, flag: str = "--out") -> None:
    """Refuse a path under ``/proc``, ``/sys`` or ``/dev``: those file systems accept ``access()`` (and, for
    root, every permission check) but refuse new files."""
    resolved = str(Path(path).resolve())
    for root in ("/proc", "/sys", "/dev"):
        if resolved.startswith(root + "/") or resolved == root:
            raise ArgumentError(f"{flag} {path}: cannot write under {root}")


def check_out_dir(path, flag: str = "--out") -> Path:
    """Check that folder ``path`` exists as a writable folder or can be created. Returns it as a Path."""
    p = Path(path)
    if str(path) == "":
        raise ArgumentError(f"{flag}: empty path")
    if p.exists() and not p.is_dir():
        raise ArgumentError(f"{flag} {p}: is a file; give a folder (stepsim writes several files into it)")
    if p.suffix == ".parquet" and not p.exists():
        raise ArgumentError(f"{flag} {p}: give a folder, not a .parquet file name (this command writes several "
                            "files into it)")
    _check_creatable(p, flag)
    return p


def check_cache_dir(path, variable: str, what: str) -> Path:
    """:func:`check_out_dir` of a cache folder ``path`` that the environment variable ``variable`` chooses: an error
    names the variable when it is set, else ``what`` and how to choose another folder."""
    where = f"${variable}" if os.environ.get(variable) else f"{what} (set ${variable} to choose another folder)"
    return check_out_dir(path, where)


def record_file_paths(path) -> dict[str, Path]:
    """Where ``stepsim run --out NAME.parquet`` writes: the record row at ``NAME.parquet``, and for simulations
    the per-unit and per-channel tables beside it (``NAME_units.parquet``, ``NAME_channels.parquet``)."""
    p = Path(path)
    return {"run": p, "units": p.with_name(f"{p.stem}_units.parquet"),
            "channels": p.with_name(f"{p.stem}_channels.parquet")}


def is_record_file(path) -> bool:
    """``--out`` of ``run`` / ``metrics`` names a Parquet file (``.parquet``, not an existing folder)."""
    p = Path(path)
    return p.suffix == ".parquet" and not p.is_dir()


def check_record_out(path, flag: str = "--out") -> Path:
    """``run`` / ``metrics --out``: a ``.parquet`` file name (checked with the tables written beside it, see
    :func:`record_file_paths`) or a folder (:func:`check_out_dir`)."""
    if not is_record_file(path):
        return check_out_dir(path, flag)
    for target in record_file_paths(path).values():
        check_out_file(target, flag if target == Path(path) else f"{flag} {path}: table file")
    return Path(path)


def check_out_file(path, flag: str = "--out") -> Path:
    """Check that file ``path`` can be written (a new file, or an existing file that is not a folder)."""
    p = Path(path)
    if str(path) == "":
        raise ArgumentError(f"{flag}: empty path")
    if p.is_dir():
        raise ArgumentError(f"{flag} {p}: is a folder; give a file name")
    _check_creatable(p, flag)
    return p
