"""Pass 5: STeP emission. One handler per ONNX op type (the :data:`HANDLERS` registry, filled by
:mod:`~stepsim.frontend.ops_elementwise`, :mod:`~stepsim.frontend.ops_matmul` and
:mod:`~stepsim.frontend.ops_layout`), each turning a node into
operators on the streams :mod:`stepsim.frontend.layouts` assigns (an :class:`Act`): every activation streams
``tile_m``-row blocks of fp32 tiles, as row tiles (stream ``(1, M)``) or column stripes (``(1, M, N / tn)``);
a ``[B, S, H, hd]`` head view streams the ``hd``-wide stripes of ``[B, S, H * hd]``.

Graph inputs are loaded by name, graph outputs stored by name; initializers are off-chip tensors named as in the
model (a weight read once per row block of the MatMul's input, a row vector (bias, norm scale) read once and
repeated on chip, a constant shared by several readers loaded once, per phase). A spilled edge is written to
off-chip memory and read back once the whole tensor is stored (:mod:`stepsim.frontend.spill`: ``2 x`` its bytes
of traffic, moved by the engine's HBM); a spilled edge into a consumer that needs whole rows reads rows back (no
retile converter), into a Transpose reads back in the transposed order (no reorder converter).

Phases (:func:`stepsim.frontend.fusion.phases`): a node after a spill waits for a whole tensor, so the loads it
shares with the nodes before it would stall them; graph inputs and shared constants are loaded once per phase.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from stepsim.base.errors import FrontendError
from stepsim.frontend import fusion, spill
from stepsim.frontend.ir import Model, Node
from stepsim.frontend.layouts import (
    Tiling,
    groups_rows_cols,
    needs_rows,
    stream_layout,
    views,
)
from stepsim.graph import (
    BF16,
    FP32,
    Accum,
    Bufferize,
    Empty,
    Flatten,
    Graph,
    LinearOffChipLoad,
    LinearOffChipStore,
    Map,
    Pointwise,
    Promote,
    RepeatStatic,
    Reshape,
    RetileCol,
    Streamify,
    Tensor,
    Tile,
)
from stepsim.graph.graph import OutputRef

HANDLERS: dict = {}


def handles(*op_types: str):
    """Register a handler ``(emitter, node)`` for ``op_types``."""
    def register(fn):
        for t in op_types:
            HANDLERS[t] = fn
        return fn
    return register


#: op types rewritten into others before emission (two-operand Einsums: stepsim.frontend.einsum)
REWRITTEN = ("Einsum",)


def supported_ops() -> str:
    return ", ".join(sorted({*HANDLERS, *REWRITTEN}))


@dataclass(frozen=True)
class Act:
    """An activation's stream: ``s`` (an operator or output) of shape ``(1, M)`` (row tiles, ``tn == n``) or
    ``(1, M, n / tn)`` (column stripes), of ``tile_m x tn`` fp32 tiles; ``n`` is the last dim (elements)."""

    s: object
    tn: int
    n: int
    #: a ``[.., S, H, hd]`` head view: the stream is the ``hd``-wide stripes of ``[.., S, H * hd]``
    merged: bool = False

    @property
    def stripes(self) -> bool:
        return self.tn != self.n


class _Annotating(dict):
    """``Emitter.val``: setting an activation puts its layout (:func:`~stepsim.frontend.layouts.stream_layout`) on
    the stream that carries it (``Stream.layout``), before any consumer is built, so the shape operators after it
    carry it on; only where the stream carries exactly the value's tiles (not a view, not a re-read)."""

    def __init__(self, emitter: "Emitter"):
        super().__init__()
        self.emitter = emitter
        self.skip = None

    def __setitem__(self, value, act):
        super().__setitem__(value, act)
        e = self.emitter
        if self.skip is None:
            self.skip = views(e.model)
        if value in self.skip or value not in e.tn:
            return
        lay = stream_layout(e.model.shapes[value], e.tm, e.tn[value])
        op, index = (act.s.op, act.s.index) if isinstance(act.s, OutputRef) else (act.s, 0)
        total = op.outputs[index].total_elements()
        if isinstance(total, int) and total == lay.num_tiles:
            op.assume_layout(index, lay)


class Emitter:
    """Builds the STeP graph of a :class:`Model` (see the module docstring)."""

    def __init__(self, model: Model, tiling: Tiling, tile_m: int, tn: dict, conversions: dict, edges: list):
        self.model = model
        self.tiling = tiling
        self.tm = tile_m
        self.tn = tn
        self.bw = tiling.compute_bw
        self.conversions = conversions
        self.spilled = {(e.value, e.consumer) for e in edges if not e.fused}
        self.phases = fusion.phases(model, edges)  # node -> phase (spills crossed before it)
        self.phase = 0  # the phase of the node being emitted
        self.input_acts: dict = {}  # (graph input, phase) -> its load's Act
        self.spill_reads: dict = {}  # (value, consumer) -> the spilled edge's read-back Act
        self.spilled_converters: set = set()  # conversion keys a spill replaced (FrontendReport.spilled_converters)
        self.g = Graph(model.name)
        self.val: dict = _Annotating(self)  # value -> its Act (its stream annotated with the value's layout)
        self.rows: dict = {}  # value -> its retiled Act (built once, shared by every consumer that needs rows)
        self.producer = model.producer()
        self.converter_ops: dict = {}  # conversion key -> the operator holding that converter's buffer
        self.inputs: set = set()  # graph inputs not loaded yet
        self.loads: dict = {}  # (tensor, tile, view) -> its load: one load per distinct read, shared
        self.swapped: set = set()  # values that are a last-two-dims swap of their Transpose's input
        self.routing = None  # the MoE blocks' routing traces (stepsim.frontend.moe)
        self.input_data: dict = {}  # graph input -> the values its load carries (teacher-routed MoE models)

    # --- streams -----------------------------------------------------------------------------------------
    def tiles(self, value: str) -> int:
        """Row blocks ``M`` of an activation."""
        b, r, _ = groups_rows_cols(self.model.shapes[value])
        return b * r // self.tm

    def cols(self, value: str) -> int:
        return groups_rows_cols(self.model.shapes[value])[2]

    def act(self, value: str, node: Node, *, through_spill: bool = True) -> Act:
        """Activation ``value`` as ``node`` reads it: retiled to rows if the node needs rows (layouts.needs_rows),
        through a spill if the edge spills (``through_spill`` False: the caller spills it itself)."""
        if value in self.inputs:
            key = (value, self.phase)
            if key not in self.input_acts:
                self.input_acts[key] = self.load(value, self.model.shapes[value], self.model.shapes[value][-1],
                                                 self.input_data.get(value))
            self.val[value] = self.input_acts[key]
        if value not in self.val:
            raise FrontendError(f"{node.describe()}: input {value!r} is neither a graph input, an initializer nor "
                                f"the output of an earlier node")
        a = self.val[value]
        rows = a.stripes and not a.merged and needs_rows(self.model, self.tiling, self.tn, node,
                                                         node.inputs.index(value))
        if through_spill and (value, node.name) in self.spilled:  # the memory retiles: no converter buffer
            if (value, node.name) not in self.spill_reads:  # one spill per edge, however often its node asks
                read = spill.spill_in_order(self.g, a.s, f"{value}->{node.name}", rows=rows,
                                            par_dispatch=self.tiling.par_dispatch)
                self.spill_reads[(value, node.name)] = Act(read, a.n, a.n) if rows else dataclasses.replace(a, s=read)
                conv = self.conversions.get(value)
                if rows and conv is not None and conv.kind == "retile" and value not in self.converter_ops:
                    self.spilled_converters.add(value)
            return self.spill_reads[(value, node.name)]
        return self.retiled(value) if rows else a

    def retiled(self, value: str) -> Act:
        """The retile converter of ``value`` (column stripes -> row tiles): an accumulator of one row block."""
        self.spilled_converters.discard(value)  # a fused reader needs it after all
        if value not in self.rows:
            a = self.val[value]
            acc = Accum(self.g, a.s, RetileCol(), Empty(self.tm, 0), 1, compute_bw=0,
                        out_dtype=Tile(FP32, self.tm, a.n), name=f"retile[{value}]")
            self.converter_ops[value] = acc
            self.rows[value] = Act(acc, a.n, a.n)
        return self.rows[value]

    def tensor(self, name: str, shape: tuple, data=None) -> Tensor:
        """The off-chip tensor ``name``: stored as the model stores it (bf16 or fp32; frontend-made constants fp32),
        loaded into fp32 tiles (compute is fp32: the artifact's accounting of bf16 models)."""
        dtype = BF16 if name in self.model.bf16 else FP32
        return Tensor(name, shape, dtype, None if data is None else np.asarray(data, np.float32))

    def load(self, name: str, shape: tuple, tn: int, data=None) -> Act:
        """A load of tensor ``name`` (a graph input, or a full-size initializer) as row tiles or stripes."""
        b, r, n = groups_rows_cols(shape)
        tensor_shape = (r, n) if b == 1 else (b, r, n)
        m, nt = b * r // self.tm, n // tn
        view = ((m,), (1,)) if nt == 1 else ((m, nt), (nt, 1))
        return Act(self.load_view(self.tensor(name, tensor_shape, data), (self.tm, tn), *view), tn, n)

    def load_view(self, tensor: Tensor, tile: tuple, out_shape_tiled: tuple, stride: tuple):
        """A LinearOffChipLoad, shared by every reader of the same tensor, tile and view in one phase (one DRAM
        read per phase: a load shared across a spill would stall the readers before it)."""
        key = (tensor.name, tile, out_shape_tiled, stride, self.phase)
        if key not in self.loads:
            self.loads[key] = LinearOffChipLoad(self.g, tensor, tile, out_shape_tiled, stride, stream_dtype=FP32,
                                                par_dispatch=self.tiling.par_dispatch)
        return self.loads[key]

    def load_transposed(self, x: str, perm: list, merged: bool) -> Act:
        """Graph input ``x`` read in the order of its Transpose by ``perm`` (the last dim kept last): ``tile_m x
        N`` tiles of the output, each a 2-D block of ``x`` viewed as ``[prod(dims before d), d, prod(dims after
        d)]`` where ``d`` is the input dim of the output's row dim (its ``-2``; ``-3`` for a head merge's
        ``merged`` view, whose tiles stripe its last two dims); the view's strides walk the output's order. One
        read of ``x``, as an untransposed load: no converter, no extra bytes."""
        shape = self.model.shapes[x]
        rank, n = len(shape), shape[-1]
        row_out = rank - 3 if merged else rank - 2
        d = perm[row_out]
        if shape[d] % self.tm:
            raise FrontendError(f"Transpose of graph input {x!r} by perm {perm}: tile_m {self.tm} does not divide "
                                f"its rows dim of {shape[d]}")
        before, after = math.prod(shape[:d]), math.prod(shape[d + 1:])
        blocks, cols = shape[d] // self.tm, after // n  # the view's tile grid: (before, blocks, cols)

        def stride(j: int) -> int:  # tiles between neighbours along input dim j in the grid, row-major
            if j < d:
                return math.prod(shape[j + 1:d]) * blocks * cols
            return cols if j == d else math.prod(shape[j + 1:rank - 1])
        trips = tuple(shape[perm[i]] // (self.tm if i == row_out else 1) for i in range(rank - 1))
        strides = tuple(stride(perm[i]) for i in range(rank - 1))
        tensor_shape = (shape[d], after) if before == 1 else (before, shape[d], after)
        tensor = self.tensor(x, tensor_shape, self.input_data.get(x))
        s = self.load_view(tensor, (self.tm, n), trips, strides)  # (1,) + trips
        if merged:  # (1, ..., Sm, H) -> (1, M, H): hd-wide stripes of [.., S, H * hd]
            return Act(Flatten(self.g, s, 1, rank - 2) if rank > 3 else s, n, n * trips[-1], merged=True)
        return Act(Flatten(self.g, s, 0, rank - 2) if rank > 2 else s, n, n)

    def row_vector(self, name: str, vec: np.ndarray, like: Act) -> Act:
        """A ``[1, N]`` constant read once, streamed alongside ``like``: repeated as one tile per row block (on
        chip: one tile), or, for stripes, buffered whole and replayed per row block."""
        n, m = vec.size, self.tiles_of(like)
        data = vec.reshape(1, n).astype(np.float32)
        if not like.stripes:
            load = LinearOffChipLoad(self.g, self.tensor(name, (1, n), data), (1, n), (1,), (0,), stream_dtype=FP32)
            return Act(Flatten(self.g, RepeatStatic(self.g, load, m), 0, 1), n, n)
        nt = n // like.tn
        load = LinearOffChipLoad(self.g, self.tensor(name, (1, n), data), (1, like.tn), (nt,), (1,), stream_dtype=FP32)
        return Act(Streamify(self.g, Bufferize(self.g, load, 1), [m], 1), like.tn, n)

    def head_row_vector(self, name: str, vec: np.ndarray, like: Act) -> Act:
        """A ``[1, hd]`` constant broadcast over a head view's heads (RoPE's cos / sin of a decode token on
        ``[B, 1, H, hd]``): read once, the tile repeated for every head's stripe of every row block (on chip:
        ``H`` tiles)."""
        m, heads = self.tiles_of(like), like.n // like.tn
        load = LinearOffChipLoad(self.g, self.tensor(name, (1, like.tn), vec.reshape(1, -1).astype(np.float32)),
                                 (1, like.tn), (1,), (0,), stream_dtype=FP32)
        per_block = Flatten(self.g, RepeatStatic(self.g, load, heads), 0, 1)  # (1, H) of the same tile
        return Act(Streamify(self.g, Bufferize(self.g, per_block, 1), [m], 1), like.tn, like.n)

    @staticmethod
    def tiles_of(a: Act) -> int:
        """Row blocks ``M`` of a stream."""
        return a.s.stream.shape[1]

    def map(self, ins, fn) -> Act:
        """``Map`` over one or two lock-stepped activations (the same layout), broadcasting inside tiles."""
        ins = [ins] if isinstance(ins, Act) else ins
        out = Map(self.g, [a.s for a in ins], fn, compute_bw=self.bw)
        cols = out.stream.dtype.cols
        stripes = next((a for a in ins if a.stripes), None)
        # a head view stays one (RoPE on DeepSeek's [B, S, H, rope] query part: its stripes are per head)
        return Act(out, cols, stripes.n if stripes else cols, merged=bool(stripes and stripes.merged))

    def pw(self, a: Act, kind: str, c: float = 0.0) -> Act:
        return self.map(a, Pointwise(kind, c))

    # --- driver -----------------------------------------------------------------------------------------
    def run(self) -> Graph:
        for name in self.model.inputs:
            if name in self.model.bound:  # integer values given at lowering (token ids): not a loaded tensor
                continue
            self.inputs.add(name)  # loaded on first use (a MatMul may read it with its own view instead)
        for node in self.model.nodes:
            handler = HANDLERS.get(node.op_type)
            if handler is None:
                raise FrontendError(f"{node.describe()}: unsupported operator; supported: {supported_ops()}")
            first = len(self.g.ops)
            self.phase = self.phases[node.name]
            handler(self, node)
            for op in self.g.ops[first:]:  # metrics per ONNX node (and per layer: stepsim.frontend.layers)
                op.group = ("node", node.name)
        self.phase = 0  # stores read their value's own stream (no shared load)
        for name in self.model.outputs:
            self.store(name)
        return self.g

    def store(self, name: str):
        if name not in self.val:
            raise FrontendError(f"graph output {name!r} is a constant or a graph input; nothing to compute")
        a = self.val[name]
        s = a.s
        b, r, _ = groups_rows_cols(self.model.shapes[name])
        if b > 1 and not a.stripes:  # (1, B * R/tm) -> (1, B, R/tm, 1): the store writes a [B, R, N] tensor
            s = Promote(self.g, Reshape(self.g, s, r // self.tm, 0), 0)
        elif b > 1:  # (1, B * R/tm, nt) -> (1, B, R/tm, nt)
            s = Reshape(self.g, s, r // self.tm, 1)
        LinearOffChipStore(self.g, s, tensor_name=name, par_dispatch=self.tiling.par_dispatch)

    def const_or_act(self, node: Node, value: str, like: str) -> Act:
        """Input ``value`` of an elementwise node whose activation operand is ``like``: the activation itself, or
        a constant as a row vector or a full tensor, in ``like``'s layout. Scalars are handled by the caller."""
        if not self.model.is_const(value):
            return self.act(value, node)
        c = self.model.consts[value].astype(np.float32)
        a = self.act(like, node)
        if c.size == a.n and all(d == 1 for d in c.shape[:-1]):
            return self.row_vector(value, c, a)
        if a.merged and a.stripes and c.size == a.tn and all(d == 1 for d in c.shape[:-1]):
            return self.head_row_vector(value, c, a)
        if tuple(c.shape) == tuple(self.model.shapes[like]):
            return self.load(value, c.shape, a.tn, c)
        g, r, n = groups_rows_cols(self.model.shapes[like])
        if c.size == r * n and c.shape[-2:] == (r, n) and not a.stripes:  # one [R, N] for every group: a mask
            load = self.load_view(self.tensor(value, (r, n), c.reshape(r, n)), (self.tm, n), (g, r // self.tm),
                                  (0, 1))
            return Act(Flatten(self.g, load, 0, 1), n, n)
        raise FrontendError(f"{node.describe()}: constant {value!r} of shape {list(c.shape)} broadcasts against "
                            f"{like!r} {list(self.model.shapes[like])} in a way that is not supported (scalars, "
                            f"row vectors of the last dim, or the same shape)")
