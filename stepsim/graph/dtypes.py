"""Element types of streams: scalars, static and dynamic tiles, selectors, buffer references, tuples.

Byte sizes follow the STeP artifact (docs/semantics.md §1.3): a tile is ``rows * cols * element bytes``; a
multi-hot selector over ``n`` targets is ``n`` bytes; an index selector holding ``k`` indices is ``2k`` bytes;
a buffer reference is the size of the buffer it names. Every type is an immutable, hashable value.
"""

from __future__ import annotations

from dataclasses import dataclass

from stepsim.base.errors import ArgumentError
from stepsim.graph.dims import Dim, fmt_dim, fmt_shape, is_static, normalize, product, sp


@dataclass(frozen=True)
class ScalarType:
    """A scalar element type; ``bytes`` is its storage size in bytes."""

    name: str
    bytes: int

    def size_in_bytes(self) -> int:
        return self.bytes

    def __str__(self) -> str:
        return self.name


BF16 = ScalarType("bf16", 2)
FP16 = ScalarType("fp16", 2)
FP32 = ScalarType("fp32", 4)
INT32 = ScalarType("int32", 4)
UINT32 = ScalarType("uint32", 4)
UINT64 = ScalarType("uint64", 8)
BOOL = ScalarType("bool", 1)
SCALARS = {t.name: t for t in (BF16, FP16, FP32, INT32, UINT32, UINT64, BOOL)}


@dataclass(frozen=True)
class Tile:
    """A static 2-D tile of ``rows x cols`` elements of ``dtype``."""

    dtype: ScalarType
    rows: int
    cols: int

    def __post_init__(self):
        for field in ("rows", "cols"):
            v = getattr(self, field)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ArgumentError(f"Tile {field} must be a non-negative int, got {v!r}")

    @property
    def shape(self) -> tuple[Dim, Dim]:
        return (self.rows, self.cols)

    def size_in_bytes(self) -> int:
        return self.rows * self.cols * self.dtype.bytes

    def with_dtype(self, dtype: ScalarType) -> "Tile":
        return Tile(dtype, self.rows, self.cols)

    def __str__(self) -> str:
        return f"Tile[{self.dtype}]({self.rows}, {self.cols})"


@dataclass(frozen=True)
class DynTile:
    """A dynamically shaped tile (dynamic tiling): rows and/or cols are symbolic dimensions."""

    dtype: ScalarType
    rows: Dim
    cols: Dim

    def __post_init__(self):
        object.__setattr__(self, "rows", normalize(self.rows))
        object.__setattr__(self, "cols", normalize(self.cols))

    @property
    def shape(self) -> tuple[Dim, Dim]:
        return (self.rows, self.cols)

    def size_factors(self) -> tuple[Dim, Dim, int]:
        """Rows, cols and bytes per scalar: the factors of :meth:`size_in_bytes`."""
        return (self.rows, self.cols, self.dtype.bytes)

    def size_in_bytes(self) -> Dim:
        return product(self.size_factors())

    def with_dtype(self, dtype: ScalarType) -> "DynTile":
        return DynTile(dtype, self.rows, self.cols)

    def __str__(self) -> str:
        return f"DynTile[{self.dtype}]({fmt_dim(self.rows)}, {fmt_dim(self.cols)})"


def tile(dtype: ScalarType, rows: Dim, cols: Dim) -> "Tile | DynTile":
    """A :class:`Tile` when both dims are static, else a :class:`DynTile`."""
    rows, cols = normalize(rows), normalize(cols)
    if is_static(rows) and is_static(cols):
        return Tile(dtype, rows, cols)
    return DynTile(dtype, rows, cols)


def is_tile(t) -> bool:
    return isinstance(t, (Tile, DynTile))


@dataclass(frozen=True)
class Selector:
    """A selector over ``num_targets`` targets.

    ``multihot=True``: a multi-hot vector, ``num_targets`` bytes. ``multihot=False``: a list of indices
    (``Index`` in the artifact), 2 bytes per index over ``active`` selected indices.
    """

    num_targets: int
    multihot: bool = True
    active: int | None = None

    def __post_init__(self):
        if not isinstance(self.num_targets, int) or self.num_targets < 1:
            raise ArgumentError(f"Selector num_targets must be a positive int, got {self.num_targets!r}")

    def size_in_bytes(self) -> int:
        if self.multihot:
            return self.num_targets
        return 2 * (self.active if self.active is not None else self.num_targets)

    def __str__(self) -> str:
        kind = "MultiHot" if self.multihot else "Index"
        return f"{kind}({self.num_targets})"


@dataclass(frozen=True)
class BufferRef:
    """A reference to an on-chip buffer made by Bufferize: ``shape`` elements of ``tile`` each.

    Only ``shape[0]`` may be symbolic (as in the artifact).
    """

    tile: Tile
    shape: tuple

    def __post_init__(self):
        object.__setattr__(self, "shape", tuple(normalize(d) for d in self.shape))

    def size_in_bytes(self) -> Dim:
        return normalize(product(self.shape) * self.tile.size_in_bytes())

    def __str__(self) -> str:
        return f"Buffer[{self.tile}]{fmt_shape(self.shape)}"


@dataclass(frozen=True)
class TupleType:
    """A tuple of element types (made by Zip)."""

    elements: tuple

    def size_in_bytes(self) -> Dim:
        total = 0
        for e in self.elements:
            total = normalize(total + e.size_in_bytes())
        return total

    def __str__(self) -> str:
        return "Tuple(" + ", ".join(str(e) for e in self.elements) + ")"


ElementType = ScalarType | Tile | DynTile | Selector | BufferRef | TupleType


def size_in_bytes(t: ElementType) -> Dim:
    """Bytes of one element of type ``t`` (a sympy expression for dynamic tiles)."""
    return normalize(t.size_in_bytes())


def size_factors(t: ElementType) -> tuple:
    """Factors whose product is :func:`size_in_bytes` of ``t`` (bytes of one element): a dynamic tile's rows, cols
    and bytes per scalar, one factor for any other type.

    Operators give their on-chip bytes as terms of these factors (``Op.on_chip_bytes_terms``) so that a dynamic
    tile's size is evaluated from its symbolic rows without building a sympy product per operator."""
    if isinstance(t, DynTile):
        return t.size_factors()
    return (size_in_bytes(t),)


def as_expr_bytes(t: ElementType) -> sp.Expr:
    b = size_in_bytes(t)
    return sp.Integer(b) if isinstance(b, int) else b
