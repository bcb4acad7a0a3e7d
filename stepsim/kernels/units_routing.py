"""Routing operators: Partition, Reassemble, EagerMerge, Parallelize, Broadcast (docs/timing_model.md §7.1-§7.5).

* Partition: PEEK sel, ``now += L(sel)``, DEQ sel; per data element of the group: ``now += L(x)``, DEQ,
  ``now += max switch over targets + W(x)``, ENQ every target (ascending). Out stop ``min(stop, rank)``;
  outputs re-flagged read_from_mu = write_back_mu.
* Reassemble (canonical rule 4): DEQ sel; blocking peeks of every selected input (clock = max of head
  stamps); drain inputs ordered by head stamp a_i (ties: selector order): per element
  ``now = max(now, a_i + switch_i + L(x))``, DEQ, ``now += W(x)``, ENQ. The last drained group's closing
  element gets ``s + sel_stop + 1`` (``1 + sel_stop`` for a Val), earlier groups keep s (Val at rank 0).
* EagerMerge (canonical rule 3): time-sensitive while choosing. The engine calls it with a decision time T
  (the first T >= clock at which some input head is visible, i.e. stamped <= T); it picks the smallest head
  stamp (ties: lowest input index), ENQ the one-hot selector at T, then forwards the group Kahn-style
  (DEQ, ENQ; +1 between elements, none after the last).
* Parallelize: DEQ; ENQ(out[lane], now + switch[lane]); round-robin per group; no own cycles.
* Broadcast: DEQ; wait until every target has a free slot; ENQ all at now.
"""

from __future__ import annotations

from stepsim.kernels import abi as A
from stepsim.kernels.channels import can_pop, can_push, head_stamp, pop
from stepsim.kernels.hbm import E_STATUS, E_STATUS_ARG
from stepsim.kernels.jit import kernel
from stepsim.kernels.units_common import (
    advance_busy,
    await_input,
    block,
    emit,
    emit_copy,
    load_cycles,
    look,
    pmu_cycles,
    room_on_outputs,
    seen_closed,
    sel_count,
    sel_target,
    spend,
    stash,
    take,
    tok_bytes,
    wait_input,
)
from stepsim.kernels.values import drop

R_SFLAGS = A.US_R0 + 0
R_SPAY = A.US_R0 + 1
R_SSTOP = A.US_R0 + 2
R_NT = A.US_R0 + 3  # number of selected targets
R_MAXSW = A.US_R0 + 4
R_J = A.US_R0 + 5  # target / order index
R_GEND = A.US_R0 + 6  # current element closes its group
R_OSTOP = A.US_R0 + 7  # stop of the pending output
R_DECIDE = A.US_R0 + 8  # EagerMerge: decision time set by the engine (-1: none)
R_CHOSEN = A.US_R0 + 9
R_LANE = A.US_R0 + 10
R_SCR = A.US_R0 + 11  # Reassemble: first arena row of its scratch (set by the engine)


@kernel
def _bad(eng, u, code):
    eng[E_STATUS] = code
    eng[E_STATUS_ARG] = u
    return A.STEP_BLOCKED


@kernel
def _take_selector(u, us, chs, slots, c, pmu, fi, tl):
    """PEEK sel, now += L(sel), DEQ sel; keep its flags/payload/stop. reads: sel head / writes: us[u]."""
    row = look(us, u, chs, slots, c, tl)
    spend(us, u, load_cycles(slots, row, A.SL_TOKEN, pmu), tl)
    pop(chs, slots, c, us[u, A.US_CLOCK], tl)
    drop(fi, slots, row, A.SL_TOKEN)
    us[u, R_SFLAGS] = slots[row, A.SL_TOKEN + A.TK_FLAGS]
    us[u, R_SPAY] = slots[row, A.SL_TOKEN + A.TK_PAYLOAD]
    us[u, R_SSTOP] = slots[row, A.SL_TOKEN + A.TK_STOP]


@kernel
def step_partition(u, up, us, in_ch, out_ch, chs, slots, payload, sel_ptr, sel_idx, hw, arena, eng, hfree,
                   hq, fv, fi, tl):
    """reads: data and selector inputs / writes: outputs, us[u] / returns: DONE when the selector closes."""
    cdata = in_ch[up[u, A.UP_IN_START]]
    csel = in_ch[up[u, A.UP_IN_START] + 1]
    ostart = up[u, A.UP_OUT_START]
    n_out = up[u, A.UP_N_OUT]
    rank = up[u, A.UP_A0 + A.PA_RANK]
    wb = up[u, A.UP_A0 + A.PA_WRITE_BACK]
    swoff = up[u, A.UP_A0 + A.PA_SWITCH_OFF]
    pmu = hw[A.HW_PMU_BW]
    while True:
        ph = us[u, A.US_PHASE]
        if ph == 0:
            got = await_input(us, u, chs, csel, tl)
            if got != A.STEP_READY:
                return got
            _take_selector(u, us, chs, slots, csel, pmu, fi, tl)
            nt = sel_count(us[u, R_SFLAGS], us[u, R_SPAY], sel_ptr)
            maxsw = 0
            for j in range(nt):
                e = sel_target(us[u, R_SFLAGS], us[u, R_SPAY], j, sel_ptr, sel_idx)
                if e < 0 or e >= n_out:
                    return _bad(eng, u, A.ST_BAD_SELECTOR)
                maxsw = max(maxsw, payload[swoff + e])
            us[u, R_NT] = nt
            us[u, R_MAXSW] = maxsw
            us[u, A.US_PHASE] = 1
        elif ph == 1:
            got = await_input(us, u, chs, cdata, tl)
            if got != A.STEP_READY:
                return got
            row = look(us, u, chs, slots, cdata, tl)
            spend(us, u, load_cycles(slots, row, A.SL_TOKEN, pmu), tl)
            pop(chs, slots, cdata, us[u, A.US_CLOCK], tl)
            stash(us, u, A.US_TOK_A, slots, row, A.SL_TOKEN)
            s = slots[row, A.SL_TOKEN + A.TK_STOP]
            w = pmu_cycles(tok_bytes(slots, row, A.SL_TOKEN), pmu) if wb else 0
            spend(us, u, us[u, R_MAXSW] + w, tl)
            us[u, R_GEND] = 1 if (rank == 0 or s >= rank) else 0
            us[u, R_OSTOP] = min(rank, s)
            flags = us[u, A.US_TOK_A + A.TK_FLAGS] & ~A.FLAG_MU
            us[u, A.US_TOK_A + A.TK_FLAGS] = flags | (A.FLAG_MU if wb else 0)
            us[u, R_J] = 0
            us[u, A.US_FIRES] += 1
            us[u, A.US_PHASE] = 2
        else:
            nt = us[u, R_NT]
            while us[u, R_J] < nt:
                e = sel_target(us[u, R_SFLAGS], us[u, R_SPAY], us[u, R_J], sel_ptr, sel_idx)
                c = out_ch[ostart + e]
                if not can_push(chs, c):
                    return block(us, u, c, A.WAIT_FULL)
                emit_copy(us, u, chs, slots, c, us[u, A.US_CLOCK], us, u, A.US_TOK_A, us[u, R_OSTOP], fi, tl)
                us[u, R_J] += 1
            drop(fi, us, u, A.US_TOK_A)  # every target holds its own copy (none: the element is dropped)
            us[u, A.US_PHASE] = 0 if us[u, R_GEND] else 1


@kernel
def step_reassemble(u, up, us, in_ch, out_ch, chs, slots, payload, sel_ptr, sel_idx, hw, arena, eng, hfree,
                    hq, fv, fi, tl):
    """reads: data inputs and selector / writes: output, us[u], scratch rows / returns: DONE on selector close."""
    istart = up[u, A.UP_IN_START]
    n_in = up[u, A.UP_N_IN] - 1
    csel = in_ch[istart + n_in]
    out = out_ch[up[u, A.UP_OUT_START]]
    rank = up[u, A.UP_A0 + A.PA_RANK]
    wb = up[u, A.UP_A0 + A.PA_WRITE_BACK]
    swoff = up[u, A.UP_A0 + A.PA_SWITCH_OFF]
    pmu = hw[A.HW_PMU_BW]
    scr = us[u, R_SCR]
    while True:
        ph = us[u, A.US_PHASE]
        if ph == 0:
            got = await_input(us, u, chs, csel, tl)
            if got != A.STEP_READY:
                return got
            _take_selector(u, us, chs, slots, csel, pmu, fi, tl)
            nt = sel_count(us[u, R_SFLAGS], us[u, R_SPAY], sel_ptr)
            for j in range(nt):
                e = sel_target(us[u, R_SFLAGS], us[u, R_SPAY], j, sel_ptr, sel_idx)
                if e < 0 or e >= n_in:
                    return _bad(eng, u, A.ST_BAD_SELECTOR)
            us[u, R_NT] = nt
            us[u, A.US_PHASE] = 1
        elif ph == 1:
            # blocking peeks of every selected input
            nt = us[u, R_NT]
            for j in range(nt):
                c = in_ch[istart + sel_target(us[u, R_SFLAGS], us[u, R_SPAY], j, sel_ptr, sel_idx)]
                if not can_pop(chs, c):
                    if seen_closed(us, u, chs, c, tl):
                        return _bad(eng, u, A.ST_MISMATCH)
                    return block(us, u, c, A.WAIT_EMPTY)
            # order by head stamp, ties in selector order (stable insertion sort into scratch rows)
            for j in range(nt):
                e = sel_target(us[u, R_SFLAGS], us[u, R_SPAY], j, sel_ptr, sel_idx)
                a = head_stamp(chs, slots, in_ch[istart + e])
                wait_input(us, u, a, in_ch[istart + e], tl)
                k = j
                while k > 0 and arena[scr + k - 1, 1] > a:
                    arena[scr + k, 0] = arena[scr + k - 1, 0]
                    arena[scr + k, 1] = arena[scr + k - 1, 1]
                    k -= 1
                arena[scr + k, 0] = e
                arena[scr + k, 1] = a
            us[u, R_J] = 0
            us[u, A.US_PHASE] = 2 if nt > 0 else 0
        elif ph == 2:
            j = us[u, R_J]
            e = arena[scr + j, 0]
            c = in_ch[istart + e]
            if not can_pop(chs, c):
                if seen_closed(us, u, chs, c, tl):
                    return _bad(eng, u, A.ST_MISMATCH)
                return block(us, u, c, A.WAIT_EMPTY)
            row = look(us, u, chs, slots, c, tl)
            ready = arena[scr + j, 1] + payload[swoff + e] + load_cycles(slots, row, A.SL_TOKEN, pmu)
            advance_busy(us, u, ready, -1, tl)
            pop(chs, slots, c, us[u, A.US_CLOCK], tl)
            stash(us, u, A.US_TOK_A, slots, row, A.SL_TOKEN)
            if wb:
                spend(us, u, pmu_cycles(tok_bytes(slots, row, A.SL_TOKEN), pmu), tl)
            s = slots[row, A.SL_TOKEN + A.TK_STOP]
            gend = rank == 0 or s >= rank
            ostop = s
            if gend:
                if j == us[u, R_NT] - 1:
                    ostop = (max(0, s)) + us[u, R_SSTOP] + 1
                elif rank == 0:
                    ostop = 0
            us[u, R_GEND] = 1 if gend else 0
            us[u, R_OSTOP] = ostop
            flags = us[u, A.US_TOK_A + A.TK_FLAGS] & ~A.FLAG_MU
            us[u, A.US_TOK_A + A.TK_FLAGS] = flags | (A.FLAG_MU if wb else 0)
            us[u, A.US_FIRES] += 1
            us[u, A.US_PHASE] = 3
        else:
            if not can_push(chs, out):
                return block(us, u, out, A.WAIT_FULL)
            emit_copy(us, u, chs, slots, out, us[u, A.US_CLOCK], us, u, A.US_TOK_A, us[u, R_OSTOP], fi, tl)
            drop(fi, us, u, A.US_TOK_A)
            us[u, A.US_PHASE] = 2
            if us[u, R_GEND]:
                us[u, R_J] += 1
                if us[u, R_J] == us[u, R_NT]:
                    us[u, A.US_PHASE] = 0


@kernel
def eager_merge_event_time(u, up, us, in_ch, chs, slots):
    """When may EagerMerge (or Link, :mod:`stepsim.kernels.units_link`) u decide? (only while choosing, phase 0)

    reads: its inputs' heads and close times / writes: nothing / returns: max(clock, smallest head stamp),
    or (all inputs closed and empty) max(clock, last close time), or NEVER when it must wait for data.
    """
    istart = up[u, A.UP_IN_START]
    n_in = up[u, A.UP_N_IN]
    clock = us[u, A.US_CLOCK]
    best = A.NEVER
    all_closed = True
    last_close = clock
    for k in range(n_in):
        c = in_ch[istart + k]
        if can_pop(chs, c):
            t = head_stamp(chs, slots, c)
            best = min(best, t)
            all_closed = False
        elif chs[c, A.CH_CLOSED] == 1:
            last_close = max(last_close, chs[c, A.CH_CLOSE_TIME])
        else:
            all_closed = False
    return decision_time(clock, best, all_closed, last_close)


@kernel
def decision_time(clock, best, all_closed, last_close):
    """The decision time of a time-sensitive chooser (EagerMerge, Link) from its scan of its inputs (cycles).

    reads/writes: nothing / returns: max(clock, best) when some input offers a time (``best`` != NEVER), else
    ``last_close`` when every input is closed and empty (the unit then finishes), else NEVER (it must wait).
    Shared so both choosers finish on one rule (the reference engine's twin: ``_earliest_head`` and ``_link``).
    """
    if best != A.NEVER:
        return max(clock, best)
    if all_closed:
        return last_close
    return A.NEVER


@kernel
def step_eager_merge(u, up, us, in_ch, out_ch, chs, slots, payload, sel_ptr, sel_idx, hw, arena, eng, hfree,
                     hq, fv, fi, tl):
    """reads: inputs, us[u, R_DECIDE] / writes: data and selector outputs, us[u] /
    returns: STEP_TIME while choosing without a decision time, DONE when all inputs closed."""
    istart = up[u, A.UP_IN_START]
    n_in = up[u, A.UP_N_IN]
    cdata = out_ch[up[u, A.UP_OUT_START]]
    csel = out_ch[up[u, A.UP_OUT_START] + 1]
    rank = up[u, A.UP_A0 + A.PA_RANK]
    while True:
        ph = us[u, A.US_PHASE]
        if ph == 0:
            T = us[u, R_DECIDE]
            if T < 0:
                us[u, A.US_WAIT_KIND] = A.WAIT_TIME
                us[u, A.US_WAIT_CH] = -1
                return A.STEP_TIME
            us[u, R_DECIDE] = -1
            chosen = -1
            best = A.NEVER
            for k in range(n_in):
                c = in_ch[istart + k]
                if can_pop(chs, c):
                    t = head_stamp(chs, slots, c)
                    if t <= T and t < best:
                        best = t
                        chosen = k
            wait_input(us, u, T, in_ch[istart + chosen] if chosen >= 0 else -1, tl)
            if chosen < 0:
                return A.STEP_DONE
            us[u, R_CHOSEN] = chosen
            us[u, A.US_PHASE] = 1
        elif ph == 1:
            if not can_push(chs, csel):
                return block(us, u, csel, A.WAIT_FULL)
            emit(us, u, chs, slots, csel, us[u, A.US_CLOCK], 0, A.KIND_SELECTOR, 1, 1, n_in, 0, us[u, R_CHOSEN], tl)
            us[u, A.US_PHASE] = 2
        elif ph == 2:
            c = in_ch[istart + us[u, R_CHOSEN]]
            if not can_pop(chs, c):
                if seen_closed(us, u, chs, c, tl):
                    us[u, A.US_PHASE] = 0
                    continue
                return block(us, u, c, A.WAIT_EMPTY)
            row = take(us, u, chs, slots, c, tl)
            stash(us, u, A.US_TOK_A, slots, row, A.SL_TOKEN)
            s = slots[row, A.SL_TOKEN + A.TK_STOP]
            if s > rank:
                return _bad(eng, u, A.ST_BAD_STOP)
            us[u, R_GEND] = 1 if (rank == 0 or s == rank) else 0
            us[u, A.US_FIRES] += 1
            us[u, A.US_PHASE] = 3
        else:
            if not can_push(chs, cdata):
                return block(us, u, cdata, A.WAIT_FULL)
            emit_copy(us, u, chs, slots, cdata, us[u, A.US_CLOCK], us, u, A.US_TOK_A,
                      us[u, A.US_TOK_A + A.TK_STOP], fi, tl)
            drop(fi, us, u, A.US_TOK_A)
            if us[u, R_GEND]:
                us[u, A.US_PHASE] = 0
            else:
                spend(us, u, 1, tl)
                us[u, A.US_PHASE] = 2


@kernel
def step_parallelize(u, up, us, in_ch, out_ch, chs, slots, payload, sel_ptr, sel_idx, hw, arena, eng, hfree,
                     hq, fv, fi, tl):
    """reads: input / writes: outputs, us[u] / returns: DONE when the input closes."""
    c = in_ch[up[u, A.UP_IN_START]]
    ostart = up[u, A.UP_OUT_START]
    n_out = up[u, A.UP_N_OUT]
    rank = up[u, A.UP_A0 + A.PA_RANK]
    swoff = up[u, A.UP_A0 + A.PA_SWITCH_OFF]
    while True:
        if us[u, A.US_PHASE] == 0:
            got = await_input(us, u, chs, c, tl)
            if got != A.STEP_READY:
                return got
            row = take(us, u, chs, slots, c, tl)
            stash(us, u, A.US_TOK_A, slots, row, A.SL_TOKEN)
            s = slots[row, A.SL_TOKEN + A.TK_STOP]
            if s > rank:
                return _bad(eng, u, A.ST_BAD_STOP)
            us[u, R_GEND] = 1 if (rank == 0 or s == rank) else 0
            us[u, A.US_FIRES] += 1
            us[u, A.US_PHASE] = 1
        lane = us[u, R_LANE]
        o = out_ch[ostart + lane]
        if not can_push(chs, o):
            return block(us, u, o, A.WAIT_FULL)
        emit_copy(us, u, chs, slots, o, us[u, A.US_CLOCK] + payload[swoff + lane], us, u, A.US_TOK_A,
                  us[u, A.US_TOK_A + A.TK_STOP], fi, tl)
        drop(fi, us, u, A.US_TOK_A)
        if us[u, R_GEND]:
            us[u, R_LANE] = (lane + 1) % n_out
        us[u, A.US_PHASE] = 0


@kernel
def step_broadcast(u, up, us, in_ch, out_ch, chs, slots, payload, sel_ptr, sel_idx, hw, arena, eng, hfree,
                   hq, fv, fi, tl):
    """reads: input / writes: every output, us[u] / returns: DONE when the input closes."""
    c = in_ch[up[u, A.UP_IN_START]]
    ostart = up[u, A.UP_OUT_START]
    n_out = up[u, A.UP_N_OUT]
    while True:
        if us[u, A.US_PHASE] == 0:
            got = await_input(us, u, chs, c, tl)
            if got != A.STEP_READY:
                return got
            row = take(us, u, chs, slots, c, tl)
            stash(us, u, A.US_TOK_A, slots, row, A.SL_TOKEN)
            us[u, A.US_FIRES] += 1
            us[u, A.US_PHASE] = 1
        if not room_on_outputs(us, u, chs, slots, out_ch, ostart, n_out, tl):
            return A.STEP_BLOCKED
        for k in range(n_out):
            emit_copy(us, u, chs, slots, out_ch[ostart + k], us[u, A.US_CLOCK], us, u, A.US_TOK_A,
                      us[u, A.US_TOK_A + A.TK_STOP], fi, tl)
        drop(fi, us, u, A.US_TOK_A)
        us[u, A.US_PHASE] = 0
