"""Compute operators: Map (unary / binary), Accum, MapAccum, Scan (docs/timing_model.md §3.3, §6).

Costs (cycles), with L(x) = ceil(bytes/PMU_BW) if x.read_from_mu, W(x) = ceil(bytes/PMU_BW) if write_back_mu:

* Map: PEEK inputs; ``now += max(L1 + L2, F, W(out))``; ENQ(out, now) with in1's stop; DEQ inputs.
* Accum(rank r): PEEK; non-closing (stop < r): ``now += max(L, F)``, DEQ. Closing: ``now += max(L, F, W(init))``,
  DEQ, ENQ (stop - r, Val when equal); the accumulator resets to the init tile.
* MapAccum: as Accum with two lock-stepped inputs and ``L1 + L2``.
* Scan (@5fbd7223): PEEK; ``now += max(L, F, W(out))``; DEQ; ENQ one output per input (stop unchanged); reset
  at stop >= rank.

F is ``ceil(FLOPs / compute_bw)`` for FLOP functions, 1 for the fixed-cost ones, 0 for RetileRow/Col. Output
tile shapes are computed from the tokens at run time (dynamic tiles follow the trace).
"""

from __future__ import annotations

from stepsim.kernels import abi as A
from stepsim.kernels import values as V
from stepsim.kernels.channels import can_pop, can_push, head_row, pop
from stepsim.kernels.hbm import E_STATUS, E_STATUS_ARG
from stepsim.kernels.jit import inline_kernel, kernel
from stepsim.kernels.units_common import block, emit, load_cycles, pmu_cycles, seen_closed, spend, wait_input
from stepsim.kernels.values import drop, keep

R_INIT = A.US_R0 + 0  # 1 once the accumulator holds the init tile
# the last operand shapes of a Map / MapAccum and their compute cycles (see _cached_map_cycles); shapes start at
# -1, so the first firing always computes
R_COST_A_ROWS = A.US_R0 + 1
R_COST_A_COLS = A.US_R0 + 2
R_COST_B_ROWS = A.US_R0 + 3
R_COST_B_COLS = A.US_R0 + 4
R_COST = A.US_R0 + 5


@kernel
def _ceil_div(a, b):
    return (a + b - 1) // b


@kernel
def stops_conflict(s1, s2):
    """Lock-stepped operands disagree iff both carry a stop and the levels differ.

    A plain value (stop 0) may pair with a stop: the artifact's attention pairs a rank-0 Partition output
    (step-perf never emits stops there, §7.1) with a metadata stream ending in ValStop(1), and the paper ran
    it, so step-perf accepts that pair. The output carries input 1's level (§6: "carries the input's stop").
    reads/writes: nothing / returns: bool.
    """
    return s1 != s2 and s1 > 0 and s2 > 0


@kernel
def fn_map_cycles(fn, param, bw, a_rows, a_cols, b_rows, b_cols):
    """reads/writes: nothing / returns: the compute cycles of a Map function on operands of these shapes."""
    if fn == A.FN_MATMUL:
        n = b_rows if param == 1 else b_cols
        return _ceil_div(2 * a_rows * a_cols * n, bw)
    if fn == A.FN_ADD or fn == A.FN_SUB or fn == A.FN_MUL or fn == A.FN_DIV or fn == A.FN_MAX:
        return _ceil_div(max(b_rows, a_rows) * max(b_cols, a_cols), bw)
    if fn == A.FN_SILU:
        return _ceil_div(8 * a_rows * a_cols, bw)
    if fn == A.FN_EXP:
        return _ceil_div(4 * a_rows * a_cols, bw)
    if fn == A.FN_ROWSUM or fn == A.FN_ROWMAX:
        return _ceil_div(a_rows * a_cols, bw)
    if fn == A.FN_ONLINE_SOFTMAX:  # a: scores [q, n], b: values [n, d]
        q, n, d = a_rows, a_cols, b_cols
        return _ceil_div(2 * q * n * d + 8 * q * n + 2 * q * d + 6 * q, bw)
    if fn == A.FN_SOFTMAX_NORMALIZE:
        return _ceil_div(a_rows * (a_cols - 2), bw)
    if fn == A.FN_POINTWISE:
        return _ceil_div(A.POINTWISE_FLOPS[param & 255] * a_rows * a_cols, bw)
    if fn == A.FN_SET_OFFSET or fn == A.FN_ROW_APPEND or fn == A.FN_CACHE_WRITE_ADDR:
        return 1
    return 0


@inline_kernel
def _cached_map_cycles(us, u, fn, param, bw, a_rows, a_cols, b_rows, b_cols):
    """:func:`fn_map_cycles`, remembered per unit for the last operand shapes (R_COST_*).

    A unit's function, parameter and bandwidth never change and its operands mostly keep their shape, so
    this saves the integer division on almost every firing (about 20 % of a Map firing's cost).
    reads/writes: us[u] cost registers / returns: cycles.
    """
    if (a_rows == us[u, R_COST_A_ROWS] and a_cols == us[u, R_COST_A_COLS] and b_rows == us[u, R_COST_B_ROWS]
            and b_cols == us[u, R_COST_B_COLS]):
        return us[u, R_COST]
    cycles = fn_map_cycles(fn, param, bw, a_rows, a_cols, b_rows, b_cols)
    us[u, R_COST_A_ROWS] = a_rows
    us[u, R_COST_A_COLS] = a_cols
    us[u, R_COST_B_ROWS] = b_rows
    us[u, R_COST_B_COLS] = b_cols
    us[u, R_COST] = cycles
    return cycles


@inline_kernel
def fn_map(us, u, fn, param, bw, sa, ra, ca, sb, rb, cb):
    """Apply a Map function to operand tokens a (and b) of unit u.

    reads: the operand tokens, us[u] cost registers / writes: us[u] cost registers /
    returns: (cycles, kind flags, bytes/elem, rows, cols, offset, payload) of the output (MU flag not set).
    """
    a_rows = sa[ra, ca + A.TK_ROWS]
    a_cols = sa[ra, ca + A.TK_COLS]
    a_bytes = sa[ra, ca + A.TK_BYTES]
    b_rows = sb[rb, cb + A.TK_ROWS]
    b_cols = sb[rb, cb + A.TK_COLS]
    cycles = _cached_map_cycles(us, u, fn, param, bw, a_rows, a_cols, b_rows, b_cols)
    # valid rows follow the operand that supplies the output's rows, so RowStreamify(filter_mask) after a
    # chain of row-preserving compute still drops exactly the padded rows of the packed token tile
    a_valid = sa[ra, ca + A.TK_OFFSET]
    if fn == A.FN_MATMUL:
        n = b_rows if param == 1 else b_cols
        return cycles, A.KIND_TILE, a_bytes, a_rows, n, a_valid, -1
    if fn == A.FN_ADD or fn == A.FN_SUB or fn == A.FN_MUL or fn == A.FN_DIV or fn == A.FN_MAX:
        r = max(b_rows, a_rows)
        c = max(b_cols, a_cols)
        valid = a_valid if a_rows == r else sb[rb, cb + A.TK_OFFSET]
        return cycles, A.KIND_TILE, a_bytes, r, c, valid, -1
    if fn == A.FN_ROWSUM or fn == A.FN_ROWMAX:
        return cycles, A.KIND_TILE, a_bytes, a_rows, 1, a_valid, -1
    if fn == A.FN_ONLINE_SOFTMAX:  # -> the [q, d + 2] state
        return cycles, A.KIND_TILE, a_bytes, a_rows, b_cols + 2, a_valid, -1
    if fn == A.FN_SOFTMAX_NORMALIZE:
        return cycles, A.KIND_TILE, a_bytes, a_rows, a_cols - 2, a_valid, -1
    if fn == A.FN_SET_OFFSET:
        return cycles, A.KIND_TILE, a_bytes, a_rows, a_cols, sb[rb, cb + A.TK_PAYLOAD], -1
    if fn == A.FN_CACHE_WRITE_ADDR:
        value = sa[ra, ca + A.TK_PAYLOAD] * param + sb[rb, cb + A.TK_PAYLOAD] - 1
        return cycles, A.KIND_SCALAR, a_bytes, 1, 1, 1, value
    return cycles, A.KIND_TILE, a_bytes, a_rows, a_cols, a_valid, -1  # SiLU, Exp, RowAppend, others


@kernel
def fn_fold(fn, bw, sa, ra, ca, sx, rx, cx):
    """Fold element x into accumulator a (Accum / Scan functions).

    reads: the accumulator and element tokens / writes: nothing /
    returns: (cycles, flags, bytes/elem, rows, cols, offset, payload) of the new accumulator; for RetileRow /
    RetileCol the flags carry x's read_from_mu (inherited), otherwise the caller sets it.
    """
    a_rows = sa[ra, ca + A.TK_ROWS]
    a_cols = sa[ra, ca + A.TK_COLS]
    a_bytes = sa[ra, ca + A.TK_BYTES]
    x_rows = sx[rx, cx + A.TK_ROWS]
    x_cols = sx[rx, cx + A.TK_COLS]
    x_bytes = sx[rx, cx + A.TK_BYTES]
    x_flags = sx[rx, cx + A.TK_FLAGS]
    if fn == A.FN_RETILE_ROW or fn == A.FN_RETILE_COL:
        valid = 0 if x_flags & A.FLAG_PAD else sx[rx, cx + A.TK_OFFSET]
        flags = A.KIND_TILE | (x_flags & A.FLAG_MU)
        if fn == A.FN_RETILE_ROW:
            return 0, flags, x_bytes, a_rows + x_rows, x_cols, sa[ra, ca + A.TK_OFFSET] + valid, -1
        return 0, flags, x_bytes, x_rows, a_cols + x_cols, x_rows, -1
    if fn == A.FN_SIGNAL_REQ_ALL_READ:
        return 1, A.KIND_SCALAR, 8, 1, 1, 1, 1
    nbytes = a_bytes if a_bytes > 0 else x_bytes
    valid = sx[rx, cx + A.TK_OFFSET]
    if a_rows * a_cols == 0:
        r = x_rows
        c = x_cols
    else:
        r = max(x_rows, a_rows)
        c = max(x_cols, a_cols)
        valid = max(valid, sa[ra, ca + A.TK_OFFSET])
    return _ceil_div(r * c, bw), A.KIND_TILE, nbytes, r, c, valid, -1


@kernel
def _init_acc(u, up, us, fv, fi):
    """reads: up[u] init tile / writes: us[u] accumulator (token A; functional: a fresh zero tile) / returns:
    nothing."""
    wb = up[u, A.UP_A0 + A.PA_WRITE_BACK]
    fn = up[u, A.UP_A0 + A.PA_FN]
    col = A.US_TOK_A
    us[u, col + A.TK_STOP] = 0
    us[u, col + A.TK_FLAGS] = (A.KIND_SCALAR if fn == A.FN_SIGNAL_REQ_ALL_READ else A.KIND_TILE) | (
        A.FLAG_MU if wb else 0)
    us[u, col + A.TK_BYTES] = up[u, A.UP_A0 + A.PA_INIT_BYTES]
    us[u, col + A.TK_ROWS] = up[u, A.UP_A0 + A.PA_INIT_ROWS]
    us[u, col + A.TK_COLS] = up[u, A.UP_A0 + A.PA_INIT_COLS]
    us[u, col + A.TK_OFFSET] = 0
    us[u, col + A.TK_PAYLOAD] = -1
    if fi is not None and fn != A.FN_SIGNAL_REQ_ALL_READ:
        n = up[u, A.UP_A0 + A.PA_INIT_ROWS] * up[u, A.UP_A0 + A.PA_INIT_COLS]
        h = V.alloc(fi, n, u)
        V.fill_zero(fv, fi, h, n)
        us[u, col + A.TK_PAYLOAD] = h
    us[u, R_INIT] = 1


@kernel
def _set_acc(u, us, fn, wb, res, handle):
    """reads: a fold result / writes: us[u] accumulator (token A), its payload ``handle`` when >= 0 (functional
    mode) / returns: nothing."""
    col = A.US_TOK_A
    flags = res[1]
    if fn != A.FN_RETILE_ROW and fn != A.FN_RETILE_COL and wb:
        flags |= A.FLAG_MU
    us[u, col + A.TK_FLAGS] = flags
    us[u, col + A.TK_BYTES] = res[2]
    us[u, col + A.TK_ROWS] = res[3]
    us[u, col + A.TK_COLS] = res[4]
    us[u, col + A.TK_OFFSET] = res[5]
    us[u, col + A.TK_PAYLOAD] = handle if handle >= 0 else res[6]


@kernel
def _mismatch(u, eng, us):
    eng[E_STATUS] = A.ST_MISMATCH
    eng[E_STATUS_ARG] = u
    return A.STEP_BLOCKED


@kernel
def _map_values(u, fn, param, slots, r1, r2, rows, cols, fv, fi):
    """Functional mode: compute a Map's output tile. reads: the operand tiles / writes: a fresh block /
    returns: its handle (set_offset shares operand 1's block: its values do not change)."""
    c = A.SL_TOKEN
    h1 = V.tile_handle(slots, r1, c)
    if fn == A.FN_SET_OFFSET:
        V.incref(fi, h1)
        return h1
    h = V.alloc(fi, rows * cols, u)
    V.map_values(fv, fi, fn, param, h1, slots[r1, c + A.TK_ROWS], slots[r1, c + A.TK_COLS], slots[r1, c + A.TK_OFFSET],
                 V.tile_handle(slots, r2, c), slots[r2, c + A.TK_ROWS], slots[r2, c + A.TK_COLS], h, rows, cols)
    return h


@kernel
def _fold_values(u, us, fn, hx, xr, xc, rows, cols, fv, fi):
    """Functional mode: the next accumulator tile (``rows x cols``): fn(accumulator, x) for the
    ``xr x xc`` tile in block hx. The old accumulator block is released (the register owns one reference).
    reads: the accumulator and x / writes: a fresh block / returns: the new accumulator's handle.
    """
    acc = A.US_TOK_A
    ha = us[u, acc + A.TK_PAYLOAD]
    h = V.alloc(fi, rows * cols, u)
    V.fold_values(fv, fi, fn, ha, us[u, acc + A.TK_ROWS], us[u, acc + A.TK_COLS], hx, xr, xc, h, rows, cols)
    V.decref(fi, ha)
    return h


@kernel
def _online_softmax_values(u, us, head_dim, slots, r1, r2, rows, cols, fv, fi):
    """Functional mode: the next softmax state (``rows x cols``) of an online_softmax MapAccum from the score
    tile (slot r1) and the value tile (slot r2). The old state block is released.
    reads: the state and both tiles / writes: a fresh block / returns: its handle.
    """
    c = A.SL_TOKEN
    ha = us[u, A.US_TOK_A + A.TK_PAYLOAD]
    h = V.alloc(fi, rows * cols, u)
    V.online_softmax(fv, fi, ha, V.tile_handle(slots, r1, c), slots[r1, c + A.TK_ROWS], slots[r1, c + A.TK_COLS],
                     V.tile_handle(slots, r2, c), slots[r2, c + A.TK_COLS], head_dim, h)
    V.decref(fi, ha)
    return h


@kernel
def step_map(u, up, us, in_ch, out_ch, chs, slots, payload, sel_ptr, sel_idx, hw, arena, eng, hfree, hq, fv, fi, tl):
    """reads: inputs / writes: output, input credits, us[u] / returns: DONE when the inputs close."""
    start = up[u, A.UP_IN_START]
    c1 = in_ch[start]
    binary = up[u, A.UP_N_IN] == 2
    c2 = in_ch[start + 1] if binary else c1
    out = out_ch[up[u, A.UP_OUT_START]]
    fn = up[u, A.UP_A0 + A.PA_FN]
    param = up[u, A.UP_A0 + A.PA_FN_PARAM]
    bw = up[u, A.UP_A0 + A.PA_COMPUTE_BW]
    wb = up[u, A.UP_A0 + A.PA_WRITE_BACK]
    pmu = hw[A.HW_PMU_BW]
    while True:
        if not can_pop(chs, c1):
            if seen_closed(us, u, chs, c1, tl):
                if not binary or seen_closed(us, u, chs, c2, tl):
                    return A.STEP_DONE
                if can_pop(chs, c2):  # input 2 still has elements: the inputs disagree
                    return _mismatch(u, eng, us)
                return block(us, u, c2, A.WAIT_EMPTY)  # input 2 may still close: wait for it
            return block(us, u, c1, A.WAIT_EMPTY)
        if binary and not can_pop(chs, c2):
            if seen_closed(us, u, chs, c2, tl):
                return _mismatch(u, eng, us)
            return block(us, u, c2, A.WAIT_EMPTY)
        if not can_push(chs, out):
            return block(us, u, out, A.WAIT_FULL)
        r1 = head_row(chs, c1)
        wait_input(us, u, slots[r1, A.SL_STAMP], c1, tl)
        load = load_cycles(slots, r1, A.SL_TOKEN, pmu)
        r2 = r1
        if binary:
            r2 = head_row(chs, c2)
            wait_input(us, u, slots[r2, A.SL_STAMP], c2, tl)
            load += load_cycles(slots, r2, A.SL_TOKEN, pmu)
            if stops_conflict(slots[r1, A.SL_TOKEN + A.TK_STOP], slots[r2, A.SL_TOKEN + A.TK_STOP]):
                return _mismatch(u, eng, us)
        res = fn_map(us, u, fn, param, bw, slots, r1, A.SL_TOKEN, slots, r2, A.SL_TOKEN)
        cost = res[0]
        cost = max(cost, load)
        if wb:
            store = pmu_cycles(res[2] * res[3] * res[4], pmu)
            cost = max(cost, store)
        spend(us, u, cost, tl)
        value = res[6]
        if fi is not None and res[1] == A.KIND_TILE:
            value = _map_values(u, fn, param, slots, r1, r2, res[3], res[4], fv, fi)
        emit(us, u, chs, slots, out, us[u, A.US_CLOCK], slots[r1, A.SL_TOKEN + A.TK_STOP],
             res[1] | (A.FLAG_MU if wb else 0), res[2], res[3], res[4], res[5], value, tl)
        pop(chs, slots, c1, us[u, A.US_CLOCK], tl)
        drop(fi, slots, r1, A.SL_TOKEN)
        if binary:
            pop(chs, slots, c2, us[u, A.US_CLOCK], tl)
            drop(fi, slots, r2, A.SL_TOKEN)
        us[u, A.US_FIRES] += 1


@kernel
def step_accum(u, up, us, in_ch, out_ch, chs, slots, payload, sel_ptr, sel_idx, hw, arena, eng, hfree, hq, fv, fi, tl):
    """Accum, MapAccum and Scan (by opcode).

    reads: inputs / writes: output, input credits, us[u] accumulator / returns: DONE when the inputs close.
    """
    op = up[u, A.UP_OPCODE]
    start = up[u, A.UP_IN_START]
    c1 = in_ch[start]
    binary = op == A.OP_MAP_ACCUM
    c2 = in_ch[start + 1] if binary else c1
    out = out_ch[up[u, A.UP_OUT_START]]
    fn = up[u, A.UP_A0 + A.PA_FN]
    param = up[u, A.UP_A0 + A.PA_FN_PARAM]
    bw = up[u, A.UP_A0 + A.PA_COMPUTE_BW]
    wb = up[u, A.UP_A0 + A.PA_WRITE_BACK]
    rank = up[u, A.UP_A0 + A.PA_RANK]
    pmu = hw[A.HW_PMU_BW]
    init_store = 0
    if wb:
        init_store = pmu_cycles(up[u, A.UP_A0 + A.PA_INIT_ROWS] * up[u, A.UP_A0 + A.PA_INIT_COLS]
                                * up[u, A.UP_A0 + A.PA_INIT_BYTES], pmu)
    if us[u, R_INIT] == 0:
        _init_acc(u, up, us, fv, fi)
    while True:
        if us[u, A.US_PHASE] == 1:
            # pending output in token B (Accum / MapAccum: DEQ happened before this ENQ)
            if not can_push(chs, out):
                return block(us, u, out, A.WAIT_FULL)
            b = A.US_TOK_B
            emit(us, u, chs, slots, out, us[u, A.US_CLOCK], us[u, b + A.TK_STOP], us[u, b + A.TK_FLAGS],
                 us[u, b + A.TK_BYTES], us[u, b + A.TK_ROWS], us[u, b + A.TK_COLS], us[u, b + A.TK_OFFSET],
                 us[u, b + A.TK_PAYLOAD], tl)
            us[u, A.US_PHASE] = 0
        if not can_pop(chs, c1):
            if seen_closed(us, u, chs, c1, tl):
                if not binary or seen_closed(us, u, chs, c2, tl):
                    drop(fi, us, u, A.US_TOK_A)  # the init tile of a group that never came
                    return A.STEP_DONE
                if can_pop(chs, c2):  # input 2 still has elements: the inputs disagree
                    return _mismatch(u, eng, us)
                return block(us, u, c2, A.WAIT_EMPTY)  # input 2 may still close: wait for it
            return block(us, u, c1, A.WAIT_EMPTY)
        if binary and not can_pop(chs, c2):
            if seen_closed(us, u, chs, c2, tl):
                return _mismatch(u, eng, us)
            return block(us, u, c2, A.WAIT_EMPTY)
        r1 = head_row(chs, c1)
        wait_input(us, u, slots[r1, A.SL_STAMP], c1, tl)
        load = load_cycles(slots, r1, A.SL_TOKEN, pmu)
        stop = slots[r1, A.SL_TOKEN + A.TK_STOP]
        r2 = r1
        prod_rows = prod_cols = 0  # MapAccum: shape of fn(in1, in2) before it is added to the accumulator
        if binary:
            r2 = head_row(chs, c2)
            wait_input(us, u, slots[r2, A.SL_STAMP], c2, tl)
            load += load_cycles(slots, r2, A.SL_TOKEN, pmu)
            if stops_conflict(stop, slots[r2, A.SL_TOKEN + A.TK_STOP]):
                return _mismatch(u, eng, us)
            prod = fn_map(us, u, fn, param, bw, slots, r1, A.SL_TOKEN, slots, r2, A.SL_TOKEN)
            acc = A.US_TOK_A
            a_rows = us[u, acc + A.TK_ROWS]
            a_cols = us[u, acc + A.TK_COLS]
            rows = prod[3]
            cols = prod[4]
            valid = prod[5]
            if a_rows * a_cols != 0:
                rows = max(rows, a_rows)
                cols = max(cols, a_cols)
                valid = max(valid, us[u, acc + A.TK_OFFSET])
            nbytes = us[u, acc + A.TK_BYTES] if us[u, acc + A.TK_BYTES] > 0 else prod[2]
            res = (prod[0], A.KIND_TILE, nbytes, rows, cols, valid, -1)
            prod_rows = prod[3]
            prod_cols = prod[4]
        else:
            res = fn_fold(fn, bw, us, u, A.US_TOK_A, slots, r1, A.SL_TOKEN)
        handle = -1
        if fi is not None and res[1] & A.KIND_MASK == A.KIND_TILE:
            if fn == A.FN_ONLINE_SOFTMAX:  # MapAccum folding both operands into the softmax state
                handle = _online_softmax_values(u, us, param, slots, r1, r2, res[3], res[4], fv, fi)
            elif binary:  # MapAccum: acc + fn(in1, in2)
                hp = _map_values(u, fn, param, slots, r1, r2, prod_rows, prod_cols, fv, fi)
                handle = _fold_values(u, us, A.FN_ADD, hp, prod_rows, prod_cols, res[3], res[4], fv, fi)
                V.decref(fi, hp)
            else:
                handle = _fold_values(u, us, fn, V.tile_handle(slots, r1, A.SL_TOKEN), slots[r1, A.SL_TOKEN + A.TK_ROWS],
                                      slots[r1, A.SL_TOKEN + A.TK_COLS], res[3], res[4], fv, fi)
        comp = res[0]
        cost = max(comp, load)
        if op == A.OP_SCAN:
            if wb:
                store = pmu_cycles(res[2] * res[3] * res[4], pmu)
                cost = max(cost, store)
            spend(us, u, cost, tl)
            pop(chs, slots, c1, us[u, A.US_CLOCK], tl)
            drop(fi, slots, r1, A.SL_TOKEN)
            _set_acc(u, us, fn, wb, res, handle)
            for k in range(A.N_TOKEN):
                us[u, A.US_TOK_B + k] = us[u, A.US_TOK_A + k]
            keep(fi, us, u, A.US_TOK_B)  # the pending output shares the accumulator's values
            us[u, A.US_TOK_B + A.TK_STOP] = stop
            if stop >= rank:
                drop(fi, us, u, A.US_TOK_A)
                _init_acc(u, up, us, fv, fi)
            us[u, A.US_FIRES] += 1
            us[u, A.US_PHASE] = 1
            continue
        closing = stop >= rank
        if closing and init_store > cost:
            cost = init_store
        spend(us, u, cost, tl)
        pop(chs, slots, c1, us[u, A.US_CLOCK], tl)
        drop(fi, slots, r1, A.SL_TOKEN)
        if binary:
            pop(chs, slots, c2, us[u, A.US_CLOCK], tl)
            drop(fi, slots, r2, A.SL_TOKEN)
        _set_acc(u, us, fn, wb, res, handle)
        us[u, A.US_FIRES] += 1
        if closing:
            for k in range(A.N_TOKEN):  # the accumulator's reference moves to the pending output
                us[u, A.US_TOK_B + k] = us[u, A.US_TOK_A + k]
            us[u, A.US_TOK_B + A.TK_STOP] = stop - rank
            _init_acc(u, up, us, fv, fi)
            us[u, A.US_PHASE] = 1
