"""Optional event recording (timelines): unit intervals, FIFO occupancy changes, HBM requests per window.

The engine passes one more array, ``tl``, down to every function that moves a unit's clock or a channel.
When recording is off it is ``None``: numba compiles that specialization with every ``if tl is not None``
branch pruned, so a run without a timeline executes exactly the code it did before (the bench checks the
throughput). When it is an array (built by :func:`stepsim.timeline.new_buffer`) the engine writes:

* **intervals** ``[kind, unit, start, end, channel]``: every advance of a unit's clock is one of busy
  (``TL_BUSY``; channel -1, or ``TL_CH_HBM`` while a memory unit waits for its tile), blocked on input
  (``TL_BLOCKED_IN``, the channel it waits on) or blocked on output (``TL_BLOCKED_OUT``, the channel whose
  credit it waits for). These are exactly the increments of the unit's busy / blocked counters, so per unit
  the intervals sum to the counters. A new interval that continues the unit's previous one (same kind and
  channel, no gap) extends it instead of taking a record.
* **channel events** ``[TL_CHANNEL, channel, t, delta_elements, delta_bytes]``: +1 when an element is sent
  (at the sender's clock after its credit wait) and -1 when its slot's credit is back (dequeue time + credit
  latency), the same timestamps the peak-occupancy counter uses, so the running sum per channel (releases
  before sends at equal times) never exceeds the depth and its maximum equals the peak counter.
* **HBM requests per window**: the requests the HBM takes at each tick (also for ticks served in closed
  form), summed into ``TL_N_BUCKETS`` buckets of ``window`` cycles. The window starts at 1 cycle and doubles
  (adjacent buckets merged) whenever a tick falls past the last bucket, so memory stays fixed and the counts
  stay exact at the final window.

The record buffer holds at most ``capacity`` records (the user's limit). Units run ahead of each other, so
the order in which records arrive is not the order of their times: a buffer that kept the first records to
arrive would be complete only up to cycle 0 or so. Instead the engine also counts every record by its start
time into a histogram (``TL_N_BUCKETS`` buckets, window doubling as for the HBM) and keeps only records that
start before ``TLH_CUTOFF``. When a run overflows, :func:`stepsim.kernels.api.run` picks from the histogram
the latest bucket boundary whose earlier records fit and runs once more with that cutoff (the engine is
deterministic, so the second run sees the same records). ``horizon`` is the earliest start of any record
left out: every interval and channel event that starts before it is in the buffer, so the Python side cuts
the trace there and says so: a partial trace, never a crash.

Layout of ``tl`` (one int64 array; header slots ``TLH_*``, then per unit its last interval's kind, channel,
end and record index (-1 when not stored), then the HBM buckets, then the record-start histogram, then the
records, ``TL_COLS`` per record).
"""

from __future__ import annotations

from stepsim.kernels import abi as A
from stepsim.kernels.jit import kernel

# record kinds (column 0)
TL_BUSY = 0
TL_BLOCKED_IN = 1
TL_BLOCKED_OUT = 2
TL_CHANNEL = 3
#: the channel column of a busy interval spent waiting for the HBM (a memory unit's tile in flight)
TL_CH_HBM = -2
TL_COLS = 5
TL_N_BUCKETS = 2048

# header slots
TLH_N = 0  # records written
TLH_CAP = 1  # record capacity
TLH_DROPPED = 2  # records left out once the buffer was full
TLH_HORIZON = 3  # earliest start among records left out (NEVER: nothing left out)
TLH_WINDOW = 4  # HBM bucket width (cycles, a power of two)
TLH_LAST = 5  # offset of the per-unit last-interval registers (TL_UNIT_COLS per unit)
TLH_BUCKETS = 6  # offset of the HBM buckets
TLH_REC = 7  # offset of the records
TLH_CUTOFF = 8  # records starting at or after this cycle are left out (NEVER: none)
TLH_HIST = 9  # offset of the record-start histogram
TLH_HIST_WINDOW = 10  # its bucket width (cycles, a power of two)
N_TLH = 12
#: per-unit registers: the last interval's kind, channel, end and record index (-1: not stored)
TL_UNIT_COLS = 4


@kernel
def _keep(tl, t):
    """Count a new record starting at t in the histogram; returns the row to write it to, or -1 when it is left
    out (at or after the cutoff, or the buffer is full), which lowers the horizon."""
    _fit_window(tl, t, TLH_HIST_WINDOW, TLH_HIST)
    tl[tl[TLH_HIST] + t // tl[TLH_HIST_WINDOW]] += 1
    n = tl[TLH_N]
    if t >= tl[TLH_CUTOFF] or n == tl[TLH_CAP]:
        tl[TLH_DROPPED] += 1
        if t < tl[TLH_HORIZON]:
            tl[TLH_HORIZON] = t
        return -1
    tl[TLH_N] = n + 1
    return tl[TLH_REC] + n * TL_COLS


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
            tl[r + 3] = end
        return
    r = _keep(tl, start)
    tl[last] = kind
    tl[last + 1] = ch
    tl[last + 2] = end
    tl[last + 3] = r
    if r >= 0:
        tl[r] = kind
        tl[r + 1] = u
        tl[r + 2] = start
        tl[r + 3] = end
        tl[r + 4] = ch


@kernel
def tl_channel(tl, c, t, d_elems, d_bytes):
    """Record an occupancy change of channel c at time t. reads/writes: tl / returns: nothing."""
    r = _keep(tl, t)
    if r >= 0:
        tl[r] = TL_CHANNEL
        tl[r + 1] = c
        tl[r + 2] = t
        tl[r + 3] = d_elems
        tl[r + 4] = d_bytes


@kernel
def _fit_window(tl, t, window_slot, offset_slot):
    """Double a histogram's window (merging adjacent buckets) until time t falls inside its last bucket."""
    b0 = tl[offset_slot]
    while t >= tl[window_slot] * TL_N_BUCKETS:
        for i in range(TL_N_BUCKETS // 2):
            tl[b0 + i] = tl[b0 + 2 * i] + tl[b0 + 2 * i + 1]
        for i in range(TL_N_BUCKETS // 2, TL_N_BUCKETS):
            tl[b0 + i] = 0
        tl[window_slot] *= 2


@kernel
def tl_hbm(tl, t, n_ticks, per_tick):
    """Add ``per_tick`` HBM requests taken at each of the ticks [t, t + n_ticks). writes: the buckets."""
    if n_ticks <= 0 or per_tick == 0:
        return
    last = t + n_ticks - 1
    _fit_window(tl, last, TLH_WINDOW, TLH_BUCKETS)
    w = tl[TLH_WINDOW]
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
    tl[TLH_WINDOW] = 1
    tl[TLH_HIST_WINDOW] = 1
    tl[TLH_LAST] = N_TLH
    units = tl[N_TLH:N_TLH + n_units * TL_UNIT_COLS].reshape(n_units, TL_UNIT_COLS)
    units[:, 0] = -1  # no last interval
    units[:, 3] = -1
    tl[TLH_BUCKETS] = N_TLH + n_units * TL_UNIT_COLS
    tl[TLH_HIST] = tl[TLH_BUCKETS] + TL_N_BUCKETS
    tl[TLH_REC] = tl[TLH_HIST] + TL_N_BUCKETS


def cutoff_that_fits(tl) -> int:
    """After an overflowing run: the latest histogram bucket boundary before which every record fits."""
    window = int(tl[TLH_HIST_WINDOW])
    hist = tl[int(tl[TLH_HIST]):int(tl[TLH_HIST]) + TL_N_BUCKETS]
    total = 0
    for k, count in enumerate(hist.tolist()):
        if total + count > tl[TLH_CAP]:
            return k * window
        total += count
    return TL_N_BUCKETS * window
