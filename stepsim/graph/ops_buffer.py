"""On-chip buffer operators: Bufferize, Streamify and its reference-stream form (docs/semantics.md §2.2)."""

from __future__ import annotations

from stepsim.base.errors import ArgumentError, DTypeError, ShapeError
from stepsim.graph.dims import fmt_shape, is_static, normalize, product, shapes_equal
from stepsim.graph.dtypes import BufferRef, Tile
from stepsim.graph.graph import PUBLISHED, Op
from stepsim.graph.stream import Stream


class Bufferize(Op):
    """Store the inner ``rank`` dims of a static-tile stream in an on-chip buffer; emit one reference each.

    Output ``in.shape[:-rank]`` of ``BufferRef(tile, in.shape[-rank:])``. On-chip ``2*|buffer| + |tile|``
    (double-buffered), or one tile with ``off_chip=True`` (spilling; then off-chip ``N(in)*|tile|``). ``off_chip``
    is a metric only (the artifact's accounting): the engine keeps the buffer on chip; a spill whose traffic the
    engine moves is a store and a load (:mod:`stepsim.frontend.spill`).
    """

    kind = "Bufferize"

    def __init__(self, graph, inp, rank: int, *, off_chip: bool = False, name: str | None = None):
        (s,) = self._begin(graph, [inp], name)
        if not isinstance(s.dtype, Tile):
            raise self._error(DTypeError, f"Bufferize needs static tiles, got {s.dtype}")
        if not isinstance(rank, int) or not 1 <= rank <= s.rank:
            raise self._error(ArgumentError, f"rank must be between 1 and the input rank {s.rank}, got {rank!r}")
        inner = s.shape[-rank:]
        if not all(is_static(d) for d in inner[1:]):
            raise self._error(ShapeError, f"only the outermost buffered dim may be dynamic, got {fmt_shape(inner)}")
        self.rank = rank
        self.off_chip = bool(off_chip)
        self._finish([Stream(BufferRef(s.dtype, inner), s.shape[:-rank])])

    def off_chip_bytes(self):
        if not self.off_chip:
            return 0
        s = self.inputs[0].stream
        return normalize(s.total_elements() * s.dtype.size_in_bytes())

    def on_chip_bytes(self, convention=PUBLISHED):
        tile_bytes = self.inputs[0].stream.dtype.size_in_bytes()
        if self.off_chip:
            return tile_bytes
        return normalize(2 * self.stream.dtype.size_in_bytes() + tile_bytes)


def _buffer_input(op: Op, s: Stream) -> BufferRef:
    if not isinstance(s.dtype, BufferRef):
        raise op._error(DTypeError, f"input must be a stream of buffer references (from Bufferize), got {s}")
    return s.dtype


class Streamify(Op):
    """Read each buffer linearly ``prod(repeat_factor)`` times.

    Output ``in.shape + repeat_factor + buffer.shape`` of the buffer's tile. ``rank`` must equal the
    buffer's rank. On-chip ``|buffer| + |tile|`` (published; 0 in mode 2). With ``off_chip`` the artifact's
    quirk is kept: traffic ``N(in) * prod(repeat) * |tile|`` (the buffer's element count is left out).
    """

    kind = "Streamify"

    def __init__(self, graph, inp, repeat_factor, rank: int, *, off_chip: bool = False, name: str | None = None):
        (s,) = self._begin(graph, [inp], name)
        buf = _buffer_input(self, s)
        repeat = tuple(repeat_factor)
        if not all(isinstance(r, int) and r >= 1 for r in repeat):
            raise self._error(ArgumentError, f"repeat_factor must be positive ints, got {list(repeat)}")
        if rank != len(buf.shape):
            raise self._error(ArgumentError, f"rank {rank} must equal the buffer rank {len(buf.shape)}")
        self.repeat_factor = repeat
        self.rank = rank
        self.off_chip = bool(off_chip)
        self._finish([Stream(buf.tile, s.shape + repeat + buf.shape)])

    def off_chip_bytes(self):
        if not self.off_chip:
            return 0
        s = self.inputs[0].stream
        return normalize(s.total_elements() * product(self.repeat_factor) * s.dtype.tile.size_in_bytes())

    def on_chip_bytes(self, convention=PUBLISHED):
        if convention.mode == 2:
            return 0
        buf = self.inputs[0].stream.dtype
        if self.off_chip:
            return buf.tile.size_in_bytes()
        return normalize(buf.size_in_bytes() + buf.tile.size_in_bytes())


class DynStreamify(Op):
    """Re-read each buffer once per element of a reference stream (Streamify with a reference).

    The input's innermost ``repeat_rank + 1`` dims must be 1 and agree with ``ref`` above them. Output
    ``ref.shape + buffer.shape``. Off-chip (with ``off_chip``) ``N(ref) * |tile|`` (artifact quirk).
    """

    kind = "DynStreamify"

    def __init__(self, graph, inp, ref, repeat_rank: int, bufferized_rank: int, *, off_chip: bool = False,
                 name: str | None = None):
        s, r = self._begin(graph, [inp, ref], name)
        buf = _buffer_input(self, s)
        k = repeat_rank + 1
        if not isinstance(repeat_rank, int) or repeat_rank < 0 or k > len(s.shape):
            raise self._error(ArgumentError, f"repeat_rank must be between 0 and {len(s.shape) - 1}, got {repeat_rank!r}")
        if bufferized_rank != len(buf.shape):
            raise self._error(ArgumentError, f"bufferized_rank {bufferized_rank} must equal the buffer rank {len(buf.shape)}")
        if len(s.shape) != len(r.shape) or any(normalize(d) != 1 for d in s.shape[-k:]) or not shapes_equal(
                s.shape[:-k], r.shape[:-k]):
            raise self._error(
                ShapeError,
                f"input {fmt_shape(s.shape)} must equal the reference {fmt_shape(r.shape)} except for its innermost "
                f"{k} dims, which must be 1",
            )
        self.repeat_rank = repeat_rank
        self.bufferized_rank = bufferized_rank
        self.off_chip = bool(off_chip)
        self._finish([Stream(buf.tile, r.shape + buf.shape)])

    def off_chip_bytes(self):
        if not self.off_chip:
            return 0
        return normalize(self.inputs[1].stream.total_elements() * self.inputs[0].stream.dtype.tile.size_in_bytes())

    def on_chip_bytes(self, convention=PUBLISHED):
        if convention.mode == 2:
            return 0
        buf = self.inputs[0].stream.dtype
        if self.off_chip:
            return buf.tile.size_in_bytes()
        return normalize(buf.size_in_bytes() + buf.tile.size_in_bytes())
