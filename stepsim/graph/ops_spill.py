"""A stream through off-chip memory (a *spill*): the producer's tiles are written to an off-chip tensor of their own
and read back once the whole tensor is stored, in any tile shape and order the memory can serve. Built only from
existing operators:

``MetadataSource`` (one tile address per tile) -> ``RandomOffChipStore`` (writes each tile through the chip's HBM,
one ack per tile) -> ``Accum(SignalReqAllRead)`` (one "all written" token after the last ack) ->
``LinearOffChipLoad(ref=...)`` (reads the tensor back, in the consumer's tiles and order, once that token arrives).

Why whole-tensor completion: a spill *materializes* the tensor (StreamTensor's unfused edge, and what an
accelerator without a producer-consumer handshake through DRAM must do): the consumer may read any tile, so it
may start only when every tile is written. It is also what makes a spill able to replace a layout converter: the
read-back can follow any order and tile shape, so no on-chip converter buffer is built.

Accounting (exact in both the symbolic metric and the engine's HBM counters): the store writes and the load reads
the tensor's bytes once each (its stream dtype), ``2 x bytes`` in all; on chip the store and the load hold one tile
each (the published convention) and the completion signal one 8-byte token.

:func:`spill` is the construction (the ONNX front end's spilled edges, :mod:`stepsim.frontend.spill`);
:func:`retile_through_memory` is the re-tiling :func:`stepsim.graph.ops_convert.convert` lowers through a spill
when no on-chip converter is minimal (``SPILL_REASON``).
"""

from __future__ import annotations

import numpy as np

from stepsim.base.errors import LayoutError
from stepsim.graph.dtypes import FP32, UINT64
from stepsim.graph.functions import SignalReqAllRead, Zero
from stepsim.graph.layout import Layout, tile_numbers
from stepsim.graph.ops_compute import Accum
from stepsim.graph.ops_memory import LinearOffChipLoad, RandomOffChipStore, Tensor
from stepsim.graph.ops_sources import MetadataSource

#: why :func:`stepsim.graph.ops_convert.convert` spills a pair (``{p}``, ``{c}``: the two tile shapes)
SPILL_REASON = ("re-tiling {p} -> {c} has no minimal on-chip converter (the consumer's tiles are not runs of the "
                "producer's in its order): spilled, read back in the consumer's tiles and order")


def row_major(shape: tuple) -> tuple:
    """Tile strides of a row-major view of ``shape`` (tiles)."""
    out, step = [], 1
    for d in reversed(shape):
        out.append(step)
        step *= d
    return tuple(reversed(out))


def spill(g, s, tag: str, *, addresses: np.ndarray, tensor_shape: tuple, load_tile: tuple, view: tuple,
          stride: tuple | None = None, dtype=FP32, par_dispatch: int = 1) -> LinearOffChipLoad:
    """Write stream ``s`` (``(1,) + addresses.shape`` tiles) to off-chip tensor ``spill[tag]`` (``tensor_shape``
    elements of ``dtype``, also the read-back tiles' dtype), tile ``k`` of the stream at tile address ``addresses[k]`` (in the tensor's row-major
    grid of ``s``'s tiles), and read it back as ``load_tile`` tiles over ``view`` (``stride``: the view's tile
    strides; default row-major: tiles ``0, 1, ...``) once the last write completed. Returns the load (output
    ``(1,) + view``)."""
    stream_dtype = s.stream.dtype
    # a fresh scratch tensor: zeros (functional mode's initial contents; a broadcast view, so no memory until then)
    tensor = Tensor(f"spill[{tag}]", tensor_shape, dtype, np.broadcast_to(np.float32(0), tensor_shape))
    addr = MetadataSource(g, np.asarray(addresses, np.int64), name=f"spill_addr[{tag}]")
    ack = RandomOffChipStore(g, s, addr, tensor, (stream_dtype.rows, stream_dtype.cols), par_dispatch=par_dispatch,
                             name=f"spill_write[{tag}]")
    done = Accum(g, ack, SignalReqAllRead(), Zero(1, 1, UINT64), len(ack.stream.shape) - 1, compute_bw=0,
                 name=f"spill_done[{tag}]")
    load = LinearOffChipLoad(g, tensor, load_tile, view, row_major(view) if stride is None else stride, ref=done,
                             stream_dtype=dtype, par_dispatch=par_dispatch, name=f"spill_read[{tag}]")
    load.spill = True  # stepsim.graph.lower.fp32_timing_bytes: a scratch read, not a model tensor's storage dtype
    return load


def retile_through_memory(g, s, p: Layout, c: Layout, tag: str, *, par_dispatch: int = 1) -> LinearOffChipLoad:
    """Spill stream ``s`` (``(1,) + p.trips`` tiles of ``p.tile``) into a tensor of ``p.shape`` (each tile at its
    place) and read it back as ``c`` (``(1,) + c.trips`` tiles of ``c.tile``, in ``c``'s order): any re-tiling and
    reordering of one tensor, at two tiles and one token on chip. ``load.spill_reason`` says why (SPILL_REASON).
    A ``tag`` already used in ``g`` gets ``#2``, ``#3``, ... (each spill its own scratch tensor).
    LayoutError when a tile spans leading dims (a load tiles only the last two)."""
    for lay in (p, c):
        if any(t != 1 for t in lay.tile[:-2]):
            raise LayoutError(f"{lay}: a spill stores and loads 2-D tiles (leading tile dims must be 1)")
    taken, base, k = {op.name for op in g.ops}, tag, 1
    while f"spill_read[{tag}]" in taken:  # one scratch tensor per spill (functional mode keys tensors by name)
        k += 1
        tag = f"{base}#{k}"
    grid = tile_numbers(p, p.tile)  # the producer's tile number at each place of the tensor's grid of its tiles
    addresses = np.empty(p.num_tiles, np.int64)
    addresses[grid.ravel()] = np.arange(p.num_tiles)  # the producer's k-th tile goes to its place, row-major
    view, stride = c.tile_view()
    dtype = s.stream.dtype.dtype
    load = spill(g, s, tag, addresses=addresses.reshape(p.trips), tensor_shape=tuple(p.shape),
                 load_tile=tuple(c.tile[-2:]), view=tuple(view), stride=tuple(stride), dtype=dtype,
                 par_dispatch=par_dispatch)
    load.spill_reason = SPILL_REASON.format(p="x".join(map(str, p.tile)), c="x".join(map(str, c.tile)))
    load.assume_layout(0, c)
    return load
