"""Timelines of a run as Arrow tables: ``simulate(..., timeline=True)`` and ``stepsim run --timeline PATH``.

The engine records into one int64 buffer (:mod:`stepsim.kernels.timeline`); :func:`decode` turns it into
a :class:`Timeline` of four Arrow tables, ready for pandas / DuckDB / polars and for the trace writers of
:mod:`stepsim.simulation.timeline_export`:

* ``intervals``: ``unit`` (str), ``group`` (``expert 3`` / ``region 1`` / ``shared``), ``kind`` (operator
  class), ``state`` (``busy`` / ``blocked_in`` / ``blocked_out``), ``start`` / ``end`` (cycles, end
  exclusive), ``channel`` (the channel waited on; null for busy), ``hbm`` (True for busy time a memory unit
  spends waiting for its tile from the HBM). Per unit, the intervals of a state sum exactly to the unit's
  counter (``unit_counters`` busy / blocked-in / blocked-out): they are recorded where those counters grow.
* ``fifo``: ``channel``, ``t`` (cycles), ``occupancy`` (elements after every change at ``t``), ``bytes``
  (bytes held then). Occupancy follows the peak counter's definition (a slot is held from the send until
  its credit is back), so its maximum per channel equals ``channel_counters`` peak.
* ``onchip``: ``t``, ``fifo_bytes``: bytes held in all FIFOs together after every change.
* ``hbm``: ``start`` / ``end`` (a window of cycles), ``requests`` taken by the HBM in it, ``bytes``
  (requests x request size) and ``bytes_per_cycle``. The window is the smallest power of two that fits the
  run into 2,048 windows. This table is always complete (the engine counts requests outside the buffer).

A full buffer never fails a run: the engine keeps the records before the latest cycle at which they fit
(:mod:`stepsim.kernels.timeline`), and the tables are cut at ``horizon``, the earliest cycle of anything left
out (every event before it is present).
``Timeline.complete`` says whether anything was cut.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from stepsim.graph.labels import graph_labels, group_label  # noqa: F401 (graph_labels: also imported from here)
from stepsim.kernels import abi as A
from stepsim.kernels import timeline as T

#: default record limit of ``simulate(..., timeline=True)`` and ``stepsim run --timeline`` (32 bytes each)
DEFAULT_RECORDS = 4_000_000

STATES = ("busy", "blocked_in", "blocked_out")

INTERVAL_SCHEMA = pa.schema([("unit", pa.string()), ("group", pa.string()), ("kind", pa.string()),
                             ("state", pa.string()), ("start", pa.int64()), ("end", pa.int64()),
                             ("channel", pa.string()), ("hbm", pa.bool_())])
FIFO_SCHEMA = pa.schema([("channel", pa.string()), ("t", pa.int64()), ("occupancy", pa.int64()),
                         ("bytes", pa.int64())])
ONCHIP_SCHEMA = pa.schema([("t", pa.int64()), ("fifo_bytes", pa.int64())])
HBM_SCHEMA = pa.schema([("start", pa.int64()), ("end", pa.int64()), ("requests", pa.int64()),
                        ("bytes", pa.int64()), ("bytes_per_cycle", pa.float64())])


@dataclass(frozen=True)
class Timeline:
    """The decoded timeline of one run (tables described in the module docstring).

    ``records`` / ``capacity``: engine records used / allowed; ``dropped``: records left out once full;
    ``horizon``: cycle the tables are cut at (None when complete); ``hbm_window``: cycles per HBM window.
    """

    intervals: pa.Table
    fifo: pa.Table
    onchip: pa.Table
    hbm: pa.Table
    records: int
    capacity: int
    dropped: int
    horizon: int | None
    hbm_window: int

    @property
    def complete(self) -> bool:
        """True when every event of the run was recorded."""
        return self.dropped == 0

    def write(self, path, *, min_dur: int = 0, max_events_per_track: int = 100_000) -> None:
        """Write a Perfetto trace by ``path``'s suffix (``.json`` / ``.json.gz`` / ``.pftrace`` /
        ``.perfetto-trace``; :func:`stepsim.simulation.timeline_export.write_timeline`), this status in its metadata."""
        from stepsim.simulation.timeline_export import write_timeline

        meta = {"status": self.status(), "complete": self.complete, "horizon_cycle": self.horizon,
                "hbm_window_cycles": self.hbm_window}
        write_timeline(path, self.intervals, self.fifo, onchip=self.onchip, hbm=self.hbm, min_dur=min_dur,
                       max_events_per_track=max_events_per_track, metadata=meta)

    def status(self) -> str:
        """One line: how much was recorded, and where the trace is cut if the buffer filled."""
        if self.complete:
            return f"timeline: {self.records:,} records (complete)"
        return (f"timeline: over the limit of {self.capacity:,} records; kept the {self.records:,} before cycle "
                f"{self.horizon:,} and left out {self.dropped:,} (raise the limit to record more)")


def decode(tl: np.ndarray, program, groups: dict[str, str] | None = None,
           kinds: dict[str, str] | None = None) -> Timeline:
    """The :class:`Timeline` of a run's buffer.

    ``program``: the lowered program that ran (unit and channel names, request size); ``groups`` / ``kinds``:
    a unit name's group label and operator class (default ``shared`` and the opcode name).
    """
    n = int(tl[T.TLH_N])
    rec = tl[int(tl[T.TLH_REC]):int(tl[T.TLH_REC]) + n * T.TL_COLS].reshape(n, T.TL_COLS)
    dropped = int(tl[T.TLH_DROPPED])
    horizon = int(tl[T.TLH_HORIZON]) if dropped else None
    cut = horizon if horizon is not None else A.NEVER
    kind = rec[:, 0] & 3
    is_ivl = kind < T.TL_CHANNEL
    ivl = np.column_stack([kind[is_ivl], rec[is_ivl, 0] >> 2, rec[is_ivl, 1:]])  # kind, unit, start, end, ch
    changes = _changes(rec[~is_ivl], cut)
    return Timeline(intervals=_intervals(ivl, program, groups or {}, kinds or {}, cut),
                    fifo=_fifo(changes, program), onchip=_onchip(changes),
                    hbm=_hbm(tl, program), records=n, capacity=int(tl[T.TLH_CAP]), dropped=dropped,
                    horizon=horizon, hbm_window=1 << int(tl[T.TLH_SHIFT]))


def _intervals(iv: np.ndarray, program, groups, kinds, cut: int) -> pa.Table:
    iv = iv[iv[:, 2] < cut]
    iv = iv[np.lexsort((iv[:, 2], iv[:, 1]))]  # by unit, then start
    end = np.minimum(iv[:, 3], cut)
    names = program.unit_names
    ch_names = program.channel_names
    units = [names[u] for u in iv[:, 1].tolist()]
    return pa.Table.from_pydict({
        "unit": units, "group": [groups.get(u, "shared") for u in units],
        "kind": [kinds.get(names[u]) or program.opcode_name(u) for u in iv[:, 1].tolist()],
        "state": [STATES[k] for k in iv[:, 0].tolist()], "start": iv[:, 2], "end": end,
        "channel": [ch_names[c] if c >= 0 else None for c in iv[:, 4].tolist()],
        "hbm": (iv[:, 4] == T.TL_CH_HBM)}, schema=INTERVAL_SCHEMA)


def _changes(elements: np.ndarray, cut: int) -> np.ndarray:
    """Occupancy changes ``[channel, t, +-1, +-bytes]`` of the element records before ``cut``: +1 at the send,
    -1 when the credit is back; sorted by (channel, t), releases before sends at equal times."""
    ch = elements[:, 0] >> 2
    sends = np.column_stack([ch, elements[:, 1], np.ones_like(ch), elements[:, 3]])
    releases = np.column_stack([ch, elements[:, 2], -np.ones_like(ch), -elements[:, 3]])
    ev = np.concatenate([sends, releases])
    ev = ev[ev[:, 1] < cut]
    return ev[np.lexsort((ev[:, 2], ev[:, 1], ev[:, 0]))]


def _fifo(ev: np.ndarray, program) -> pa.Table:
    ch, t = ev[:, 0], ev[:, 1]
    occ = np.zeros(len(ev), dtype=np.int64)
    held = np.zeros(len(ev), dtype=np.int64)
    if len(ev):
        starts = np.flatnonzero(np.r_[True, ch[1:] != ch[:-1]])  # first event of each channel
        occ = _segment_cumsum(ev[:, 2], starts)
        held = _segment_cumsum(ev[:, 3], starts)
    last = np.r_[(ch[1:] != ch[:-1]) | (t[1:] != t[:-1]), True] if len(ev) else np.zeros(0, bool)
    names = program.channel_names
    return pa.Table.from_pydict({"channel": [names[c] for c in ch[last].tolist()], "t": t[last],
                                 "occupancy": occ[last], "bytes": held[last]}, schema=FIFO_SCHEMA)


def _segment_cumsum(values: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Running sums of ``values`` restarting at every index in ``starts`` (``starts[0] == 0``)."""
    total = np.cumsum(values)
    before = np.r_[0, total[starts[1:] - 1]]  # the running sum just before each segment
    segment = np.cumsum(np.isin(np.arange(len(values)), starts)) - 1
    return total - before[segment]


def _onchip(ev: np.ndarray) -> pa.Table:
    ev = ev[np.lexsort((ev[:, 2], ev[:, 1]))]  # by time, releases first
    held = np.cumsum(ev[:, 3])
    t = ev[:, 1]
    last = np.r_[t[1:] != t[:-1], True] if len(ev) else np.zeros(0, bool)
    return pa.Table.from_pydict({"t": t[last], "fifo_bytes": held[last]}, schema=ONCHIP_SCHEMA)


def _hbm(tl: np.ndarray, program) -> pa.Table:
    """Never cut: the engine keeps counting HBM requests after the record buffer is full."""
    w = 1 << int(tl[T.TLH_SHIFT])
    b0 = int(tl[T.TLH_BUCKETS])
    buckets = tl[b0:b0 + T.TL_N_BUCKETS]
    used = np.flatnonzero(buckets)
    n_b = int(used[-1]) + 1 if len(used) else 0
    start = np.arange(n_b, dtype=np.int64) * w
    reqs = buckets[:n_b]
    nbytes = reqs * int(program.hw[A.HW_ADDR_OFFSET])
    return pa.Table.from_pydict({"start": start, "end": start + w, "requests": reqs, "bytes": nbytes,
                                 "bytes_per_cycle": nbytes / w}, schema=HBM_SCHEMA)


# --- the command line (``stepsim run --timeline PATH``) -------------------------------------------------------
TRACE_SUFFIXES = (".json", ".json.gz", ".pftrace", ".perfetto-trace")
#: runs of this many cycles or more merge intervals shorter than cycles / MIN_DUR_DIVISOR by default
MIN_DUR_DIVISOR = 200_000


def check_timeline_args(path: str | None, limit: int | None, min_dur: int | None) -> int:
    """Check ``--timeline`` / ``--timeline-limit`` / ``--timeline-min-dur`` before a run; returns the record
    limit. ArgumentError (one line, naming the flag) for a missing ``--timeline``, a bad number, an unknown
    suffix or an unwritable destination; ConfigError when the Perfetto writer's extra is not installed."""
    from stepsim.base.errors import ArgumentError, ConfigError
    from stepsim.base.outputs import check_out_file

    if path == "":
        raise ArgumentError("--timeline: empty path; give a file name ending in .json, .json.gz, .pftrace or "
                            ".perfetto-trace")
    if not path:
        flag = "--timeline-limit" if limit is not None else "--timeline-min-dur"
        raise ArgumentError(f"{flag} needs --timeline PATH")
    if limit is not None and limit < 1:
        raise ArgumentError(f"--timeline-limit {limit}: give a record count >= 1")
    if min_dur is not None and min_dur < 0:
        raise ArgumentError(f"--timeline-min-dur {min_dur}: give cycles >= 0")
    if not str(path).endswith(TRACE_SUFFIXES):
        raise ArgumentError(f"--timeline {path}: unknown trace format (use .json, .json.gz, .pftrace or "
                            ".perfetto-trace)")
    check_out_file(path, "--timeline")
    if str(path).endswith((".pftrace", ".perfetto-trace")):
        try:
            import perfetto.trace_builder.proto_builder  # noqa: F401
        except ImportError:
            raise ConfigError(f"--timeline {path}: the Perfetto protobuf writer needs the 'perfetto' package "
                              "(pip install 'stepsim[timeline]'), or write .json / .json.gz") from None
    return DEFAULT_RECORDS if limit is None else int(limit)


def write_run_timeline(record, path: str, min_dur: int | None, out) -> None:
    """Write ``record.timeline`` (a :class:`Timeline`) to ``path`` and print where, and its status, to ``out``."""
    timeline = record.timeline
    if timeline is None:  # a metrics run has no timeline (the parser only offers --timeline on run)
        return
    cycles = int(record.row.get("cycles") or 0)
    if min_dur is None:
        min_dur = cycles // MIN_DUR_DIVISOR
    timeline.write(path, min_dur=min_dur)
    print(f"wrote timeline: {path} ({timeline.status().removeprefix('timeline: ')}"
          f"{f'; intervals under {min_dur} cycles merged' if min_dur > 1 else ''})", file=out)


def write_deadlock_timeline(timeline: Timeline, path: str, min_dur: int | None) -> None:
    """``stepsim run --timeline PATH`` on a run that deadlocked: the timeline up to the deadlock (stderr note)."""
    import sys

    end = max(timeline.intervals.column("end").to_pylist(), default=0)
    timeline.write(path, min_dur=end // MIN_DUR_DIVISOR if min_dur is None else min_dur)
    print(f"wrote timeline up to the deadlock: {path} ({timeline.status().removeprefix('timeline: ')})",
          file=sys.stderr)
