"""The layers no schedule fits, remembered in the process and beside the mapper's cache on disk.

The mapper caches the schedules it finds (:func:`stepsim.mapping.mapper.map_layer`, in memory and on disk), not the
searches that found none: each ends in :class:`~stepsim.mapping.units.Infeasible` after building its candidates
(70 s for an FFN bucket of 16,384 tokens on one sn40l, 63 s for the 32,768-token bucket of a chip of two
expert-parallel ones: two thirds of issue 42's must-show plan). A plan meets the same unmappable bucket on every
replay of a deployment whose steps grow with the rate (Orca's steps of whole prompts: docs/plan.md §4, "Unservable
rates"), and every plan of the same model and chips meets it again, so :func:`schedule_for` raises the first
search's error again instead of searching again: from this process's memory, else from the file
``KEY.unmappable.json`` in the mapper's folder, keyed as the mapper keys a schedule (the layer's kind, bucket,
dimensions and hardware, the mapper's version and its sources: a change to any searches again). A damaged file is
searched again and replaced, as the mapper's own. Kept out of :mod:`stepsim.mapping.mapper`, whose source is in
every cached schedule's key: the same search, its cache unchanged.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

from stepsim.base.errors import StepsimWarning
from stepsim.base.files import atomic_output, stable_hash
from stepsim.mapping import mapper
from stepsim.mapping.units import Infeasible

#: the mapper's key of each unmappable layer (kind, bucket, dims, hardware) -> its search's error message
_UNMAPPABLE: dict[str, str] = {}


def schedule_for(kind: str, size: int, dims, hardware, *, cache: Path | None | bool = True):
    """:func:`stepsim.mapping.mapper.schedule_for`, raising a layer's :class:`Infeasible` again without a second
    search once one found no schedule (module docstring; ``cache`` as the mapper's: False or None, memory only)."""
    material = mapper.key_material(kind, mapper.bucket(size), dims, hardware)
    key = stable_hash(material)
    folder = _folder(cache)
    if key not in _UNMAPPABLE and folder is not None:
        error = _load(folder / f"{key}.unmappable.json", key)
        if error is not None:
            _UNMAPPABLE[key] = error
    if key in _UNMAPPABLE:
        raise Infeasible(_UNMAPPABLE[key])
    try:
        return mapper.schedule_for(kind, size, dims, hardware, cache=cache)
    except Infeasible as exc:
        _UNMAPPABLE[key] = str(exc)
        if folder is not None:
            record = {"key": key, "material": material, "error": str(exc)}
            with atomic_output(folder / f"{key}.unmappable.json") as tmp:
                tmp.write_text(json.dumps({**record, "sha256": mapper._checksum(record)}, indent=2) + "\n",
                               encoding="utf-8")
        raise


def _folder(cache) -> Path | None:
    """The folder of the records (the mapper's for ``cache``; None: memory only)."""
    return mapper._cache_folder(cache)


def _load(path: Path, key: str) -> str | None:
    """The error message stored at ``path`` for ``key``; None when there is none or it is unusable (a warning)."""
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        if (not isinstance(record, dict) or record.get("sha256") != mapper._checksum(record)
                or record.get("key") != key or not isinstance(record.get("error"), str)):
            raise ValueError("its checksum or key does not match")
        return record["error"]
    except Exception as exc:  # noqa: BLE001 - any damage means: search again and replace the file
        warnings.warn(f"mapping cache file {path}: unusable ({type(exc).__name__}: {exc}); searching again (the "
                      "file will be replaced)", StepsimWarning, stacklevel=3)
        return None
