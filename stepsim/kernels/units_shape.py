"""Shape operators: Flatten, Promote, Reshape, ExpandRef, RepeatStatic, RowStreamify (docs/timing_model.md §7.7).

All spend 0 own cycles except RepeatStatic (+r). Stop-level rules (docs/semantics.md §1.2, §2.5):

* Flatten(min, max): L <= min kept; min < L <= max -> min (Val when min = 0); L > max -> L - (max - min).
* Promote(p): L >= p -> L + 1. Outer promote (p = input rank + 1): each element waits for the next element
  (or the close); the stream's last element gets p.
* Reshape(S, r): the dim at rank r becomes (ceil(D/S), S): L < r kept; L == r -> r, or r + 1 when it completes
  a chunk; L > r -> L + 1. A partial last chunk at rank 0 is padded with pad tiles (burst, pad flag,
  read_from_mu = write_back_mu); the real element becomes Val and the last pad carries L + 1. For a rank-0
  input the close ends the dim (padding happens at the close). ``add_outer_dim``: a chunk-completing element
  waits for the next element (level 1) or the close (level 2). The optional second output is the paper's
  padding-flag stream: per element a Bool scalar (payload 1 on a pad tile, else 0) with the element's stop,
  sent at the same time as the element once both outputs have a free slot (as Broadcast does). step-perf has no
  such output, so it exists only when something reads it and otherwise costs nothing.
* ExpandRef(k): PEEK in; per ref element DEQ ref and ENQ a copy with the ref's stop; DEQ in at ref stop >= k.
* RepeatStatic(r): PEEK; copy i requested at (clock before its credit wait) + i (§9 S10), the last is
  ValStop(s + 1); ``now += r``; DEQ.
* RowStreamify: DEQ a tile; burst its rows (1xC) or columns (Rx1) at now; the last carries the tile's stop
  (+ 1 with ``new_dim``, the FlatMap form).
  With filtering, only the tile's valid rows (TK_OFFSET) are emitted and pad tiles vanish.
"""

from __future__ import annotations

from stepsim.kernels import abi as A
from stepsim.kernels import values as V
from stepsim.kernels.channels import can_pop, can_push, pop
from stepsim.kernels.jit import kernel
from stepsim.kernels.units_common import (
    await_input,
    block,
    consume,
    emit,
    emit_copy,
    look,
    room_on_outputs,
    seen_closed,
    spend,
    stash,
    take,
)
from stepsim.kernels.values import drop

R_I = A.US_R0 + 0
R_N = A.US_R0 + 1
R_OSTOP = A.US_R0 + 2
R_CNT = A.US_R0 + 3  # reshape: steps of the split dim inside the current chunk
R_NPAD = A.US_R0 + 4
R_PADLVL = A.US_R0 + 5
R_CLOSING = A.US_R0 + 6
R_REFSTOP = A.US_R0 + 8
R_PENDING = A.US_R0 + 9


@kernel
def step_flatten_promote(u, up, us, in_ch, out_ch, chs, slots, payload, sel_ptr, sel_idx, hw, arena, eng, hfree,
                         hq, fv, fi, tl):
    """Flatten and (inner) Promote. reads: input / writes: output, us[u] / returns: DONE on close."""
    c = in_ch[up[u, A.UP_IN_START]]
    out = out_ch[up[u, A.UP_OUT_START]]
    op = up[u, A.UP_OPCODE]
    a0 = up[u, A.UP_A0 + 0]
    a1 = up[u, A.UP_A0 + 1]
    rank = up[u, A.UP_A0 + A.PA_RANK]
    while True:
        if us[u, A.US_PHASE] == 0:
            got = await_input(us, u, chs, c, tl)
            if got != A.STEP_READY:
                return got
            row = take(us, u, chs, slots, c, tl)
            stash(us, u, A.US_TOK_A, slots, row, A.SL_TOKEN)
            s = slots[row, A.SL_TOKEN + A.TK_STOP]
            if op == A.OP_FLATTEN:
                if s > a1:
                    s = s - (a1 - a0)
                elif s > a0:
                    s = a0
            elif s >= rank:
                s += 1
            us[u, R_OSTOP] = s
            us[u, A.US_FIRES] += 1
            us[u, A.US_PHASE] = 1
        if not can_push(chs, out):
            return block(us, u, out, A.WAIT_FULL)
        emit_copy(us, u, chs, slots, out, us[u, A.US_CLOCK], us, u, A.US_TOK_A, us[u, R_OSTOP], fi, tl)
        drop(fi, us, u, A.US_TOK_A)
        us[u, A.US_PHASE] = 0


@kernel
def step_promote_outer(u, up, us, in_ch, out_ch, chs, slots, payload, sel_ptr, sel_idx, hw, arena, eng, hfree,
                       hq, fv, fi, tl):
    """Promote of the outermost dim. reads: input / writes: output, us[u] / returns: DONE on close."""
    c = in_ch[up[u, A.UP_IN_START]]
    out = out_ch[up[u, A.UP_OUT_START]]
    p = up[u, A.UP_A0 + A.PA_RANK]
    while True:
        ph = us[u, A.US_PHASE]
        if ph == 0:
            got = await_input(us, u, chs, c, tl)
            if got != A.STEP_READY:
                return got
            row = take(us, u, chs, slots, c, tl)
            stash(us, u, A.US_TOK_A, slots, row, A.SL_TOKEN)
            us[u, A.US_FIRES] += 1
            us[u, A.US_PHASE] = 1
        elif ph == 1:
            # wait for the next element (or the close) to know whether this one is the last
            if can_pop(chs, c):
                look(us, u, chs, slots, c, tl)
                us[u, R_OSTOP] = us[u, A.US_TOK_A + A.TK_STOP]
                us[u, R_CLOSING] = 0
            elif seen_closed(us, u, chs, c, tl):
                us[u, R_OSTOP] = p
                us[u, R_CLOSING] = 1
            else:
                return block(us, u, c, A.WAIT_EMPTY)
            us[u, A.US_PHASE] = 2
        else:
            if not can_push(chs, out):
                return block(us, u, out, A.WAIT_FULL)
            emit_copy(us, u, chs, slots, out, us[u, A.US_CLOCK], us, u, A.US_TOK_A, us[u, R_OSTOP], fi, tl)
            drop(fi, us, u, A.US_TOK_A)
            if us[u, R_CLOSING]:
                return A.STEP_DONE
            us[u, A.US_PHASE] = 0


@kernel
def step_reshape(u, up, us, in_ch, out_ch, chs, slots, payload, sel_ptr, sel_idx, hw, arena, eng, hfree,
                 hq, fv, fi, tl):
    """reads: input / writes: output (data and pad tiles), us[u] / returns: DONE after the close."""
    c = in_ch[up[u, A.UP_IN_START]]
    out = out_ch[up[u, A.UP_OUT_START]]
    S = up[u, A.UP_A0 + A.PA_CHUNK]
    r = up[u, A.UP_A0 + A.PA_RANK]
    pad_rows = up[u, A.UP_A0 + A.PA_PAD_ROWS]
    pad_cols = up[u, A.UP_A0 + A.PA_PAD_COLS]
    pad_bytes = up[u, A.UP_A0 + A.PA_PAD_BYTES]
    add_outer = up[u, A.UP_A0 + A.PA_ADD_OUTER]
    wb = up[u, A.UP_A0 + A.PA_RESHAPE_WB]
    pad_flags = A.KIND_TILE | A.FLAG_PAD | (A.FLAG_MU if wb else 0)
    out_start = up[u, A.UP_OUT_START]
    n_out = up[u, A.UP_N_OUT]  # 2 when the padding flags are read
    flags_out = out_ch[out_start + 1] if n_out == 2 else -1
    while True:
        ph = us[u, A.US_PHASE]
        if ph == 0:
            if not can_pop(chs, c):
                if seen_closed(us, u, chs, c, tl):
                    # the close ends a rank-0 input's split dim: pad a partial chunk
                    if us[u, R_CNT] > 0 and pad_bytes > 0:
                        us[u, R_NPAD] = S - us[u, R_CNT]
                        us[u, R_PADLVL] = 2 if add_outer else 1
                        us[u, R_CNT] = 0
                        us[u, R_CLOSING] = 1
                        us[u, A.US_PHASE] = 2
                        continue
                    return A.STEP_DONE
                return block(us, u, c, A.WAIT_EMPTY)
            row = take(us, u, chs, slots, c, tl)
            stash(us, u, A.US_TOK_A, slots, row, A.SL_TOKEN)
            us[u, A.US_FIRES] += 1
            L = slots[row, A.SL_TOKEN + A.TK_STOP]
            us[u, R_NPAD] = 0
            us[u, A.US_PHASE] = 1
            if L < r:
                us[u, R_OSTOP] = L
            elif L == r:
                cnt = us[u, R_CNT] + 1
                if cnt == S:
                    us[u, R_CNT] = 0
                    us[u, R_OSTOP] = r + 1
                    if add_outer:
                        us[u, A.US_PHASE] = 3
                else:
                    us[u, R_CNT] = cnt
                    us[u, R_OSTOP] = r
            else:
                cnt = us[u, R_CNT] + 1
                us[u, R_CNT] = 0
                if cnt == S or pad_bytes == 0:
                    us[u, R_OSTOP] = L + 1
                else:
                    us[u, R_OSTOP] = r
                    us[u, R_NPAD] = S - cnt
                    us[u, R_PADLVL] = L + 1
        elif ph == 3:
            # add_outer_dim: a chunk-closing element waits for the next element or the close
            if can_pop(chs, c):
                look(us, u, chs, slots, c, tl)
                us[u, R_OSTOP] = 1
            elif seen_closed(us, u, chs, c, tl):
                us[u, R_OSTOP] = 2
            else:
                return block(us, u, c, A.WAIT_EMPTY)
            us[u, A.US_PHASE] = 1
        elif ph == 1:
            if not room_on_outputs(us, u, chs, slots, out_ch, out_start, n_out, tl):
                return A.STEP_BLOCKED
            emit_copy(us, u, chs, slots, out, us[u, A.US_CLOCK], us, u, A.US_TOK_A, us[u, R_OSTOP], fi, tl)
            if flags_out >= 0:
                emit(us, u, chs, slots, flags_out, us[u, A.US_CLOCK], us[u, R_OSTOP], A.KIND_SCALAR, 1, 1, 1, 1, 0, tl)
            drop(fi, us, u, A.US_TOK_A)
            us[u, A.US_PHASE] = 2 if us[u, R_NPAD] > 0 else 0
        else:
            while us[u, R_NPAD] > 0:
                if not room_on_outputs(us, u, chs, slots, out_ch, out_start, n_out, tl):
                    return A.STEP_BLOCKED
                n = us[u, R_NPAD]
                stop = us[u, R_PADLVL] if n == 1 else 0
                value = -1
                if fi is not None:  # a pad tile holds zeros
                    value = V.alloc(fi, pad_rows * pad_cols, u)
                    V.fill_zero(fv, fi, value, pad_rows * pad_cols)
                emit(us, u, chs, slots, out, us[u, A.US_CLOCK], stop, pad_flags, pad_bytes, pad_rows, pad_cols, 0,
                     value, tl)
                if flags_out >= 0:
                    emit(us, u, chs, slots, flags_out, us[u, A.US_CLOCK], stop, A.KIND_SCALAR, 1, 1, 1, 1, 1, tl)
                us[u, R_NPAD] = n - 1
            if us[u, R_CLOSING]:
                return A.STEP_DONE
            us[u, A.US_PHASE] = 0


@kernel
def step_expand_ref(u, up, us, in_ch, out_ch, chs, slots, payload, sel_ptr, sel_idx, hw, arena, eng, hfree,
                    hq, fv, fi, tl):
    """reads: input and ref / writes: output, us[u] / returns: DONE when either input closes."""
    c = in_ch[up[u, A.UP_IN_START]]
    ref = in_ch[up[u, A.UP_IN_START] + 1]
    out = out_ch[up[u, A.UP_OUT_START]]
    k = up[u, A.UP_A0 + A.PA_RANK]
    while True:
        got = await_input(us, u, chs, c, tl)
        if got != A.STEP_READY:
            return got
        row = look(us, u, chs, slots, c, tl)
        if us[u, A.US_PHASE] == 0:
            got = await_input(us, u, chs, ref, tl)
            if got != A.STEP_READY:
                return got
            rrow = consume(us, u, chs, slots, ref, fi, tl)
            us[u, R_REFSTOP] = slots[rrow, A.SL_TOKEN + A.TK_STOP]
            us[u, A.US_FIRES] += 1
            us[u, A.US_PHASE] = 1
        if not can_push(chs, out):
            return block(us, u, out, A.WAIT_FULL)
        emit_copy(us, u, chs, slots, out, us[u, A.US_CLOCK], slots, row, A.SL_TOKEN, us[u, R_REFSTOP], fi, tl)
        us[u, A.US_PHASE] = 0
        if us[u, R_REFSTOP] >= k:
            pop(chs, slots, c, us[u, A.US_CLOCK], tl)
            drop(fi, slots, row, A.SL_TOKEN)


@kernel
def step_repeat_static(u, up, us, in_ch, out_ch, chs, slots, payload, sel_ptr, sel_idx, hw, arena, eng, hfree,
                       hq, fv, fi, tl):
    """reads: input / writes: output, us[u] / returns: DONE when the input closes."""
    c = in_ch[up[u, A.UP_IN_START]]
    out = out_ch[up[u, A.UP_OUT_START]]
    r = up[u, A.UP_A0 + A.PA_COUNT]
    while True:
        got = await_input(us, u, chs, c, tl)
        if got != A.STEP_READY:
            return got
        row = look(us, u, chs, slots, c, tl)
        if us[u, A.US_PHASE] == 0:
            us[u, R_I] = 0
            us[u, A.US_PHASE] = 1
        while us[u, R_I] < r:
            if not can_push(chs, out):
                return block(us, u, out, A.WAIT_FULL)
            i = us[u, R_I]
            stop = slots[row, A.SL_TOKEN + A.TK_STOP] + 1 if i == r - 1 else 0
            # requested = the clock before this copy's credit wait + i (§9 S10: copy 3 requests 149 + 3)
            emit_copy(us, u, chs, slots, out, us[u, A.US_CLOCK] + i, slots, row, A.SL_TOKEN, stop, fi, tl)
            us[u, R_I] = i + 1
        spend(us, u, r, tl)
        pop(chs, slots, c, us[u, A.US_CLOCK], tl)
        drop(fi, slots, row, A.SL_TOKEN)
        us[u, A.US_FIRES] += 1
        us[u, A.US_PHASE] = 0


@kernel
def step_row_streamify(u, up, us, in_ch, out_ch, chs, slots, payload, sel_ptr, sel_idx, hw, arena, eng, hfree,
                       hq, fv, fi, tl):
    """reads: tile input / writes: row output, us[u] / returns: DONE when the input closes."""
    c = in_ch[up[u, A.UP_IN_START]]
    out = out_ch[up[u, A.UP_OUT_START]]
    split_rows = up[u, A.UP_A0 + A.PA_SPLIT_ROWS]
    filt = up[u, A.UP_A0 + A.PA_FILTER]
    new_dim = up[u, A.UP_A0 + A.PA_NEW_DIM]
    a = A.US_TOK_A
    while True:
        if us[u, A.US_PHASE] == 0:
            got = await_input(us, u, chs, c, tl)
            if got != A.STEP_READY:
                return got
            row = take(us, u, chs, slots, c, tl)
            stash(us, u, a, slots, row, A.SL_TOKEN)
            n = us[u, a + A.TK_ROWS] if split_rows else us[u, a + A.TK_COLS]
            if filt:
                if us[u, a + A.TK_FLAGS] & A.FLAG_PAD:
                    n = 0
                elif split_rows and us[u, a + A.TK_OFFSET] < n:
                    n = us[u, a + A.TK_OFFSET]
            us[u, R_N] = n
            us[u, R_I] = 0
            us[u, A.US_FIRES] += 1
            us[u, A.US_PHASE] = 1
        n = us[u, R_N]
        flags = us[u, a + A.TK_FLAGS] & ~A.FLAG_PAD
        while us[u, R_I] < n:
            if not can_push(chs, out):
                return block(us, u, out, A.WAIT_FULL)
            i = us[u, R_I]
            # the last row closes the new dim too (FlatMap: stops shift up by one) or keeps the tile's level
            stop = us[u, a + A.TK_STOP] + new_dim if i == n - 1 else 0
            rows = us[u, a + A.TK_ROWS]
            cols = us[u, a + A.TK_COLS]
            value = -1
            if fi is not None:  # a fresh block per row / column
                value = V.alloc(fi, cols if split_rows else rows, u)
                if split_rows:
                    V.copy_rows(fv, fi, us[u, a + A.TK_PAYLOAD], cols, i, 1, value, 0)
                else:
                    V.copy_col(fv, fi, us[u, a + A.TK_PAYLOAD], rows, cols, i, value)
            if split_rows:
                emit(us, u, chs, slots, out, us[u, A.US_CLOCK], stop, flags, us[u, a + A.TK_BYTES], 1, cols, 1, value,
                     tl)
            else:
                emit(us, u, chs, slots, out, us[u, A.US_CLOCK], stop, flags, us[u, a + A.TK_BYTES], rows, 1, rows,
                     value, tl)
            us[u, R_I] = i + 1
        drop(fi, us, u, a)
        us[u, A.US_PHASE] = 0
