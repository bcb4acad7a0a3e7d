"""Simulated costs kept in the mapping cache's subfolders: one checksummed JSON file per key, named by the hash of
the material the cost depends on, so that worker processes and later runs read a cost instead of simulating it
again. A file that is damaged or made for other material is warned about, simulated again and replaced; a cost is
only ever reused for the very material it was simulated for (the material names the sources that compute it)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Callable

from stepsim.base.errors import StepsimWarning
from stepsim.base.files import atomic_output, stable_hash


def cost_path(folder: str, material: dict) -> Path:
    """The file of ``material``'s cost in the mapping cache's subfolder ``folder``."""
    from stepsim.mapping.mapper import _cache_folder

    return _cache_folder(True) / folder / f"{stable_hash(material)}.json"


def stored_cost(folder: str, material: dict, what: str, length: int, simulate: Callable) -> tuple[int, ...]:
    """The ``length`` counts stored for ``material`` in ``folder``, else ``simulate()``'s, stored (``what`` names the
    cost in a damaged file's warning)."""
    path = cost_path(folder, material)
    cost = load_cost(path, material, what, length)
    if cost is None:
        cost = tuple(int(v) for v in simulate())
        save_cost(path, material, cost)
    return cost


def load_cost(path: Path, material: dict, what: str, length: int) -> tuple[int, ...] | None:
    """The stored cost, or None when there is none; a damaged file, or one for other material, is warned about
    (None: simulated again, then replaced)."""
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(record, dict) or record.get("sha256") != stable_hash(
                {k: v for k, v in record.items() if k != "sha256"}) or record.get("material") != material:
            raise ValueError("its checksum or material does not match")
        cost = tuple(record["cost"])
        if len(cost) != length or not all(type(v) is int and v >= 0 for v in cost):
            raise ValueError(f"its cost {record['cost']!r} is not {length} counts")
        return cost
    except Exception as exc:  # noqa: BLE001 - any damage means: simulate again and replace the file
        warnings.warn(f"{what} file {path}: unusable ({type(exc).__name__}: {exc}); simulating again (the file will "
                      "be replaced)", StepsimWarning, stacklevel=4)
        return None


def save_cost(path: Path, material: dict, cost: tuple[int, ...]) -> None:
    """One checksummed file: the material and the cost, written whole or not at all."""
    record = {"material": material, "cost": list(cost)}
    with atomic_output(path) as tmp:
        tmp.write_text(json.dumps({**record, "sha256": stable_hash(record)}, indent=2) + "\n", encoding="utf-8")
