"""STeP emission of the ops that only move data: reshapes (of leading dims, into and out of heads), Transposes
(through the layout converters), Concat along the rows (handlers of :mod:`stepsim.frontend.emit`)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from stepsim.base.errors import FrontendError
from stepsim.frontend.emit import Act, Emitter, handles
from stepsim.frontend.ir import Node
from stepsim.frontend.layouts import (
    groups_rows_cols,
    head_merge,
    head_split,
    read_transposed,
    split_sizes,
    swap_view,
    transpose_kind,
    views,
)
from stepsim.frontend.spill import spill_reordered, spill_transposed, transposed_rows, transposed_view
from stepsim.graph import (
    Bufferize,
    Flatten,
    Partition,
    Promote,
    Reassemble,
    Reshape,
    SelectorSource,
    Streamify,
)
from stepsim.graph.ops_convert import convert as convert_on_chip


@handles("Identity", "Dropout", "Cast", "Reshape", "Flatten", "Squeeze", "Unsqueeze")
def _same_stream(e: Emitter, node: Node):
    """Ops that leave the row-tile stream as it is: the last dim and the row order are kept."""
    x, y = node.inputs[0], node.outputs[0]
    # compute is fp32 throughout: a cast between float types (FLOAT, FLOAT16, BFLOAT16) keeps the stream, which
    # the check's dtype tolerance covers for bf16 / fp16 models
    if node.op_type == "Cast" and node.attrs.get("to") not in (1, 10, 16):
        raise FrontendError(f"{node.describe()}: casts to element type {node.attrs.get('to')} are not supported "
                            f"(float activations only)")
    if head_split(e.model, node):  # the producer streams one hd-wide stripe per head: a view
        a = e.act(x, node)
        heads, hd = head_split(e.model, node)
        if a.tn != hd:
            raise FrontendError(f"{node.describe()}: splitting into {heads} heads of {hd} needs its input to stream "
                                f"{hd}-wide stripes (its MatMul's tile_n = {hd}), got {a.tn}")
        e.val[y] = Act(a.s, hd, a.n, merged=True)
        return
    merge = head_merge(e.model, node)
    if merge and e.val.get(x, Act(None, 0, 0)).merged:  # heads' stripes: the merged value's
        a = e.act(x, node)
        e.val[y] = Act(a.s, a.tn, a.n)
        return
    if merge and e.tm == 1 and not e.val.get(x, Act(None, 0, 0)).stripes:
        # rows [.., S, H, hd] at tile_m 1 (a per-head Einsum's result): one token's heads after another, which are
        # the merged value's stripes, (1, B S H) -> (1, B S, H)
        heads, hd = merge
        a = e.act(x, node)
        e.val[y] = Act(Reshape(e.g, a.s, heads, 0), hd, hd * heads)
        return
    sx, sy = e.model.shapes[x], e.model.shapes[y]
    a = e.val.get(x)
    if a is not None and a.merged and a.stripes and tuple(sx) != tuple(sy) and sy[-1] == a.tn:
        # a head view [B, S, H, hd] reshaped so its heads are rows (an Einsum's [B S, H, hd]): at tile_m 1 its
        # stripes, one token's head after another, are those rows
        if e.tm != 1:
            raise FrontendError(f"{node.describe()}: {list(sx)} -> {list(sy)} reads a head view's heads as rows, "
                                f"which streams at tile_m 1 (got {e.tm})")
        a = e.act(x, node)
        e.val[y] = Act(Flatten(e.g, a.s, 0, 1), a.tn, a.tn)
        return
    gx, gy = groups_rows_cols(sx), groups_rows_cols(sy)
    if gx[2] != gy[2] or gx[0] * gx[1] != gy[0] * gy[1] or gy[1] % e.tm:
        raise FrontendError(f"{node.describe()}: {list(sx)} -> {list(sy)} changes the last dim or splits rows off "
                            f"tile boundaries; only reshapes of the leading dims stream on chip")
    e.val[y] = e.act(x, node)


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


# --- layout-only ops -----------------------------------------------------------------------------------
@handles("Transpose")
def _transpose(e: Emitter, node: Node):
    x, y = node.inputs[0], node.outputs[0]
    kind = transpose_kind(e.model, node)
    if read_transposed(e.model, node):  # a graph input: the load reads it in the transposed order
        perm = list(node.attrs.get("perm", range(len(e.model.shapes[x]) - 1, -1, -1)))
        e.val[y] = e.load_transposed(x, perm, merged=y in views(e.model))
        return
    if kind == "swap" and swap_view(e.model, node):  # read transposed by its MatMuls
        e.val[y] = e.act(x, node)
        e.swapped.add(y)
        return
    if kind == "swap":  # x^T: the memory reads x element by element in x^T's order (fusion.SWAP_REASON)
        e.val[y] = _materialized_swap(e, node)
        return
    conv = e.conversions[node.name]
    # a spilled input is read back in the transposed order (stepsim.frontend.spill): no converter buffer
    spilled = (x, node.name) in e.spilled and conv.buffer.method != "compatible"
    a = e.act(x, node, through_spill=not spilled)
    producer = e.producer.get(x)
    names = dict(producer_name=producer.name if producer else x, consumer_name=node.name)

    def convert(g, s, p, c, **names):
        if spilled:
            return spill_reordered(g, s, f"{x}->{node.name}", p, c, par_dispatch=e.tiling.par_dispatch)
        return convert_on_chip(g, s, p, c, **names)
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
    if spilled:
        e.spilled_converters.add(node.name)
    else:
        e.converter_ops[node.name] = out


def _materialized_swap(e: Emitter, node: Node) -> Act:
    """A swap of the last two dims as its own row tiles: a graph input read straight from memory as 1x1 tiles in
    the swap's order, a computed value spilled (its edge is, :data:`stepsim.frontend.fusion.SWAP_REASON`) and read
    back so; the elements packed into ``tile_m x rows`` tiles (:func:`stepsim.frontend.spill.transposed_rows`)."""
    x, y = node.inputs[0], node.outputs[0]
    groups, rows, cols = groups_rows_cols(e.model.shapes[x])
    if cols % e.tm:
        raise FrontendError(f"{node.describe()}: tile_m {e.tm} does not divide the {cols} rows of its output "
                            f"{list(e.model.shapes[y])}")
    if x in e.inputs:  # one read of the graph input, in the transposed order
        trips, strides = transposed_view(groups, rows, cols)
        tensor = e.tensor(x, (rows, cols) if groups == 1 else (groups, rows, cols), e.input_data.get(x))
        elements = e.load_view(tensor, (1, 1), trips, strides)
    else:
        a = e.act(x, node, through_spill=False)  # row tiles (a Transpose reads whole rows)
        elements = spill_transposed(e.g, a.s, f"{x}->{node.name}", groups, rows, cols,
                                    par_dispatch=e.tiling.par_dispatch)
    return Act(transposed_rows(e.g, elements, e.tm, rows, f"swap[{node.name}]"), rows, rows)


@handles("Expand")
def _expand(e: Emitter, node: Node):
    """Repeat along one leading dim (grouped-query attention's ``repeat_kv``: ``[B, Hkv, 1, S, hd]`` ->
    ``[B, Hkv, rep, S, hd]``): the block of tiles inside that dim is buffered once and streamed ``rep`` times
    (Bufferize + Streamify; on chip: the block, double-buffered)."""
    x, y = node.inputs[0], node.outputs[0]
    sx, sy = e.model.shapes[x], e.model.shapes[y]
    grown = [i for i, (a, b) in enumerate(zip(sx, sy)) if a != b] if len(sx) == len(sy) else None
    if not grown or len(grown) != 1 or grown[0] >= len(sy) - 2 or sx[grown[0]] != 1:
        raise FrontendError(f"{node.describe()}: {list(sx)} -> {list(sy)}; supported is a repeat along one leading "
                            f"dim of size 1 (grouped-query heads)")
    j, rep = grown[0], sy[grown[0]]
    a = e.act(x, node)
    inner = math.prod(sx[j + 1:-2]) * (sx[-2] // e.tm) * (a.n // a.tn)  # tiles inside the repeated dim
    s = a.s if not a.stripes else Flatten(e.g, a.s, 0, 1)  # (1, M[, nt]) -> one tile dim
    block = Bufferize(e.g, Reshape(e.g, s, inner, 0), 1)  # (1, outer, inner) -> (1, outer) of [inner] buffers
    out = Flatten(e.g, Streamify(e.g, block, [rep], 1), 0, 2)  # (1, outer, rep, inner) -> (1, outer*rep*inner)
    if a.stripes:
        out = Reshape(e.g, out, a.n // a.tn, 0)
    e.val[y] = dataclasses.replace(a, s=out)


@handles("Split")
def _split(e: Emitter, node: Node):
    """A split along the last dim of a stream of column stripes (a fused projection, GPT-2's ``c_attn``): a
    Partition sends each stripe to its part (on chip: nothing); each part streams its own stripes."""
    x = node.inputs[0]
    sizes = split_sizes(e.model, node)
    a = e.act(x, node)
    if sizes is None or any(w % a.tn for w in sizes):
        raise FrontendError(f"{node.describe()}: supported is a split along the last dim into parts that are whole "
                            f"column stripes of its input (stripes {a.tn} wide; the producing MatMul's tile_n)")
    per = [w // a.tn for w in sizes]  # stripes of each part
    m = e.tiles_of(a)
    part_of = np.repeat(np.arange(len(sizes)), per)  # stripe -> part
    hot = np.zeros((m, len(part_of), len(sizes)), np.int8)
    hot[:, np.arange(len(part_of)), part_of] = 1
    s = a.s if a.stripes else Promote(e.g, a.s, 0)  # (1, M, nt)
    part = Partition(e.g, s, SelectorSource(e.g, hot, len(sizes)), 0, len(sizes), name=f"{node.name}.split")
    for i, (v, k) in enumerate(zip(node.outputs, per)):
        part.assume_shape(i, (m * k,))
        out = Promote(e.g, Reshape(e.g, part[i], k, 0), 2)  # (M*k,) -> (M, k) -> (1, M, k)
        e.val[v] = Act(out, a.tn, sizes[i]) if k > 1 else Act(Flatten(e.g, out, 0, 1), sizes[i], sizes[i])
