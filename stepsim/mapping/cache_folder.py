"""The mapping cache folder checked before any work (``$STEPSIM_MAPPING_CACHE``, else the user's): the schedules and
the simulated costs (stepsim/serve/projections.py, stepsim/serve/ffn_points.py) are saved there, so a folder that
is a file, or cannot be created or written, failed only when the first one was saved, after minutes of mapping.
Not part of the mapper's sources (:data:`stepsim.mapping.mapper.SHARED_MODULES`): it decides where, not what."""

from __future__ import annotations

from pathlib import Path


def checked_mapping_cache() -> Path:
    """The process's mapping cache folder, checked: one line naming where it came from; nothing is created."""
    from stepsim.base.outputs import check_cache_dir
    from stepsim.mapping.mapper import _cache_folder

    return check_cache_dir(_cache_folder(True), "STEPSIM_MAPPING_CACHE", "the mapping cache")
