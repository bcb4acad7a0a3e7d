"""Helpers shared by the per-family unit state machines (clock accounting, tokens, selectors, stop levels).

Every unit step function has the signature
``step(u, up, us, in_ch, out_ch, chs, slots, payload, sel_ptr, sel_idx, hw, arena, eng, hfree, hq)`` and
returns ``abi.STEP_BLOCKED`` (after recording what it waits on in ``us[u, US_WAIT_CH / US_WAIT_KIND]``),
``abi.STEP_DONE`` or ``abi.STEP_TIME`` (a time-sensitive unit yielding to the global scheduler).
Units run ahead until they block (canonical rule 2): a firing is started only when everything it needs is
physically present, or its progress so far is kept in ``US_PHASE`` and the scratch registers.
"""

from __future__ import annotations

from stepsim.kernels import abi as A
from stepsim.kernels.channels import can_pop, can_push, closed_empty, head_row, next_free, pop, push, push_copy
from stepsim.kernels.jit import kernel
from stepsim.kernels.timeline import TL_BLOCKED_IN, TL_BLOCKED_OUT, TL_BUSY, tl_interval
from stepsim.kernels.values import drop, keep


@kernel
def block(us, u, c, kind):
    """reads: nothing / writes: us[u] wait channel and kind / returns: STEP_BLOCKED."""
    us[u, A.US_WAIT_CH] = c
    us[u, A.US_WAIT_KIND] = kind
    return A.STEP_BLOCKED


@kernel
def wait_input(us, u, t, c, tl):
    """Blocking-receive clock rule ``clock = max(clock, t)``, counted as blocked-on-input.

    reads: us[u] clock / writes: us[u] clock and blocked-in counter / returns: nothing.
    """
    clock = us[u, A.US_CLOCK]
    if t > clock:
        us[u, A.US_BLOCKED_IN] += t - clock
        us[u, A.US_CLOCK] = t
        if tl is not None:
            tl_interval(tl, TL_BLOCKED_IN, u, clock, t, c)


@kernel
def seen_closed(us, u, chs, c, tl):
    """True if channel c is closed and empty; the unit then observes the closure at the producer's final clock.

    Canonical rule (docs/timing_model.md §1.3): a closure is observed at T iff the producer's final clock <= T, so the
    observer's clock becomes ``max(clock, close time)`` (counted as blocked-on-input). Acting on a closure
    earlier would let a unit react to the future, e.g. pad a ragged tile or issue HBM requests in the past.

    reads: chs[c] / writes: us[u] clock and blocked-in counter when closed / returns: bool.
    """
    if closed_empty(chs, c):
        wait_input(us, u, chs[c, A.CH_CLOSE_TIME], c, tl)
        return True
    return False


@kernel
def await_input(us, u, chs, c, tl):
    """The input prologue of a unit driven by channel c.

    reads: chs[c] / writes: us[u] wait registers (or clock, on close) / returns: STEP_READY when c holds an
    element, STEP_DONE when c is closed (observed at its close time, :func:`seen_closed`), else STEP_BLOCKED
    waiting on c.
    """
    if can_pop(chs, c):
        return A.STEP_READY
    if seen_closed(us, u, chs, c, tl):
        return A.STEP_DONE
    return block(us, u, c, A.WAIT_EMPTY)


@kernel
def spend(us, u, cycles, tl):
    """reads: nothing / writes: us[u] clock += cycles and the busy counter / returns: nothing."""
    if tl is not None and cycles > 0:
        tl_interval(tl, TL_BUSY, u, us[u, A.US_CLOCK], us[u, A.US_CLOCK] + cycles, -1)
    us[u, A.US_CLOCK] += cycles
    us[u, A.US_BUSY] += cycles


@kernel
def advance_busy(us, u, t, ch, tl):
    """``clock = max(clock, t)`` counted as busy (``ch``: the timeline's channel column, -1 or TL_CH_HBM).

    reads/writes: us[u] clock, busy / returns: nothing.
    """
    clock = us[u, A.US_CLOCK]
    if t > clock:
        us[u, A.US_BUSY] += t - clock
        us[u, A.US_CLOCK] = t
        if tl is not None:
            tl_interval(tl, TL_BUSY, u, clock, t, ch)


@kernel
def take(us, u, chs, slots, c, tl):
    """Blocking dequeue of c's head (c must be non-empty): clock = max(clock, stamp), then pop.

    reads: the head slot / writes: us[u] clock, the channel / returns: the head's slot row (still readable).
    """
    row = head_row(chs, c)
    wait_input(us, u, slots[row, A.SL_STAMP], c, tl)
    pop(chs, slots, c, us[u, A.US_CLOCK], tl)
    return row


@kernel
def consume(us, u, chs, slots, c, fi, tl):
    """:func:`take` for a unit that only reads the token's metadata: its values (functional mode) are released.

    reads: the head slot / writes: us[u] clock, the channel / returns: the head's slot row (metadata readable).
    """
    row = take(us, u, chs, slots, c, tl)
    drop(fi, slots, row, A.SL_TOKEN)
    return row


@kernel
def look(us, u, chs, slots, c, tl):
    """Blocking peek of c's head (c must be non-empty): clock = max(clock, stamp).

    reads: the head slot / writes: us[u] clock / returns: the head's slot row.
    """
    row = head_row(chs, c)
    wait_input(us, u, slots[row, A.SL_STAMP], c, tl)
    return row


@kernel
def emit(us, u, chs, slots, c, requested, stop, flags, nbytes, rows, cols, offset, payload, tl):
    """Enqueue on c at ``requested`` (c must have a free slot); credit waits count as blocked-on-output.

    reads: us[u] clock / writes: the channel, us[u] clock and blocked-out counter / returns: nothing.
    """
    clock = us[u, A.US_CLOCK]
    t = push(chs, slots, c, clock, requested, stop, flags, nbytes, rows, cols, offset, payload)
    if t > clock:
        us[u, A.US_BLOCKED_OUT] += t - clock
        us[u, A.US_CLOCK] = t
        if tl is not None:
            tl_interval(tl, TL_BLOCKED_OUT, u, clock, t, c)


@kernel
def room_on_outputs(us, u, chs, slots, out_ch, start, n, tl):
    """Make room to send one element on every output ``out_ch[start:start+n]`` at one time (Broadcast, and
    Reshape with its padding flags): each needs a free slot, then the clock waits for the latest credit
    (counted as blocked-on-output).

    reads: chs, slots / writes: us[u] clock, blocked-out counter and wait / returns: True when the element can be
    sent now, False after recording the block on the first full output.
    """
    clock = us[u, A.US_CLOCK]
    latest = clock
    latest_ch = -1
    for k in range(n):
        o = out_ch[start + k]
        if not can_push(chs, o):
            block(us, u, o, A.WAIT_FULL)
            return False
        free = next_free(chs, slots, o)
        if free > latest:
            latest = free
            latest_ch = o
    if latest > clock:
        us[u, A.US_BLOCKED_OUT] += latest - clock
        us[u, A.US_CLOCK] = latest
        if tl is not None:
            tl_interval(tl, TL_BLOCKED_OUT, u, clock, latest, latest_ch)
    return True


@kernel
def emit_copy(us, u, chs, slots, c, requested, src, srow, scol, stop, fi, tl):
    """Enqueue a copy of the token at ``src[srow, scol:]`` with stop ``stop``; like :func:`emit`.

    The copy holds its own reference to a tile's values (functional mode, :func:`stepsim.kernels.values.keep`).
    reads: the source row / writes: the channel, us[u] clock and blocked-out counter / returns: nothing.
    """
    keep(fi, src, srow, scol)
    clock = us[u, A.US_CLOCK]
    t = push_copy(chs, slots, c, clock, requested, src, srow, scol, stop)
    if t > clock:
        us[u, A.US_BLOCKED_OUT] += t - clock
        us[u, A.US_CLOCK] = t
        if tl is not None:
            tl_interval(tl, TL_BLOCKED_OUT, u, clock, t, c)


@kernel
def stash(us, u, col, src, srow, scol):
    """Copy the token at ``src[srow, scol:]`` into us[u, col:col+N_TOKEN].

    reads: the source row / writes: us[u] token registers / returns: nothing.
    """
    for k in range(A.N_TOKEN):
        us[u, col + k] = src[srow, scol + k]


@kernel
def tok_bytes(src, row, col):
    """reads: a token / writes: nothing / returns: its size in bytes (rows * cols * bytes per element)."""
    return src[row, col + A.TK_ROWS] * src[row, col + A.TK_COLS] * src[row, col + A.TK_BYTES]


@kernel
def pmu_cycles(nbytes, pmu_bw):
    """reads/writes: nothing / returns: ceil(nbytes / pmu_bw) (cycles)."""
    return (nbytes + pmu_bw - 1) // pmu_bw


@kernel
def load_cycles(src, row, col, pmu_bw):
    """L(x): PMU read cycles of a token if its read_from_mu flag is set, else 0.

    reads: the token / writes: nothing / returns: cycles.
    """
    if src[row, col + A.TK_FLAGS] & A.FLAG_MU:
        return pmu_cycles(tok_bytes(src, row, col), pmu_bw)
    return 0


@kernel
def stop_from_shape(payload, off, n, i):
    """Stop level of element i of a static shape ``payload[off:off+n]`` (outermost first).

    reads: the shape / writes: nothing / returns: the number of innermost dims element i closes (<= n).
    """
    level = 0
    for k in range(n):
        d = payload[off + n - 1 - k]
        if i % d == d - 1:
            level += 1
            i //= d
        else:
            break
    return level


@kernel
def sel_count(flags, value, sel_ptr):
    """reads: a selector token's flags/payload / writes: nothing / returns: how many targets it selects."""
    if flags & A.FLAG_SEL_CSR:
        return sel_ptr[value + 1] - sel_ptr[value]
    return 0 if value < 0 else 1


@kernel
def sel_target(flags, value, j, sel_ptr, sel_idx):
    """reads: a selector token's flags/payload / writes: nothing / returns: its j-th target (ascending)."""
    if flags & A.FLAG_SEL_CSR:
        return sel_idx[sel_ptr[value] + j]
    return value
