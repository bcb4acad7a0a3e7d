"""Functions applied by Map, Accum, Scan, MapAccum and FlatMap: type rules and FLOP counts.

FLOP convention (the reference simulator's, docs/timing_model.md §3.3; one FLOP = one multiply or one add):

* Matmul ``[M,K] x [K,N]``: ``2*M*K*N`` (the accumulate-add of a MapAccum is not counted);
* elementwise Add / Sub / Mul / Div / Max and accumulating Add / Mul: ``R*C`` of the broadcast output;
* SiLU: ``8*R*C``; Exp: ``4*R*C``; row-wise Sum / Max: ``R*C`` of the input;
* fixed-cost helpers (SetOffset, RowAppend, CacheWriteAddr, SignalReqAllRead) take **1 cycle** regardless
  of compute bandwidth and count 0 FLOPs; concatenating accumulators (RetileRow / RetileCol) take 0 cycles.

Each function exposes ``out_type(in_types)`` (raises ``ValueError`` with a readable reason, which the operator
wraps into a typed error naming itself), ``flops(in_types)`` (per application, an int or sympy expression) with
``flops_factors(in_types)`` (factors whose product it is), and ``fixed_cycles`` (``None`` for FLOP-based
functions). ``code`` is the stable name the engine lowering maps to an integer function code.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from stepsim.base.errors import ArgumentError
from stepsim.graph.dims import Dim, dims_equal, fmt_dim, is_static, normalize, product
from stepsim.graph.dtypes import FP32, UINT64, DynTile, ScalarType, Tile, is_tile, tile


def _need_tile(t, what: str):
    if not is_tile(t):
        raise ValueError(f"{what} must be a tile, got {t}")


def _broadcast_dim(a: Dim, b: Dim) -> Dim:
    if dims_equal(a, b):
        return a
    if normalize(a) == 1:
        return b
    if normalize(b) == 1:
        return a
    raise ValueError(f"dimensions {fmt_dim(a)} and {fmt_dim(b)} do not broadcast (equal or one of them 1)")


class Function:
    """Base of all functions. Subclasses set ``code``, ``arity`` and implement ``out_type``."""

    code: str = ""
    arity: int = 1
    fixed_cycles: int | None = None

    def out_type(self, in_types: tuple):
        raise NotImplementedError

    def flops(self, in_types: tuple) -> Dim:
        """FLOPs of one application to operands of types ``in_types`` (0: a fixed-cost function)."""
        return 0

    def flops_factors(self, in_types: tuple) -> tuple:
        """Factors (ints or sympy dims) whose product is :meth:`flops` (FLOPs per application); here the one
        factor :meth:`flops` (see :class:`_FactoredFlops`)."""
        return (self.flops(in_types),)

    @property
    def param(self) -> int:
        """Integer parameter passed to the engine (function specific; 0 when unused)."""
        return 0

    def __repr__(self) -> str:
        return type(self).__name__ + "()"

    def __eq__(self, other) -> bool:
        return type(self) is type(other) and self.__dict__ == other.__dict__

    def __hash__(self) -> int:
        return hash((type(self).__name__, tuple(sorted(self.__dict__.items()))))


class _FactoredFlops(Function):
    """A function whose FLOPs per application are a product: subclasses give :meth:`flops_factors` and
    :meth:`flops` is their product.

    A dynamic tile's FLOPs are a product of its symbolic rows and static sizes; the factors let the metrics
    evaluate them one by one (:func:`stepsim.workloads.base.factors_value`) instead of building a new sympy
    product for each operator: each product holds another expert's token-count symbol, so sympy's expression
    cache cannot reuse it, and building them was most of ``Workload.metrics()`` of a dynamic-tiling MoE layer."""

    def flops(self, in_types: tuple) -> Dim:
        return product(self.flops_factors(in_types))

    def flops_factors(self, in_types: tuple) -> tuple:
        raise NotImplementedError


# --- map functions -------------------------------------------------------------------------------------
class Matmul(_FactoredFlops):
    """``A @ B`` (``A @ B.T`` when ``weight_transposed``); static or dynamic tiles; FLOPs ``2*M*K*N``."""

    code = "matmul"
    arity = 2

    def __init__(self, weight_transposed: bool = False):
        self.weight_transposed = bool(weight_transposed)

    @property
    def param(self) -> int:
        return int(self.weight_transposed)

    def _mkn(self, in_types):
        a, b = in_types
        _need_tile(a, "Matmul left operand")
        _need_tile(b, "Matmul right operand")
        m, k = a.rows, a.cols
        kb, n = (b.cols, b.rows) if self.weight_transposed else (b.rows, b.cols)
        if not dims_equal(k, kb):
            lhs = f"[{fmt_dim(m)}, {fmt_dim(k)}]"
            rhs = f"[{fmt_dim(b.rows)}, {fmt_dim(b.cols)}]"
            raise ValueError(
                f"Matmul inner dimensions differ: {lhs} x {rhs}"
                + (" (weight transposed)" if self.weight_transposed else "")
            )
        return m, k, n

    def out_type(self, in_types):
        m, _, n = self._mkn(in_types)
        return tile(in_types[0].dtype, m, n)

    def flops_factors(self, in_types):
        m, k, n = self._mkn(in_types)
        return (2, m, k, n)

    def __repr__(self):
        return f"Matmul(weight_transposed={self.weight_transposed})"


def _declare(base: type, name: str, code: str, doc: str, **attrs) -> type:
    """The public function class ``name``: a subclass of ``base`` that only sets ``code`` (and ``attrs``).

    The elementwise, unary, row-reduce, accumulate and retile functions differ from their base only in these
    values, so each is declared as one row instead of a class statement; the result is an ordinary class of
    this module (same name, docstring, pickling and ``==`` as a class statement would give).
    """
    return type(base)(name, (base,), {"__module__": __name__, "__qualname__": name, "__doc__": doc,
                                      "code": code, **attrs})


class _Elementwise(_FactoredFlops):
    """Two tiles in, broadcasting 1-sized dims; ``R*C`` FLOPs of the broadcast output."""

    arity = 2

    def out_type(self, in_types):
        a, b = in_types
        _need_tile(a, f"{type(self).__name__} left operand")
        _need_tile(b, f"{type(self).__name__} right operand")
        return tile(a.dtype, _broadcast_dim(a.rows, b.rows), _broadcast_dim(a.cols, b.cols))

    def flops_factors(self, in_types):
        out = self.out_type(in_types)
        return (out.rows, out.cols)


class _Unary(_FactoredFlops):
    """One tile in, ``_out(tile)`` out (the same tile by default); ``flops_per_element`` FLOPs per input element."""

    arity = 1
    flops_per_element = 1

    def _out(self, a):
        return a

    def out_type(self, in_types):
        (a,) = in_types
        _need_tile(a, f"{type(self).__name__} operand")
        return self._out(a)

    def flops_factors(self, in_types):
        (a,) = in_types
        return (self.flops_per_element, a.rows, a.cols)


class _RowReduce(_Unary):
    """A unary function reducing each row: ``[R,C] -> [R,1]``; ``R*C`` FLOPs (of the input)."""

    def _out(self, a):
        return tile(a.dtype, a.rows, 1)


Add = _declare(_Elementwise, "Add", "add", "Elementwise sum with broadcasting of 1-sized dims; ``R*C`` FLOPs.")
Sub = _declare(_Elementwise, "Sub", "sub", "Elementwise difference with broadcasting; ``R*C`` FLOPs.")
Mul = _declare(_Elementwise, "Mul", "mul", "Elementwise product with broadcasting; ``R*C`` FLOPs.")
Div = _declare(_Elementwise, "Div", "div", "Elementwise quotient with broadcasting; ``R*C`` FLOPs.")
Max = _declare(_Elementwise, "Max", "max", "Elementwise maximum with broadcasting; ``R*C`` FLOPs.")
Silu = _declare(_Unary, "Silu", "silu", "``x * sigmoid(x)``; 8 FLOPs per element (neg, exp as 4, add, div, mul).",
                flops_per_element=8)
Exp = _declare(_Unary, "Exp", "exp", "``exp(x)``; 4 FLOPs per element.", flops_per_element=4)
RowSum = _declare(_RowReduce, "RowSum", "rowsum", "Row sums ``[R,C] -> [R,1]``; ``R*C`` FLOPs.")
RowMax = _declare(_RowReduce, "RowMax", "rowmax", "Row maxima ``[R,C] -> [R,1]``; ``R*C`` FLOPs.")


#: the kinds of :class:`Pointwise`: name -> (engine kind code, FLOPs per element, takes a constant)
#: (codes and FLOPs as stepsim.kernels.abi.PW_* / POINTWISE_FLOPS, which the engine uses; a test checks they agree)
POINTWISE_KINDS = {
    "neg": (0, 1, False), "sqrt": (1, 4, False), "relu": (2, 1, False), "sigmoid": (3, 7, False),
    "tanh": (4, 7, False), "erf": (5, 4, False), "gelu": (6, 8, False), "add_c": (7, 1, True), "mul_c": (8, 1, True),
    "rsub_c": (9, 1, True), "rdiv_c": (10, 1, True), "pow_c": (11, 4, True), "max_c": (12, 1, True),
    "min_c": (13, 1, True), "sub_c": (14, 1, True), "div_c": (15, 1, True),
}


class Pointwise(_Unary):
    """One elementwise function of a tile, optionally with a float32 constant ``c``: ``neg``, ``sqrt``, ``relu``,
    ``sigmoid``, ``tanh``, ``erf``, ``gelu`` (erf form), ``add_c`` (x + c), ``sub_c``, ``rsub_c`` (c - x),
    ``mul_c``, ``div_c``, ``rdiv_c`` (c / x), ``pow_c`` (x ** c), ``max_c``, ``min_c``.

    FLOPs per element: a transcendental counts 4 as :class:`Exp` does (sqrt, erf, pow), sigmoid and tanh 7
    (SiLU's 8 less its multiply), gelu 8, the rest 1. The engine gets ``kind + 256 * bits(float32(c))``.
    """

    code = "pointwise"

    def __init__(self, kind: str, c: float = 0.0):
        if kind not in POINTWISE_KINDS:
            raise ArgumentError(f"Pointwise kind must be one of {', '.join(POINTWISE_KINDS)}, got {kind!r}")
        self.kind = kind
        self.c = float(np.float32(c))
        self.flops_per_element = POINTWISE_KINDS[kind][1]

    @property
    def param(self) -> int:
        bits = int(np.array([self.c], np.float32).view(np.uint32)[0])
        return POINTWISE_KINDS[self.kind][0] + 256 * bits

    def __repr__(self):
        return f"Pointwise({self.kind!r}" + (f", {self.c!r})" if POINTWISE_KINDS[self.kind][2] else ")")


class OnlineSoftmax(Function):
    """MapAccum function: FlashAttention's numerically stable softmax-weighted sum, one KV tile at a time.

    Operands: a score tile ``S = q K^T`` ``[q, n]`` and the matching value tile ``V`` ``[n, d]``. The
    accumulator (init ``Zero(q, d + 2)``) is the state ``[acc | l | m]``: per query row the running maximum
    ``m`` of the scaled scores ``x = S / sqrt(head_dim)``, the running sum ``l = sum exp(x - m)`` and the
    running ``acc = sum exp(x - m) v``; a new tile raises ``m`` to ``m'`` and rescales ``l`` and ``acc`` by
    ``exp(m - m')`` (``l == 0`` marks the empty state). :class:`SoftmaxNormalize` turns the final state into
    ``acc / l = softmax(x) V``. Every exponent is <= 0, so it never overflows, unlike the plain
    ``exp(S) V / rowsum(exp(S))`` form.

    FLOPs per tile ``2qnd + 8qn + 2qd + 6q``: ``P V``; row max, scale and subtract (2), exp (4) and row sum of
    the scores; rescale and add of ``acc``; the correction's exp (4) and rescale and add of ``l``.
    ``head_dim = 0`` leaves the scores unscaled.
    """

    code = "online_softmax"
    arity = 2
    map_accum_only = True

    def __init__(self, head_dim: int):
        if not isinstance(head_dim, int) or isinstance(head_dim, bool) or head_dim < 0:
            raise ArgumentError(f"OnlineSoftmax head_dim must be a non-negative int (0: no scale), got {head_dim!r}")
        self.head_dim = head_dim

    @property
    def param(self) -> int:
        return self.head_dim

    def _qnd(self, in_types):
        s, v = in_types
        _need_tile(s, "OnlineSoftmax score operand")
        _need_tile(v, "OnlineSoftmax value operand")
        if not dims_equal(s.cols, v.rows):
            raise ValueError(f"OnlineSoftmax needs score columns == value rows (one score per KV row), got scores "
                             f"{s} and values {v}")
        return s.rows, s.cols, v.cols

    def out_type(self, in_types):
        q, _, d = self._qnd(in_types)
        return tile(in_types[0].dtype, q, normalize(d + 2))

    def flops(self, in_types):
        q, n, d = self._qnd(in_types)
        return normalize(2 * q * n * d + 8 * q * n + 2 * q * d + 6 * q)

    def __repr__(self):
        return f"OnlineSoftmax(head_dim={self.head_dim})"


class SoftmaxNormalize(_Unary):
    """The final step of :class:`OnlineSoftmax`: state ``[q, d + 2]`` -> ``acc / l`` ``[q, d]``; ``q*d`` FLOPs."""

    code = "softmax_normalize"

    def _out(self, a):
        if not is_static(a.cols) or a.cols < 3:
            raise ValueError(f"SoftmaxNormalize needs an OnlineSoftmax state [q, d + 2], got {a}")
        return tile(a.dtype, a.rows, a.cols - 2)

    def flops_factors(self, in_types):
        out = self.out_type(in_types)
        return (out.rows, out.cols)


class SetOffset(Function):
    """(tile, [1,1] u64 offset) -> tile with the KV-append row offset recorded; fixed 1 cycle."""

    code = "set_offset"
    arity = 2
    fixed_cycles = 1

    def out_type(self, in_types):
        a, off = in_types
        _need_tile(a, "SetOffset tile")
        if not (is_tile(off) and off.dtype == UINT64 and off.shape == (1, 1)):
            raise ValueError(f"SetOffset offset must be a Tile[uint64](1, 1), got {off}")
        return a


class RowAppend(Function):
    """(tile [N,D], row [1,D]) -> tile [N,D] with the row written at the recorded offset; fixed 1 cycle."""

    code = "row_append"
    arity = 2
    fixed_cycles = 1

    def out_type(self, in_types):
        a, row = in_types
        _need_tile(a, "RowAppend tile")
        _need_tile(row, "RowAppend row")
        if normalize(row.rows) != 1 or not dims_equal(row.cols, a.cols):
            raise ValueError(f"RowAppend row must be [1, {fmt_dim(a.cols)}], got {row}")
        return a


class CacheWriteAddr(Function):
    """([1,1] u64 request index, [1,1] u64 tiles) -> [1,1] u64 ``idx*row_offset + tiles - 1``; 1 cycle."""

    code = "cache_write_addr"
    arity = 2
    fixed_cycles = 1

    def __init__(self, row_offset: int):
        if not isinstance(row_offset, int) or row_offset < 1:
            raise ArgumentError(f"CacheWriteAddr row_offset must be a positive int, got {row_offset!r}")
        self.row_offset = row_offset

    @property
    def param(self) -> int:
        return self.row_offset

    def out_type(self, in_types):
        for t in in_types:
            if not (is_tile(t) and t.dtype == UINT64 and t.shape == (1, 1)):
                raise ValueError(f"CacheWriteAddr operands must be Tile[uint64](1, 1), got {t}")
        return Tile(UINT64, 1, 1)


# --- accumulate functions (acc, x) -> acc ----------------------------------------------------------------
AccumAdd = _declare(_Elementwise, "AccumAdd", "add", "``acc + x`` with broadcasting; ``R*C`` FLOPs per element.")
AccumMul = _declare(_Elementwise, "AccumMul", "mul", "``acc * x`` with broadcasting; ``R*C`` FLOPs per element.")


class _Retile(Function):
    """Concatenate ``x`` to the accumulator along one axis; the other axis (``matched``) must agree; 0 cycles."""

    arity = 2
    fixed_cycles = 0
    matched: tuple[str, str]  # (the Tile attribute that must agree, its word in messages), set per subclass

    def out_type(self, in_types):
        acc, x = in_types
        _need_tile(x, f"{type(self).__name__} element")
        attr, word = self.matched
        if not dims_equal(getattr(acc, attr), getattr(x, attr)):
            raise ValueError(f"{type(self).__name__} needs equal {word} counts: accumulator {acc}, element {x}")
        return acc


RetileRow = _declare(_Retile, "RetileRow", "retile_row", "Append the rows of ``x`` to the accumulator (packs token "
                     "rows into a tall tile); 0 cycles.", matched=("cols", "column"))
RetileCol = _declare(_Retile, "RetileCol", "retile_col", "Append the columns of ``x`` to the accumulator; 0 cycles.",
                     matched=("rows", "row"))


class SignalReqAllRead(Function):
    """Emit one u64 "group done" token per reduction (dynamic dispatch feedback); 1 cycle."""

    code = "signal_req_all_read"
    arity = 2
    fixed_cycles = 1

    def out_type(self, in_types):
        return Tile(UINT64, 1, 1)


# --- initialisers --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Zero:
    """Accumulator initialised to zeros of ``rows x cols`` ``dtype``."""

    rows: int
    cols: int
    dtype: ScalarType = FP32

    def tile(self) -> Tile:
        return Tile(self.dtype, self.rows, self.cols)


@dataclass(frozen=True)
class Empty:
    """Empty accumulator (``rows`` usually 0) for concatenating functions such as RetileRow."""

    rows: int
    cols: int
    dtype: ScalarType = FP32

    def tile(self) -> Tile:
        return Tile(self.dtype, self.rows, self.cols)


# --- FlatMap functions ---------------------------------------------------------------------------------
class RowStreamify(Function):
    """FlatMap function: a ``[R,C]`` tile becomes a stream of ``R`` row tiles ``[1,C]`` (a new rank-1 dim).

    With ``filter_padding`` the padded rows added by a padding Reshape are dropped, so the new dimension is
    ragged.
    """

    code = "row_streamify"
    arity = 1

    def __init__(self, filter_padding: bool = False):
        self.filter_padding = bool(filter_padding)

    def out_type(self, in_types):
        (a,) = in_types
        _need_tile(a, "RowStreamify operand")
        return tile(a.dtype, 1, a.cols)

    def out_count(self, in_type) -> Dim:
        return in_type.rows


def is_static_tile(t) -> bool:
    return isinstance(t, Tile) or (isinstance(t, DynTile) and is_static(t.rows) and is_static(t.cols))
