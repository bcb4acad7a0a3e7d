"""The layers no schedule fits, remembered in this process.

The mapper caches the schedules it finds (:func:`stepsim.mapping.mapper.map_layer`, in memory and on disk), not the
searches that found none: each ends in :class:`~stepsim.mapping.units.Infeasible` after building its candidates
(about two minutes for an FFN bucket of 16,384 tokens on one sn40l). A plan meets the same unmappable bucket on every
replay of a deployment whose steps grow with the rate (Orca's steps of whole prompts: docs/plan.md §4, "Unservable
rates"), so :func:`schedule_for` raises the first search's error again instead of searching again. Kept out of
:mod:`stepsim.mapping.mapper`, whose source is in every cached schedule's key: the same search, its cache unchanged.
"""

from __future__ import annotations

from pathlib import Path

from stepsim.base.files import stable_hash
from stepsim.mapping import mapper
from stepsim.mapping.units import Infeasible

#: the mapper's key of each unmappable layer (kind, bucket, dims, hardware) -> its search's error message
_UNMAPPABLE: dict[str, str] = {}


def schedule_for(kind: str, size: int, dims, hardware, *, cache: Path | None | bool = True):
    """:func:`stepsim.mapping.mapper.schedule_for`, raising a layer's :class:`Infeasible` again without a second
    search once one found no schedule in this process."""
    key = stable_hash(mapper.key_material(kind, mapper.bucket(size), dims, hardware))
    if key in _UNMAPPABLE:
        raise Infeasible(_UNMAPPABLE[key])
    try:
        return mapper.schedule_for(kind, size, dims, hardware, cache=cache)
    except Infeasible as exc:
        _UNMAPPABLE[key] = str(exc)
        raise
