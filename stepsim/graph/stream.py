"""Streams: an element type plus a shape ``[D_N, ..., D_0]`` (outermost first); rank = len(shape) - 1."""

from __future__ import annotations

from dataclasses import dataclass

from stepsim.errors import ArgumentError, ShapeError
from stepsim.graph.dims import Dim, fmt_shape, is_static, normalize, product, shapes_equal
from stepsim.graph.dtypes import ElementType


@dataclass(frozen=True)
class Stream:
    """A stream type: ``dtype`` elements arranged as ``shape`` (outermost first).

    ``rank`` is ``len(shape) - 1``; rank 0 is the innermost dimension. ``total_elements()`` is the product of
    every entry including the outermost one (the cardinality used in traffic formulas).
    """

    dtype: ElementType
    shape: tuple

    def __post_init__(self):
        if not isinstance(self.shape, tuple) or not self.shape:
            raise ShapeError(f"a stream shape needs at least one dimension, got {self.shape!r}")
        shape = []
        for i, d in enumerate(self.shape):
            try:
                d = normalize(d)
            except TypeError as exc:
                raise ShapeError(f"stream shape {self.shape!r}: dim {i} is invalid: {exc}") from None
            if is_static(d) and d < 0:
                raise ShapeError(f"stream shape {self.shape!r}: dim {i} is {d}, dims must be >= 0")
            shape.append(d)
        object.__setattr__(self, "shape", tuple(shape))

    @property
    def rank(self) -> int:
        return len(self.shape) - 1

    def dim(self, rank: int) -> Dim:
        """The dimension at ``rank`` (rank 0 is innermost); ArgumentError outside ``0..self.rank``."""
        if not isinstance(rank, int) or isinstance(rank, bool) or not 0 <= rank <= self.rank:
            raise ArgumentError(f"rank {rank!r} is outside 0..{self.rank} of {self}")
        return self.shape[len(self.shape) - 1 - rank]

    def total_elements(self) -> Dim:
        return product(self.shape)

    def same_type(self, other: "Stream") -> bool:
        return self.dtype == other.dtype and shapes_equal(self.shape, other.shape)

    def __str__(self) -> str:
        return f"Stream<{self.dtype}>{fmt_shape(self.shape)}"


def stop_level(index: tuple, shape: tuple) -> int:
    """Stop level attached to the element at ``index`` (outermost first) of a static ``shape``.

    ``level = max k such that i_j == D_j - 1 for all j < k`` (rank-j indices), capped at the stream rank;
    0 means a plain value without stop token (STEP_SEMANTICS §1.2).
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
