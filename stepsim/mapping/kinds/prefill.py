"""The ``prefill`` kind: the causal prefill attention of every KV head (each head's prompt chunks as requests of
their own), over ``size`` = query positions a head computes, in whole tiles (:func:`prefill_size`), docs/mapping.md.
Representative data: one prompt of ``size`` tokens, nothing cached, per KV head. Space: ``regions`` (parallel
pipelines over the query tiles of every head, dealt round-robin: powers of two up to the query tiles; a layer of
fewer query tiles than the knob takes one region a tile, and shares are uneven where the regions do not divide the
query tiles: :func:`prefill_regions`)."""

from __future__ import annotations

import numpy as np

from stepsim.mapping.kinds.common import KV_TILE, PLACEHOLDER_BW
from stepsim.mapping.kinds.common import powers_of_two as _powers_of_two

#: the builders this kind's schedules depend on (part of its cache key: :func:`stepsim.mapping.mapper.source_files`)
BUILDERS = ("stepsim.workloads.prefill_attention.build",)


def prefill_size(data, dims: dict) -> int:
    """The ``prefill`` size of ``data`` = ``(cached, chunk)`` over every KV head's requests: the query tiles one head
    computes, in positions (``KV_TILE`` x query tiles / ``kv_heads``). It depends on the shape alone, as a serving
    template's key (requests, query tiles) does."""
    from stepsim.workloads.prefill_attention.build import query_tiles

    request, _ = query_tiles(np.asarray(data[0]), np.asarray(data[1]), KV_TILE)
    return KV_TILE * len(request) // dims["kv_heads"]


def prefill_data(size: int, dims: dict) -> tuple[np.ndarray, np.ndarray]:
    """The representative data at ``size``: per KV head one prompt of ``size`` tokens, nothing cached."""
    heads = dims["kv_heads"]
    return np.zeros(heads, dtype=np.int64), np.full(heads, size, dtype=np.int64)


def prefill_space(size: int, dims: dict) -> list[dict]:
    """Every ``prefill`` candidate's knobs at ``size``: regions, powers of two up to the query tiles of every head."""
    return [{"regions": r} for r in _powers_of_two(dims["kv_heads"] * -(-size // KV_TILE))]


def prefill_regions(knobs: dict, query_tiles: int) -> int:
    """The regions a layer of ``query_tiles`` query tiles is built with: the knob's, at most one a query tile.
    Query tile ``j`` goes to region ``j % regions``, so the first ``query_tiles % regions`` regions get one tile
    more than the others (until 2026-11-26 the regions had to divide the query tiles: ``gcd(knob, query tiles)``,
    and a 1,028-token prompt of the 4-layer Qwen3 shape, 132 query tiles, ran on 4 of its bucket's 128 regions)."""
    return min(knobs["regions"], query_tiles)


def prefill_bound(knobs: dict, data, dims: dict, hardware) -> int:
    """A lower bound on the ``prefill`` candidate's cycles from its knobs and data alone: the K and V tiles (the K
    tiles alone with ``shared_kv``) read at the HBM's peak, and the busiest region's K tiles issued one request a
    cycle (a cache load issues one request of ``addr_offset`` bytes a cycle: ``tile_n x ceil(2 head_dim /
    addr_offset)`` a bf16 tile). Sound for uneven shares too: each region's K load issues its own tiles' requests,
    whatever the other regions get."""
    from stepsim.workloads.prefill_attention.build import query_tiles

    _, group = query_tiles(np.asarray(data[0]), np.asarray(data[1]), KV_TILE)
    regions = prefill_regions(knobs, len(group))
    d = dims["head_dim"]
    caches = 1 if dims.get("shared_kv") else 2
    kv_bytes = caches * int(np.sum(group + 1)) * KV_TILE * d * 2
    busiest = max(int(np.sum(group[r::regions] + 1)) for r in range(regions))
    return max(-(-kv_bytes // hardware.hbm_peak_bytes_per_cycle),
               busiest * KV_TILE * -(-2 * d // hardware.addr_offset))


def build_prefill(data, dims: dict, knobs: dict, max_n: int | None = None):
    """The prefill attention of ``data`` = ``(cached, chunk)`` (every KV head's requests) with ``knobs``."""
    from stepsim.workloads.prefill_attention.build import build_prefill_attention, query_tiles

    cached, chunk = (np.asarray(a, dtype=np.int64) for a in data)
    request, _ = query_tiles(cached, chunk, KV_TILE)
    if max_n is not None:
        max_n = -(-max_n // KV_TILE) * KV_TILE
    return build_prefill_attention(cached, chunk, head_dim=dims["head_dim"],
                                   query_per_kv_head=dims["query_per_kv_head"], tile_n=KV_TILE, max_n=max_n,
                                   compute_bw=PLACEHOLDER_BW, regions=prefill_regions(knobs, len(request)),
                                   shared_kv=dims.get("shared_kv", False))
