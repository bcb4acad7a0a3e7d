"""The layout converter: reorder a tile stream from a producer's layout into a consumer's, on chip, in the least
buffer (:func:`stepsim.graph.layout.converter_buffer`), built from operators the engine already simulates.

Construction (why it needs exactly the minimum): run the lazy schedule of the layout module (the producer
delivers a tile only when the consumer's next tile is still incomplete) and give every tile a *slot* for its
lifetime, from its arrival to its departure, reusing the lowest free slot. At most ``B_min`` tiles are alive at
once, so ``B_min`` slots suffice. Two tiles of one slot never overlap in time, so a slot sees its tiles in the
same order on both sides: it is a FIFO. The converter is then

    SelectorSource(slot of each producer tile) -> Partition(rank 0) into one depth-1 FIFO per slot
    SelectorSource(slot of each consumer tile) -> Reassemble(rank 0) from the slots, in the consumer's order

plus a Flatten that folds Reassemble's one-element group dim away, so the output has the consumer's stream
shape ``(1,) + trips``. It cannot deadlock: when the Partition waits for a slot, the slot's tile leaves at a
consumer position before the one at which the lazy schedule delivers the waiting tile, and every consumer
tile before that needs only tiles already delivered.

The Partition carries the converter's on-chip bytes, ``B_min`` tiles (the selectors' bytes are control, as
everywhere else in stepsim's accounting).

Re-tiling (different tile shapes) is built for one family, *in-order packing*: every consumer tile is ``k``
producer tiles side by side along one of the last two dims, which the producer emits consecutively in that order
(:func:`packs_in_order`), e.g. column stripes of a row block into the row block. Then ``max_j P_j T_p - j T_c``
is ``T_c`` (the producer has delivered exactly tiles ``0 .. j`` of the consumer's when tile ``j`` leaves), and an
``Accum(RetileCol)`` (or ``RetileRow``) over each run of ``k`` tiles holds exactly one consumer tile: minimal.
Other pairs of unequal tiles spill (below).

Why other re-tilings are not built from slots: with STeP's units it would be a reorder at the common cell (this
construction) followed by an ``Accum`` packing each consumer tile from ``T_c`` cells (and, when the producer's tile
is coarser, a ``RetileStreamify`` splitting it). The packing Accum's tile is allocated whole for the whole run,
on top of the slots' peak, so the total exceeds the minimum ``max_j P_j T_p - j T_c`` cells (it did on every one
of 2,260 random 2-D pairs whose consumer tile is a union of producer tiles, checked while writing this): not
minimal. The front end re-tiles its one case, column
stripes into row tiles, with ``Accum(RetileCol)`` at exactly the minimum (:mod:`stepsim.frontend.converters`);
any other pair spills.

So :func:`convert` lowers any other pair of unequal tiles through a spill
(:func:`stepsim.graph.ops_spill.retile_through_memory`): the producer's tiles are written to off-chip memory at
their places and, once all are written, read back in the consumer's tiles and order: ``2 x`` the tensor's bytes of
traffic, two tiles and one 8-byte token on chip, and the reason on the load (``spill_reason``: "re-tiling ... has
no minimal on-chip converter"). Only pairs nothing can join (different tensors, element sizes, repeated tiles)
remain a LayoutError.
"""

from __future__ import annotations

import heapq
import math

import numpy as np

from stepsim.graph.dtypes import Tile
from stepsim.graph.functions import Empty, RetileCol, RetileRow
from stepsim.graph.graph import PUBLISHED, Op
from stepsim.graph.layout import Layout, converter_buffer, tile_numbers
from stepsim.graph.ops_compute import Accum
from stepsim.graph.ops_routing import Partition, Reassemble
from stepsim.graph.ops_shape import Flatten, Promote, Reshape
from stepsim.graph.ops_sources import SelectorSource
from stepsim.graph.ops_spill import retile_through_memory


class ConverterPartition(Partition):
    """The Partition of a layout converter: routes each tile to its slot FIFO (depth 1); on-chip the converter's
    whole buffer, ``buffer_bytes`` (bytes), in every convention."""

    def __init__(self, graph, inp, control, num_slots: int, buffer_bytes: int, *, name: str | None = None):
        super().__init__(graph, inp, control, 0, num_slots, name=name)
        self.buffer_bytes = int(buffer_bytes)
        self.channel_depth = 1  # one tile per slot: the FIFOs are the buffer

    def on_chip_bytes(self, convention=PUBLISHED):
        return self.buffer_bytes

    def on_chip_bytes_terms(self, convention=PUBLISHED):
        return ((self.buffer_bytes,),)


def slot_schedule(p: Layout, c: Layout) -> tuple[np.ndarray, np.ndarray, int]:
    """The slot of every tile in producer order and in consumer order (int64 arrays of the layouts' trip shapes)
    and the number of slots, from the lazy schedule (module docstring). Equal tile shapes only."""
    cell = p.tile
    pn, cn = tile_numbers(p, cell).ravel(), tile_numbers(c, cell).ravel()
    producer_of = np.empty(c.num_tiles, np.int64)  # consumer tile -> producer tile of the same cell
    producer_of[cn] = pn
    slot_p = np.empty(p.num_tiles, np.int64)
    free: list[int] = []
    used = 0
    delivered = 0
    slot_c = np.empty(c.num_tiles, np.int64)
    for j in range(c.num_tiles):
        need = producer_of[j]
        while delivered <= need:
            if free:
                slot_p[delivered] = heapq.heappop(free)
            else:
                slot_p[delivered] = used
                used += 1
            delivered += 1
        slot_c[j] = slot_p[need]
        heapq.heappush(free, int(slot_c[j]))
    return slot_p.reshape(p.trips), slot_c.reshape(c.trips), used


def convert(graph, inp, producer: Layout, consumer: Layout, *, producer_name: str = "producer",
            consumer_name: str = "consumer") -> Op:
    """A converter from ``inp`` (a tile stream of shape ``(1,) + producer.trips``) to a stream of shape
    ``(1,) + consumer.trips`` carrying the same tiles in the consumer's order; returns its output operator.

    ``inp`` itself is returned when the layouts are compatible; tiles of one shape are reordered through slots,
    unequal tiles that pack in order (:func:`packs_in_order`) by one Accum; other unequal tiles are spilled and
    read back in the consumer's tiles and order (:func:`stepsim.graph.ops_spill.retile_through_memory`; the
    returned load's ``spill_reason`` says why). LayoutError (one line naming both operators and layouts) when
    nothing can do it: different tensors or element sizes, a producer that repeats tiles, a consumer that re-reads
    them (:func:`stepsim.graph.layout.converter_buffer`), or, for a spill, tiles spanning leading dims.
    """
    size = converter_buffer(producer, consumer, producer=producer_name, consumer=consumer_name)
    if size.method == "compatible":
        return inp
    if producer.tile != consumer.tile:
        axis = packs_in_order(producer, consumer)
        if axis is None:  # no on-chip converter is minimal (module docstring): the memory re-tiles
            return retile_through_memory(graph, inp, producer, consumer, f"{producer_name}->{consumer_name}")
        return _pack(graph, inp, producer, consumer, axis, size.bytes)
    slot_p, slot_c, slots = slot_schedule(producer, consumer)
    assert slots * producer.tile_elements == size.elements, "the lazy schedule's peak is the closed form"
    return from_slots(graph, inp, consumer, slot_p, slot_c, slots, size.bytes)


def from_slots(graph, inp, consumer: Layout, slot_p: np.ndarray, slot_c: np.ndarray, slots: int,
               buffer_bytes: int) -> Op:
    """The converter's operators for a slot assignment (:func:`slot_schedule`): ``inp``'s tiles routed to
    ``slots`` depth-1 FIFOs by ``slot_p`` and read back in the consumer's order by ``slot_c``; the Partition
    holds ``buffer_bytes``. Returns the output operator (shape ``(1,) + consumer.trips``)."""
    one_hot = np.eye(slots, dtype=np.int8)
    sel_p = SelectorSource(graph, one_hot[slot_p], slots)
    part = ConverterPartition(graph, inp, sel_p, slots, buffer_bytes)
    counts = np.bincount(slot_p.ravel(), minlength=slots)
    for i in range(slots):
        part.assume_shape(i, (int(counts[i]),))
    sel_c = SelectorSource(graph, one_hot[slot_c], slots)
    merged = Reassemble(graph, [part[i] for i in range(slots)], sel_c, 0)
    merged.assume_shape(0, (1,) + consumer.trips + (1,))
    out = Flatten(graph, merged, 0, 1)
    out.assume_layout(0, consumer)  # the converter's whole point: its output carries the consumer's layout
    return out


def packs_in_order(p: Layout, c: Layout) -> int | None:
    """The tensor dim along which every consumer tile is a run of producer tiles that the producer emits
    consecutively, in increasing order along it (module docstring: in-order packing), or None.

    Both tiles must agree on every other dim, the leading tile dims be 1 (tiles are 2-D), and the axis be one of
    the last two dims."""
    diff = [d for d, (a, b) in enumerate(zip(p.tile, c.tile)) if a != b]
    if len(diff) != 1 or p.shape != c.shape or not (p.injective and c.injective):
        return None
    (axis,) = diff
    if axis < p.rank - 2 or c.tile[axis] % p.tile[axis] or any(t != 1 for t in p.tile[:-2]):
        return None
    k = c.tile[axis] // p.tile[axis]
    produced = list(p.origins())
    for j, origin in enumerate(c.origins()):
        for i in range(k):
            want = origin[:axis] + (origin[axis] + i * p.tile[axis],) + origin[axis + 1:]
            if produced[j * k + i] != want:
                return None
    return axis


def _pack(graph, inp, p: Layout, c: Layout, axis: int, buffer_bytes: int) -> Op:
    """In-order packing (:func:`packs_in_order`): the stream flattened, cut into runs of ``k`` producer tiles,
    each run concatenated along ``axis`` by an Accum holding one consumer tile (``buffer_bytes``), and shaped
    ``(1,) + c.trips`` carrying ``c``."""
    k = c.tile[axis] // p.tile[axis]
    s = inp.stream
    flat = Flatten(graph, inp, 0, s.rank) if s.rank else inp
    runs = Reshape(graph, flat, k, 0)  # (N_c, k)
    rows, cols = c.tile[-2], c.tile[-1]
    along_rows = axis == p.rank - 2
    init = Empty(0, p.tile[-1]) if along_rows else Empty(p.tile[-2], 0)
    acc = Accum(graph, runs, RetileRow() if along_rows else RetileCol(), init, 1, compute_bw=0,
                out_dtype=Tile(s.dtype.dtype, rows, cols))
    assert acc.on_chip_bytes() == buffer_bytes, "in-order packing holds exactly the minimum: one consumer tile"
    if not c.trips:  # one consumer tile: the Accum's (1,) is already the shape
        acc.assume_layout(0, c)
        return acc
    out = acc
    for r in range(len(c.trips) - 1):  # (N_c,) -> c.trips: split the innermost dim, outermost loop first
        out = Reshape(graph, out, math.prod(c.trips[r + 1:]), 0)
    out = Promote(graph, out, len(c.trips))  # the leading 1
    out.assume_layout(0, c)
    return out
