"""The ``decode`` kind: the GQA decode attention of one KV head over ``batch`` requests, dynamic strategy
(docs/mapping.md). Representative KV lengths: :data:`DECODE_KV_LENGTH` tokens each. Space: ``regions`` (powers of
two up to the batch)."""

from __future__ import annotations

import numpy as np

from stepsim.mapping.kinds.common import KV_TILE, PLACEHOLDER_BW
from stepsim.mapping.kinds.common import powers_of_two as _powers_of_two

#: the builders this kind's schedules depend on (part of its cache key: :func:`stepsim.mapping.mapper.source_files`)
BUILDERS = ("stepsim.workloads.attention.build",)
#: KV tokens of each request in the decode attention the mapper decides on (a mid-length conversation context)
DECODE_KV_LENGTH = 1024


def decode_bound(knobs: dict, kv_lengths, dims: dict, hardware) -> int:
    """No bound without a build for the decode attention (its space is a handful of candidates): 0."""
    return 0


def decode_space(batch: int) -> list[dict]:
    """Every ``decode`` candidate's knobs for ``batch`` requests."""
    return [{"regions": r} for r in _powers_of_two(batch)]


def decode_lengths(batch: int) -> np.ndarray:
    """The representative KV lengths (module docstring)."""
    return np.full(batch, DECODE_KV_LENGTH, dtype=np.int64)


def build_decode(kv_lengths: np.ndarray, dims: dict, knobs: dict, max_n: int | None = None):
    """The decode attention of one KV head with ``knobs`` (``dims``: ``head_dim``, ``query_per_kv_head``; with
    ``shared_kv`` one cache of keys and values, an MLA layer's latent)."""
    from stepsim.workloads.attention.build import build_attention

    regions = min(knobs["regions"], len(kv_lengths))
    return build_attention(kv_lengths, "dynamic", head_dim=dims["head_dim"],
                           query_per_kv_head=dims["query_per_kv_head"], tile_n=KV_TILE, max_n=max_n,
                           regions=regions, compute_bw=PLACEHOLDER_BW, shared_kv=dims.get("shared_kv", False))
