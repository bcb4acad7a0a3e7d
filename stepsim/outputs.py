"""Output destinations checked before any work: a bad ``--out`` fails in milliseconds, not after a simulation.

:func:`check_out_dir` and :func:`check_out_file` raise :class:`~stepsim.errors.ArgumentError` with one line
naming the flag and what is wrong (a parent that is a file, a folder that is a file, no write permission, a
system folder such as ``/proc``) and create nothing. The writers themselves write to a temporary name and rename
it into place, so an interrupted command never leaves half a file.
"""

from __future__ import annotations

import os
from pathlib import Path

from stepsim.errors import ArgumentError


def _nearest_existing(path: Path) -> Path:
    """``path`` or its nearest ancestor that exists."""
    for candidate in (path, *path.parents):
        if candidate.exists():
            return candidate
    return Path(".")


def _check_creatable(path: Path, flag: str) -> None:
    """Every existing ancestor must be a writable folder (so ``path`` can be created under it)."""
    existing = _nearest_existing(path.parent if not path.exists() else path)
    if existing != path and not existing.is_dir():
        raise ArgumentError(f"{flag} {path}: {existing} is a file, not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ArgumentError(f"{flag} {path}: {existing} is not writable")
    # pseudo file systems accept access() but refuse new files
    for root in ("/proc", "/sys", "/dev"):
        if str(path.resolve()).startswith(root + "/") or str(path.resolve()) == root:
            raise ArgumentError(f"{flag} {path}: cannot write under {root}")


def check_out_dir(path, flag: str = "--out") -> Path:
    """Check that folder ``path`` exists as a writable folder or can be created. Returns it as a Path."""
    p = Path(path)
    if str(path) == "":
        raise ArgumentError(f"{flag}: empty path")
    if p.exists() and not p.is_dir():
        raise ArgumentError(f"{flag} {p}: is a file; give a folder (stepsim writes several files into it)")
    if p.suffix == ".parquet" and not p.exists():
        raise ArgumentError(f"{flag} {p}: give a folder, not a .parquet file name (the record and its unit and "
                            "channel tables are written into it as part-<id>.parquet, _units-... and _channels-...)")
    _check_creatable(p, flag)
    return p


def check_out_file(path, flag: str = "--out") -> Path:
    """Check that file ``path`` can be written (a new file, or an existing file that is not a folder)."""
    p = Path(path)
    if str(path) == "":
        raise ArgumentError(f"{flag}: empty path")
    if p.is_dir():
        raise ArgumentError(f"{flag} {p}: is a folder; give a file name")
    _check_creatable(p, flag)
    if p.exists() and not os.access(p, os.W_OK):
        raise ArgumentError(f"{flag} {p}: the file is not writable")
    return p
