"""What the decode attention kinds over tiled KV caches share (``mla_attention``, ``sliding_attention``): the
additive mask of each request's last KV tile and the operators that add it.

A request reads whole tiles of ``tile_n`` cache rows; the rows of its last tile past the tokens it attends to
hold whatever the cache holds there, so their scores get :data:`MASKED` added (``exp`` of it is 0 in fp32),
as the prefill graph masks its diagonal tile. The mask is one ``(1, tile_n)`` row per request, read from HBM
(``2 * tile_n`` bytes each in bf16) and broadcast over the query rows.
"""

from __future__ import annotations

import numpy as np

from stepsim.base.errors import ArgumentError
from stepsim.graph import Add, FilterLastTile, Flatten, Map, Partition, Reassemble

#: the mask's value for a row that is not attended to (added to its score)
MASKED = -1e30


def positive_int(name: str, value) -> int:
    """``value`` as an int >= 1, or one line naming ``name``."""
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
        raise ArgumentError(f"{name} must be a positive int, got {value!r}")
    return int(value)


def cache_slots(need: int, max_n, tile_n: int) -> int:
    """KV rows each request's cache region holds (``max_n``, default ``need``, the longest request's tiles):
    a multiple of ``tile_n`` of at least ``need`` rows, else a one-line ArgumentError."""
    slots = need if max_n is None else positive_int("max_n", max_n)
    if slots % tile_n or slots < need:
        raise ArgumentError(f"max_n must be a multiple of tile_n={tile_n} holding the longest request ({need} rows), "
                            f"got {slots}")
    return slots


def tail_mask(valid_in_last: np.ndarray, tile_n: int) -> np.ndarray:
    """``[requests, tile_n]`` float32: 0 in the first ``valid_in_last[b]`` columns of row ``b`` (the rows of
    request ``b``'s last tile that it attends to, 1 .. tile_n), :data:`MASKED` after them."""
    cols = np.arange(tile_n)[None, :]
    return np.where(cols < np.asarray(valid_in_last)[:, None], 0.0, MASKED).astype(np.float32)


def mask_last_tile(g, scores, seq_len, mask, compute_bw: int):
    """``scores`` (``[requests, tiles]`` of score tiles) with ``mask`` (``[requests]`` of ``(1, tile_n)``
    rows) added to each request's last tile; ``seq_len`` is the requests' tile counts (``[requests]`` u64).
    Returns the merged ``[requests * tiles]`` stream of score tiles in the input order."""
    shape = scores.stream.shape
    last = FilterLastTile(g, seq_len)
    last.assume_shape(0, shape)
    split = Partition(g, scores, last, 0, 2)
    split.assume_shape(0, (shape[0],))  # one last tile per request
    split.assume_shape(1, (shape[0] * (shape[1] - 1),))
    masked = Map(g, [split[0], mask], Add(), compute_bw=compute_bw)
    merged = Reassemble(g, [masked, split[1]], last, 0)
    merged.assume_shape(0, shape + (1,))  # one tile per selector
    return Flatten(g, merged, 0, 1)
