"""Sources, sinks and address / selector generators (docs/timing_model.md §7.7, §7.8).

* SelectGen: element i stamped ``now + 1``, then ``now += 1``; stops from the static shape.
* MetadataGen: element i requested at stamp i (arrivals 1, 1, 2, ...); the clock only moves on credit waits.
* Sink: DEQ, then ``now += 1``.
* ExpertAddrGen: DEQ a selector, burst ``T`` u64 addresses ``base + e*T + j`` per selected e (stops 1, and
  ``2 + sel_stop`` on the last).
* CacheReadAddrGen: DEQ idx, DEQ seq_len n; n addresses ``idx*row_offset + j`` requested at ``start + j``;
  the last gets ``1 + idx stop``. No own cycles.
* FilterLastTile: DEQ seq_len n; burst n two-target selectors (target 1, ..., target 0); last gets
  ``1 + seq_len stop``.
"""

from __future__ import annotations

from stepsim.kernels import abi as A
from stepsim.kernels.channels import can_push
from stepsim.kernels.jit import kernel
from stepsim.kernels.units_common import (
    await_input,
    block,
    consume,
    emit,
    sel_count,
    sel_target,
    spend,
    stop_from_shape,
)

R_I = A.US_R0 + 0
R_N = A.US_R0 + 1
R_STOP = A.US_R0 + 2
R_VAL = A.US_R0 + 3
R_START = A.US_R0 + 4
R_SFLAGS = A.US_R0 + 5
R_SPAY = A.US_R0 + 6
R_J = A.US_R0 + 7

SCALAR_FLAGS = A.KIND_SCALAR
SELECTOR_FLAGS = A.KIND_SELECTOR


@kernel
def step_select_gen(u, up, us, in_ch, out_ch, chs, slots, payload, sel_ptr, sel_idx, hw, arena, eng, hfree,
                    hq, fv, fi, tl):
    """reads: selector CSR, shape / writes: out channel, us[u] / returns: DONE after the last element."""
    out = out_ch[up[u, A.UP_OUT_START]]
    n = up[u, A.UP_A0 + A.PA_N_ELEMS]
    e0 = up[u, A.UP_A0 + A.PA_VALUES_OFF]
    soff = up[u, A.UP_A0 + A.PA_SHAPE_OFF]
    slen = up[u, A.UP_A0 + A.PA_SHAPE_LEN]
    width = up[u, A.UP_A0 + A.PA_N_TARGETS]
    while us[u, R_I] < n:
        if not can_push(chs, out):
            return block(us, u, out, A.WAIT_FULL)
        i = us[u, R_I]
        stop = stop_from_shape(payload, soff, slen, i)
        emit(us, u, chs, slots, out, us[u, A.US_CLOCK] + 1, stop, SELECTOR_FLAGS | A.FLAG_SEL_CSR, 1, 1, width,
             0, e0 + i, tl)
        spend(us, u, 1, tl)
        us[u, R_I] = i + 1
        us[u, A.US_FIRES] += 1
    return A.STEP_DONE


@kernel
def step_metadata_gen(u, up, us, in_ch, out_ch, chs, slots, payload, sel_ptr, sel_idx, hw, arena, eng, hfree,
                      hq, fv, fi, tl):
    """reads: values, shape / writes: out channel, us[u] / returns: DONE after the last element."""
    out = out_ch[up[u, A.UP_OUT_START]]
    n = up[u, A.UP_A0 + A.PA_N_ELEMS]
    voff = up[u, A.UP_A0 + A.PA_VALUES_OFF]
    soff = up[u, A.UP_A0 + A.PA_SHAPE_OFF]
    slen = up[u, A.UP_A0 + A.PA_SHAPE_LEN]
    while us[u, R_I] < n:
        if not can_push(chs, out):
            return block(us, u, out, A.WAIT_FULL)
        i = us[u, R_I]
        stop = stop_from_shape(payload, soff, slen, i)
        emit(us, u, chs, slots, out, i, stop, SCALAR_FLAGS, 8, 1, 1, 1, payload[voff + i], tl)
        us[u, R_I] = i + 1
        us[u, A.US_FIRES] += 1
    return A.STEP_DONE


@kernel
def step_sink(u, up, us, in_ch, out_ch, chs, slots, payload, sel_ptr, sel_idx, hw, arena, eng, hfree, hq, fv, fi, tl):
    """reads: input channel / writes: input credits, us[u] / returns: DONE when the input closes."""
    c = in_ch[up[u, A.UP_IN_START]]
    while True:
        got = await_input(us, u, chs, c, tl)
        if got != A.STEP_READY:
            return got
        consume(us, u, chs, slots, c, fi, tl)
        spend(us, u, 1, tl)
        us[u, A.US_FIRES] += 1


@kernel
def step_expert_addr_gen(u, up, us, in_ch, out_ch, chs, slots, payload, sel_ptr, sel_idx, hw, arena, eng, hfree,
                         hq, fv, fi, tl):
    """reads: selector input / writes: address output, us[u] / returns: DONE when the selectors close."""
    c = in_ch[up[u, A.UP_IN_START]]
    out = out_ch[up[u, A.UP_OUT_START]]
    T = up[u, A.UP_A0 + A.PA_TILES_PER_TARGET]
    base = up[u, A.UP_A0 + A.PA_BASE]
    while True:
        if us[u, A.US_PHASE] == 0:
            got = await_input(us, u, chs, c, tl)
            if got != A.STEP_READY:
                return got
            row = consume(us, u, chs, slots, c, fi, tl)
            us[u, R_SFLAGS] = slots[row, A.SL_TOKEN + A.TK_FLAGS]
            us[u, R_SPAY] = slots[row, A.SL_TOKEN + A.TK_PAYLOAD]
            us[u, R_STOP] = slots[row, A.SL_TOKEN + A.TK_STOP]
            us[u, R_N] = sel_count(us[u, R_SFLAGS], us[u, R_SPAY], sel_ptr) * T
            us[u, R_I] = 0
            us[u, A.US_FIRES] += 1
            us[u, A.US_PHASE] = 1
        n = us[u, R_N]
        while us[u, R_I] < n:
            if not can_push(chs, out):
                return block(us, u, out, A.WAIT_FULL)
            i = us[u, R_I]
            e = sel_target(us[u, R_SFLAGS], us[u, R_SPAY], i // T, sel_ptr, sel_idx)
            j = i % T
            stop = 1
            if j == T - 1:
                stop = 2
                if i == n - 1:
                    stop = 2 + us[u, R_STOP]
            emit(us, u, chs, slots, out, us[u, A.US_CLOCK], stop, SCALAR_FLAGS, 8, 1, 1, 1, base + e * T + j, tl)
            us[u, R_I] = i + 1
        us[u, A.US_PHASE] = 0


@kernel
def step_cache_read_addr_gen(u, up, us, in_ch, out_ch, chs, slots, payload, sel_ptr, sel_idx, hw, arena, eng,
                             hfree, hq, fv, fi, tl):
    """reads: idx and seq_len inputs / writes: address output, us[u] / returns: DONE when an input closes."""
    cidx = in_ch[up[u, A.UP_IN_START]]
    clen = in_ch[up[u, A.UP_IN_START] + 1]
    out = out_ch[up[u, A.UP_OUT_START]]
    row_offset = up[u, A.UP_A0 + A.PA_ROW_OFFSET]
    while True:
        ph = us[u, A.US_PHASE]
        if ph == 0:
            got = await_input(us, u, chs, cidx, tl)
            if got != A.STEP_READY:
                return got
            row = consume(us, u, chs, slots, cidx, fi, tl)
            us[u, R_VAL] = slots[row, A.SL_TOKEN + A.TK_PAYLOAD]
            us[u, R_STOP] = slots[row, A.SL_TOKEN + A.TK_STOP]
            us[u, A.US_PHASE] = 1
        elif ph == 1:
            got = await_input(us, u, chs, clen, tl)
            if got != A.STEP_READY:
                return got
            row = consume(us, u, chs, slots, clen, fi, tl)
            us[u, R_N] = slots[row, A.SL_TOKEN + A.TK_PAYLOAD]
            us[u, R_START] = us[u, A.US_CLOCK]
            us[u, R_I] = 0
            us[u, A.US_FIRES] += 1
            us[u, A.US_PHASE] = 2
        else:
            n = us[u, R_N]
            while us[u, R_I] < n:
                if not can_push(chs, out):
                    return block(us, u, out, A.WAIT_FULL)
                j = us[u, R_I]
                stop = 1 + us[u, R_STOP] if j == n - 1 else 0
                emit(us, u, chs, slots, out, us[u, R_START] + j, stop, SCALAR_FLAGS, 8, 1, 1, 1,
                     us[u, R_VAL] * row_offset + j, tl)
                us[u, R_I] = j + 1
            us[u, A.US_PHASE] = 0


@kernel
def step_filter_last_tile(u, up, us, in_ch, out_ch, chs, slots, payload, sel_ptr, sel_idx, hw, arena, eng, hfree,
                          hq, fv, fi, tl):
    """reads: seq_len input / writes: selector output, us[u] / returns: DONE when the input closes."""
    c = in_ch[up[u, A.UP_IN_START]]
    out = out_ch[up[u, A.UP_OUT_START]]
    while True:
        if us[u, A.US_PHASE] == 0:
            got = await_input(us, u, chs, c, tl)
            if got != A.STEP_READY:
                return got
            row = consume(us, u, chs, slots, c, fi, tl)
            us[u, R_N] = slots[row, A.SL_TOKEN + A.TK_PAYLOAD]
            us[u, R_STOP] = slots[row, A.SL_TOKEN + A.TK_STOP]
            us[u, R_I] = 0
            us[u, A.US_FIRES] += 1
            us[u, A.US_PHASE] = 1
        n = us[u, R_N]
        while us[u, R_I] < n:
            if not can_push(chs, out):
                return block(us, u, out, A.WAIT_FULL)
            j = us[u, R_I]
            last = j == n - 1
            emit(us, u, chs, slots, out, us[u, A.US_CLOCK], 1 + us[u, R_STOP] if last else 0, SELECTOR_FLAGS, 1, 1,
                 2, 0, 0 if last else 1, tl)
            us[u, R_I] = j + 1
        us[u, A.US_PHASE] = 0
