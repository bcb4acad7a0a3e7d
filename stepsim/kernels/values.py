"""Functional mode: the value arena that tile tokens point into, and the fp32 tile math.

In functional mode a tile token's ``TK_PAYLOAD`` is a *handle*: the index of a fixed-size block of ``fv`` (one
float32 array) holding the tile's ``rows x cols`` values row-major. Timing never reads values, so timing mode
passes ``fv = fi = None`` and numba compiles a second specialization of every kernel in which all the
``if fi is not None`` blocks are pruned: timing mode pays nothing for functional mode.

Ownership (reference counts, so Broadcast / RepeatStatic / Streamify replay never copy a tile): every place
holding a token (a channel slot, a unit's stash register, a Bufferize arena row) owns one reference.

* ``emit`` of a fresh handle moves the creator's reference into the channel;
* ``emit_copy`` copies a token, so it takes a new reference (:func:`keep`);
* ``pop`` / ``take`` / ``stash`` move a reference (no count change); the unit that is done with a token it
  consumed, or with its stash after forwarding copies of it, calls :func:`drop`.

A block returns to the free stack when its count reaches zero. Everything outside the handles lives in ``fi``
(int64): the header ``FI_*``, the reference counts, the free stack and a per-unit table ``FU_*`` telling
memory operators where their tensor sits in ``fv`` (after the ``cap + 1`` blocks; the extra block is a spare
that absorbs writes after an allocation failed, so a failure never corrupts memory, and while the status is OK
serves as a transposed matmul operand's scratch).

Failures do not stop a step midway: they set ``fi[FI_STATUS]``. :data:`VS_FULL` (out of handles) and
:data:`VS_BAD_ADDRESS` (a tile index outside its tensor) stop the event loop after the step. :data:`VS_TOO_BIG`
(a tile larger than a block) lets the run finish without values (tile math is skipped once a status is set,
timing is unaffected) so that ``FI_ARG2`` ends as the largest tile of the whole run, and the caller reruns once
with blocks that size.

Numerics: fp32 values, fp32 accumulation (products of fp32 summed in fp32, in index order). Tensors stored
as bf16 are rounded to bf16 on load and on store (:func:`bf16_round_into`: round to nearest, ties to even, the
rule of :func:`stepsim.workloads.reference.round_to_bf16`).
"""

from __future__ import annotations

import math

import numpy as np

from stepsim.kernels import abi as A
from stepsim.kernels.jit import kernel

# ------------------------------------------------------------------------------------------ fi header
FI_BLOCK = 0  # floats per block
FI_CAP = 1  # handles (blocks) in the arena; block FI_CAP is the spare (see alloc, _matmul)
FI_TOP = 2  # free-stack size
FI_LIVE = 3  # handles in use
FI_PEAK = 4  # most handles in use at once
FI_STATUS = 5  # VS_* below
FI_ARG = 6  # the unit that failed
FI_ARG2 = 7  # VS_TOO_BIG: elements of the largest tile that did not fit; VS_BAD_ADDRESS: the tile index
FI_REFS = 8  # offset in fi of the reference counts (cap words)
FI_STACK = 9  # offset in fi of the free stack (cap words)
FI_UNITS = 10  # offset in fi of the per-unit table (N_FU words per unit)
FI_ALLOCS = 11  # allocations so far (functional work counter)
N_FI_HEADER = 12

VS_OK = 0
VS_TOO_BIG = 1
VS_FULL = 2  # this and the codes above stop the run
VS_BAD_ADDRESS = 3

# ---------------------------------------------------------------------- per-unit table (memory ops)
FU_MEM = 0  # first float of the unit's tensor in fv (-1: the unit has no tensor)
FU_COLS = 1  # tensor columns: the row stride in floats (leading dims are folded into rows)
FU_GRID_COLS = 2  # tiles per tensor row (cols / tile cols)
FU_TILE_ROWS = 3
FU_TILE_COLS = 4
FU_BF16 = 5  # 1: round to bf16 on load / store
FU_N_TILES = 6  # tiles in the tensor (addresses are checked against it)
FU_STRIDE = 7  # first of PA view-dim strides (loads); strides for at most N_STRIDES view dims
N_STRIDES = 8
N_FU = FU_STRIDE + N_STRIDES


# ------------------------------------------------------------------------------------------ handles
@kernel
def alloc(fi, n_elems, u):
    """A fresh handle (reference count 1) for a tile of ``n_elems`` floats.

    reads/writes: the arena state in fi / returns: the handle, or the spare block after a failure (the
    status then says why; the run stops after this step).
    """
    cap = fi[FI_CAP]
    if n_elems > fi[FI_BLOCK]:
        if fi[FI_STATUS] == VS_OK:
            fi[FI_STATUS] = VS_TOO_BIG
            fi[FI_ARG] = u
        if fi[FI_STATUS] == VS_TOO_BIG:
            fi[FI_ARG2] = max(fi[FI_ARG2], n_elems)
        return cap
    top = fi[FI_TOP]
    if top == 0:
        if fi[FI_STATUS] < VS_FULL:
            fi[FI_STATUS] = VS_FULL
            fi[FI_ARG] = u
        return cap
    top -= 1
    h = fi[fi[FI_STACK] + top]
    fi[FI_TOP] = top
    fi[fi[FI_REFS] + h] = 1
    live = fi[FI_LIVE] + 1
    fi[FI_LIVE] = live
    fi[FI_PEAK] = max(fi[FI_PEAK], live)
    fi[FI_ALLOCS] += 1
    return h


@kernel
def incref(fi, h):
    """reads/writes: h's reference count / returns: nothing (no-op for -1 and the spare)."""
    if 0 <= h < fi[FI_CAP]:
        fi[fi[FI_REFS] + h] += 1


@kernel
def decref(fi, h):
    """reads/writes: h's reference count, the free stack / returns: nothing (no-op for -1 and the spare)."""
    if 0 <= h < fi[FI_CAP]:
        r = fi[FI_REFS] + h
        fi[r] -= 1
        if fi[r] == 0:
            fi[fi[FI_STACK] + fi[FI_TOP]] = h
            fi[FI_TOP] += 1
            fi[FI_LIVE] -= 1


@kernel
def tile_handle(src, row, col):
    """reads: the token at ``src[row, col:]`` / writes: nothing / returns: its handle, -1 if not a tile."""
    if src[row, col + A.TK_FLAGS] & A.KIND_MASK == A.KIND_TILE:
        return src[row, col + A.TK_PAYLOAD]
    return -1


@kernel
def keep(fi, src, row, col):
    """Take a reference for a copy of the token at ``src[row, col:]`` (no-op in timing mode)."""
    if fi is not None:
        incref(fi, tile_handle(src, row, col))


@kernel
def drop(fi, src, row, col):
    """Release the reference held by the token at ``src[row, col:]`` (no-op in timing mode)."""
    if fi is not None:
        decref(fi, tile_handle(src, row, col))


# ------------------------------------------------------------------------------------------ numerics
@kernel
def bf16_round_into(src, dst):
    """``dst[i]`` = float32 ``src[i]`` rounded to the nearest bf16 value, ties to even (float32 slices of one
    length; they may be the same slice).

    On the bit pattern: adding ``0x7FFF`` plus the lowest kept bit to the 16 bits bf16 drops carries into the
    kept bits exactly when the dropped part is above half, or half with an odd kept part; the carry runs
    through the exponent, so values past the largest bf16 become inf and subnormals round like normals. NaNs
    keep their sign and high payload and get the quiet bit. The same rule as
    :func:`stepsim.workloads.reference.round_to_bf16` (one integer add per element, no float arithmetic).
    """
    sb = src.view(np.uint32)
    db = dst.view(np.uint32)
    for i in range(sb.size):
        u = sb[i]
        if (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000):  # NaN
            db[i] = (u & np.uint32(0xFFFF0000)) | np.uint32(0x00400000)
        else:
            db[i] = (u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)


@kernel
def _silu(x):
    return x / (np.float32(1.0) + np.exp(-x))


@kernel
def _pointwise(kind, c, x):
    """One element of a Pointwise function (``stepsim.kernels.abi.PW_*``) with constant ``c`` (fp32)."""
    if kind == A.PW_NEG:
        return -x
    if kind == A.PW_SQRT:
        return np.sqrt(x)
    if kind == A.PW_RELU:
        return max(x, np.float32(0.0))
    if kind == A.PW_SIGMOID:
        return np.float32(1.0) / (np.float32(1.0) + np.exp(-x))
    if kind == A.PW_TANH:
        return np.tanh(x)
    if kind == A.PW_ERF:
        return np.float32(math.erf(x))
    if kind == A.PW_GELU:
        return np.float32(0.5) * x * (np.float32(1.0) + np.float32(math.erf(x * np.float32(0.7071067811865476))))
    if kind == A.PW_ADD_C:
        return x + c
    if kind == A.PW_MUL_C:
        return x * c
    if kind == A.PW_RSUB_C:
        return c - x
    if kind == A.PW_RDIV_C:
        return c / x
    if kind == A.PW_POW_C:
        return x ** c
    if kind == A.PW_MAX_C:
        return max(x, c)
    if kind == A.PW_MIN_C:
        return min(x, c)
    if kind == A.PW_SUB_C:
        return x - c
    return x / c  # PW_DIV_C


@kernel
def pointwise_constant(param):
    """The float32 constant of a Pointwise function's ``fn_param`` (its bits at 8..39), decoded arithmetically
    (exact in float64 for every finite float32)."""
    bits = (param >> 8) & 0xFFFFFFFF
    sign = -1.0 if bits >> 31 else 1.0
    e = (bits >> 23) & 255
    m = bits & 0x7FFFFF
    if e == 0:  # zero and subnormals
        return np.float32(sign * m * 2.0 ** -149)
    return np.float32(sign * (1.0 + m / 8388608.0) * 2.0 ** (e - 127))


@kernel
def _elementwise(fn, a, b):
    if fn == A.FN_ADD:
        return a + b
    if fn == A.FN_SUB:
        return a - b
    if fn == A.FN_MUL:
        return a * b
    if fn == A.FN_DIV:
        return a / b
    return max(a, b)  # FN_MAX


@kernel
def _tile_addr(fi, u, t):
    """reads: the unit table / writes: the status on a bad address / returns: float offset of tile t, -1."""
    f = fi[FI_UNITS] + u * N_FU
    if t < 0 or t >= fi[f + FU_N_TILES]:
        if fi[FI_STATUS] == VS_OK:
            fi[FI_STATUS] = VS_BAD_ADDRESS
            fi[FI_ARG] = u
            fi[FI_ARG2] = t
        return -1
    grid = fi[f + FU_GRID_COLS]
    return fi[f + FU_MEM] + (t // grid) * fi[f + FU_TILE_ROWS] * fi[f + FU_COLS] + (t % grid) * fi[f + FU_TILE_COLS]


@kernel
def view_tile(fi, payload, u, voff, vlen, i):
    """Tile index read by element i of a load's view: ``sum_k idx_k * stride_k`` (idx: i unravelled over the
    view shape ``payload[voff:voff+vlen]``, outermost first). reads: view shape, strides / returns: the index."""
    f = fi[FI_UNITS] + u * N_FU
    t = 0
    for k in range(vlen - 1, -1, -1):
        d = payload[voff + k]
        t += (i % d) * fi[f + FU_STRIDE + k]
        i //= d
    return t


@kernel
def copy_tile(fv, fi, u, t, h, rows, cols, to_tensor):
    """Copy between block h (``rows x cols``, row-major) and tile t of unit u's tensor: a load
    (``to_tensor`` False) or a store (True). At most the tensor's tile is copied; values are rounded to bf16
    if the tensor is bf16 (on load and on store)."""
    if fi[FI_STATUS] != VS_OK:
        return
    at = _tile_addr(fi, u, t)
    if at < 0:
        return
    f = fi[FI_UNITS] + u * N_FU
    stride = fi[f + FU_COLS]
    blk = h * fi[FI_BLOCK]
    n_cols = min(cols, fi[f + FU_TILE_COLS])
    for r in range(min(rows, fi[f + FU_TILE_ROWS])):
        block_row = fv[blk + r * cols:blk + r * cols + n_cols]
        tensor_row = fv[at + r * stride:at + r * stride + n_cols]
        src = block_row if to_tensor else tensor_row
        dst = tensor_row if to_tensor else block_row
        if fi[f + FU_BF16]:
            bf16_round_into(src, dst)
        else:
            for c in range(n_cols):
                dst[c] = src[c]


@kernel
def fill_zero(fv, fi, h, n):
    """Zero the first n floats of block h (init, pad and empty tiles)."""
    if fi[FI_STATUS] != VS_OK:
        return
    base = h * fi[FI_BLOCK]
    for k in range(n):
        fv[base + k] = np.float32(0.0)


@kernel
def copy_rows(fv, fi, hs, cols, r0, n_rows, hd, d0):
    """Copy rows ``r0 .. r0+n_rows`` of block hs (``cols`` wide) to rows ``d0 ..`` of block hd."""
    if fi[FI_STATUS] != VS_OK:
        return
    b = fi[FI_BLOCK]
    s = hs * b + r0 * cols
    d = hd * b + d0 * cols
    for k in range(n_rows * cols):
        fv[d + k] = fv[s + k]


@kernel
def copy_col(fv, fi, hs, rows, cols, c, hd):
    """Copy column c of block hs (``rows x cols``) to block hd as a ``rows x 1`` tile."""
    if fi[FI_STATUS] != VS_OK:
        return
    b = fi[FI_BLOCK]
    for r in range(rows):
        fv[hd * b + r] = fv[hs * b + r * cols + c]


@kernel
def concat_cols(fv, fi, ha, ar, ac, hx, xc, ho):
    """Block ho = [a | x] (both ``ar`` rows; a is ``ar x ac``, x ``ar x xc``)."""
    if fi[FI_STATUS] != VS_OK:
        return
    b = fi[FI_BLOCK]
    oc = ac + xc
    for r in range(ar):
        for c in range(ac):
            fv[ho * b + r * oc + c] = fv[ha * b + r * ac + c]
        for c in range(xc):
            fv[ho * b + r * oc + ac + c] = fv[hx * b + r * xc + c]


@kernel
def _matmul(fv, fi, pa, pb, po, m, k_len, n, b_cols, b_transposed):
    """``fv[po:] [m, n] = fv[pa:] [m, k_len] @ B``; B at ``pb`` is ``[k_len, n]`` or, ``b_transposed``,
    ``[n, k_len]`` (row stride ``b_cols`` either way).

    Every output sums its products in ascending k (bit-identical to the plain triple loop). Why the loops look
    like this: indexing the one big array with computed offsets kept LLVM from vectorizing; through row slices
    the inner loop over n vectorizes (about 8x faster on AVX2). A transposed B is first copied as ``[k_len, n]``
    into the spare block (free while the status is OK; B fits in a block, so its transpose does too).
    """
    if b_transposed:
        pt = fi[FI_CAP] * fi[FI_BLOCK]
        for j in range(n):
            for k in range(k_len):
                fv[pt + k * n + j] = fv[pb + j * b_cols + k]
        pb = pt
        b_cols = n
    for i in range(m):
        out = fv[po + i * n:po + (i + 1) * n]
        for j in range(n):
            out[j] = np.float32(0.0)
        a = fv[pa + i * k_len:pa + (i + 1) * k_len]
        for k in range(k_len):
            x = a[k]
            row = fv[pb + k * b_cols:pb + k * b_cols + n]
            for j in range(n):
                out[j] += x * row[j]


@kernel
def map_values(fv, fi, fn, param, ha, ar, ac, a_off, hb, br, bc, ho, orows, ocols):
    """Block ho (``orows x ocols``) = fn(a, b) for a Map function (fp32).

    matmul: ``a [ar, K] @ b`` with b ``[K, N]`` (``param`` 0) or ``[N, K]`` (1, weight transposed);
    elementwise: numpy broadcasting of size-1 dims; unary: SiLU, exp, row sum / max (``[R, 1]``);
    set_offset: a copy of a; row_append: a copy of a with b (``1 x C``) written at row ``a_off``.
    """
    if fi[FI_STATUS] != VS_OK:
        return
    blk = fi[FI_BLOCK]
    pa = ha * blk
    pb = hb * blk
    po = ho * blk
    if fn == A.FN_MATMUL:
        _matmul(fv, fi, pa, pb, po, orows, ac, ocols, bc, param == 1)
    elif fn == A.FN_ADD or fn == A.FN_SUB or fn == A.FN_MUL or fn == A.FN_DIV or fn == A.FN_MAX:
        for i in range(orows):
            ia = i if ar > 1 else 0
            ib = i if br > 1 else 0
            for j in range(ocols):
                x = fv[pa + ia * ac + (j if ac > 1 else 0)]
                y = fv[pb + ib * bc + (j if bc > 1 else 0)]
                fv[po + i * ocols + j] = _elementwise(fn, x, y)
    elif fn == A.FN_SILU or fn == A.FN_EXP:
        for k in range(ar * ac):
            x = fv[pa + k]
            fv[po + k] = _silu(x) if fn == A.FN_SILU else np.exp(x)
    elif fn == A.FN_POINTWISE:
        kind = param & 255
        c = pointwise_constant(param)
        for k in range(ar * ac):
            fv[po + k] = _pointwise(kind, c, fv[pa + k])
    elif fn == A.FN_ROWSUM or fn == A.FN_ROWMAX:
        for i in range(ar):
            s = fv[pa + i * ac]
            for j in range(1, ac):
                x = fv[pa + i * ac + j]
                s = s + x if fn == A.FN_ROWSUM else max(s, x)
            fv[po + i] = s
    elif fn == A.FN_SOFTMAX_NORMALIZE:  # a = [acc | l | m] -> acc / l
        d = ac - 2
        for i in range(ar):
            total = fv[pa + i * ac + d]
            for k in range(d):
                fv[po + i * d + k] = fv[pa + i * ac + k] / total
    elif fn == A.FN_SET_OFFSET or fn == A.FN_ROW_APPEND:
        for k in range(ar * ac):
            fv[po + k] = fv[pa + k]
        if fn == A.FN_ROW_APPEND and 0 <= a_off < ar:
            for j in range(min(ac, bc)):
                fv[po + a_off * ac + j] = fv[pb + j]


@kernel
def fold_values(fv, fi, fn, ha, ar, ac, hx, xr, xc, ho, orows, ocols):
    """Block ho = fold(acc a, element x) for an Accum / Scan function (an empty acc takes x's values).

    add / mul / max: elementwise with broadcasting; retile_row: a's rows then x's; retile_col: a's columns
    then x's.
    """
    if fi[FI_STATUS] != VS_OK:
        return
    blk = fi[FI_BLOCK]
    if fn == A.FN_RETILE_ROW:
        copy_rows(fv, fi, ha, ac if ar > 0 else xc, 0, ar, ho, 0)
        copy_rows(fv, fi, hx, xc, 0, xr, ho, ar)
    elif fn == A.FN_RETILE_COL:
        if ac == 0:
            copy_rows(fv, fi, hx, xc, 0, xr, ho, 0)
        else:
            concat_cols(fv, fi, ha, xr, ac, hx, xc, ho)
    elif ar * ac == 0:
        for k in range(xr * xc):
            fv[ho * blk + k] = fv[hx * blk + k]
    else:
        map_values(fv, fi, fn, 0, ha, ar, ac, 0, hx, xr, xc, ho, orows, ocols)


@kernel
def online_softmax(fv, fi, ha, hs, q, n, hv, d, head_dim, ho):
    """Block ho = the FlashAttention fold of a score tile and its value tile into the softmax state (fp32).

    ``ha`` / ``ho``: the state ``[q, d + 2]`` = ``[acc | l | m]`` (``l == 0``: nothing folded yet, so the old
    max is ignored); ``hs``: scores ``[q, n]``; ``hv``: values ``[n, d]``. With ``x = s / sqrt(head_dim)``
    (``head_dim`` 0: ``x = s``), per row: ``m' = max(m, max_j x_j)``, ``c = exp(m - m')``,
    ``l' = c*l + sum_j exp(x_j - m')``, ``acc' = c*acc + sum_j exp(x_j - m') v_j`` (sums in ascending j).
    Every exponent is <= 0, so nothing overflows.
    """
    if fi[FI_STATUS] != VS_OK:
        return
    blk = fi[FI_BLOCK]
    w = d + 2
    pa = ha * blk
    ps = hs * blk
    pv = hv * blk
    po = ho * blk
    scale = np.float32(1.0) if head_dim == 0 else np.float32(1.0 / math.sqrt(head_dim))
    for i in range(q):
        l_old = fv[pa + i * w + d]
        m_old = fv[pa + i * w + d + 1]
        m = fv[ps + i * n] * scale
        for j in range(1, n):
            m = max(m, fv[ps + i * n + j] * scale)
        c = np.float32(0.0)
        if l_old != 0:
            m = max(m, m_old)
            c = np.exp(m_old - m)
        for k in range(d):
            fv[po + i * w + k] = fv[pa + i * w + k] * c
        l_new = l_old * c
        for j in range(n):
            p = np.exp(fv[ps + i * n + j] * scale - m)
            l_new += p
            for k in range(d):
                fv[po + i * w + k] += p * fv[pv + j * d + k]
        fv[po + i * w + d] = l_new
        fv[po + i * w + d + 1] = m
