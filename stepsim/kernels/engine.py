"""The event loop: one worklist of Kahn units, one time-ordered choice among time-sensitive units.

Scheduling (canonical rules 2 and 3):

1. Every Kahn unit (all but EagerMerge and Link while they choose, and the HBM) runs ahead until it blocks on an
   empty input, a full output or the HBM. Blocking operations are timestamp-deterministic, so the order in which
   runnable units are stepped does not change any time. After a unit steps, the engine wakes the neighbour
   on each of its channels if that neighbour waits on exactly that channel and the channel now allows it.
2. When no Kahn unit is runnable, the earliest time-sensitive event is taken: the HBM's next tick or an
   EagerMerge's or a Link's decision time (ties go to the HBM; any action at time T only creates elements stamped > T,
   so the order of equal-time actions cannot matter). The HBM serves ticks up to the earliest EagerMerge
   event and stops after a tick that completed a tile (see :mod:`stepsim.kernels.hbm`). The time-sensitive
   units' decision times are scanned again only after some unit stepped: an HBM event that woke nobody
   changed no clock and no channel, so the last scan still holds (on many chips most HBM events are such).
3. When neither exists, the run is over: finished if every unit is done, else a deadlock.

Reported cycles (canonical rule 6): max over every unit's final clock and, if there are memory units,
their max final clock + 1 (the HBM's end).
"""

from __future__ import annotations

import numpy as np

from stepsim.kernels import abi as A
from stepsim.kernels.channels import can_pop, can_push, close, settle_peak
from stepsim.kernels.hbm import (
    E_BYTES_READ,
    E_BYTES_WRITTEN,
    E_EVENTS,
    E_HBM_REQS,
    E_HBM_RESUME,
    E_HBM_RESUME_BOUND,
    E_HBM_SKIPPED,
    E_HBM_SNAP_T,
    E_HBM_UNEVEN,
    E_N_REC,
    E_STATUS,
    E_STATUS_ARG,
    E_TS_EVALS,
    E_TS_FRESH,
    E_TS_RESCAN,
    E_TS_SCANS,
    E_TS_T,
    E_TS_U,
    E_WL_N,
    E_WORK_LEFT,
    HBM_OUT_OF_WORK,
    N_ENG,
    N_HQ,
    hbm_init,
    hbm_next_tick,
    hbm_process,
)
from stepsim.kernels.jit import inline_kernel, kernel
from stepsim.kernels.timeline import TL_CH_HBM
from stepsim.kernels.units_common import advance_busy
from stepsim.kernels.units_compute import R_COST_A_ROWS, step_accum, step_map
from stepsim.kernels.units_link import link_decision_time, link_event_time, step_link
from stepsim.kernels.units_memory import (
    step_bufferize,
    step_dyn_streamify,
    step_offchip_load,
    step_offchip_store,
    step_random_offchip_load,
    step_random_offchip_store,
    step_streamify,
)
from stepsim.kernels.units_routing import (
    R_DECIDE,
    R_SCR,
    eager_merge_event_time,
    step_broadcast,
    step_eager_merge,
    step_parallelize,
    step_partition,
    step_reassemble,
)
from stepsim.kernels.units_shape import (
    step_expand_ref,
    step_flatten_promote,
    step_promote_outer,
    step_repeat_static,
    step_reshape,
    step_row_streamify,
)
from stepsim.kernels.units_sources import (
    step_cache_read_addr_gen,
    step_expert_addr_gen,
    step_filter_last_tile,
    step_metadata_gen,
    step_select_gen,
    step_sink,
)
from stepsim.kernels.values import FI_STATUS, VS_FULL


@inline_kernel
def dispatch(u, up, us, in_ch, out_ch, chs, slots, payload, sel_ptr, sel_idx, hw, arena, eng, hfree, hq, fv, fi, tl):
    """Step unit u by its opcode. reads/writes: whatever the unit's step does / returns: its STEP_* code.

    Inlined into the event loop (numba IR inlining) so a step costs one call, not two: every call passes
    ~15 arrays as exploded structs, which dominated the per-event cost.
    """
    op = up[u, A.UP_OPCODE]
    if op == A.OP_MAP:
        return step_map(u, up, us, in_ch, out_ch, chs, slots, payload, sel_ptr, sel_idx, hw, arena, eng, hfree,
                        hq, fv, fi, tl)
    if op == A.OP_ACCUM or op == A.OP_MAP_ACCUM or op == A.OP_SCAN:
        return step_accum(u, up, us, in_ch, out_ch, chs, slots, payload, sel_ptr, sel_idx, hw, arena, eng, hfree,
                          hq, fv, fi, tl)
    if op == A.OP_OFFCHIP_LOAD or op == A.OP_DYN_OFFCHIP_LOAD:
        return step_offchip_load(u, up, us, in_ch, out_ch, chs, slots, payload, sel_ptr, sel_idx, hw, arena, eng,
                                 hfree, hq, fv, fi, tl)
    if op == A.OP_SINK:
        return step_sink(u, up, us, in_ch, out_ch, chs, slots, payload, sel_ptr, sel_idx, hw, arena, eng, hfree,
                         hq, fv, fi, tl)
    if op == A.OP_BROADCAST:
        return step_broadcast(u, up, us, in_ch, out_ch, chs, slots, payload, sel_ptr, sel_idx, hw, arena, eng,
                              hfree, hq, fv, fi, tl)
    if op == A.OP_FLATTEN:
        return step_flatten_promote(u, up, us, in_ch, out_ch, chs, slots, payload, sel_ptr, sel_idx, hw, arena,
                                    eng, hfree, hq, fv, fi, tl)
    if op == A.OP_PROMOTE:
        if up[u, A.UP_A0 + A.PA_PROMOTE_OUTER]:
            return step_promote_outer(u, up, us, in_ch, out_ch, chs, slots, payload, sel_ptr, sel_idx, hw, arena,
                                      eng, hfree, hq, fv, fi, tl)
        return step_flatten_promote(u, up, us, in_ch, out_ch, chs, slots, payload, sel_ptr, sel_idx, hw, arena,
                                    eng, hfree, hq, fv, fi, tl)
    if op == A.OP_RESHAPE:
        return step_reshape(u, up, us, in_ch, out_ch, chs, slots, payload, sel_ptr, sel_idx, hw, arena, eng,
                            hfree, hq, fv, fi, tl)
    if op == A.OP_PARTITION:
        return step_partition(u, up, us, in_ch, out_ch, chs, slots, payload, sel_ptr, sel_idx, hw, arena, eng,
                              hfree, hq, fv, fi, tl)
    if op == A.OP_REASSEMBLE:
        return step_reassemble(u, up, us, in_ch, out_ch, chs, slots, payload, sel_ptr, sel_idx, hw, arena, eng,
                               hfree, hq, fv, fi, tl)
    if op == A.OP_EAGER_MERGE:
        return step_eager_merge(u, up, us, in_ch, out_ch, chs, slots, payload, sel_ptr, sel_idx, hw, arena, eng,
                                hfree, hq, fv, fi, tl)
    if op == A.OP_PARALLELIZE:
        return step_parallelize(u, up, us, in_ch, out_ch, chs, slots, payload, sel_ptr, sel_idx, hw, arena, eng,
                                hfree, hq, fv, fi, tl)
    if op == A.OP_OFFCHIP_STORE:
        return step_offchip_store(u, up, us, in_ch, out_ch, chs, slots, payload, sel_ptr, sel_idx, hw, arena,
                                  eng, hfree, hq, fv, fi, tl)
    if op == A.OP_RANDOM_OFFCHIP_LOAD:
        return step_random_offchip_load(u, up, us, in_ch, out_ch, chs, slots, payload, sel_ptr, sel_idx, hw,
                                        arena, eng, hfree, hq, fv, fi, tl)
    if op == A.OP_RANDOM_OFFCHIP_STORE:
        return step_random_offchip_store(u, up, us, in_ch, out_ch, chs, slots, payload, sel_ptr, sel_idx, hw,
                                         arena, eng, hfree, hq, fv, fi, tl)
    if op == A.OP_BUFFERIZE:
        return step_bufferize(u, up, us, in_ch, out_ch, chs, slots, payload, sel_ptr, sel_idx, hw, arena, eng,
                              hfree, hq, fv, fi, tl)
    if op == A.OP_STREAMIFY:
        return step_streamify(u, up, us, in_ch, out_ch, chs, slots, payload, sel_ptr, sel_idx, hw, arena, eng,
                              hfree, hq, fv, fi, tl)
    if op == A.OP_DYN_STREAMIFY:
        return step_dyn_streamify(u, up, us, in_ch, out_ch, chs, slots, payload, sel_ptr, sel_idx, hw, arena,
                                  eng, hfree, hq, fv, fi, tl)
    if op == A.OP_EXPAND_REF:
        return step_expand_ref(u, up, us, in_ch, out_ch, chs, slots, payload, sel_ptr, sel_idx, hw, arena, eng,
                               hfree, hq, fv, fi, tl)
    if op == A.OP_REPEAT_STATIC:
        return step_repeat_static(u, up, us, in_ch, out_ch, chs, slots, payload, sel_ptr, sel_idx, hw, arena,
                                  eng, hfree, hq, fv, fi, tl)
    if op == A.OP_ROW_STREAMIFY:
        return step_row_streamify(u, up, us, in_ch, out_ch, chs, slots, payload, sel_ptr, sel_idx, hw, arena,
                                  eng, hfree, hq, fv, fi, tl)
    if op == A.OP_SELECT_GEN:
        return step_select_gen(u, up, us, in_ch, out_ch, chs, slots, payload, sel_ptr, sel_idx, hw, arena, eng,
                               hfree, hq, fv, fi, tl)
    if op == A.OP_METADATA_GEN:
        return step_metadata_gen(u, up, us, in_ch, out_ch, chs, slots, payload, sel_ptr, sel_idx, hw, arena, eng,
                                 hfree, hq, fv, fi, tl)
    if op == A.OP_EXPERT_ADDR_GEN:
        return step_expert_addr_gen(u, up, us, in_ch, out_ch, chs, slots, payload, sel_ptr, sel_idx, hw, arena,
                                    eng, hfree, hq, fv, fi, tl)
    if op == A.OP_CACHE_READ_ADDR_GEN:
        return step_cache_read_addr_gen(u, up, us, in_ch, out_ch, chs, slots, payload, sel_ptr, sel_idx, hw,
                                        arena, eng, hfree, hq, fv, fi, tl)
    if op == A.OP_FILTER_LAST_TILE:
        return step_filter_last_tile(u, up, us, in_ch, out_ch, chs, slots, payload, sel_ptr, sel_idx, hw, arena,
                                     eng, hfree, hq, fv, fi, tl)
    if op == A.OP_LINK:
        return step_link(u, up, us, in_ch, out_ch, chs, slots, payload, sel_ptr, sel_idx, hw, arena, eng, hfree,
                         hq, fv, fi, tl)
    return A.STEP_DONE


@kernel
def _wake(us, wl, wl_n, v):
    """reads: us[v] / writes: wl, us[v] in-worklist flag / returns: the new worklist length."""
    if us[v, A.US_IN_WORKLIST] == 0 and us[v, A.US_DONE] == 0:
        us[v, A.US_IN_WORKLIST] = 1
        wl[wl_n] = v
        wl_n += 1
    return wl_n


@kernel
def _producer_side(us, chs, ch_prod, wl, wl_n, c):
    """After c's consumer stepped (it may have popped c): c's producer's decision time is stale, and it is woken if
    it waits for room in c and c has some. reads/writes: us, wl / returns: the new worklist length."""
    v = ch_prod[c]
    us[v, A.US_TS_FRESH] = 0
    if us[v, A.US_WAIT_CH] == c and us[v, A.US_WAIT_KIND] == A.WAIT_FULL and can_push(chs, c):
        wl_n = _wake(us, wl, wl_n, v)
    return wl_n


@kernel
def _consumer_side(us, chs, ch_cons, wl, wl_n, c):
    """After c's producer stepped (it may have pushed to or closed c): c's consumer's decision time is stale, and
    it is woken if it waits on c and c has a head or is closed. reads/writes: us, wl / returns: the new worklist
    length."""
    v = ch_cons[c]
    us[v, A.US_TS_FRESH] = 0
    if us[v, A.US_WAIT_CH] == c and us[v, A.US_WAIT_KIND] == A.WAIT_EMPTY and (
            can_pop(chs, c) or chs[c, A.CH_CLOSED] == 1):
        wl_n = _wake(us, wl, wl_n, v)
    return wl_n


#: the most transfers on a Link's list of changed ones for which :func:`_link_neighbours` looks at those alone
LINK_WAKE_LIST = 16


@kernel
def _link_neighbours(u, up, us, in_ch, chs, ch_prod, ch_cons, wl, wl_n):
    """After Link u stepped (and did not finish): :func:`_producer_side` of the inputs and :func:`_consumer_side`
    of the outputs of the transfers on its list of changed ones only, in the order the loops over every channel
    take them (the inputs by transfer, then the outputs); -1 when the list holds more than :data:`LINK_WAKE_LIST`
    transfers (the caller loops over every channel).

    The same wake-ups in the same order: a Link's step changes only channels of its transfers, and each push, pop
    or close lists its transfer (:func:`stepsim.kernels.channels.link_transfer_changed`; the list may also hold
    transfers others changed before the step, looked at as the full loops look at them). Across a channel the step
    did not change, a wake-up's condition is what it was before the step: false (a unit is woken the moment its
    condition holds), and the decision time of the unit across it still holds. Why: a 16-chip all-to-all's Links
    carry hundreds of transfers, and both loops over every one after every element a Link carried were about a
    third of an expert-parallel layer's engine time (bench/README.md, session 55). A run with
    ``reuse_scans=False`` takes the full loops: tests/reference/test_scan_reuse.py compares the two.

    reads: the list (chs[:, CH_LK_*]) / writes: us, wl / returns: the new worklist length or -1."""
    first = in_ch[up[u, A.UP_IN_START]]
    listed = 0
    c = chs[first, A.CH_LK_HEAD]
    while c >= 0:
        listed += 1
        if listed > LINK_WAKE_LIST:
            return -1
        c = chs[c, A.CH_LK_NEXT]
    for side in range(2):
        last = -1
        for _ in range(listed):  # the listed transfers by index: the least above the last one each time
            k_next = up[u, A.UP_N_IN]
            c_next = -1
            c = chs[first, A.CH_LK_HEAD]
            while c >= 0:
                k = chs[c, A.CH_LK_K]
                if last < k < k_next:
                    k_next = k
                    c_next = c
                c = chs[c, A.CH_LK_NEXT]
            last = k_next
            if side == 0:
                wl_n = _producer_side(us, chs, ch_prod, wl, wl_n, c_next)
            else:
                wl_n = _consumer_side(us, chs, ch_cons, wl, wl_n, chs[c_next, A.CH_LK_OUT])
    return wl_n


@inline_kernel
def _earliest_hbm(eng, hq):
    """The HBM (one per chip) with the earliest tick, which may serve ticks up to the earliest other event; for
    another HBM's next tick T', up to T' + start_up + latency + 1 (see the event loop).

    reads: every HBM's next tick / writes: nothing / returns: (its tick, the next other HBM's tick, its index).
    """
    t_hbm = A.NEVER
    t_other = A.NEVER
    best_h = 0
    for h in range(hq.shape[0]):
        t = hbm_next_tick(eng[h * N_ENG:(h + 1) * N_ENG], hq[h])
        if t < t_hbm:
            t_other = t_hbm
            t_hbm = t
            best_h = h
        elif t < t_other:
            t_other = t
    return t_hbm, t_other, best_h


@kernel
def event_loop(up, us, in_ptr, in_ch, out_ptr, out_ch, ch_prod, ch_cons, chs, slots, payload, sel_ptr, sel_idx, hw,
               arena, eng, hfree, hq, done_list, wl, ts_units, n_ts, stop_events, rec, fv, fi, tl):
    """The scheduler (compiled without NRT: no reference counting on the hot path).

    Runs until the program ends, a unit raises a status, or ``eng[E_EVENTS]`` reaches ``stop_events``
    (then it returns ST_MAX_EVENTS with every state array consistent, so a later call resumes exactly where
    this one stopped: the engine runs in slices, see :mod:`stepsim.kernels.api`).

    reads: the program / writes: every state array, rec, eng[E_EVENTS / E_N_REC / E_WL_N] / returns: status.
    """
    wl_n = eng[E_WL_N]
    n_rec_max = rec.shape[0]
    n_rec = eng[E_N_REC]
    events = eng[E_EVENTS]
    status = A.ST_OK
    stepped = eng[E_TS_FRESH] == 0  # a unit stepped since the last scan of the time-sensitive units (or none yet)
    ts_t = eng[E_TS_T]  # that scan's result: the earliest decision time and its unit
    ts_u = eng[E_TS_U]
    rescan = eng[E_TS_RESCAN] != 0  # run(..., reuse_scans=False): every decision time at every decision
    while status == A.ST_OK:
        while wl_n > 0:
            stepped = True
            wl_n -= 1
            u = wl[wl_n]
            us[u, A.US_IN_WORKLIST] = 0
            r = dispatch(u, up, us, in_ch, out_ch, chs, slots, payload, sel_ptr, sel_idx, hw, arena, eng, hfree,
                         hq, fv, fi, tl)
            us[u, A.US_TS_FRESH] = 0  # its own decision time, if it has one, is stale (and its neighbours', below)
            events += 1
            if n_rec < n_rec_max:
                rec[n_rec, 0] = u
                rec[n_rec, 1] = us[u, A.US_CLOCK]
                rec[n_rec, 2] = us[u, A.US_FIRES]
                rec[n_rec, 3] = r
                n_rec += 1
            if eng[E_STATUS] != A.ST_OK:
                status = eng[E_STATUS]
                break
            if fi is not None and fi[FI_STATUS] >= VS_FULL:  # functional mode: out of handles, bad address
                status = A.ST_VALUES
                break
            if r == A.STEP_DONE:
                us[u, A.US_DONE] = 1
                us[u, A.US_WAIT_KIND] = A.WAIT_NONE
                us[u, A.US_WAIT_CH] = -1
                for k in range(out_ptr[u], out_ptr[u + 1]):
                    c = out_ch[k]
                    close(chs, c, us[u, A.US_CLOCK])  # unless closed: a Link closes each transfer's output itself
            woke = -1
            if not rescan and r != A.STEP_DONE and up[u, A.UP_OPCODE] == A.OP_LINK and up[u, A.UP_N_IN] > 0:
                woke = _link_neighbours(u, up, us, in_ch, chs, ch_prod, ch_cons, wl, wl_n)
            if woke >= 0:  # a Link: only across the transfers its step changed
                wl_n = woke
            else:
                for k in range(in_ptr[u], in_ptr[u + 1]):
                    c = in_ch[k]
                    wl_n = _producer_side(us, chs, ch_prod, wl, wl_n, c)
                for k in range(out_ptr[u], out_ptr[u + 1]):
                    c = out_ch[k]
                    wl_n = _consumer_side(us, chs, ch_cons, wl, wl_n, c)
            if events >= stop_events:
                status = A.ST_MAX_EVENTS
                break
        if status != A.ST_OK:
            break
        # no Kahn unit can run: take the earliest time-sensitive event
        best_t = A.NEVER
        best_u = -1
        resume = eng[E_HBM_RESUME]
        if resume > 0:  # an HBM batch the last slice cut short (its work ran out): finish it first, as it was
            best_h = resume - 1
            bound = eng[E_HBM_RESUME_BOUND]
            eng[E_HBM_RESUME] = 0
            t_hbm = A.NEVER
            take_hbm = True
        else:
            # A decision time depends only on its unit's clock and channels, which only unit steps change: after
            # an HBM event that woke nobody (a batch stopped at its bound, typical when several chips' HBMs
            # bound each other), the last scan still holds.
            if stepped or rescan:
                eng[E_TS_SCANS] += 1
                ts_t = A.NEVER
                ts_u = -1
                for k in range(n_ts):
                    v = ts_units[k]
                    if us[v, A.US_DONE] == 0 and us[v, A.US_WAIT_KIND] == A.WAIT_TIME:
                        # A unit's decision time reads its clock and its channels, which change only when it or
                        # the unit across one of them steps (each clears its flag above): recompute only then.
                        # A Link's reads every input (hundreds on an all-to-all): rescanning them all at every
                        # decision was most of a 16-chip expert-parallel layer's engine time.
                        if us[v, A.US_TS_FRESH] == 1 and not rescan:
                            t = us[v, A.US_TS_TIME]
                        else:
                            if up[v, A.UP_OPCODE] == A.OP_LINK and rescan:  # every transfer looked at
                                t = link_event_time(v, up, us, in_ch, out_ch, chs, slots)
                            elif up[v, A.UP_OPCODE] == A.OP_LINK:  # the transfers that changed
                                t = link_decision_time(v, up, us, in_ch, chs, slots)
                            else:
                                t = eager_merge_event_time(v, up, us, in_ch, chs, slots)
                            us[v, A.US_TS_TIME] = t
                            us[v, A.US_TS_FRESH] = 1
                            eng[E_TS_EVALS] += 1
                        if t < ts_t:
                            ts_t = t
                            ts_u = v
                stepped = False
            best_t = ts_t
            best_u = ts_u
            t_hbm, t_other, best_h = _earliest_hbm(eng, hq)
            if t_hbm == A.NEVER and best_u < 0:
                break
            take_hbm = t_hbm <= best_t
            # another HBM's tick T' completes a tile no earlier than T' + 1 + start_up + latency, and a request
            # that completion causes is taken at a later tick: this HBM may serve ticks up to that point
            if t_other != A.NEVER:
                t_other += hw[A.HW_HBM_START_UP] + hw[A.HW_HBM_LATENCY] + 1
            bound = min(best_t, t_other)
        if take_hbm:
            seg = eng[best_h * N_ENG:(best_h + 1) * N_ENG]  # this chip's HBM scalars
            if best_h != 0:  # the slice's work budget is one for every HBM: lend it to this one's segment
                seg[E_WORK_LEFT] = eng[E_WORK_LEFT]
            nd = hbm_process(bound, us, seg, hq[best_h], hw, hfree[best_h], done_list, tl)
            if best_h != 0:
                eng[E_WORK_LEFT] = seg[E_WORK_LEFT]
            if nd == HBM_OUT_OF_WORK:  # the slice's work is spent: end it; the next slice resumes this event
                eng[E_HBM_RESUME] = best_h + 1
                eng[E_HBM_RESUME_BOUND] = bound
                status = A.ST_MAX_EVENTS
                break
            events += 1
            for k in range(nd):
                v = done_list[k]
                advance_busy(us, v, us[v, A.US_TOK_B], TL_CH_HBM, tl)
                us[v, A.US_WAIT_KIND] = A.WAIT_NONE
                wl_n = _wake(us, wl, wl_n, v)
        else:
            us[best_u, R_DECIDE] = best_t
            us[best_u, A.US_WAIT_KIND] = A.WAIT_NONE
            wl_n = _wake(us, wl, wl_n, best_u)
    eng[E_WL_N] = wl_n
    eng[E_EVENTS] = events
    eng[E_N_REC] = n_rec
    eng[E_TS_FRESH] = 0 if stepped else 1
    eng[E_TS_T] = ts_t
    eng[E_TS_U] = ts_u
    return status


def new_state(up, ch_cap, ch_lat, ch_credit, ch_prod, ch_cons, hw, n_mem, arena_rows):
    """Allocate and initialize the run state of a program (every unit on the worklist).

    Plain Python: NumPy allocates, :func:`engine_init` fills in. No kernel allocates, because numba's
    allocation code lives in ``numba.np.arrayobj``: a cached kernel that allocated would make every process
    that loads the engine import that module (50-90 ms of a 0.7 s warm start).

    Returns (us, chs, slots, arena, eng, hfree, hq, done_list, wl, ts_units, n_ts): unit and channel state,
    channel slots, arena, engine scalars, HBM state, worklist and the time-sensitive units.
    """
    opcodes = up[:, A.UP_OPCODE]
    n_units = up.shape[0]
    n_ts = int(np.count_nonzero(np.isin(opcodes, A.TIME_SENSITIVE_OPS)))
    scratch_rows = int(up[opcodes == A.OP_REASSEMBLE, A.UP_N_IN].sum())
    us = np.zeros((n_units, A.N_US), dtype=np.int64)
    chs = np.zeros((ch_cap.shape[0], A.N_CH), dtype=np.int64)
    slots = np.zeros((max(int(ch_cap.sum()), 1), A.N_SLOT), dtype=np.int64)
    arena = np.zeros((arena_rows + scratch_rows, A.N_TOKEN), dtype=np.int64)
    ts_units = np.zeros(max(n_ts, 1), dtype=np.int64)
    # one HBM per chip whose memory ops use it (one on a single chip): its free times, period snapshot and idle
    # flags (hbm.py), its queue rows (one per memory op of that chip) and its scalar segment of eng
    memory = up[:, A.UP_MEM_PRIORITY] >= 0
    hbm_of = up[memory, A.UP_CHIP]
    n_hbm = int(hbm_of.max()) + 1 if hbm_of.size else 1
    rows = int(np.bincount(hbm_of, minlength=n_hbm).max()) if hbm_of.size else 1
    hfree = np.zeros((n_hbm, 3, hw[A.HW_HBM_CHANNELS]), dtype=np.int64)
    hq = np.zeros((n_hbm, max(rows, 1), N_HQ), dtype=np.int64)
    done_list = np.zeros(max(n_mem, 1), dtype=np.int64)
    eng = np.zeros(N_ENG * n_hbm, dtype=np.int64)
    wl = np.zeros(max(n_units, 1), dtype=np.int64)
    engine_init(up, ch_cap, ch_lat, ch_credit, ch_prod, ch_cons, arena_rows, us, chs, ts_units, hq, eng, wl)
    return us, chs, slots, arena, eng, hfree, hq, done_list, wl, ts_units, n_ts


@kernel
def engine_init(up, ch_cap, ch_lat, ch_credit, ch_prod, ch_cons, arena_rows, us, chs, ts_units, hq, eng, wl):
    """Initialize the run state that :func:`new_state` allocated (zeroed).

    reads: the program arrays / writes: us, chs, ts_units, hq, eng, wl / returns: nothing.
    """
    us[:, A.US_WAIT_CH] = -1
    total = 0
    for c in range(ch_cap.shape[0]):
        chs[c, A.CH_CAP] = ch_cap[c]
        chs[c, A.CH_LAT] = ch_lat[c]
        chs[c, A.CH_CREDIT_LAT] = ch_credit[c]
        chs[c, A.CH_BASE] = total
        chs[c, A.CH_HEAD_ROW] = total
        chs[c, A.CH_TAIL_ROW] = total
        chs[c, A.CH_END] = total + ch_cap[c]
        chs[c, A.CH_PRODUCER] = ch_prod[c]
        chs[c, A.CH_CONSUMER] = ch_cons[c]
        total += ch_cap[c]
    extra = 0  # the arena holds the Bufferize regions, then the Reassemble scratch rows
    k = 0
    n_units = up.shape[0]
    for u in range(n_units):
        op = up[u, A.UP_OPCODE]
        if op == A.OP_REASSEMBLE:
            us[u, R_SCR] = arena_rows + extra
            extra += up[u, A.UP_N_IN]
        elif op == A.OP_EAGER_MERGE or op == A.OP_LINK:  # time-sensitive: abi.TIME_SENSITIVE_OPS
            us[u, R_DECIDE] = -1
            ts_units[k] = u
            k += 1
        elif op == A.OP_MAP or op == A.OP_MAP_ACCUM:
            us[u, R_COST_A_ROWS] = -1  # no operand shape seen yet (see units_compute._cached_map_cycles)
    for h in range(hq.shape[0]):
        hbm_init(hq[h], up, h)
        eng[h * N_ENG + E_HBM_SNAP_T] = -1
    wl_n = 0
    for u in range(n_units - 1, -1, -1):
        wl_n = _wake(us, wl, wl_n, u)
    eng[E_WL_N] = wl_n


@kernel
def engine_finish(up, us, chs, slots, eng, status, out):
    """Close a run: settle channel peaks, compute the reported cycles and the output scalars.

    reads: unit and channel state / writes: chs peaks, out (the scalars abi.OUT_*, zeroed by the caller) /
    returns: nothing. A run that stopped with ST_OK and unfinished units is a deadlock.
    """
    n_units = up.shape[0]
    if status == A.ST_OK:
        for u in range(n_units):
            if us[u, A.US_DONE] == 0:
                status = A.ST_DEADLOCK
                break
    for c in range(chs.shape[0]):  # elements still queued hold their slots to the end
        settle_peak(chs, slots, c, True)
    cycles = 0
    fires = 0
    for u in range(n_units):
        t = us[u, A.US_CLOCK]
        if up[u, A.UP_MEM_PRIORITY] >= 0:
            t += 1
        cycles = max(cycles, t)
        fires += us[u, A.US_FIRES]
    out[A.OUT_STATUS] = status
    out[A.OUT_STATUS_ARG] = eng[E_STATUS_ARG]
    out[A.OUT_EVENTS] = eng[E_EVENTS]
    out[A.OUT_CYCLES] = cycles
    out[A.OUT_BYTES_READ] = eng[E_BYTES_READ]
    out[A.OUT_BYTES_WRITTEN] = eng[E_BYTES_WRITTEN]
    out[A.OUT_N_RECORDED] = eng[E_N_REC]
    out[A.OUT_FIRES] = fires
    out[A.OUT_TS_SCANS] = eng[E_TS_SCANS]
    out[A.OUT_TS_EVALS] = eng[E_TS_EVALS]
    for h in range(eng.shape[0] // N_ENG):  # every chip's HBM
        out[A.OUT_HBM_REQUESTS] += eng[h * N_ENG + E_HBM_REQS]
        out[A.OUT_HBM_CLOSED_FORM_TICKS] += eng[h * N_ENG + E_HBM_SKIPPED]
        out[A.OUT_HBM_UNEVEN_TICKS] += eng[h * N_ENG + E_HBM_UNEVEN]
