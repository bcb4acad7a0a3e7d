"""Streams: an element type plus a shape ``[D_N, ..., D_0]`` (outermost first); rank = len(shape) - 1."""

from __future__ import annotations

from dataclasses import dataclass

from stepsim.graph.dims import Dim, fmt_shape, normalize, product, shapes_equal
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
        shape = tuple(normalize(d) for d in self.shape)
        if not shape:
            raise ValueError("a stream shape needs at least one dimension")
        object.__setattr__(self, "shape", shape)

    @property
    def rank(self) -> int:
        return len(self.shape) - 1

    def dim(self, rank: int) -> Dim:
        """The dimension at ``rank`` (rank 0 is innermost)."""
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
