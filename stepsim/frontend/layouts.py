"""Pass 2: layout assignment. Every activation streams ``tile_m`` rows at a time, in row-major order (a 3-D value
``[B, S, N]`` as ``B`` groups of ``S / tile_m``); within a row block either as one *row tile* (``tile_m`` x the
whole last dim ``N``; stream ``(1, M)``) or as *column stripes* (``tile_m x tn`` tiles, ``n`` innermost; stream
``(1, M, N / tn)``), the layout a MatMul with ``tile_n < N`` produces.

Stripes flow through elementwise ops and into a MatMul whose N is one tile, which takes them as its K chunks
(the same tiles in the same order: compatible layouts, no converter); a consumer that needs whole rows
(reductions, Softmax, norms, Transpose, a MatMul with several N tiles, a binary op whose operands' stripes
differ) gets them from a retile converter (:mod:`stepsim.frontend.converters`).

Shape ops that keep the last dim and the row order (Reshape, Flatten, Squeeze, Unsqueeze merging or splitting
leading dims) are map rewrites: the stream is unchanged. So is a split into heads (``[.., S, H * hd] ->
[.., S, H, hd]``) when the projection before it streams ``hd``-wide stripes (:func:`head_tiles` sets its tile_n),
and a Split of a fused projection into part-wide stripes. A Transpose of heads (``[B, S, H, hd] <->
[B, H, S, hd]``) or of leading dims with one-row tiles is a reorder of the same tiles (a converter,
:mod:`stepsim.frontend.converters`); a swap of the last two dims is read transposed by its MatMul when it is a
MatMul's right operand (``q k^T``), else read back from memory element by element in the swapped order (``x^T W``;
:func:`materialized_swap`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

from stepsim.base.errors import FrontendError
from stepsim.frontend.ir import Model
from stepsim.graph.layout import Layout, Loop

#: default compute bandwidth of every compute operator (FLOPs/cycle), as the workloads' FFNs use
DEFAULT_COMPUTE_BW = 1024


@dataclass(frozen=True)
class Tiling:
    """Tile sizes of a lowering.

    Attributes
    ----------
    tile_m : int or None
        Rows per activation tile (elements); it must divide the rows of every activation (the second-to-last dim
        of a 3-D one). Default: the gcd of those row counts.
    tile_n : int or None
        Columns per MatMul output tile (elements), at most a MatMul's N; default the whole N. ``per_node``
        overrides it per MatMul.
    per_node : dict
        ``{node name: tile_n}``.
    compute_bw : int
        FLOPs per cycle of each compute operator.
    par_dispatch : int
        Requests each off-chip load and store issues per cycle.
    reread_inputs : bool
        A MatMul with several N tiles reads a graph input from off-chip memory once per N tile (the hand-written
        layers' schedule) instead of once, repeated on chip.
    """

    tile_m: int | None = None
    tile_n: int | None = None
    per_node: dict = field(default_factory=dict)
    compute_bw: int = DEFAULT_COMPUTE_BW
    par_dispatch: int = 1
    reread_inputs: bool = False

    def n_tile(self, node_name: str, n: int) -> int:
        tn = self.per_node.get(node_name, self.tile_n) or n
        if node_name not in self.per_node and tn > n:  # the global tile_n caps at a narrower MatMul's N
            tn = n
        if n % tn:
            raise FrontendError(f"node {node_name!r} (MatMul): tile_n {tn} does not divide N = {n}")
        return tn


def tiling_of(tiling) -> Tiling:
    """``from_onnx``'s ``tiling`` (a :class:`Tiling`, a dict of its fields, or None) as a checked Tiling: every
    size an integer of at least 1 (``tile_m`` / ``tile_n`` may be None: chosen), FrontendError naming the field
    otherwise, before anything is lowered (a ``tile_m`` of 0 would divide by zero)."""
    from numbers import Integral

    if tiling is None:
        return Tiling()
    if isinstance(tiling, dict):
        unknown = sorted(set(map(str, tiling)) - {f.name for f in fields(Tiling)})
        if unknown:
            raise FrontendError(f"tiling: unknown field {unknown[0]!r} (fields: "
                                f"{', '.join(f.name for f in fields(Tiling))})")
        tiling = Tiling(**tiling)
    if not isinstance(tiling, Tiling):
        raise FrontendError(f"tiling must be a Tiling or a dict of its fields, got {type(tiling).__name__}")

    def count(name, value, optional):
        ok = isinstance(value, Integral) and not isinstance(value, bool) and value >= 1
        if not ok and not (optional and value is None):
            raise FrontendError(f"tiling: {name} must be an integer of at least 1{' or None' if optional else ''}, "
                                f"got {value!r}")

    count("tile_m", tiling.tile_m, True)
    count("tile_n", tiling.tile_n, True)
    count("compute_bw", tiling.compute_bw, False)
    count("par_dispatch", tiling.par_dispatch, False)
    if not isinstance(tiling.per_node, dict):
        raise FrontendError(f"tiling: per_node must be a dict {{node name: tile_n}}, got {tiling.per_node!r}")
    for node, tn in tiling.per_node.items():
        count(f"per_node[{node!r}]", tn, False)
    if not isinstance(tiling.reread_inputs, bool):
        raise FrontendError(f"tiling: reread_inputs must be True or False, got {tiling.reread_inputs!r}")
    # NumPy integers as Python ints (the graph's operators take ints only)
    return Tiling(*(None if v is None else int(v) for v in (tiling.tile_m, tiling.tile_n)),
                  per_node={k: int(v) for k, v in tiling.per_node.items()}, compute_bw=int(tiling.compute_bw),
                  par_dispatch=int(tiling.par_dispatch), reread_inputs=tiling.reread_inputs)


def groups_rows_cols(shape: tuple) -> tuple[int, int, int]:
    """``(groups, rows, cols)`` of an activation: ``[N]`` -> (1, 1, N), ``[R, N]`` -> (1, R, N), ``[..., S, N]``
    -> (product of the leading dims, S, N) (a batch, or batch x heads)."""
    shape = tuple(shape)
    if len(shape) == 0:
        return 1, 1, 1
    if len(shape) == 1:
        return 1, 1, shape[0]
    return math.prod(shape[:-2]), shape[-2], shape[-1]


def row_layout(shape: tuple, tile_m: int) -> Layout:
    """The row-tile layout of an activation of ``shape`` (see the module docstring)."""
    b, r, n = groups_rows_cols(shape)
    return Layout((b, r, n), (1, tile_m, n), (Loop(0, b, 1), Loop(1, r // tile_m, tile_m)))


def matmul_layout(shape: tuple, tile_m: int, tile_n: int) -> Layout:
    """A MatMul's output layout: ``tile_m x tile_n`` tiles, rows outer, ``n`` inner."""
    b, r, n = groups_rows_cols(shape)
    return Layout((b, r, n), (1, tile_m, tile_n),
                  (Loop(0, b, 1), Loop(1, r // tile_m, tile_m), Loop(2, n // tile_n, tile_n)))


#: ops whose input 0 must arrive as whole rows
ROW_CONSUMERS = frozenset({"ReduceMean", "ReduceSum", "ReduceMax", "Softmax", "SinkSoftmax", "LayerNormalization", "RMSNormalization",
                           "SimplifiedLayerNormalization", "Transpose"})
#: elementwise ops (output layout = input layout)
ELEMENTWISE = frozenset({"Swish", "Relu", "Sigmoid", "Tanh", "Erf", "Sqrt", "Neg", "Exp", "Reciprocal", "Gelu", "Identity",
                         "Dropout", "Cast", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Expand"})
BINARY = frozenset({"Add", "Sub", "Mul", "Div", "Max", "Min", "Pow"})


def head_split(model: Model, node) -> tuple[int, int] | None:
    """``(H, hd)`` if ``node`` is a Reshape splitting the last dim into heads, ``[.., S, H*hd] -> [.., S, H, hd]``."""
    if node.op_type != "Reshape":
        return None
    sx, sy = model.shapes[node.inputs[0]], model.shapes[node.outputs[0]]
    if len(sy) == len(sx) + 1 and sy[:-2] == sx[:-1] and sy[-2] * sy[-1] == sx[-1] and sy[-2] > 1:
        return sy[-2], sy[-1]
    return None


def head_merge(model: Model, node) -> tuple[int, int] | None:
    """``(H, hd)`` if ``node`` is a Reshape merging heads into the last dim, ``[.., S, H, hd] -> [.., S, H*hd]``."""
    if node.op_type != "Reshape":
        return None
    sx, sy = model.shapes[node.inputs[0]], model.shapes[node.outputs[0]]
    if len(sx) == len(sy) + 1 and sx[:-2] == sy[:-1] and sx[-2] * sx[-1] == sy[-1] and sx[-2] > 1:
        return sx[-2], sx[-1]
    return None


def split_sizes(model: Model, node) -> list | None:
    """The part widths of a Split along the last dim, else None."""
    if node.op_type != "Split":
        return None
    rank = len(model.shapes[node.inputs[0]])
    if node.attrs.get("axis", 0) % rank != rank - 1:
        return None
    return [model.shapes[v][-1] for v in node.outputs]


def head_tiles(model: Model) -> dict:
    """``{MatMul node: width}``: a MatMul whose output is split into heads or parts along its last dim (through
    elementwise ops, e.g. its bias, and Splits) streams stripes that wide (the gcd of every head and part width),
    so the splits need no data movement."""
    producers = model.producer()
    forced: dict = {}
    for node in model.nodes:
        heads = head_split(model, node)
        width = heads[1] if heads else math.gcd(*split_sizes(model, node)) if split_sizes(model, node) else None
        v = node.inputs[0]
        while width and v in producers:
            p = producers[v]
            if p.op_type in ("MatMul", "Gemm"):
                forced[p.name] = math.gcd(forced.get(p.name, width), width)
                break
            acts = [u for u in p.inputs[:2] if u and not model.is_const(u)]
            if p.op_type not in ELEMENTWISE | BINARY | {"Split"} or len(acts) != 1:
                break
            v = acts[0]
    return forced


def transpose_kind(model: Model, node) -> str:
    """``"swap"`` (the last two dims: a MatMul's right operand read transposed), ``"heads"`` (``[B, S, H, hd]``
    <-> ``[B, H, S, hd]``), ``"leading"`` (the two leading dims of a 3-D value) or ``"other"``."""
    shape = model.shapes[node.inputs[0]]
    r = len(shape)
    perm = list(node.attrs.get("perm", range(r - 1, -1, -1)))
    if r >= 2 and perm == list(range(r - 2)) + [r - 1, r - 2]:
        return "swap"
    if perm == [0, 2, 1, 3]:
        return "heads"
    if perm == [1, 0, 2]:
        return "leading"
    return "other"


def swap_view(model: Model, node) -> bool:
    """A last-two-dims swap read only as the right operand of MatMuls of two activations (attention's ``k^T``):
    a view its MatMuls read transposed. Any other swap (``x^T W``, a swap that is a graph output, ...) is
    materialized: its input read element by element in the transposed order (:func:`stepsim.frontend.spill.
    transposed_rows`), from the graph input, or through a spill of a computed value."""
    if node.op_type != "Transpose" or transpose_kind(model, node) != "swap":
        return False
    y = node.outputs[0]
    readers = model.consumers().get(y, [])
    return bool(readers) and y not in model.outputs and all(
        activation_matmul(model, n) and n.inputs[1] == y and n.inputs[0] != y for n in readers)


def materialized_swap(model: Model, node) -> bool:
    """A last-two-dims swap that is not a :func:`swap_view`: it streams its own row tiles."""
    return node.op_type == "Transpose" and transpose_kind(model, node) == "swap" and not swap_view(model, node)


def read_transposed(model: Model, node) -> bool:
    """A Transpose of a graph input that keeps its last dim last (not a last-two-dims swap): read straight from
    memory in the transposed order (:meth:`stepsim.frontend.emit.Emitter.load_transposed`), no converter."""
    if node.op_type != "Transpose":
        return False
    x = node.inputs[0]
    if x not in model.inputs or model.is_const(x) or x in model.bound:
        return False
    r = len(model.shapes[x])
    perm = list(node.attrs.get("perm", range(r - 1, -1, -1)))
    return perm[-1] == r - 1 and perm != list(range(r)) and transpose_kind(model, node) != "swap"


def views(model: Model) -> set:
    """Values that never stream in their own shape: a head split's ``[B, S, H, hd]`` (the stripes of its input),
    the ``[B, S, H, hd]`` a head merge reads, and a last-two-dims swap its MatMuls read transposed (:func:`swap_view`)."""
    out = set()
    for node in model.nodes:
        if head_split(model, node):
            out.add(node.outputs[0])
        elif head_merge(model, node):
            out.add(node.inputs[0])
        elif swap_view(model, node):
            out.add(node.outputs[0])
    return out


def activation_matmul(model: Model, node) -> bool:
    """A MatMul of two activations (attention scores, or attention probabilities times values)."""
    return node.op_type == "MatMul" and not model.is_const(node.inputs[1])


def matmul_out_tile(model: Model, tiling: Tiling, node) -> tuple[int, int]:
    """``(tn, N)`` of a MatMul / Gemm node's output."""
    n = model.shapes[node.outputs[0]][-1]
    return tiling.n_tile(node.name, n), n


def assign(model: Model, tiling: Tiling) -> dict:
    """``{activation: tn}``: the column tile of every activation (its last dim ``N`` for row tiles), in node order
    (module docstring)."""
    tn = {v: model.shapes[v][-1] for v in model.inputs if v not in model.bound}
    for node in model.nodes:
        ins = [v for v in node.inputs[:2 if node.op_type in BINARY else 1] if v and not model.is_const(v)]
        out = node.outputs[0]
        cols = model.shapes[out][-1] if model.shapes[out] else 1
        if activation_matmul(model, node):
            tn[out] = cols
        elif node.op_type in ("MatMul", "Gemm"):
            tn[out] = matmul_out_tile(model, tiling, node)[0]
        elif node.op_type in ELEMENTWISE and ins:
            tn[out] = tn.get(ins[0], cols)
        elif node.op_type in BINARY and ins:
            tn[out] = tn[ins[0]] if _same_stripes(model, tn, ins) else cols
        else:
            tn[out] = cols
        for v in node.outputs[1:]:
            tn[v] = model.shapes[v][-1] if model.shapes.get(v) else 1
        if split_sizes(model, node) and ins:  # each part keeps the input's stripes
            for v in node.outputs:
                tn[v] = min(tn[ins[0]], model.shapes[v][-1])
    return tn


def needs_rows(model: Model, tiling: Tiling, tn: dict, node, index: int) -> bool:
    """Whether ``node`` must read its input ``index`` as whole rows (a retile converter goes before it when that
    input streams as stripes)."""
    if node.op_type in ROW_CONSUMERS:
        return index == 0
    if node.op_type == "Concat":
        return True
    if activation_matmul(model, node):
        return True  # the left operand row by row, the right one packed per group
    if node.op_type in ("MatMul", "Gemm"):
        out_tn, n = matmul_out_tile(model, tiling, node)
        return index == 0 and out_tn != n  # one N tile: the stripes are its K chunks
    if node.op_type in BINARY:
        return not _same_stripes(model, tn, [v for v in node.inputs[:2] if v and not model.is_const(v)])
    return False


def _same_stripes(model: Model, tn: dict, acts: list) -> bool:
    """Whether the activation operands of a binary op can be combined tile by tile as they stream: one operand,
    or two of the same last dim streaming the same column tiles."""
    return len(acts) == 1 or (tn[acts[0]] == tn[acts[1]] and model.shapes[acts[0]][-1] == model.shapes[acts[1]][-1])


def stream_layout(shape: tuple, tile_m: int, tn: int) -> Layout:
    """The layout of an activation streaming ``tn`` columns per tile (row tiles when ``tn`` is the last dim)."""
    return row_layout(shape, tile_m) if tn == groups_rows_cols(shape)[2] else matmul_layout(shape, tile_m, tn)


def default_depth(model: Model, tile_m: int, tn: dict) -> int | None:
    """The FIFO depth (elements) a lowered model runs with unless told otherwise: with attention, twice the most
    tiles of any activation's group (row blocks x column tiles), since an edge that bypasses attention (the
    residual, the queries while the keys are packed) holds a whole sequence of tiles while the head Transposes and
    the packing wait for that sequence's last row; the same with a MoE block (each expert packs all its tokens
    before computing); without either, None (the workloads' default)."""
    if not any(activation_matmul(model, n) or n.op_type == "MoE" for n in model.nodes):
        return None
    skip = views(model)
    tiles = [groups_rows_cols(model.shapes[v])[1] // tile_m * (model.shapes[v][-1] // tn.get(v, model.shapes[v][-1]))
             for n in model.nodes for v in n.inputs + n.outputs
             if v and not model.is_const(v) and v not in model.bound and v not in skip]
    return max(2, 2 * max(tiles))


def choose_tile_m(model: Model, tiling: Tiling) -> int:
    """``tiling.tile_m``, checked against every activation's rows, or their gcd."""
    rows = {}
    skip = views(model)
    for node in model.nodes:
        for v in node.inputs + node.outputs:
            if v and not model.is_const(v) and v not in model.bound and v not in skip:
                rows[v] = groups_rows_cols(model.shapes[v])[1]
    if tiling.tile_m is None:
        return math.gcd(*rows.values()) if rows else 1
    bad = next((v for v, r in rows.items() if r % tiling.tile_m), None)
    if bad is not None:
        raise FrontendError(f"tile_m {tiling.tile_m} does not divide the {rows[bad]} rows of {bad!r}")
    return tiling.tile_m
