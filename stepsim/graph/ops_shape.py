"""Shape operators: Flatten, Reshape, Promote, Expand, RepeatStatic, Zip (§2.5).

Each shape operator also documents how it rewrites stop levels (``stop_level_out``), which the engines
implement; tests check both against each other.
"""

from __future__ import annotations

from stepsim.base.errors import ArgumentError, DTypeError, ShapeError
from stepsim.graph.dims import (
    ceil_div,
    fmt_shape,
    is_static,
    nonzero_indicator,
    normalize,
    shapes_equal,
)
from stepsim.graph.dtypes import BOOL, TupleType, is_tile, size_factors
from stepsim.graph.functions import Empty, Zero
from stepsim.graph.graph import PUBLISHED, OnChipFromTerms, Op
from stepsim.graph.stream import Stream


class _FifoOnChip(OnChipFromTerms, Op):
    """A shape operator that holds nothing itself: on-chip its input FIFO's two elements when FIFOs count, else 0.

    Given as size factors (:func:`stepsim.graph.dtypes.size_factors`) so that a dynamic tile's size is
    evaluated without a sympy product per operator."""

    def on_chip_bytes_terms(self, convention=PUBLISHED):
        if convention.count_fifos:
            return ((*size_factors(self.inputs[0].stream.dtype), 2),)
        return ((0,),)


class _ElementOnChip(OnChipFromTerms, Op):
    """A shape operator that holds one output element (two when FIFOs count), in size factors (see
    :class:`_FifoOnChip`)."""

    def on_chip_bytes_terms(self, convention=PUBLISHED):
        element = size_factors(self.stream.dtype)
        return ((*element, 2),) if convention.count_fifos else (element,)


class Flatten(_FifoOnChip):
    """Merge the dims of ranks ``min_rank..max_rank`` (inclusive) into one (their product)."""

    kind = "Flatten"

    def __init__(self, graph, inp, min_rank: int, max_rank: int, *, name: str | None = None):
        (s,) = self._begin(graph, [inp], name)
        if not (isinstance(min_rank, int) and isinstance(max_rank, int) and 0 <= min_rank < max_rank <= s.rank):
            raise self._error(
                ArgumentError, f"need 0 <= min_rank < max_rank <= {s.rank} (input rank), got {min_rank}, {max_rank}")
        n = len(s.shape)
        lo, hi = n - 1 - max_rank, n - 1 - min_rank
        merged = normalize(1)
        for d in s.shape[lo:hi + 1]:
            merged = normalize(merged * d)
        self.min_rank, self.max_rank = min_rank, max_rank
        self._finish([Stream(s.dtype, s.shape[:lo] + (merged,) + s.shape[hi + 1:], s.layout)])  # same tile order

    def stop_level_out(self, level: int) -> int:
        """L <= min unchanged; min < L <= max becomes min; L > max drops by ``max - min``."""
        if level <= self.min_rank:
            return level
        if level <= self.max_rank:
            return self.min_rank
        return level - (self.max_rank - self.min_rank)


class Reshape(_FifoOnChip):
    """Split the dim at ``rank`` into ``(ceil(D/chunk), chunk)``.

    A static dim must be divisible by ``chunk_size`` unless ``rank == 0`` and a ``pad`` initialiser is given
    (the tail is padded with ``pad`` tiles) or ``chunk_size == 1``. ``add_outer_dim`` (rank-0 inputs only)
    prepends ``1`` or, for a symbolic dim ``X``, ``Piecewise((1, X >= 1), (0, True))`` (the paper's Promote).

    Outputs: 0 = data (the primary output), 1 = padding flags (Bool, same shape; True on the pad tiles this
    Reshape inserted). The flag stream is a stepsim extension (step-perf does not expose it): it is only
    materialized when something reads it, and then each element and its flag leave together.
    """

    kind = "Reshape"
    primary_output = 0

    def __init__(self, graph, inp, chunk_size: int, rank: int, *, pad=None, add_outer_dim: bool = False,
                 write_back_mu: bool = False, name: str | None = None):
        (s,) = self._begin(graph, [inp], name)
        if not isinstance(chunk_size, int) or chunk_size < 1:
            raise self._error(ArgumentError, f"chunk_size must be a positive int, got {chunk_size!r}")
        if not isinstance(rank, int) or not 0 <= rank <= s.rank:
            raise self._error(ArgumentError, f"rank must be between 0 and the input rank {s.rank}, got {rank!r}")
        if pad is not None:
            if not isinstance(pad, (Zero, Empty)):
                raise self._error(ArgumentError, f"pad must be Zero(...) or Empty(...), got {pad!r}")
            if not is_tile(s.dtype) or pad.tile() != s.dtype:
                raise self._error(DTypeError, f"pad tile {pad.tile()} must equal the stream's element type {s.dtype}")
        d = s.dim(rank)
        padded_ok = rank == 0 and (pad is not None or chunk_size == 1)
        if not padded_ok:
            if not is_static(d):
                raise self._error(
                    ShapeError, f"dim {d} at rank {rank} is dynamic; only rank 0 can be split with padding")
            if d % chunk_size:
                raise self._error(
                    ShapeError,
                    f"dim {d} at rank {rank} is not divisible by chunk_size {chunk_size}; give pad= (rank 0 only)")
        if add_outer_dim and s.rank != 0:
            raise self._error(ArgumentError, f"add_outer_dim is only allowed for rank-0 inputs (this one has rank {s.rank})")
        pos = len(s.shape) - 1 - rank
        shape = s.shape[:pos] + (ceil_div(d, chunk_size), chunk_size) + s.shape[pos + 1:]
        if add_outer_dim:
            shape = (nonzero_indicator(d),) + shape
        self.chunk_size = chunk_size
        self.rank = rank
        self.pad = pad
        self.add_outer_dim = bool(add_outer_dim)
        self.write_back_mu = bool(write_back_mu)
        self._finish([Stream(s.dtype, shape), Stream(BOOL, shape)])


class Promote(_FifoOnChip):
    """Insert a new dim of size 1 so that it has rank ``rank`` in the output (artifact semantics).

    Stop levels ``L >= rank`` become ``L + 1``.
    """

    kind = "Promote"

    def __init__(self, graph, inp, rank: int, *, name: str | None = None):
        (s,) = self._begin(graph, [inp], name)
        if not isinstance(rank, int) or not 0 <= rank <= len(s.shape):
            raise self._error(ArgumentError, f"rank must be between 0 and {len(s.shape)}, got {rank!r}")
        pos = len(s.shape) - rank
        self.rank = rank
        self._finish([Stream(s.dtype, s.shape[:pos] + (1,) + s.shape[pos:], s.layout)])  # same tile order

    def stop_level_out(self, level: int) -> int:
        return level + 1 if level >= self.rank else level


class Expand(_ElementOnChip):
    """Repeat each input element over the reference stream's inner ``rank`` dims (the artifact's ExpandRef).

    The input's innermost ``rank`` dims must be 1 and its outer dims must equal the reference's. Output has
    the reference's shape and the input's element type. On-chip one element (x2 with FIFOs).
    """

    kind = "Expand"

    def __init__(self, graph, inp, ref, rank: int, *, name: str | None = None):
        s, r = self._begin(graph, [inp, ref], name)
        if not isinstance(rank, int) or not 1 <= rank <= s.rank:
            raise self._error(ArgumentError, f"rank must be between 1 and the input rank {s.rank}, got {rank!r}")
        if len(s.shape) != len(r.shape):
            raise self._error(ShapeError, f"input {fmt_shape(s.shape)} and reference {fmt_shape(r.shape)} differ in rank")
        if any(normalize(d) != 1 for d in s.shape[-rank:]):
            raise self._error(ShapeError, f"the input's innermost {rank} dims must be 1, got {fmt_shape(s.shape)}")
        if not shapes_equal(s.shape[:-rank], r.shape[:-rank]):
            raise self._error(
                ShapeError, f"outer dims differ: input {fmt_shape(s.shape)} vs reference {fmt_shape(r.shape)}")
        self.rank = rank
        self._finish([Stream(s.dtype, r.shape)])


ExpandRef = Expand


class RepeatStatic(_ElementOnChip):
    """Emit each element ``count`` times in a row: output ``in.shape + (count,)``; on-chip one element."""

    kind = "RepeatStatic"

    def __init__(self, graph, inp, count: int, *, name: str | None = None):
        (s,) = self._begin(graph, [inp], name)
        if not isinstance(count, int) or count < 1:
            raise self._error(ArgumentError, f"count must be a positive int, got {count!r}")
        self.count = count
        self._finish([Stream(s.dtype, s.shape + (count,))])


class Zip(Op):
    """Pair two lock-stepped streams of identical shape into a stream of tuples."""

    kind = "Zip"

    def __init__(self, graph, a, b, *, name: str | None = None):
        x, y = self._begin(graph, [a, b], name)
        if not shapes_equal(x.shape, y.shape):
            raise self._error(ShapeError, f"Zip needs identical shapes, got {fmt_shape(x.shape)} and {fmt_shape(y.shape)}")
        self._finish([Stream(TupleType((x.dtype, y.dtype)), x.shape)])
