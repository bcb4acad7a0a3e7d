"""STeP emission of MatMul / Gemm (weights, or two activations) and embedding Gathers (handlers of
:mod:`stepsim.frontend.emit`)."""

from __future__ import annotations

import numpy as np

from stepsim.base.errors import FrontendError
from stepsim.frontend.emit import Act, Emitter, handles
from stepsim.frontend.ir import Node, scalar
from stepsim.frontend.layouts import (
    activation_matmul,
    groups_rows_cols,
    matmul_out_tile,
)
from stepsim.graph import (
    FP32,
    Accum,
    Add,
    Bufferize,
    Empty,
    Flatten,
    LinearOffChipLoad,
    MapAccum,
    Matmul,
    MetadataSource,
    Promote,
    RandomOffChipLoad,
    RepeatStatic,
    Reshape,
    RetileRow,
    Streamify,
    Tile,
    Zero,
)


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
    groups = _weight_groups(e, node)
    weights = e.model.consts[w].astype(np.float32)
    k, n = weights.shape[-2:][::-1] if trans_b else weights.shape[-2:]
    y = node.outputs[0]
    tn, _ = matmul_out_tile(e.model, e.tiling, node)
    nt = n // tn
    heads = 1  # a head view's heads as rows (_per_head)
    if e.tiling.reread_inputs and a in e.model.inputs and nt > 1 and groups == 1 and (a, node.name) not in e.spilled:
        # the graph input read from DRAM once per N tile (the hand-written layers' "mn_mk" schedule) instead of
        # once and repeated on chip; MatMuls reading it alike share the load
        b_, r_, _ = groups_rows_cols(e.model.shapes[a])
        m, tk, kt = b_ * r_ // e.tm, k, 1
        xs = e.load_view(e.tensor(a, (r_, k) if b_ == 1 else (b_, r_, k)), (e.tm, k), (m, nt, 1), (1, 0, 1))
    else:
        x = e.act(a, node)  # whole rows, unless this MatMul's N is one tile: then stripes are its K chunks
        heads = _per_head(e, node, x, k, nt)
        if heads > 1:  # a head view's stripes are its rows, one head's [tm, k] after another: (1, M, H) -> (1, M H)
            x = Act(Flatten(e.g, x.s, 0, 1), k, k)
        m, tk = e.tiles_of(x), x.tn
        kt = k // tk
        if x.stripes:  # (1, M, kt) -> (1, M, 1, kt): the K loop innermost, one N tile
            xs = Reshape(e.g, x.s, 1, 1)
        elif nt > 1:  # (1, M) -> (1, M, nt, 1): each row block once per N tile (on chip: one tile)
            xs = Promote(e.g, RepeatStatic(e.g, x.s, nt), 0)
        else:
            xs = Promote(e.g, Promote(e.g, x.s, 0), 0)
    # tile (k-chunk, n-tile) of the weight; tile numbers of the row-major tiled tensor
    if groups > 1:
        # weight g ([G * K, N] stored) read once and held on chip while group g's row blocks stream (a decode's
        # per-head W_UK at tile_m 1 would otherwise be read once per request): (G, [nt, kt]) -> (G, M/G, nt, kt)
        held = Bufferize(e.g, LinearOffChipLoad(e.g, e.tensor(w, (groups * k, n), weights.reshape(-1, n)), (tk, tn),
                                                (groups, nt, kt), (kt * nt, 1, nt), stream_dtype=FP32,
                                                par_dispatch=e.tiling.par_dispatch), 2)
        wl = Flatten(e.g, Streamify(e.g, held, [m // groups], 2), 2, 3)  # -> (M, nt, kt)
    elif trans_b:  # [N, K] stored
        wl = LinearOffChipLoad(e.g, e.tensor(w, (n, k), weights), (tn, tk), (m, nt, kt), (0, kt, 1),
                               stream_dtype=FP32, par_dispatch=e.tiling.par_dispatch)
    else:
        wl = LinearOffChipLoad(e.g, e.tensor(w, (k, n), weights), (tk, tn), (m, nt, kt), (0, 1, nt),
                               stream_dtype=FP32, par_dispatch=e.tiling.par_dispatch)
    # a K-chunked product accumulates a whole-N row block: too wide for a compute unit, it lives in a memory unit
    prod = MapAccum(e.g, xs, wl, Matmul(weight_transposed=trans_b), Zero(e.tm, tn), 1, compute_bw=e.bw,
                    write_back_mu=kt > 1)
    out = Act(prod, tn, n) if nt > 1 else Act(Flatten(e.g, prod, 0, 1), n, n)
    if heads > 1:  # (1, M H) -> (1, M, H): the output's head view
        out = Act(Reshape(e.g, out.s, heads, 0), n, n * heads, merged=True)
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


def _per_head(e: Emitter, node: Node, x: Act, k: int, nt: int) -> int:
    """The heads ``H`` when ``x`` is a head view ``[B, S, H, k]`` streamed as one ``k``-wide stripe per head
    (a per-head split of a projection, :mod:`stepsim.frontend.mla`) multiplied by a 2-D weight (DeepSeek's RoPE
    on its rope part as ``rotate_half``'s MatMul, :mod:`stepsim.frontend.patterns`), else 1. The stripes are
    then the MatMul's rows, and its output the same head view of ``N``-wide stripes."""
    if not (x.merged and x.tn == k == e.model.shapes[node.inputs[0]][-1] and x.n > k):
        return 1
    if nt > 1:
        raise FrontendError(f"{node.describe()}: a product of a head view [.., {x.n // k}, {k}] needs its output "
                            f"[.., {e.model.shapes[node.outputs[0]][-1]}] in one column tile (tile_n)")
    return x.n // k


def _weight_groups(e: Emitter, node: Node) -> int:
    """1 for an activation times a 2-D weight; ``G`` for an activation ``[.., G, rows, K]`` times a 3-D
    initializer ``[G, K, N]``: one weight per group of rows (a per-head product: an Einsum's ``bshd,hdc->bshc``
    as ``[H, B S, d]`` by ``[H, d, c]``, :mod:`stepsim.frontend.einsum`), each group's row blocks reading its own
    weight."""
    a, w = node.inputs[:2]
    weights = e.model.consts.get(w)
    if e.model.is_const(a) or weights is None or weights.ndim not in (2, 3) or (
            weights.ndim == 3 and (node.op_type != "MatMul" or
                                   groups_rows_cols(e.model.shapes[a])[0] != weights.shape[0])):
        raise FrontendError(f"{node.describe()}: supported is an activation times a 2-D initializer (weights), "
                            f"times a 3-D initializer of one weight per group of its leading dims, or times "
                            f"another activation")
    return weights.shape[0] if weights.ndim == 3 else 1


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
    e.val[node.outputs[0]] = e.map([x, Act(packed, src_cols, src_cols)], Matmul(weight_transposed=trans))


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
    rows = RandomOffChipLoad(e.g, MetadataSource(e.g, idx), e.tensor(table, (v, d), data), (1, d), stream_dtype=FP32,
                             par_dispatch=e.tiling.par_dispatch)
    out = node.outputs[0]
    if e.tm == 1:  # one-row tiles already
        e.val[out] = Act(rows, d, d)
        return
    packed = Accum(e.g, Reshape(e.g, rows, e.tm, 0), RetileRow(), Empty(0, d), 1, compute_bw=0,
                   out_dtype=Tile(FP32, e.tm, d), name=f"retile[{out}]")
    e.converter_ops[out] = packed
    e.val[out] = Act(packed, d, d)
