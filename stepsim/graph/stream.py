"""Streams: an element type plus a shape ``[D_N, ..., D_0]`` (outermost first); rank = len(shape) - 1; and, where
the operators' shape rules know it, the layout of the tensor tiles it carries (:mod:`stepsim.graph.layout`)."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from stepsim.base.errors import ArgumentError
from stepsim.graph.dims import Dim, fmt_shape, normalize, product, shapes_equal, sp
from stepsim.graph.dtypes import ElementType

if TYPE_CHECKING:
    from stepsim.graph.layout import Layout


@dataclass(frozen=True)
class Stream:
    """A stream type: ``dtype`` elements arranged as ``shape`` (outermost first).

    ``rank`` is ``len(shape) - 1``; rank 0 is the innermost dimension. ``total_elements()`` is the product of
    every entry including the outermost one (the cardinality used in traffic formulas).

    ``layout`` (StreamTensor's iterative tensor type) says which tile of which tensor each element is: set by
    the operators whose shape rules know it (a tiled load's view, the shape operators that keep the tile order,
    a layout converter's output, the ONNX front end's activations), None elsewhere. It is a type annotation:
    two streams that differ only in it are the same type (equality, :meth:`same_type`), and the engine never
    reads it.
    """

    dtype: ElementType
    shape: tuple
    layout: Layout | None = field(default=None, compare=False, repr=False)

    def __post_init__(self):
        try:
            raw = tuple(self.shape)
        except TypeError:
            raise ArgumentError(
                f"Stream<{self.dtype}>: shape must be a sequence of dimensions, got {self.shape!r}") from None
        if not raw:
            raise ArgumentError(f"Stream<{self.dtype}>: a stream shape needs at least one dimension, got {raw!r}")
        shape = []
        for i, d in enumerate(raw):
            problem = _dim_problem(d) if not (type(d) is int and d >= 0) else None
            if problem is not None:
                # the message is built only here: formatting every dim of every stream cost more than the
                # rest of building a graph
                text = "[" + ", ".join(str(x) for x in raw) + "]"
                raise ArgumentError(f"Stream<{self.dtype}>{text}: entry {i} (rank {len(raw) - 1 - i}) {problem}")
            shape.append(normalize(d))
        object.__setattr__(self, "shape", tuple(shape))

    @property
    def rank(self) -> int:
        return len(self.shape) - 1

    def dim(self, rank: int) -> Dim:
        """The dimension at ``rank`` (rank 0 is innermost); ArgumentError outside ``0..self.rank``."""
        if not isinstance(rank, int) or isinstance(rank, bool) or not 0 <= rank <= self.rank:
            raise ArgumentError(f"{self}: rank {rank!r} is out of range; this stream has ranks 0..{self.rank}")
        return self.shape[len(self.shape) - 1 - rank]

    def total_elements(self) -> Dim:
        return product(self.shape)

    def same_type(self, other: "Stream") -> bool:
        return self.dtype == other.dtype and shapes_equal(self.shape, other.shape)

    def __str__(self) -> str:
        return f"Stream<{self.dtype}>{fmt_shape(self.shape)}"


def _dim_problem(d) -> str | None:
    """What is wrong with ``d`` as a dimension (the end of an error sentence), or None if it is valid.

    Symbolic dims are rejected only when sympy can decide: ``X / 4`` (an integer for the right ``X``) is kept,
    ``5/2``, ``2.5`` or ``-X - 1`` (negative for every non-negative ``X``) are not.
    """
    try:
        d = normalize(d)
    except ArgumentError as exc:
        return f"is invalid: {exc}"
    if isinstance(d, int):
        return f"is {d}; a dimension must be >= 0" if d < 0 else None
    return _symbolic_dim_problem(d)


@functools.lru_cache(maxsize=1 << 16)
def _symbolic_dim_problem(d) -> str | None:
    """:func:`_dim_problem` for a sympy expression, remembered: graphs reuse the same dimension objects in
    many streams, and each assumption query on a new expression costs about a millisecond."""
    if _surely_count(d):
        return None
    if d.is_Number or d.is_integer is False:
        return (f"is {d} ({type(d).__name__}); a dimension must be an int or an integer-valued sympy "
                "expression")
    if d.is_negative:
        return f"is {d}, negative for every value of its symbols; a dimension must be >= 0"
    return None


def _surely_count(e) -> bool:
    """True if ``e`` is built so that it is a non-negative integer for every value of its symbols: counts
    (integer, non-negative symbols), non-negative integers, and sums, products, Max / Min, Piecewise values
    and floor / ceiling (of non-negative arguments) of such. A cheap structural proof that spares sympy's
    assumption queries for the dimensions graphs build; False only means "not proven here"."""
    if e.is_Symbol:
        return e.is_integer is True and e.is_nonnegative is True
    if e.is_Integer:
        return e >= 0
    if isinstance(e, (sp.floor, sp.ceiling)):
        return _surely_nonnegative(e.args[0])
    if isinstance(e, sp.Piecewise):
        return all(_surely_count(expr) for expr, _ in e.args)
    if e.is_Add or e.is_Mul or isinstance(e, (sp.Max, sp.Min)):
        return all(_surely_count(a) for a in e.args)
    return False


def _surely_nonnegative(e) -> bool:
    """True if ``e`` is built from non-negative symbols and non-negative rationals by sums, products, Max / Min,
    Piecewise values, floor and ceiling (so it is >= 0 for every value of its symbols)."""
    if e.is_Symbol:
        return e.is_nonnegative is True
    if e.is_Rational:
        return e >= 0
    if isinstance(e, sp.Piecewise):
        return all(_surely_nonnegative(expr) for expr, _ in e.args)
    if e.is_Add or e.is_Mul or isinstance(e, (sp.Max, sp.Min, sp.floor, sp.ceiling)):
        return all(_surely_nonnegative(a) for a in e.args)
    return False


def stop_level(index: tuple, shape: tuple) -> int:
    """Stop level attached to the element at ``index`` (outermost first) of a static ``shape``.

    ``level = max k such that i_j == D_j - 1 for all j < k`` (rank-j indices), capped at the stream rank;
    0 means a plain value without stop token (docs/semantics.md §1.2).
    """
    rank = len(shape) - 1
    level = 0
    for r in range(rank):
        pos = len(shape) - 1 - r
        if index[pos] == shape[pos] - 1:
            level = r + 1
        else:
            break
    return level
