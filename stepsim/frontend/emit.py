"""Pass 5: STeP emission. One handler per ONNX op type (the :data:`HANDLERS` registry), each turning a node into
operators on row-tile streams (:mod:`stepsim.frontend.layouts`): every activation is a stream of shape
``(1, M)`` of ``tile_m x cols`` fp32 tiles, ``M`` the number of row tiles.

Graph inputs are loaded by name, graph outputs stored by name; initializers are off-chip tensors named as in the
model (a weight read once per row tile of the MatMul's input, a row vector (bias, norm scale) read once and
repeated on chip). A spilled edge goes through ``Bufferize(off_chip) -> Streamify(off_chip)``: the tensor is
written and read back once each (``2 x`` its bytes of traffic) while the values keep flowing in order.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from stepsim.base.errors import FrontendError
from stepsim.frontend.ir import Model, Node, scalar
from stepsim.frontend.layouts import (
    Tiling,
    activation_matmul,
    groups_rows_cols,
    head_merge,
    head_split,
    matmul_out_tile,
    needs_rows,
    transpose_kind,
)
from stepsim.graph import (
    FP32,
    Accum,
    Add,
    Bufferize,
    Div,
    Empty,
    Exp,
    Flatten,
    Graph,
    LinearOffChipLoad,
    LinearOffChipStore,
    Map,
    MapAccum,
    Matmul,
    Max,
    MetadataSource,
    Mul,
    Pointwise,
    Promote,
    RandomOffChipLoad,
    Reassemble,
    RepeatStatic,
    Reshape,
    RetileCol,
    RetileRow,
    RowMax,
    RowSum,
    SelectorSource,
    Silu,
    Streamify,
    Sub,
    Tensor,
    Tile,
    Zero,
)
from stepsim.graph.ops_convert import convert

HANDLERS: dict = {}


def handles(*op_types: str):
    """Register a handler ``(emitter, node)`` for ``op_types``."""
    def register(fn):
        for t in op_types:
            HANDLERS[t] = fn
        return fn
    return register


def supported_ops() -> str:
    return ", ".join(sorted(HANDLERS))


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
        self.g = Graph(model.name)
        self.val: dict = {}  # value -> its Act
        self.rows: dict = {}  # value -> its retiled Act (built once, shared by every consumer that needs rows)
        self.producer = model.producer()
        self.converter_ops: dict = {}  # conversion key -> the operator holding that converter's buffer
        self.inputs: set = set()  # graph inputs not loaded yet
        self.loads: dict = {}  # (tensor, tile, view) -> its load: one load per distinct read, shared
        self.swapped: set = set()  # values that are a last-two-dims swap of their Transpose's input

    # --- streams -----------------------------------------------------------------------------------------
    def tiles(self, value: str) -> int:
        """Row blocks ``M`` of an activation."""
        b, r, _ = groups_rows_cols(self.model.shapes[value])
        return b * r // self.tm

    def cols(self, value: str) -> int:
        return groups_rows_cols(self.model.shapes[value])[2]

    def act(self, value: str, node: Node) -> Act:
        """Activation ``value`` as ``node`` reads it: retiled to rows if the node needs rows (layouts.needs_rows),
        through a spill if the edge spills."""
        if value in self.inputs:
            self.inputs.discard(value)
            self.val[value] = self.load(value, self.model.shapes[value], self.model.shapes[value][-1])
        if value not in self.val:
            raise FrontendError(f"{node.describe()}: input {value!r} is neither a graph input, an initializer nor "
                                f"the output of an earlier node")
        a = self.val[value]
        if a.stripes and not a.merged and needs_rows(self.model, self.tiling, self.tn, node,
                                                     node.inputs.index(value)):
            a = self.retiled(value)
        if (value, node.name) in self.spilled:
            b = Bufferize(self.g, Promote(self.g, a.s, 0), 1, off_chip=True, name=f"spill_write[{value}->{node.name}]")
            read = Streamify(self.g, b, [1], 1, off_chip=True, name=f"spill_read[{value}->{node.name}]")
            a = dataclasses.replace(a, s=Flatten(self.g, read, 0, 2))
        return a

    def retiled(self, value: str) -> Act:
        """The retile converter of ``value`` (column stripes -> row tiles): an accumulator of one row block."""
        if value not in self.rows:
            a = self.val[value]
            acc = Accum(self.g, a.s, RetileCol(), Empty(self.tm, 0), 1, compute_bw=0,
                        out_dtype=Tile(FP32, self.tm, a.n), name=f"retile[{value}]")
            self.converter_ops[value] = acc
            self.rows[value] = Act(acc, a.n, a.n)
        return self.rows[value]

    def load(self, name: str, shape: tuple, tn: int, data=None) -> Act:
        """A load of tensor ``name`` (a graph input, or a full-size initializer) as row tiles or stripes."""
        b, r, n = groups_rows_cols(shape)
        tensor_shape = (r, n) if b == 1 else (b, r, n)
        m, nt = b * r // self.tm, n // tn
        view = ((m,), (1,)) if nt == 1 else ((m, nt), (nt, 1))
        return Act(self.load_view(Tensor(name, tensor_shape, FP32, data), (self.tm, tn), *view), tn, n)

    def load_view(self, tensor: Tensor, tile: tuple, out_shape_tiled: tuple, stride: tuple):
        """A LinearOffChipLoad, shared by every reader of the same tensor, tile and view (one DRAM read)."""
        key = (tensor.name, tile, out_shape_tiled, stride)
        if key not in self.loads:
            self.loads[key] = LinearOffChipLoad(self.g, tensor, tile, out_shape_tiled, stride,
                                                par_dispatch=self.tiling.par_dispatch)
        return self.loads[key]

    def row_vector(self, name: str, vec: np.ndarray, like: Act) -> Act:
        """A ``[1, N]`` constant read once, streamed alongside ``like``: repeated as one tile per row block (on
        chip: one tile), or, for stripes, buffered whole and replayed per row block."""
        n, m = vec.size, self.tiles_of(like)
        data = vec.reshape(1, n).astype(np.float32)
        if not like.stripes:
            load = LinearOffChipLoad(self.g, Tensor(name, (1, n), FP32, data), (1, n), (1,), (0,))
            return Act(Flatten(self.g, RepeatStatic(self.g, load, m), 0, 1), n, n)
        nt = n // like.tn
        load = LinearOffChipLoad(self.g, Tensor(name, (1, n), FP32, data), (1, like.tn), (nt,), (1,))
        return Act(Streamify(self.g, Bufferize(self.g, load, 1), [m], 1), like.tn, n)

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
        return Act(out, cols, stripes.n if stripes else cols)

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
            handler(self, node)
            for op in self.g.ops[first:]:  # metrics per ONNX node (and per layer: stepsim.frontend.layers)
                op.group = ("node", node.name)
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
        if tuple(c.shape) == tuple(self.model.shapes[like]):
            return self.load(value, c.shape, a.tn, c)
        g, r, n = groups_rows_cols(self.model.shapes[like])
        if c.size == r * n and c.shape[-2:] == (r, n) and not a.stripes:  # one [R, N] for every group: a mask
            load = self.load_view(Tensor(value, (r, n), FP32, c.reshape(r, n)), (self.tm, n), (g, r // self.tm),
                                  (0, 1))
            return Act(Flatten(self.g, load, 0, 1), n, n)
        raise FrontendError(f"{node.describe()}: constant {value!r} of shape {list(c.shape)} broadcasts against "
                            f"{like!r} {list(self.model.shapes[like])} in a way that is not supported (scalars, "
                            f"row vectors of the last dim, or the same shape)")


# --- elementwise ---------------------------------------------------------------------------------------
_BINARY = {"Add": (Add, "add_c", "add_c"), "Sub": (Sub, "sub_c", "rsub_c"), "Mul": (Mul, "mul_c", "mul_c"),
           "Div": (Div, "div_c", "rdiv_c"), "Max": (Max, "max_c", "max_c"), "Min": (None, "min_c", "min_c"),
           "Pow": (None, "pow_c", None)}


@handles(*_BINARY)
def _binary(e: Emitter, node: Node):
    a, b = node.inputs[:2]
    fn, kind_right, kind_left = _BINARY[node.op_type]
    y = node.outputs[0]
    ca, cb = e.model.is_const(a), e.model.is_const(b)
    act = b if ca else a
    if tuple(e.model.shapes[y]) != tuple(e.model.shapes[act]) and groups_rows_cols(e.model.shapes[y]) != \
            groups_rows_cols(e.model.shapes[act]):
        raise FrontendError(f"{node.describe()}: the output {list(e.model.shapes[y])} is larger than the activation "
                            f"operand {list(e.model.shapes[act])}; broadcasting an activation is not supported")
    for const, kind in ((b, kind_right), (a, kind_left)):
        if e.model.is_const(const) and scalar(e.model.consts[const]) is not None:
            if kind is None:
                raise FrontendError(f"{node.describe()}: a constant base of Pow is not supported")
            c = scalar(e.model.consts[const])
            e.val[y] = _pow(e, e.act(act, node), c) if kind == "pow_c" else e.pw(e.act(act, node), kind, c)
            return
    if fn is None:
        raise FrontendError(f"{node.describe()}: {node.op_type} of two tensors is supported only with a scalar "
                            f"constant operand")
    ga, gb = groups_rows_cols(e.model.shapes[a]), groups_rows_cols(e.model.shapes[b])
    if not ca and not cb and (ga[:2] != gb[:2] or (ga[2] != gb[2] and 1 not in (ga[2], gb[2]))):
        raise FrontendError(f"{node.describe()}: operands {list(e.model.shapes[a])} and {list(e.model.shapes[b])} "
                            f"must have the same rows (and the same last dim, or 1)")
    e.val[y] = e.map([e.const_or_act(node, a, act), e.const_or_act(node, b, act)], fn())


def _pow(e: Emitter, s, c: float):
    """``x ** c``; squares (the exporters' RMSNorm and GELU) as an exact product."""
    if c == 2.0:
        return e.map([s, s], Mul())
    if c == 1.0:
        return s
    return e.pw(s, "pow_c", c)


_UNARY = {"Relu": "relu", "Sigmoid": "sigmoid", "Tanh": "tanh", "Erf": "erf", "Sqrt": "sqrt", "Neg": "neg"}


@handles(*_UNARY)
def _unary(e: Emitter, node: Node):
    e.val[node.outputs[0]] = e.pw(e.act(node.inputs[0], node), _UNARY[node.op_type])


@handles("Swish")
def _swish(e: Emitter, node: Node):
    if node.attrs.get("alpha", 1.0) != 1.0:
        raise FrontendError(f"{node.describe()}: only alpha = 1 (SiLU) is supported, got {node.attrs['alpha']}")
    e.val[node.outputs[0]] = e.map(e.act(node.inputs[0], node), Silu())


@handles("Exp")
def _exp(e: Emitter, node: Node):
    e.val[node.outputs[0]] = e.map(e.act(node.inputs[0], node), Exp())


@handles("Reciprocal")
def _reciprocal(e: Emitter, node: Node):
    e.val[node.outputs[0]] = e.pw(e.act(node.inputs[0], node), "rdiv_c", 1.0)


@handles("Gelu")
def _gelu(e: Emitter, node: Node):
    x = e.act(node.inputs[0], node)
    if node.attrs.get("approximate", b"none") in (b"none", "none"):
        e.val[node.outputs[0]] = e.pw(x, "gelu")
        return
    # tanh form: x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
    inner = e.pw(e.map([x, e.map([x, x], Mul())], Mul()), "mul_c", 0.044715)
    t = e.pw(e.pw(e.map([x, inner], Add()), "mul_c", math.sqrt(2 / math.pi)), "tanh")
    e.val[node.outputs[0]] = e.map([e.pw(x, "mul_c", 0.5), e.pw(t, "add_c", 1.0)], Mul())


@handles("Identity", "Dropout", "Cast", "Reshape", "Flatten", "Squeeze", "Unsqueeze")
def _same_stream(e: Emitter, node: Node):
    """Ops that leave the row-tile stream as it is: the last dim and the row order are kept."""
    x, y = node.inputs[0], node.outputs[0]
    if node.op_type == "Cast" and node.attrs.get("to") != 1:  # TensorProto.FLOAT
        raise FrontendError(f"{node.describe()}: casts to element type {node.attrs.get('to')} are not supported "
                            f"(fp32 activations only)")
    if head_split(e.model, node):  # the producer streams one hd-wide stripe per head: a view
        a = e.act(x, node)
        heads, hd = head_split(e.model, node)
        if a.tn != hd:
            raise FrontendError(f"{node.describe()}: splitting into {heads} heads of {hd} needs its input to stream "
                                f"{hd}-wide stripes (its MatMul's tile_n = {hd}), got {a.tn}")
        e.val[y] = Act(a.s, hd, a.n, merged=True)
        return
    if head_merge(e.model, node) and e.val.get(x, Act(None, 0, 0)).merged:  # heads' stripes: the merged value's
        a = e.act(x, node)
        e.val[y] = Act(a.s, a.tn, a.n)
        return
    sx, sy = e.model.shapes[x], e.model.shapes[y]
    gx, gy = groups_rows_cols(sx), groups_rows_cols(sy)
    if gx[2] != gy[2] or gx[0] * gx[1] != gy[0] * gy[1] or gy[1] % e.tm:
        raise FrontendError(f"{node.describe()}: {list(sx)} -> {list(sy)} changes the last dim or splits rows off "
                            f"tile boundaries; only reshapes of the leading dims stream on chip")
    e.val[y] = e.act(x, node)


# --- reductions over the last axis ---------------------------------------------------------------------
def _last_axis(e: Emitter, node: Node, axes) -> None:
    rank = len(e.model.shapes[node.inputs[0]])
    if [a % rank for a in axes] != [rank - 1]:
        raise FrontendError(f"{node.describe()}: only the last axis can be reduced or normalized (got axes "
                            f"{list(axes)} of a rank-{rank} tensor)")


@handles("ReduceMean", "ReduceSum", "ReduceMax")
def _reduce(e: Emitter, node: Node):
    axes = node.attrs.get("axes")
    if axes is None and len(node.inputs) > 1 and node.inputs[1]:
        axes = [int(a) for a in e.model.consts[node.inputs[1]].reshape(-1)]
    _last_axis(e, node, axes if axes is not None else range(len(e.model.shapes[node.inputs[0]])))
    if node.attrs.get("keepdims", 1) != 1:
        raise FrontendError(f"{node.describe()}: keepdims=0 is not supported")
    x = e.act(node.inputs[0], node)
    if node.op_type == "ReduceMax":
        e.val[node.outputs[0]] = e.map(x, RowMax())
        return
    s = e.map(x, RowSum())
    n = e.cols(node.inputs[0])
    e.val[node.outputs[0]] = e.pw(s, "mul_c", 1.0 / n) if node.op_type == "ReduceMean" else s


@handles("Softmax")
def _softmax(e: Emitter, node: Node):
    _last_axis(e, node, [node.attrs.get("axis", -1)])
    x = e.act(node.inputs[0], node)
    ex = e.map(e.map([x, e.map(x, RowMax())], Sub()), Exp())
    e.val[node.outputs[0]] = e.map([ex, e.map(ex, RowSum())], Div())


def _normalize(e: Emitter, node: Node, x, centered: bool):
    """``(x - mean) / sqrt(var + eps)`` (LayerNorm) or ``x / sqrt(mean(x^2) + eps)`` (RMSNorm), then the scale
    and bias (row vectors)."""
    _last_axis(e, node, [node.attrs.get("axis", -1)])
    n = e.cols(node.inputs[0])
    if centered:
        x = e.map([x, e.pw(e.map(x, RowSum()), "mul_c", 1.0 / n)], Sub())
    ms = e.pw(e.map(e.map([x, x], Mul()), RowSum()), "mul_c", 1.0 / n)
    inv = e.pw(e.pw(e.pw(ms, "add_c", node.attrs.get("epsilon", 1e-5)), "sqrt"), "rdiv_c", 1.0)
    y = e.map([x, inv], Mul())
    for k, fn in ((1, Mul), (2, Add)):
        if len(node.inputs) > k and node.inputs[k]:
            v = node.inputs[k]
            if not e.model.is_const(v):
                raise FrontendError(f"{node.describe()}: the scale and bias must be initializers")
            y = e.map([y, e.row_vector(v, e.model.consts[v].astype(np.float32), y)], fn())
    e.val[node.outputs[0]] = y


@handles("LayerNormalization")
def _layer_norm(e: Emitter, node: Node):
    _normalize(e, node, e.act(node.inputs[0], node), centered=True)


@handles("RMSNormalization", "SimplifiedLayerNormalization")
def _rms_norm(e: Emitter, node: Node):
    _normalize(e, node, e.act(node.inputs[0], node), centered=False)


# --- MatMul / Gemm -------------------------------------------------------------------------------------
@handles("MatMul", "Gemm")
def _matmul(e: Emitter, node: Node):
    a, w = node.inputs[:2]
    trans_b = bool(node.attrs.get("transB", 0))
    if node.attrs.get("transA", 0):
        raise FrontendError(f"{node.describe()}: transA=1 is not supported")
    if activation_matmul(e.model, node) and not e.model.is_const(a):
        _matmul_activations(e, node)
        return
    if e.model.is_const(a) or not e.model.is_const(w) or e.model.consts[w].ndim != 2:
        raise FrontendError(f"{node.describe()}: supported is an activation times a 2-D initializer (weights) or "
                            f"times another activation")
    weights = e.model.consts[w].astype(np.float32)
    k, n = weights.shape[::-1] if trans_b else weights.shape
    y = node.outputs[0]
    tn, _ = matmul_out_tile(e.model, e.tiling, node)
    nt = n // tn
    if e.tiling.reread_inputs and a in e.model.inputs and nt > 1 and (a, node.name) not in e.spilled:
        # the graph input read from DRAM once per N tile (the hand-written layers' "mn_mk" schedule) instead of
        # once and repeated on chip; MatMuls reading it alike share the load
        b_, r_, _ = groups_rows_cols(e.model.shapes[a])
        m, tk, kt = b_ * r_ // e.tm, k, 1
        xs = e.load_view(Tensor(a, (r_, k) if b_ == 1 else (b_, r_, k), FP32), (e.tm, k), (m, nt, 1), (1, 0, 1))
    else:
        x = e.act(a, node)  # whole rows, unless this MatMul's N is one tile: then stripes are its K chunks
        m, tk = e.tiles_of(x), x.tn
        kt = k // tk
        if x.stripes:  # (1, M, kt) -> (1, M, 1, kt): the K loop innermost, one N tile
            xs = Reshape(e.g, x.s, 1, 1)
        elif nt > 1:  # (1, M) -> (1, M, nt, 1): each row block once per N tile (on chip: one tile)
            xs = Promote(e.g, RepeatStatic(e.g, x.s, nt), 0)
        else:
            xs = Promote(e.g, Promote(e.g, x.s, 0), 0)
    # tile (k-chunk, n-tile) of the weight; tile numbers of the row-major tiled tensor
    if trans_b:  # [N, K] stored
        wl = LinearOffChipLoad(e.g, Tensor(w, (n, k), FP32, weights), (tn, tk), (m, nt, kt), (0, kt, 1),
                               par_dispatch=e.tiling.par_dispatch)
    else:
        wl = LinearOffChipLoad(e.g, Tensor(w, (k, n), FP32, weights), (tk, tn), (m, nt, kt), (0, 1, nt),
                               par_dispatch=e.tiling.par_dispatch)
    # a K-chunked product accumulates a whole-N row block: too wide for a compute unit, it lives in a memory unit
    prod = MapAccum(e.g, xs, wl, Matmul(weight_transposed=trans_b), Zero(e.tm, tn), 1, compute_bw=e.bw,
                    write_back_mu=kt > 1)
    out = Act(prod, tn, n) if nt > 1 else Act(Flatten(e.g, prod, 0, 1), n, n)
    alpha, beta = node.attrs.get("alpha", 1.0), node.attrs.get("beta", 1.0)
    if alpha != 1.0:
        out = e.pw(out, "mul_c", alpha)
    if len(node.inputs) > 2 and node.inputs[2]:
        c = e.model.consts.get(node.inputs[2])
        if c is None:
            raise FrontendError(f"{node.describe()}: the bias C must be an initializer")
        c = beta * c.astype(np.float32)
        out = e.pw(out, "add_c", scalar(c)) if c.size == 1 else e.map(
            [out, e.row_vector(node.inputs[2], c, out)], Add())
    e.val[y] = out


def _matmul_activations(e: Emitter, node: Node):
    """``A @ B`` of two activations with the same groups (batch x heads): B is packed into one tile per group (the
    reuse buffer, ``rows x cols`` of B) and repeated for each row block of A; B may be a last-two-dims swap,
    read transposed."""
    a, b = node.inputs[:2]
    ga, ra, _ = groups_rows_cols(e.model.shapes[a])
    gb, rb, cb = groups_rows_cols(e.model.shapes[b])
    trans = b in e.swapped
    src_rows, src_cols = (cb, rb) if trans else (rb, cb)  # B's stream: rows of its Transpose's input
    if ga != gb:
        raise FrontendError(f"{node.describe()}: operands {list(e.model.shapes[a])} and {list(e.model.shapes[b])} "
                            f"must have the same leading dims (no broadcasting of the right operand)")
    x, bs = e.act(a, node), e.act(b, node)
    packed = bs.s
    if src_rows > e.tm:  # (1, G * rows/tm) -> (1, G, rows/tm) -> (1, G) of one [rows, cols] tile per group
        packed = Accum(e.g, Reshape(e.g, bs.s, src_rows // e.tm, 0), RetileRow(), Empty(0, src_cols), 1,
                       compute_bw=0, out_dtype=Tile(FP32, src_rows, src_cols), name=f"pack[{b}->{node.name}]")
    m_per_group = ra // e.tm
    if m_per_group > 1:  # (1, G) -> (1, G, M_g) -> (1, G * M_g): each group's tile once per row block of A
        packed = Flatten(e.g, RepeatStatic(e.g, packed, m_per_group), 0, 1)
    n = e.model.shapes[node.outputs[0]][-1]
    e.val[node.outputs[0]] = e.map([x, Act(packed, src_cols, src_cols)], Matmul(weight_transposed=trans))
    assert e.val[node.outputs[0]].n == n


@handles("Concat")
def _concat(e: Emitter, node: Node):
    """Concatenation along the rows (``axis`` = -2; e.g. a KV cache and the new token's keys): per group, each
    input's row blocks in turn, merged by a Reassemble on a static selector (on chip: nothing)."""
    y = node.outputs[0]
    rank = len(e.model.shapes[y])
    ins = [v for v in node.inputs if v]
    if rank < 2 or node.attrs.get("axis", 0) % rank != rank - 2 or any(e.model.is_const(v) for v in ins):
        raise FrontendError(f"{node.describe()}: supported is a concatenation of activations along the rows "
                            f"(axis -2)")
    g, _, n = groups_rows_cols(e.model.shapes[y])
    blocks = []
    for v in ins:
        gv, rv, nv = groups_rows_cols(e.model.shapes[v])
        if (gv, nv) != (g, n) or rv % e.tm:
            raise FrontendError(f"{node.describe()}: input {v!r} {list(e.model.shapes[v])} must share the leading "
                                f"dims and the last dim, with rows a multiple of tile_m {e.tm}")
        blocks.append(rv // e.tm)
    acts = [e.act(v, node) for v in ins]  # whole rows (layouts.needs_rows)
    order = np.concatenate([np.repeat(np.arange(len(ins)), blocks)] * g)
    sel = SelectorSource(e.g, np.eye(len(ins), dtype=np.int8)[order], len(ins))
    # (1, M_i) -> (M_i,): a rank-0 stream, whose elements carry no stop level into the Reassemble's groups
    merged = Reassemble(e.g, [Flatten(e.g, a.s, 0, 1) for a in acts], sel, 0)
    merged.assume_shape(0, (1, len(order), 1))  # one tile per selector element
    e.val[y] = Act(Flatten(e.g, merged, 0, 1), n, n)


@handles("Gather")
def _gather(e: Emitter, node: Node):
    """An embedding lookup: rows of a constant table at the token ids given at lowering (``values=``), one random
    read of a ``1 x D`` tile per id, packed ``tile_m`` rows at a time (a retile of one row block)."""
    table, ids = node.inputs[:2]
    if not e.model.is_const(table) or e.model.consts[table].ndim != 2 or node.attrs.get("axis", 0) != 0 \
            or ids not in e.model.bound:
        raise FrontendError(f"{node.describe()}: supported is a Gather of rows (axis 0) of a 2-D initializer at "
                            f"token ids given with from_onnx(..., values=...)")
    data = e.model.consts[table].astype(np.float32)
    v, d = data.shape
    idx = e.model.bound[ids].reshape(-1)
    if idx.min() < 0 or idx.max() >= v:
        raise FrontendError(f"{node.describe()}: token id {int(idx.max() if idx.max() >= v else idx.min())} is "
                            f"outside the table's {v} rows")
    rows = RandomOffChipLoad(e.g, MetadataSource(e.g, idx), Tensor(table, (v, d), FP32, data), (1, d),
                             par_dispatch=e.tiling.par_dispatch)
    out = node.outputs[0]
    if e.tm == 1:  # one-row tiles already
        e.val[out] = Act(rows, d, d)
        return
    packed = Accum(e.g, Reshape(e.g, rows, e.tm, 0), RetileRow(), Empty(0, d), 1, compute_bw=0,
                   out_dtype=Tile(FP32, e.tm, d), name=f"retile[{out}]")
    e.converter_ops[out] = packed
    e.val[out] = Act(packed, d, d)


# --- layout-only ops -----------------------------------------------------------------------------------
@handles("Transpose")
def _transpose(e: Emitter, node: Node):
    x, y = node.inputs[0], node.outputs[0]
    kind = transpose_kind(e.model, node)
    if kind == "swap":  # read transposed by its MatMul (converters.plan checked the readers)
        e.val[y] = e.act(x, node)
        e.swapped.add(y)
        return
    conv = e.conversions[node.name]
    a = e.act(x, node)
    producer = e.producer.get(x)
    names = dict(producer_name=producer.name if producer else x, consumer_name=node.name)
    if kind == "leading":
        b, r, _ = groups_rows_cols(e.model.shapes[x])
        out = convert(e.g, Reshape(e.g, a.s, r, 0), conv.producer, conv.consumer, **names)  # (1, B, R) -> (1, R, B)
        e.val[y] = Act(Flatten(e.g, out, 0, 1), a.n, a.n)
    elif conv.buffer.method == "compatible":  # one row block per sequence: (1, B, H) either way, no buffer
        h = conv.producer.shape[1]
        e.val[y] = (Act(Flatten(e.g, a.s, 0, 1), a.tn, a.tn) if a.merged else
                    Act(Reshape(e.g, a.s, h, 0), a.tn, a.tn * h, merged=True))
        return
    elif a.merged:  # [B, S, H, hd] -> [B, H, S, hd]: (1, B*Sm, H) -> (1, B, Sm, H) -> (1, B, H, Sm) -> rows
        sm = conv.producer.trips[1]
        out = convert(e.g, Reshape(e.g, a.s, sm, 1), conv.producer, conv.consumer, **names)
        e.val[y] = Act(Flatten(e.g, out, 0, 2), a.tn, a.tn)
    else:  # [B, H, S, hd] rows -> [B, S, H, hd]: (1, B*H*Sm) -> (1, B, H, Sm) -> (1, B, Sm, H) -> (1, B*Sm, H)
        h, sm = conv.producer.shape[1], conv.producer.trips[2]
        s = Reshape(e.g, Reshape(e.g, a.s, sm, 0), h, 1)
        out = convert(e.g, s, conv.producer, conv.consumer, **names)
        e.val[y] = Act(Flatten(e.g, out, 1, 2), a.tn, a.tn * h, merged=True)
    e.converter_ops[node.name] = out
