"""A spilled edge as real off-chip traffic: the producer's tiles are written to an off-chip tensor of their own and
read back by the consumer once the whole tensor is stored, built only from existing operators:

``MetadataSource`` (one tile address per tile) -> ``RandomOffChipStore`` (writes each tile through the chip's HBM,
one ack per tile) -> ``Accum(SignalReqAllRead)`` (one "all written" token after the last ack) ->
``LinearOffChipLoad(ref=...)`` (reads the tensor back, in the consumer's order, once that token arrives).

Why whole-tensor completion: a spill *materializes* the tensor (StreamTensor's unfused edge, and what an
accelerator without a producer-consumer handshake through DRAM must do): the consumer may read any tile, so it
may start only when every tile is written. It is also what makes a spill able to replace a layout converter: the
read-back can follow any order (a Transpose's), so the converter's on-chip buffer is not built.

Accounting (exact in both the symbolic metric and the engine's HBM counters): the store writes and the load reads
``bytes`` of the tensor once each (fp32: the tiles' stream dtype), ``2 x bytes`` in all; on chip the store and
the load hold one tile each (the published convention) and the completion signal one 8-byte token.
"""

from __future__ import annotations

import numpy as np

from stepsim.graph import (
    FP32,
    UINT64,
    Accum,
    LinearOffChipLoad,
    MetadataSource,
    RandomOffChipStore,
    SignalReqAllRead,
    Tensor,
    Zero,
)
from stepsim.graph.layout import Layout, tile_numbers


def row_major(shape: tuple) -> tuple:
    """Tile strides of a row-major view of ``shape`` (tiles)."""
    out, step = [], 1
    for d in reversed(shape):
        out.append(step)
        step *= d
    return tuple(reversed(out))


def spill(g, s, tag: str, *, addresses: np.ndarray, tensor_shape: tuple, load_tile: tuple, view: tuple,
          par_dispatch: int = 1) -> LinearOffChipLoad:
    """Write stream ``s`` (``(1,) + addresses.shape`` tiles) to off-chip tensor ``spill[tag]`` (``tensor_shape``
    elements, fp32), tile ``k`` of the stream at tile address ``addresses[k]`` (in the tensor's row-major grid of
    ``s``'s tiles), and read it back as ``load_tile`` tiles over ``view`` (row-major: tiles ``0, 1, ...``) once the
    last write completed. Returns the load (output ``(1,) + view``)."""
    dtype = s.stream.dtype
    # a fresh scratch tensor: zeros (functional mode's initial contents; a broadcast view, so no memory until then)
    tensor = Tensor(f"spill[{tag}]", tensor_shape, FP32, np.broadcast_to(np.float32(0), tensor_shape))
    addr = MetadataSource(g, np.asarray(addresses, np.int64), name=f"spill_addr[{tag}]")
    ack = RandomOffChipStore(g, s, addr, tensor, (dtype.rows, dtype.cols), par_dispatch=par_dispatch,
                             name=f"spill_write[{tag}]")
    done = Accum(g, ack, SignalReqAllRead(), Zero(1, 1, UINT64), len(ack.stream.shape) - 1, compute_bw=0,
                 name=f"spill_done[{tag}]")
    load = LinearOffChipLoad(g, tensor, load_tile, view, row_major(view), ref=done, stream_dtype=FP32,
                             par_dispatch=par_dispatch, name=f"spill_read[{tag}]")
    load.spill = True  # stepsim.graph.lower.fp32_timing_bytes: a scratch read, not a model tensor's storage dtype
    return load


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
