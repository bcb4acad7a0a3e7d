"""Higher-order compute operators: Map, Accum, MapAccum, Scan, FlatMap (docs/semantics.md §2.3).

Each takes ``compute_bw`` (FLOPs/cycle for this node) and ``write_back_mu`` (results go to an on-chip memory
unit, which costs store cycles in the timing model). FLOP-based functions need ``compute_bw > 0``; the
fixed-cost helpers (SetOffset, RowAppend, CacheWriteAddr, SignalReqAllRead, RetileRow) accept 0, as the
artifact's attention graphs use them (the reference simulator would panic dividing by zero otherwise).
"""

from __future__ import annotations

from stepsim.base.errors import ArgumentError, DTypeError, ShapeError
from stepsim.graph.dims import fmt_shape, is_static, make_symbol, normalize, product, shapes_equal
from stepsim.graph.dtypes import TupleType, is_tile, size_factors, tile
from stepsim.graph.functions import Empty, Function, Matmul, RowStreamify, Zero
from stepsim.graph.graph import PUBLISHED, OnChipFromTerms, Op
from stepsim.graph.stream import Stream


def _check_fn(op: Op, fn, arity: int | None = None) -> Function:
    if not isinstance(fn, Function):
        raise op._error(ArgumentError, f"fn must be a stepsim function (e.g. Matmul()), got {fn!r}")
    if arity is not None and fn.arity != arity:
        raise op._error(ArgumentError, f"{fn!r} takes {fn.arity} operand(s), but {arity} were given")
    if getattr(fn, "map_accum_only", False) and op.kind != "MapAccum":
        raise op._error(ArgumentError, f"{fn!r} folds its operands into an accumulator state; use it in a MapAccum")
    return fn


def _check_bw(op: Op, fn: Function, compute_bw) -> int:
    if not isinstance(compute_bw, int) or isinstance(compute_bw, bool) or compute_bw < 0:
        raise op._error(ArgumentError, f"compute_bw must be a non-negative int (FLOPs/cycle), got {compute_bw!r}")
    if compute_bw == 0 and fn.fixed_cycles is None:
        raise op._error(
            ArgumentError,
            f"compute_bw is 0 but {fn!r} is FLOP-based (cycles = FLOPs / compute_bw); give a positive bandwidth",
        )
    return compute_bw


def _apply(op: Op, fn: Function, types: tuple):
    try:
        return fn.out_type(types)
    except ValueError as exc:
        raise op._error(DTypeError, f"{fn!r} cannot be applied: {exc}") from None


def _check_init(op: Op, init):
    if not isinstance(init, (Zero, Empty)):
        raise op._error(ArgumentError, f"init must be Zero(...) or Empty(...), got {init!r}")
    return init


def _check_rank(op: Op, rank, s: Stream) -> int:
    if not isinstance(rank, int) or not 1 <= rank <= s.rank:
        raise op._error(ArgumentError, f"rank must be between 1 and the input rank {s.rank}, got {rank!r}")
    return rank


class _FiringOp(OnChipFromTerms, Op):
    """A compute operator that fires once per element of its first input, applying ``fn`` to operands of the
    types ``firing_types()`` (which subclasses give)."""

    def firing_types(self) -> tuple:
        """Element types of the operands of one firing."""
        raise NotImplementedError

    def firing_flops(self):
        """FLOPs of one firing (an int or a sympy expression)."""
        return self.fn.flops(self.firing_types())

    def flops_factors(self):
        """The firing count dims (the first input's shape) and the factors of one firing's FLOPs: evaluated one
        by one, a dynamic tile's FLOPs need no sympy product (:class:`stepsim.graph.functions._FactoredFlops`)."""
        return (*self.inputs[0].stream.shape, *self.fn.flops_factors(self.firing_types()))

    def flops(self):
        # the firing count times one firing's FLOPs, multiplied in this order as always: the same sympy tree
        return product((*self.inputs[0].stream.shape, self.firing_flops()))


class Map(_FiringOp):
    """Apply ``fn`` to each element (``UnaryMap``) or to element pairs of two lock-stepped streams
    (``BinaryMap``), or to the elements of a tuple stream made by :class:`Zip`.

    Output has the first input's shape. FLOPs ``N(in) * fn.flops``. On-chip 0 (published); FIFOs count
    ``sum |in| + |out|``; the paper's mode counts a matmul as ``16*in1_cols + |in2| + |out|``.
    """

    kind = "Map"

    def __init__(self, graph, inputs, fn: Function, *, compute_bw: int, write_back_mu: bool = False,
                 name: str | None = None):
        if not isinstance(inputs, (list, tuple)) or (isinstance(inputs, tuple) and len(inputs) == 2
                                                      and isinstance(inputs[1], int)):
            inputs = [inputs]
        ins = self._begin(graph, list(inputs), name)
        _check_fn(self, fn)
        if len(ins) == 1 and isinstance(ins[0].dtype, TupleType):
            types = ins[0].dtype.elements
        else:
            types = tuple(s.dtype for s in ins)
        if len(types) != fn.arity:
            raise self._error(ArgumentError, f"{fn!r} takes {fn.arity} operand(s), but {len(types)} were given")
        if len(ins) > 2:
            raise self._error(ArgumentError, f"Map takes one or two input streams, got {len(ins)}; use Zip")
        if len(ins) == 2 and not shapes_equal(ins[0].shape, ins[1].shape):
            raise self._error(
                ShapeError, f"both inputs must have the same shape, got {fmt_shape(ins[0].shape)} and "
                            f"{fmt_shape(ins[1].shape)}")
        self.fn = fn
        self.operand_types = types
        self.compute_bw = _check_bw(self, fn, compute_bw)
        self.write_back_mu = bool(write_back_mu)
        self._finish([Stream(_apply(self, fn, types), ins[0].shape)])

    def firing_types(self):
        """One element of each input (or the elements of the zipped tuple)."""
        return self.operand_types

    def on_chip_bytes_terms(self, convention=PUBLISHED):
        """Nothing (published); with FIFOs the output and each operand element (mode 1) or, for a matmul in mode 2,
        16 rows of the left operand, the right operand and the output (size factors)."""
        if not convention.count_fifos:
            return ((0,),)
        if convention.mode == 2:
            if isinstance(self.fn, Matmul):
                a, b = self.operand_types
                return ((16, a.cols), size_factors(b), size_factors(self.stream.dtype))
            return ((0,),)
        return (size_factors(self.stream.dtype), *(size_factors(s) for s in self.operand_types))


def UnaryMap(graph, inp, fn, **kw) -> Map:
    """Map with one operand (artifact name)."""
    return Map(graph, [inp], fn, **kw)


def BinaryMap(graph, in1, in2, fn, **kw) -> Map:
    """Map with two lock-stepped operands (artifact name)."""
    return Map(graph, [in1, in2], fn, **kw)


class Accum(_FiringOp):
    """Reduce the inner ``rank`` dims with ``fn(acc, x)`` starting from ``init``; one output per group.

    Output ``in.shape[:-rank]`` of ``out_dtype`` (given by the caller as in the artifact; defaults to the
    init tile's type). On-chip ``|out|`` (the accumulator); FIFOs add ``|in|``.
    """

    kind = "Accum"

    def __init__(self, graph, inp, fn: Function, init, rank: int, *, compute_bw: int, out_dtype=None,
                 write_back_mu: bool = False, name: str | None = None):
        (s,) = self._begin(graph, [inp], name)
        _check_fn(self, fn, 2)
        self.init = _check_init(self, init)
        self.rank = _check_rank(self, rank, s)
        acc = self.init.tile()
        _apply(self, fn, (acc, s.dtype))
        self.fn = fn
        self.compute_bw = _check_bw(self, fn, compute_bw)
        self.write_back_mu = bool(write_back_mu)
        self.out_dtype = out_dtype or acc
        self._finish([Stream(self.out_dtype, s.shape[:-rank])])

    def firing_types(self):
        """The accumulator and one input element."""
        return (self.out_dtype, self.inputs[0].stream.dtype)

    def on_chip_bytes_terms(self, convention=PUBLISHED):
        """The accumulator, and with FIFOs (mode 1) an input element (size factors)."""
        if convention.count_fifos and convention.mode == 1:
            return (size_factors(self.out_dtype), size_factors(self.inputs[0].stream.dtype))
        return (size_factors(self.out_dtype),)


class MapAccum(_FiringOp):
    """Fused Zip + Map + Accum over two lock-stepped inputs (the artifact's BinaryMapAccum).

    Typically the matmul reduction over K: ``acc += in1 @ in2``. Output ``in1.shape[:-rank]``. On-chip
    ``|out|``; FIFOs (mode 1) ``3*|in1|``; paper mode matmul ``16*in1_cols + |in2| + |out|``.
    """

    kind = "MapAccum"

    def __init__(self, graph, in1, in2, fn: Function, init, rank: int, *, compute_bw: int,
                 write_back_mu: bool = False, name: str | None = None):
        a, b = self._begin(graph, [in1, in2], name)
        _check_fn(self, fn, 2)
        if not shapes_equal(a.shape, b.shape):
            raise self._error(
                ShapeError, f"inputs must have identical shapes, got {fmt_shape(a.shape)} and {fmt_shape(b.shape)}")
        self.init = _check_init(self, init)
        self.rank = _check_rank(self, rank, a)
        self.fn = fn
        self.compute_bw = _check_bw(self, fn, compute_bw)
        self.write_back_mu = bool(write_back_mu)
        out = _apply(self, fn, (a.dtype, b.dtype))
        if getattr(fn, "map_accum_only", False) and (not isinstance(init, Zero) or init.tile() != out):
            raise self._error(DTypeError, f"{fn!r} needs the zero state Zero({out.rows}, {out.cols}) as init, "
                                          f"got {init!r}")
        self._finish([Stream(out, a.shape[:-rank])])

    def firing_types(self):
        """One element of each input."""
        return tuple(r.stream.dtype for r in self.inputs)

    def on_chip_bytes_terms(self, convention=PUBLISHED):
        """The output, or with FIFOs three left-operand elements (mode 1) or, for a matmul in mode 2, 16 rows of
        the left operand, the right operand and the output (size factors)."""
        out = size_factors(self.stream.dtype)
        if not convention.count_fifos:
            return (out,)
        a, b = (r.stream.dtype for r in self.inputs)
        if convention.mode == 1:
            return ((*size_factors(a), 3),)
        if isinstance(self.fn, Matmul):
            return ((16, a.cols), size_factors(b), out)
        return (out,)


BinaryMapAccum = MapAccum


class Scan(_FiringOp):
    """Running reduction: like Accum but emits the accumulator after every element (paper Table 4).

    Output has the input's shape, of the accumulator's type; the accumulator resets at every group of the
    inner ``rank`` dims. On-chip ``|acc|``.
    """

    kind = "Scan"

    def __init__(self, graph, inp, fn: Function, init, rank: int, *, compute_bw: int,
                 write_back_mu: bool = False, name: str | None = None):
        (s,) = self._begin(graph, [inp], name)
        _check_fn(self, fn, 2)
        self.init = _check_init(self, init)
        self.rank = _check_rank(self, rank, s)
        acc = self.init.tile()
        self.out_dtype = _apply(self, fn, (acc, s.dtype))
        self.fn = fn
        self.compute_bw = _check_bw(self, fn, compute_bw)
        self.write_back_mu = bool(write_back_mu)
        self._finish([Stream(self.out_dtype, s.shape)])

    def firing_types(self):
        """The accumulator and one input element."""
        return (self.out_dtype, self.inputs[0].stream.dtype)

    def on_chip_bytes_terms(self, convention=PUBLISHED):
        """The accumulator (size factors)."""
        return (size_factors(self.out_dtype),)


class FlatMap(Op):
    """Expand every element into a stream of rank 1 (paper Table 4); here with :class:`RowStreamify`.

    Output ``in.shape + (n,)`` where ``n`` is the tile's row count, or a new ragged symbol
    ``<name>_dyn`` when the row count is dynamic or padding rows are filtered.
    """

    kind = "FlatMap"

    def __init__(self, graph, inp, fn: Function, *, name: str | None = None):
        (s,) = self._begin(graph, [inp], name)
        if not isinstance(fn, RowStreamify):
            raise self._error(ArgumentError, f"FlatMap supports RowStreamify functions, got {fn!r}")
        if not is_tile(s.dtype):
            raise self._error(DTypeError, f"FlatMap needs a tile stream, got {s}")
        self.fn = fn
        count = fn.out_count(s.dtype)
        if fn.filter_padding or not is_static(count):
            count = make_symbol(f"{self.name}_dyn", ragged=True)
        self._finish([Stream(_apply(self, fn, (s.dtype,)), s.shape + (count,))])


class RetileStreamify(Op):
    """Unpack tiles into row (or column) tiles merged into the innermost stream dim (artifact form).

    ``split_row``: tiles ``(R, C)`` become ``R`` tiles ``(1, C)``; shape ``in.shape[:-1] + (in.shape[-1]*R,)``.
    Otherwise ``(R, 1)`` column tiles. ``filter_mask`` drops padded rows, so the innermost dim becomes the
    ragged symbol ``<name>_dyn`` (workloads then assume the known token count, as the artifact does).
    """

    kind = "RetileStreamify"

    def __init__(self, graph, inp, *, split_row: bool = True, filter_mask: bool = False, name: str | None = None):
        (s,) = self._begin(graph, [inp], name)
        if not is_tile(s.dtype):
            raise self._error(DTypeError, f"RetileStreamify needs a tile stream, got {s}")
        self.split_row = bool(split_row)
        self.filter_mask = bool(filter_mask)
        t = s.dtype
        out_t = tile(t.dtype, 1, t.cols) if split_row else tile(t.dtype, t.rows, 1)
        n = t.rows if split_row else t.cols
        inner = make_symbol(f"{self.name}_dyn", ragged=True) if filter_mask else normalize(s.shape[-1] * n)
        self._finish([Stream(out_t, s.shape[:-1] + (inner,))])
