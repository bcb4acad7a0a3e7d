"""STeP emission of elementwise ops, activations, reductions over the last axis, Softmax and the norms
(handlers of :mod:`stepsim.frontend.emit`)."""

from __future__ import annotations

import math

import numpy as np

from stepsim.base.errors import FrontendError
from stepsim.frontend.emit import Act, Emitter, handles
from stepsim.frontend.ir import Node, scalar
from stepsim.frontend.layouts import (
    groups_rows_cols,
)
from stepsim.graph import (
    Add,
    Div,
    Exp,
    Flatten,
    Max,
    Mul,
    RowMax,
    RowSum,
    Silu,
    Sub,
)

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


@handles("SinkSoftmax")
def _sink_softmax(e: Emitter, node: Node):
    """Softmax with one more logit per head in the denominator (:mod:`stepsim.frontend.attention`):
    ``m = max(max z, s_h)``, ``exp(z - m) / (sum exp(z - m) + exp(s_h - m))``. The sinks ``[groups]`` are read as
    one ``tile_m x 1`` tile per row block of each head (a view that repeats the head's ``tile_m`` copies)."""
    z, sinks = node.inputs
    x = e.act(z, node)
    g, r, _ = groups_rows_cols(e.model.shapes[z])
    heads = e.model.consts[sinks].astype(np.float32)
    data = np.repeat(heads, e.tm).reshape(-1, 1)  # head h's logit in rows h * tile_m .. (h + 1) * tile_m - 1
    per = g // heads.size  # groups (batch x heads) per head: the batch, outer
    view = e.load_view(e.tensor(sinks, data.shape, data), (e.tm, 1), (per, heads.size, r // e.tm), (0, 1, 0))
    s = Act(Flatten(e.g, view, 0, 2), 1, 1)
    m = e.map([e.map(x, RowMax()), s], Max())
    ex = e.map(e.map([x, m], Sub()), Exp())
    den = e.map([e.map(ex, RowSum()), e.map(e.map([s, m], Sub()), Exp())], Add())
    e.val[node.outputs[0]] = e.map([ex, den], Div())


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
