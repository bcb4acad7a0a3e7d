"""Routing and merging operators: Partition, Reassemble, EagerMerge, Parallelize (§2.4); Broadcast, which the
graph inserts itself, is in :mod:`stepsim.graph.graph`."""

from __future__ import annotations

from stepsim.base.errors import ArgumentError, DTypeError, ShapeError
from stepsim.graph.dims import (
    dim_sum,
    dims_equal,
    fmt_shape,
    is_static,
    make_symbol,
    normalize,
    product,
    shapes_equal,
)
from stepsim.graph.dtypes import DynTile, Selector, Tile, size_factors, size_in_bytes
from stepsim.graph.graph import PUBLISHED, OnChipFromTerms, Op
from stepsim.graph.stream import Stream


def _switch_cycles(op: Op, value, n: int) -> tuple:
    vals = (value,) * n if isinstance(value, int) else tuple(value)
    if len(vals) != n or not all(isinstance(v, int) and v >= 0 for v in vals):
        raise op._error(ArgumentError, f"switch_cycles must be a non-negative int or {n} of them, got {value!r}")
    return vals


def _selector(op: Op, s: Stream, n: int, what: str = "control") -> Selector:
    if not isinstance(s.dtype, Selector):
        raise op._error(DTypeError, f"{what} must be a selector stream, got {s}")
    if s.dtype.num_targets != n:
        raise op._error(ArgumentError, f"{what} selects among {s.dtype.num_targets} targets but there are {n}")
    return s.dtype


def _count(op: Op, n, what: str) -> int:
    if not isinstance(n, int) or n < 1:
        raise op._error(ArgumentError, f"{what} must be a positive int, got {n!r}")
    return n


class Partition(OnChipFromTerms, Op):
    """Route each chunk of the inner ``rank`` dims to every output its selector picks (the artifact's
    FlatPartition). Output ``i`` is ``(S_i,) + in.shape[-rank:]`` with ``S_i`` the symbol
    ``<control>_<i:03d>`` (the number of chunks routed to ``i``: a dynamic-regular dimension).

    The control stream must have the input's outer shape ``in.shape[:len-rank]``. On-chip 0; FIFOs
    ``|in| * (n+1)``. ``count_symbols[i]`` is ``S_i`` (bind it to a trace's per-target counts).
    """

    kind = "Partition"

    def __init__(self, graph, inp, control, rank: int, num_consumers: int, *, switch_cycles=1,
                 write_back_mu: bool = False, name: str | None = None):
        s, c = self._begin(graph, [inp, control], name)
        n = _count(self, num_consumers, "num_consumers")
        _selector(self, c, n)
        if not isinstance(rank, int) or not 0 <= rank <= s.rank:
            raise self._error(ArgumentError, f"rank must be between 0 and the input rank {s.rank}, got {rank!r}")
        outer = s.shape[:len(s.shape) - rank]
        if not shapes_equal(outer, c.shape):
            raise self._error(
                ShapeError,
                f"control shape {fmt_shape(c.shape)} must equal the input's outer dims {fmt_shape(outer)} "
                f"(input {fmt_shape(s.shape)} partitioned at rank {rank})",
            )
        self.rank = rank
        self.num_consumers = n
        self.switch_cycles = _switch_cycles(self, switch_cycles, n)
        self.write_back_mu = bool(write_back_mu)
        control_name = self.inputs[1].op.name
        self.count_symbols = tuple(make_symbol(f"{control_name}_{i:03d}") for i in range(n))
        inner = s.shape[len(s.shape) - rank:]
        self._finish([Stream(s.dtype, (sym,) + inner) for sym in self.count_symbols])

    def on_chip_bytes_terms(self, convention=PUBLISHED):
        """With FIFOs, one input element per output FIFO and the input's (size factors); else 0."""
        if not convention.count_fifos:
            return ((0,),)
        return ((*size_factors(self.inputs[0].stream.dtype), self.num_consumers + 1),)


class Reassemble(Op):
    """Concatenate chunks of the inner ``rank`` dims from the inputs each selector element picks (the
    artifact's FlatReassemble), in arrival order. Output ``control.shape + (<name>_dyn,) + inner``, the new
    dimension ragged. On-chip 0, or with ``write_back_mu`` the artifact's product over the output dims
    from index ``control.rank - 1``; FIFOs add ``|in| * (len(inputs)+1)``.

    The inputs carry one type, except dynamic tiles of one element type whose rows (or cols) are different
    symbols (one count each, e.g. an expert's tokens in each micro-batch): the output carries a dynamic tile
    whose differing dim is the ragged ``<name>_rows`` / ``_cols``, as :class:`EagerMerge`'s.
    """

    kind = "Reassemble"

    def __init__(self, graph, inputs, control, rank: int, *, switch_cycles=1, write_back_mu: bool = False,
                 name: str | None = None):
        inputs = list(inputs)
        if not inputs:
            raise ArgumentError("Reassemble needs at least one input stream")
        ins = self._begin(graph, inputs + [control], name)
        *data, c = ins
        n = len(data)
        _selector(self, c, n)
        first = data[0]
        if not isinstance(rank, int) or not 0 <= rank <= first.rank:
            raise self._error(ArgumentError, f"rank must be between 0 and the input rank {first.rank}, got {rank!r}")
        inner = first.shape[len(first.shape) - rank:]
        dtype = self._merged_dtype([s.dtype for s in data])
        for i, s in enumerate(data):
            if rank > s.rank or not shapes_equal(s.shape[len(s.shape) - rank:], inner):
                raise self._error(
                    ShapeError, f"input {i} {fmt_shape(s.shape)} must share the inner {rank} dims {fmt_shape(inner)}")
        self.rank = rank
        self.switch_cycles = _switch_cycles(self, switch_cycles, n)
        self.write_back_mu = bool(write_back_mu)
        self.ragged_symbol = make_symbol(f"{self.name}_dyn", ragged=True)
        self._finish([Stream(dtype, c.shape + (self.ragged_symbol,) + inner)])

    def _merged_dtype(self, dtypes):
        """The inputs' one type, or the dynamic tile of the class docstring; a DTypeError naming the first input
        that differs otherwise (static tiles of different shapes never merge: the engine does not re-tile)."""
        first = dtypes[0]
        if all(t == first for t in dtypes):
            return first
        if all(isinstance(t, DynTile) and t.dtype == first.dtype for t in dtypes):
            dims = []
            for axis, label in ((0, "rows"), (1, "cols")):
                vals = [t.shape[axis] for t in dtypes]
                if all(dims_equal(v, vals[0]) for v in vals):
                    dims.append(vals[0])
                elif not any(is_static(v) for v in vals):
                    dims.append(make_symbol(f"{self.name}_{label}", ragged=True))
                else:
                    break
            else:
                return DynTile(first.dtype, *dims)
        i = next(i for i, t in enumerate(dtypes) if t != first)
        raise self._error(DTypeError, f"input {i} carries {dtypes[i]} but input 0 carries {first}")

    def on_chip_bytes(self, convention=PUBLISHED):
        total = 0
        elem = size_in_bytes(self.stream.dtype)
        if self.write_back_mu:
            control_rank = self.inputs[-1].stream.rank
            total = normalize(product(self.stream.shape[control_rank - 1:]) * elem)
        if convention.count_fifos:
            total = normalize(total + elem * len(self.inputs))
        return total


class EagerMerge(OnChipFromTerms, Op):
    """Merge whole chunks of the inner ``rank`` dims from several inputs in arrival order.

    Output 0 (data): ``(sum_i outer_i,) + inner``; output 1 (select): ``(sum_i outer_i,)`` of a one-hot
    ``Selector(len(inputs))`` saying where each chunk came from. The time-sensitive operator of STeP.
    FIFOs count ``(|in| + |sel|) * (len+1)``.
    """

    kind = "EagerMerge"

    def __init__(self, graph, inputs, rank: int, *, name: str | None = None):
        inputs = list(inputs)
        if len(inputs) < 1:
            raise ArgumentError("EagerMerge needs at least one input stream")
        ins = self._begin(graph, inputs, name)
        first = ins[0]
        if not isinstance(rank, int) or not 0 <= rank <= first.rank:
            raise self._error(ArgumentError, f"rank must be between 0 and the input rank {first.rank}, got {rank!r}")
        inner = first.shape[len(first.shape) - rank:]
        dtype = self._merged_dtype([s.dtype for s in ins])
        for i, s in enumerate(ins):
            if rank > s.rank or not shapes_equal(s.shape[len(s.shape) - rank:], inner):
                raise self._error(
                    ShapeError, f"input {i} {fmt_shape(s.shape)} must share the inner {rank} dims {fmt_shape(inner)}")
        total = dim_sum(product(s.shape[:len(s.shape) - rank]) for s in ins)
        self.rank = rank
        self._finish([Stream(dtype, (total,) + inner), Stream(Selector(len(ins)), (total,))])

    def _merged_dtype(self, dtypes):
        """Inputs must carry the same type; dynamic tiles that differ only in a symbolic dim (one expert's
        token count each) merge into a dynamic tile whose differing dim is the ragged ``<name>_rows``/``_cols``."""
        first = dtypes[0]
        if all(t == first for t in dtypes):
            return first
        if all(isinstance(t, (Tile, DynTile)) and t.dtype == first.dtype for t in dtypes):
            dims = []
            for axis, label in ((0, "rows"), (1, "cols")):
                vals = [t.shape[axis] for t in dtypes]
                same = all(dims_equal(v, vals[0]) for v in vals)
                dims.append(vals[0] if same else make_symbol(f"{self.name}_{label}", ragged=True))
            return DynTile(first.dtype, *dims)
        i = next(i for i, t in enumerate(dtypes) if t != first)
        raise self._error(DTypeError, f"input {i} carries {dtypes[i]} but input 0 carries {first}")

    def on_chip_bytes_terms(self, convention=PUBLISHED):
        """With FIFOs, a data element (size factors) and a selector per input FIFO and per output; else 0."""
        if not convention.count_fifos:
            return ((0,),)
        fifos = len(self.inputs) + 1
        return ((*size_factors(self.inputs[0].stream.dtype), fifos), (self.outputs[1].dtype.size_in_bytes(), fifos))


class Parallelize(OnChipFromTerms, Op):
    """Deal the outermost dim out round-robin to ``num_consumers`` outputs (static interleave).

    ``rank`` must equal the input rank. Each output is ``(D_outer / p,) + rest``; a static outer dim must be
    divisible by ``p``; a symbolic one is divided exactly (the artifact's ``D/p``).
    """

    kind = "Parallelize"

    def __init__(self, graph, inp, rank: int, num_consumers: int, *, switch_cycles=1, write_back_mu: bool = False,
                 name: str | None = None):
        (s,) = self._begin(graph, [inp], name)
        p = _count(self, num_consumers, "num_consumers")
        if rank != s.rank:
            raise self._error(ArgumentError, f"Parallelize rank must equal the input rank {s.rank}, got {rank!r}")
        outer = s.shape[0]
        if is_static(outer):
            if outer % p:
                raise self._error(ShapeError, f"outer dim {outer} is not divisible by {p} consumers")
            part = outer // p
        else:
            part = normalize(outer / p)
        self.rank = rank
        self.num_consumers = p
        self.switch_cycles = _switch_cycles(self, switch_cycles, p)
        self.write_back_mu = bool(write_back_mu)
        self._finish([Stream(s.dtype, (part,) + s.shape[1:]) for _ in range(p)])

    def on_chip_bytes_terms(self, convention=PUBLISHED):
        """With FIFOs, one input element per output FIFO and the input's (size factors); else 0."""
        if not convention.count_fifos:
            return ((0,),)
        return ((*size_factors(self.inputs[0].stream.dtype), self.num_consumers + 1),)
