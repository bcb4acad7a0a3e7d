"""Channels: SPSC FIFOs stored as rows of one 2-D int64 slot array (array of structs).

Channel c owns slot rows ``[chs[c, CH_BASE], chs[c, CH_BASE] + chs[c, CH_CAP])``; send number i uses row
``base + i % cap``; the rows of the head and of the next send are kept in ``CH_HEAD_ROW`` / ``CH_TAIL_ROW`` and
advanced with a wrap test, since an integer division per push, pop and peek is a large part of a firing's cost.
A slot row is ``[stamp, credit_free, token...]`` (``abi.SL_*``, ``abi.TK_*``).

Timing (canonical rule 1, docs/timing_model.md §1.2):

* enqueue: the sender first waits for the slot's credit (``clock = max(clock, credit_free)``), then the element
  is stamped ``max(requested, clock + latency)``;
* dequeue at receiver time ``d = max(clock, stamp)`` stores ``credit_free = d + credit_latency`` in the slot,
  which is exactly the credit that send ``i + cap`` waits for;
* a blocking receive (peek or dequeue) sets ``clock = max(clock, stamp)`` (the callers do that).

The functions here never block: callers check :func:`can_pop` / :func:`can_push` first and report the wait.
"""

from __future__ import annotations

from stepsim.kernels import abi as A
from stepsim.kernels.jit import kernel
from stepsim.kernels.timeline import tl_element


@kernel
def can_pop(chs, c):
    """reads: chs[c] / writes: nothing / returns: True if channel c holds an element."""
    return chs[c, A.CH_TAIL] > chs[c, A.CH_HEAD]


@kernel
def closed_empty(chs, c):
    """reads: chs[c] / writes: nothing / returns: True if c is empty and its producer finished."""
    return chs[c, A.CH_CLOSED] == 1 and chs[c, A.CH_TAIL] == chs[c, A.CH_HEAD]


@kernel
def can_push(chs, c):
    """reads: chs[c] / writes: nothing / returns: True if c has a physically free slot."""
    return chs[c, A.CH_TAIL] - chs[c, A.CH_HEAD] < chs[c, A.CH_CAP]


@kernel
def head_row(chs, c):
    """reads: chs[c] / writes: nothing / returns: slot row of c's head element (c must be non-empty)."""
    return chs[c, A.CH_HEAD_ROW]


@kernel
def head_stamp(chs, slots, c):
    """reads: chs[c], slots / writes: nothing / returns: arrival stamp of c's head (c must be non-empty)."""
    return slots[chs[c, A.CH_HEAD_ROW], A.SL_STAMP]


@kernel
def next_free(chs, slots, c):
    """reads: chs[c], slots / writes: nothing / returns: credit time of the slot the next send uses."""
    return slots[chs[c, A.CH_TAIL_ROW], A.SL_FREE]


@kernel
def next_row(chs, c, row):
    """reads: chs[c] / writes: nothing / returns: the slot row after ``row`` in c's ring (wrapping to its base)."""
    row += 1
    if row == chs[c, A.CH_END]:
        row = chs[c, A.CH_BASE]
    return row


@kernel
def settle_peak(chs, slots, c, final):
    """Fold every send whose occupancy is now known into ``chs[c, CH_PEAK]``.

    Occupancy is defined on timestamps so it does not depend on the engine's stepping order: element j holds
    a slot from its send time ``s_j`` (sender clock after the credit wait) until its credit is back
    (``credit_j`` = dequeue time + credit latency). The occupancy seen by send p is ``p - k + 1`` where k is the
    oldest element with ``credit_k > s_p`` (credits and sends are both non-decreasing). It is known once k's
    credit is known or k reaches p; ``final`` treats elements never dequeued as holding their slot forever.
    Settling is lazy: a dequeue settles first when a send older than its element is open (its credit would
    overwrite the credit of element head - cap), an enqueue when the send it overwrites is open, and the engine
    settles everything at the end, so every value read here is still in its slot row. Once the peak reaches the
    capacity it is final: the cursor ``CH_PK_NEXT`` is parked at ``NEVER``, which turns the settle tests in push
    and pop (and this function) into no-ops at no extra cost on their hot path.

    reads: chs[c], slot send/credit times / writes: chs[c] peak and cursors / returns: nothing.
    """
    p = chs[c, A.CH_PK_NEXT]
    tail = chs[c, A.CH_TAIL]
    if p >= tail:
        return  # nothing open, or the cursor is parked (the peak is final)
    k = chs[c, A.CH_PK_OLDEST]
    head = chs[c, A.CH_HEAD]
    cap = chs[c, A.CH_CAP]
    base = chs[c, A.CH_BASE]
    peak = chs[c, A.CH_PEAK]
    # send p waited for the credit of p - cap, so every element up to p - cap had left by its send time
    k = max(k, p - cap + 1)
    rp = p % cap  # ring positions of p and k, advanced without further divisions (hot path)
    rk = k % cap
    while p < tail:
        s = slots[base + rp, A.SL_SENT]
        while k < p and k < head and slots[base + rk, A.SL_FREE] <= s:
            k += 1
            rk = 0 if rk == cap - 1 else rk + 1
        if k < p and k >= head and not final:
            break  # element k is still queued: its credit (and so this occupancy) is not known yet
        peak = max(peak, p - k + 1)
        if peak == cap:  # no occupancy exceeds the capacity: park the cursor so push/pop never settle again
            p = A.NEVER
            break
        # k > p - cap still holds for p + 1: k == p + 1 - cap would have made this occupancy cap (parked above)
        p += 1
        rp = 0 if rp == cap - 1 else rp + 1
    chs[c, A.CH_PEAK] = peak
    chs[c, A.CH_PK_NEXT] = p
    chs[c, A.CH_PK_OLDEST] = k


@kernel
def _on_changed_list(chs, c):
    """Put the Link input ``c`` on its Link's list of changed transfers, once. reads/writes: chs[c], the list head
    on the Link's first input / returns: nothing."""
    if chs[c, A.CH_LK_NEXT] == -2:
        first = chs[c, A.CH_LK_FIRST]
        chs[c, A.CH_LK_NEXT] = chs[first, A.CH_LK_HEAD]
        chs[first, A.CH_LK_HEAD] = c


@kernel
def link_transfer_changed(chs, c):
    """Channel ``c`` was pushed, popped or closed: if it carries a transfer of a Link (its input or its output), that
    transfer's ready time may have changed (:func:`stepsim.kernels.units_link.link_decision_time` looks at it
    again). reads/writes: chs (abi.CH_LK_*) / returns: nothing."""
    if chs[c, A.CH_LK_OUT] >= 0:
        _on_changed_list(chs, c)
    if chs[c, A.CH_LK_IN] >= 0:
        _on_changed_list(chs, chs[c, A.CH_LK_IN])


@kernel
def close(chs, c, time):
    """Close channel ``c`` (its producer finished, or a Link passes a transfer's end on) at ``time``, once.
    reads/writes: chs[c] (and a Link's list of changed transfers) / returns: nothing."""
    if chs[c, A.CH_CLOSED] == 0:
        chs[c, A.CH_CLOSED] = 1
        chs[c, A.CH_CLOSE_TIME] = time
        link_transfer_changed(chs, c)


@kernel
def pop(chs, slots, c, clock, tl):
    """Dequeue c's head at receiver clock ``clock`` (>= its stamp).

    reads: chs[c], slots / writes: the slot's credit-free time, chs[c, CH_HEAD] / returns: nothing.
    """
    if chs[c, A.CH_PK_NEXT] < chs[c, A.CH_HEAD]:  # an open send may still need element head - cap's credit
        settle_peak(chs, slots, c, False)
    row = chs[c, A.CH_HEAD_ROW]
    d = clock
    d = max(d, slots[row, A.SL_STAMP])
    slots[row, A.SL_FREE] = d + chs[c, A.CH_CREDIT_LAT]
    if tl is not None:
        tk = A.SL_TOKEN
        tl_element(tl, c, slots[row, A.SL_SENT], d + chs[c, A.CH_CREDIT_LAT],
                   slots[row, tk + A.TK_ROWS] * slots[row, tk + A.TK_COLS] * slots[row, tk + A.TK_BYTES])
    chs[c, A.CH_HEAD] += 1
    chs[c, A.CH_HEAD_ROW] = next_row(chs, c, row)
    link_transfer_changed(chs, c)


@kernel
def push(chs, slots, c, clock, requested, stop, flags, nbytes, rows, cols, offset, payload):
    """Enqueue a token on c (c must have a free slot).

    reads: chs[c], the slot's credit-free time / writes: the slot, chs[c] tail and peak /
    returns: the sender's clock after the credit wait.
    """
    tail = chs[c, A.CH_TAIL]
    if chs[c, A.CH_PK_NEXT] <= tail - chs[c, A.CH_CAP]:  # this send overwrites an open send's time
        settle_peak(chs, slots, c, False)
    row = chs[c, A.CH_TAIL_ROW]
    free = slots[row, A.SL_FREE]
    clock = max(clock, free)
    stamp = clock + chs[c, A.CH_LAT]
    stamp = max(stamp, requested)
    slots[row, A.SL_STAMP] = stamp
    slots[row, A.SL_TOKEN + A.TK_STOP] = stop
    slots[row, A.SL_TOKEN + A.TK_FLAGS] = flags
    slots[row, A.SL_TOKEN + A.TK_BYTES] = nbytes
    slots[row, A.SL_TOKEN + A.TK_ROWS] = rows
    slots[row, A.SL_TOKEN + A.TK_COLS] = cols
    slots[row, A.SL_TOKEN + A.TK_OFFSET] = offset
    slots[row, A.SL_TOKEN + A.TK_PAYLOAD] = payload
    slots[row, A.SL_SENT] = clock
    chs[c, A.CH_TAIL] = tail + 1
    chs[c, A.CH_TAIL_ROW] = next_row(chs, c, row)
    link_transfer_changed(chs, c)
    return clock


@kernel
def push_copy(chs, slots, c, clock, requested, src, srow, scol, stop):
    """Enqueue a copy of the token at ``src[srow, scol:scol+N_TOKEN]`` with its stop level replaced.

    reads: src row, chs[c] / writes: the slot, chs[c] / returns: the sender's clock after the credit wait.
    """
    return push(chs, slots, c, clock, requested, stop, src[srow, scol + A.TK_FLAGS], src[srow, scol + A.TK_BYTES],
                src[srow, scol + A.TK_ROWS], src[srow, scol + A.TK_COLS], src[srow, scol + A.TK_OFFSET],
                src[srow, scol + A.TK_PAYLOAD])


@kernel
def record_queued(chs, slots, tl):
    """Timeline: record every element still queued when the run ends as holding its slot forever (credit NEVER),
    as the peak counter counts it. reads: chs, slots / writes: tl / returns: nothing."""
    tk = A.SL_TOKEN
    for c in range(chs.shape[0]):
        row = chs[c, A.CH_HEAD_ROW]
        for _ in range(chs[c, A.CH_TAIL] - chs[c, A.CH_HEAD]):
            tl_element(tl, c, slots[row, A.SL_SENT], A.NEVER,
                       slots[row, tk + A.TK_ROWS] * slots[row, tk + A.TK_COLS] * slots[row, tk + A.TK_BYTES])
            row = next_row(chs, c, row)
