"""A spilled edge as real off-chip traffic: the producer's tiles are written to an off-chip tensor of their own and
read back by the consumer once the whole tensor is stored (the construction, its completion token and its exact
accounting: :mod:`stepsim.graph.ops_spill`). Here the two read-backs the front end uses: in the producer's order
(or as whole rows, the retile converter done by the memory), in a Transpose's order (the reorder converter
done by the memory), and element by element in the order of a swap of the last two dims (``x^T``: no on-chip
operator transposes a tile, so the memory does, at 4-byte reads). Spilled tensors are fp32 (the tiles' stream dtype), ``2 x bytes`` of traffic each.
"""

from __future__ import annotations

import numpy as np

from stepsim.graph import (
    FP32,
    Accum,
    Empty,
    Flatten,
    LinearOffChipLoad,
    Reshape,
    RetileCol,
    RetileRow,
    Tile,
)
from stepsim.graph.layout import Layout, tile_numbers
from stepsim.graph.ops_spill import row_major, spill

__all__ = ["row_major", "spill", "spill_in_order", "spill_reordered", "spill_transposed", "transposed_rows"]


def spill_in_order(g, s, tag: str, *, rows: bool = False, par_dispatch: int = 1) -> LinearOffChipLoad:
    """Spill stream ``s`` (``(1, M)`` row tiles or ``(1, M, nt)`` column stripes, or any ``(1,) + trips``) and read
    it back in the same order; ``rows``: stripes read back as whole-row tiles (``(1, M)`` of ``tile_rows x nt *
    tile_cols``), the retile converter done by the memory."""
    trips = tuple(int(d) for d in s.stream.shape[1:])
    tr, tc = s.stream.dtype.rows, s.stream.dtype.cols
    n_tiles = int(np.prod(trips))
    if rows:
        m, nt = trips
        return spill(g, s, tag, addresses=np.arange(n_tiles).reshape(trips), tensor_shape=(m * tr, nt * tc),
                     load_tile=(tr, nt * tc), view=(m,), par_dispatch=par_dispatch)
    return spill(g, s, tag, addresses=np.arange(n_tiles).reshape(trips), tensor_shape=(n_tiles * tr, tc),
                 load_tile=(tr, tc), view=trips, par_dispatch=par_dispatch)


def spill_reordered(g, s, tag: str, producer: Layout, consumer: Layout, *, par_dispatch: int = 1):
    """Spill stream ``s`` (``(1,) + producer.trips``) and read it back in ``consumer``'s order (``(1,) +
    consumer.trips``; the same tiles): each tile is written at its position in the consumer's order, so the read
    is linear. Replaces a reorder converter (its on-chip slots)."""
    tr, tc = s.stream.dtype.rows, s.stream.dtype.cols
    pn = tile_numbers(producer, producer.tile).ravel()
    cn = tile_numbers(consumer, producer.tile).ravel()
    addresses = np.empty(producer.num_tiles, np.int64)
    addresses[pn] = cn  # the producer's k-th tile is the consumer's addresses[k]-th
    return spill(g, s, tag, addresses=addresses.reshape(producer.trips), tensor_shape=(producer.num_tiles * tr, tc),
                 load_tile=(tr, tc), view=tuple(consumer.trips), par_dispatch=par_dispatch)


def transposed_view(groups: int, rows: int, cols: int) -> tuple[tuple, tuple]:
    """``(trips, strides)`` reading a row-major ``[groups, rows, cols]`` tensor as 1x1 tiles in the row-major order
    of its last-two-dims swap ``[groups, cols, rows]`` (tile number of element ``(g, r, c)``: ``(g * rows + r) *
    cols + c``)."""
    return (groups, cols, rows), (rows * cols, 1, cols)


def transposed_rows(g, elements, tile_m: int, rows: int, name: str):
    """Pack a stream ``(1, G, C, R)`` of 1x1 tiles (a swap's elements in its row-major order, ``R`` the swapped
    value's columns) into its row tiles: each ``R`` elements into a ``[1, R]`` row (RetileCol), each ``tile_m`` rows
    into a ``[tile_m, R]`` tile (RetileRow); ``(1, G * C / tile_m)``. On chip: one row tile being packed."""
    row = Accum(g, elements, RetileCol(), Empty(1, 0), 1, compute_bw=0, out_dtype=Tile(FP32, 1, rows),
                name=f"{name}.row")
    if tile_m == 1:
        return Flatten(g, row, 0, 1)
    block = Accum(g, Reshape(g, row, tile_m, 0), RetileRow(), Empty(0, rows), 1, compute_bw=0,
                  out_dtype=Tile(FP32, tile_m, rows), name=f"{name}.rows")
    return Flatten(g, block, 0, 1)


def spill_transposed(g, s, tag: str, groups: int, rows: int, cols: int, *, par_dispatch: int = 1):
    """Spill stream ``s`` of row tiles of a ``[groups, rows, cols]`` value (``(1, M)``, in order) and read it back
    as 1x1 tiles in the order of its last-two-dims swap (:func:`transposed_view`): ``(1, groups, cols, rows)``."""
    m = int(s.stream.shape[1])
    tr, tc = s.stream.dtype.rows, s.stream.dtype.cols
    view, stride = transposed_view(groups, rows, cols)
    return spill(g, s, tag, addresses=np.arange(m), tensor_shape=(m * tr, tc), load_tile=(1, 1), view=view,
                 stride=stride, par_dispatch=par_dispatch)
