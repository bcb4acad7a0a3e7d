"""Optional event recording (timelines): unit intervals, FIFO occupancy changes, HBM requests per window.

The engine passes one more array, ``tl``, down to every function that moves a unit's clock or a channel.
When recording is off it is ``None``: numba compiles that specialization with every ``if tl is not None``
branch pruned, so a run without a timeline executes exactly the code it did before (the bench checks the
throughput). When it is an array (``stepsim.kernels.api._new_timeline``) the engine writes:

* **intervals** ``[4 * unit + kind, start, end, channel]``: every advance of a unit's clock is one of busy
  (``TL_BUSY``; channel -1, or ``TL_CH_HBM`` while a memory unit waits for its tile), blocked on input
  (``TL_BLOCKED_IN``, the channel it waits on) or blocked on output (``TL_BLOCKED_OUT``, the channel whose
  credit it waits for). These are exactly the increments of the unit's busy / blocked counters, so per unit
  the intervals sum to the counters. A new interval that continues the unit's previous one (same kind and
  channel, no gap) extends it instead of taking a record.
* **elements** ``[4 * channel + TL_CHANNEL, sent, credit, bytes]``, written when an element is dequeued: it
  held a slot from its send (the sender's clock after its credit wait) until its credit is back (dequeue
  time + credit latency), the same timestamps the peak-occupancy counter uses, so the running occupancy per
  channel (releases before sends at equal times) never exceeds the depth and its maximum equals the peak
  counter. One record per element rather than one per change halves the records; elements still queued
  when the run ends are recorded then, with credit ``NEVER`` (:func:`stepsim.kernels.channels.record_queued`).
* **HBM requests per window**: the requests the HBM takes at each tick (also for ticks served in closed
  form), summed into ``TL_N_BUCKETS`` buckets of ``window`` cycles. The window starts at 1 cycle and doubles
  (adjacent buckets merged) whenever a tick falls past the last bucket, so memory stays fixed and the counts
  stay exact at the final window.

The record buffer holds at most ``capacity`` records (the user's limit). Units run ahead of each other, so
the order in which records arrive is not the order of their times: a buffer that kept the first records to
arrive would be complete only up to cycle 0 or so. Instead the engine counts every record it leaves out by its
start time into a histogram (``TL_N_BUCKETS`` buckets, window doubling as for the HBM) and keeps only records
that start before ``TLH_CUTOFF``. When a run overflows, :func:`stepsim.kernels.api.run` picks from the histogram
the latest bucket boundary whose earlier records fit and runs once more with that cutoff (the engine is
deterministic, so the second run sees the same records). ``horizon`` is the earliest start of any record
left out: every interval and channel event that starts before it is in the buffer, so the Python side cuts
the trace there and says so: a partial trace, never a crash.

Layout of ``tl`` (one int64 array; header slots ``TLH_*``, then per unit its last interval's kind, channel,
end and record index (-1 when not stored), then the HBM buckets, then the record-start histogram, then the
records, ``TL_COLS`` per record).
"""

from __future__ import annotations

import numpy as np

from stepsim.kernels import abi as A
from stepsim.kernels.jit import kernel

# record kinds (column 0)
TL_BUSY = 0
TL_BLOCKED_IN = 1
TL_BLOCKED_OUT = 2
TL_CHANNEL = 3
#: the channel column of a busy interval spent waiting for the HBM (a memory unit's tile in flight)
TL_CH_HBM = -2
TL_COLS = 4
TL_N_BUCKETS = 2048

# header slots
TLH_N = 0  # records written
TLH_CAP = 1  # record capacity
TLH_DROPPED = 2  # records left out once the buffer was full
TLH_HORIZON = 3  # earliest start among records left out (NEVER: nothing left out)
TLH_SHIFT = 4  # log2 of the HBM bucket width (cycles)
TLH_LAST = 5  # offset of the per-unit last-interval registers (TL_UNIT_COLS per unit)
TLH_BUCKETS = 6  # offset of the HBM buckets
TLH_REC = 7  # offset of the records
TLH_CUTOFF = 8  # records starting at or after this cycle are left out (NEVER: none)
TLH_HIST = 9  # offset of the record-start histogram
TLH_HIST_SHIFT = 10  # log2 of its bucket width (cycles)
N_TLH = 12
#: per-unit registers: the last interval's kind, channel, end and record index (-1: not stored)
TL_UNIT_COLS = 4


@kernel
def _keep(tl, t):
    """A new record starting at t: returns the offset to write it to, or -1 when it is left out (at or after
    the cutoff, or the buffer is full), which lowers the horizon and counts it in the histogram of left-out
    records (only those: the stored ones are binned in :func:`cutoff_that_fits`, which keeps this hot path
    to a compare and an increment)."""
    n = tl[TLH_N]
    if n < tl[TLH_CAP] and t < tl[TLH_CUTOFF]:
        tl[TLH_N] = n + 1
        return tl[TLH_REC] + n * TL_COLS
    tl[TLH_DROPPED] += 1
    if t < tl[TLH_HORIZON]:
        tl[TLH_HORIZON] = t
    _fit_window(tl, t, TLH_HIST_SHIFT, TLH_HIST)
    tl[tl[TLH_HIST] + (t >> tl[TLH_HIST_SHIFT])] += 1
    return -1


@kernel
def tl_interval(tl, kind, u, start, end, ch):
    """Record that unit u spent [start, end) cycles as ``kind`` (on channel ``ch``); end > start.

    reads/writes: tl / returns: nothing.
    """
    last = tl[TLH_LAST] + u * TL_UNIT_COLS
    if tl[last] == kind and tl[last + 1] == ch and tl[last + 2] == start:  # continues the unit's last interval
        tl[last + 2] = end
        r = tl[last + 3]
        if r >= 0:
            tl[r + 2] = end
        return
    # the record is written field by field here and in tl_element on purpose: one shared store helper measured
    # 10-30 % slower on the chain benchmark with recording on (A/B, 2026-11-23, bench/README.md)
    r = _keep(tl, start)
    tl[last] = kind
    tl[last + 1] = ch
    tl[last + 2] = end
    tl[last + 3] = r
    if r >= 0:
        tl[r] = u * 4 + kind
        tl[r + 1] = start
        tl[r + 2] = end
        tl[r + 3] = ch


@kernel
def tl_element(tl, c, sent, credit, nbytes):
    """Record that an element of ``nbytes`` bytes held a slot of channel c over [sent, credit).

    reads/writes: tl / returns: nothing.
    """
    r = _keep(tl, sent)
    if r >= 0:
        tl[r] = c * 4 + TL_CHANNEL
        tl[r + 1] = sent
        tl[r + 2] = credit
        tl[r + 3] = nbytes


@kernel
def _fit_window(tl, t, shift_slot, offset_slot):
    """Double a histogram's window (merging adjacent buckets) until time t falls inside its last bucket."""
    b0 = tl[offset_slot]
    while (t >> tl[shift_slot]) >= TL_N_BUCKETS:
        for i in range(TL_N_BUCKETS // 2):
            tl[b0 + i] = tl[b0 + 2 * i] + tl[b0 + 2 * i + 1]
        for i in range(TL_N_BUCKETS // 2, TL_N_BUCKETS):
            tl[b0 + i] = 0
        tl[shift_slot] += 1


@kernel
def tl_hbm(tl, t, n_ticks, per_tick):
    """Add ``per_tick`` HBM requests taken at each of the ticks [t, t + n_ticks). writes: the buckets."""
    if n_ticks <= 0 or per_tick == 0:
        return
    last = t + n_ticks - 1
    _fit_window(tl, last, TLH_SHIFT, TLH_BUCKETS)
    w = 1 << tl[TLH_SHIFT]
    b0 = tl[TLH_BUCKETS]
    while t <= last:
        b = t // w
        upto = min(last, (b + 1) * w - 1)
        tl[b0 + b] += (upto - t + 1) * per_tick
        t = upto + 1


def layout_size(n_units: int, capacity: int) -> int:
    """int64 slots of a ``tl`` array for ``n_units`` units and ``capacity`` records."""
    return N_TLH + n_units * TL_UNIT_COLS + 2 * TL_N_BUCKETS + capacity * TL_COLS


def init(tl, n_units: int, capacity: int, cutoff: int = A.NEVER) -> None:
    """Fill a zeroed ``tl`` array of :func:`layout_size` slots (plain NumPy, not compiled): keep at most
    ``capacity`` records, only those starting before ``cutoff``."""
    tl[TLH_CAP] = capacity
    tl[TLH_HORIZON] = A.NEVER
    tl[TLH_CUTOFF] = cutoff
    tl[TLH_LAST] = N_TLH
    units = tl[N_TLH:N_TLH + n_units * TL_UNIT_COLS].reshape(n_units, TL_UNIT_COLS)
    units[:, 0] = -1  # no last interval
    units[:, 3] = -1
    tl[TLH_BUCKETS] = N_TLH + n_units * TL_UNIT_COLS
    tl[TLH_HIST] = tl[TLH_BUCKETS] + TL_N_BUCKETS
    tl[TLH_REC] = tl[TLH_HIST] + TL_N_BUCKETS


def cutoff_that_fits(tl) -> int:
    """After an overflowing run: the latest cycle (a histogram bucket boundary) before which every record fits.

    Bins the stored records' start times and the engine's histogram of the left-out ones at a common
    power-of-two window (plain NumPy, not compiled)."""
    n = int(tl[TLH_N])
    starts = tl[int(tl[TLH_REC]):int(tl[TLH_REC]) + n * TL_COLS].reshape(n, TL_COLS)[:, 1]
    shift = int(tl[TLH_HIST_SHIFT])
    while n and int(starts.max()) >> shift >= TL_N_BUCKETS:
        shift += 1
    left_out = tl[int(tl[TLH_HIST]):int(tl[TLH_HIST]) + TL_N_BUCKETS]
    hist = np.bincount(np.arange(TL_N_BUCKETS) >> (shift - int(tl[TLH_HIST_SHIFT])), weights=left_out,
                       minlength=TL_N_BUCKETS).astype(np.int64)
    hist += np.bincount(starts >> shift, minlength=TL_N_BUCKETS)
    fits = np.flatnonzero(np.cumsum(hist) > tl[TLH_CAP])
    return int(fits[0]) << shift
