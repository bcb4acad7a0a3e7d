"""Chrome trace-event JSON export of a timeline (issue 14, "Timelines").

Input: the tables of a :class:`stepsim.simulation.timeline.Timeline` (each a pyarrow Table or a list of row dicts): the
interval table (columns ``unit`` str, ``group`` str, ``state`` str in {busy, blocked_in, blocked_out}, ``start``
/ ``end`` int cycles, ``channel`` str or None, optionally ``kind`` (operator class) and ``hbm`` bool), the FIFO
counter table (``channel`` str, ``t`` int cycles, ``occupancy`` int elements) and optionally the ``onchip``
(``t``, ``fifo_bytes``) and ``hbm`` (``start``, ``end``, ``bytes_per_cycle``) tables. Times are cycles,
written 1:1 as microseconds (``ts``/``dur``, the trace-event format's unit), so the Perfetto UI's "us" reads as
cycles; no ``displayTimeUnit`` is set (it would show every cycle as 1,000 ns), and the metadata says
``time_unit: "1 us = 1 cycle"``.

Tracks: one process per group (region / expert / stage, ``"graph"`` when a unit has none), in natural order
(``expert 2`` before ``expert 10``: ``process_sort_index``), one thread per unit inside it (natural order by
name: ``thread_sort_index``); each FIFO's occupancy as a counter (``ph: "C"``) in the process of the group
that produces into it (its producer is the unit named before ``[`` in the channel label ``Map_12[0]``), so an
expert's FIFOs sit with its units; channels whose producer is not among the units in a ``fifos`` process; live
FIFO bytes and HBM bandwidth (bytes per cycle per window) as counters in a ``memory`` process. Large runs stay usable:
intervals shorter than ``min_dur`` cycles are merged with their neighbours of the same kind on the same track,
and at most ``max_events_per_track`` events are written per track; what was merged or cut is written in the
trace's ``metadata`` (``aggregated`` and ``dropped`` counts per track).
"""
from __future__ import annotations

import gzip
import json
import os

__all__ = ["chrome_trace", "perfetto_trace_bytes", "write_chrome_trace", "write_timeline"]


def _rows(table) -> list[dict]:
    """Row dicts of a pyarrow Table or an iterable of dicts."""
    if table is None:
        return []
    if hasattr(table, "to_pylist"):
        return table.to_pylist()
    return [dict(r) for r in table]


def natural_key(name: str) -> tuple:
    """Sort key that compares the numbers in a name as numbers: ``expert 2`` < ``expert 10``, ``Map_9`` <
    ``Map_10``."""
    import re

    return tuple((0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", name) if part)


def _producer(channel: str) -> str | None:
    """The unit a channel label ``<unit>[<output>]`` comes from (None for another kind of name)."""
    if channel.endswith("]") and "[" in channel:
        return channel[:channel.rindex("[")]
    return None


def _aggregate(intervals: list[dict], min_dur: int) -> tuple[list[dict], int]:
    """Merge each run of same-kind intervals shorter than ``min_dur`` (cycles) that touch or are within
    ``min_dur`` of each other; returns (intervals, how many source intervals were merged away)."""
    out: list[dict] = []
    merged = 0
    for iv in intervals:
        short = iv["end"] - iv["start"] < min_dur
        if (short and out and out[-1]["state"] == iv["state"] and out[-1].get("_short")
                and iv["start"] - out[-1]["end"] < min_dur):
            out[-1]["end"] = max(out[-1]["end"], iv["end"])
            out[-1]["_n"] += 1
            merged += 1
            continue
        out.append(dict(iv, _short=short, _n=1))
    return out, merged


def chrome_trace(intervals, counters=None, *, onchip=None, hbm=None, min_dur: int = 0,
                 max_events_per_track: int = 100_000, metadata: dict | None = None) -> dict:
    """The Chrome trace-event document (a dict ready for :func:`json.dump`).

    ``min_dur`` (cycles): intervals shorter than this are aggregated (0 = keep all).
    ``max_events_per_track``: events past this many on one track are left out and counted."""
    rows = sorted(_rows(intervals), key=lambda r: (natural_key(str(r.get("group") or "graph")),
                                                     natural_key(r["unit"]), r["start"], r["end"]))
    groups = sorted({str(r.get("group") or "graph") for r in rows}, key=natural_key)
    pid_of = {g: i + 1 for i, g in enumerate(groups)}
    group_of_unit = {r["unit"]: str(r.get("group") or "graph") for r in rows}
    events: list[dict] = []
    for g, pid in pid_of.items():
        events.append({"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": g}})
        events.append({"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0, "args": {"sort_index": pid}})
    tid_of: dict[tuple, int] = {}
    by_track: dict[tuple, list[dict]] = {}
    for r in rows:
        key = (str(r.get("group") or "graph"), r["unit"])
        by_track.setdefault(key, []).append(r)
    aggregated: dict[str, int] = {}
    dropped: dict[str, int] = {}
    for (g, unit), ivs in by_track.items():
        pid = pid_of[g]
        tid = tid_of.setdefault((g, unit), len(tid_of) + 1)
        events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": unit}})
        events.append({"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tid, "args": {"sort_index": tid}})
        if min_dur > 0:
            ivs, n = _aggregate(ivs, min_dur)
            if n:
                aggregated[unit] = n
        if len(ivs) > max_events_per_track:
            dropped[unit] = len(ivs) - max_events_per_track
            ivs = ivs[:max_events_per_track]
        for iv in ivs:
            args = {}
            if iv.get("channel") is not None:
                args["channel"] = iv["channel"]
            if iv.get("kind"):
                args["op"] = iv["kind"]
            if iv.get("_n", 1) > 1:
                args["merged_intervals"] = iv["_n"]
            name = "busy (HBM)" if iv.get("hbm") else iv["state"]
            events.append({"name": name, "cat": iv["state"], "ph": "X", "pid": pid, "tid": tid,
                           "ts": int(iv["start"]), "dur": int(iv["end"] - iv["start"]), "args": args})
    crows = _rows(counters)
    if crows:
        per_ch: dict[str, list[dict]] = {}
        for c in sorted(crows, key=lambda c: (natural_key(c["channel"]), c["t"])):
            per_ch.setdefault(c["channel"], []).append(c)
        fifo_pid = None
        for ch, cs in per_ch.items():
            group = group_of_unit.get(_producer(ch))
            if group is not None:
                pid = pid_of[group]
            else:  # a channel whose producer is not among the units: one process for all of them
                if fifo_pid is None:
                    fifo_pid = len(pid_of) + 1
                    events.append({"name": "process_name", "ph": "M", "pid": fifo_pid, "tid": 0,
                                   "args": {"name": "fifos"}})
                    events.append({"name": "process_sort_index", "ph": "M", "pid": fifo_pid, "tid": 0,
                                   "args": {"sort_index": fifo_pid}})
                pid = fifo_pid
            if len(cs) > max_events_per_track:
                dropped[ch] = len(cs) - max_events_per_track
                cs = cs[:max_events_per_track]
            for c in cs:
                events.append({"name": ch, "ph": "C", "pid": pid, "tid": 0, "ts": int(c["t"]),
                               "args": {"occupancy": int(c["occupancy"])}})
    series = _memory_series(onchip, hbm)
    if series:
        mem_pid = max(e["pid"] for e in events) + 1 if events else 1
        events.append({"name": "process_name", "ph": "M", "pid": mem_pid, "tid": 0, "args": {"name": "memory"}})
        events.append({"name": "process_sort_index", "ph": "M", "pid": mem_pid, "tid": 0,
                       "args": {"sort_index": mem_pid}})
        for name, key, points in series:
            if len(points) > max_events_per_track:
                dropped[name] = len(points) - max_events_per_track
                points = points[:max_events_per_track]
            events.extend({"name": name, "ph": "C", "pid": mem_pid, "tid": 0, "ts": t, "args": {key: v}}
                          for t, v in points)
    meta = dict(metadata or {})
    meta.update({"time_unit": "1 us = 1 cycle", "min_dur_cycles": int(min_dur),
                 "max_events_per_track": int(max_events_per_track),
                 "aggregated": aggregated, "dropped": dropped})
    return {"traceEvents": events, "metadata": meta}


def _memory_series(onchip, hbm) -> list[tuple[str, str, list]]:
    """Counter series ``(track name, value key, [(t, value)])`` of live FIFO bytes and HBM bandwidth."""
    series = []
    rows = _rows(onchip)
    if rows:
        series.append(("on-chip FIFO bytes", "bytes", [(int(r["t"]), int(r["fifo_bytes"])) for r in rows]))
    rows = _rows(hbm)
    if rows:
        points = [(int(r["start"]), float(r["bytes_per_cycle"])) for r in rows]
        points.append((int(rows[-1]["end"]), 0.0))  # the last window ends
        series.append(("HBM bytes/cycle", "bytes_per_cycle", points))
    return series


def write_chrome_trace(path, intervals, counters=None, **kwargs) -> None:
    """Write :func:`chrome_trace` to ``path`` (``.json`` or ``.json.gz``), atomically (temp file, then
    os.replace), so an interrupted write never leaves a half-written trace."""
    path = os.fspath(path)
    doc = chrome_trace(intervals, counters, **kwargs)
    data = json.dumps(doc, separators=(",", ":")).encode()
    if path.endswith(".gz"):
        data = gzip.compress(data, mtime=0)  # mtime 0: identical inputs give identical bytes
    _atomic_write(path, data)


def perfetto_trace_bytes(intervals, counters=None, **kwargs) -> bytes:
    """The same tracks as :func:`chrome_trace` (same aggregation and cap) as Perfetto protobuf bytes, built with
    the ``perfetto`` package's TraceProtoBuilder (optional extra ``timeline``). Timestamps: 1 cycle = 1 us, i.e.
    1000 ns in the trace's nanosecond clock. Group tracks are parents of their units' tracks and FIFO counters, in
the JSON form's order (explicit sibling ranks)."""
    from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import TrackEvent
    from perfetto.trace_builder.proto_builder import TraceProtoBuilder

    doc = chrome_trace(intervals, counters, **kwargs)
    builder = TraceProtoBuilder()
    seq = 1
    names = {}
    for e in doc["traceEvents"]:
        if e["ph"] == "M" and e["name"] in ("process_name", "thread_name"):
            names[(e["pid"], e["tid"] if e["name"] == "thread_name" else 0)] = e["args"]["name"]
    uuid_of = {}
    for rank, ((pid, tid), name) in enumerate(sorted(names.items())):
        uuid = pid * 1_000_000 + tid + 1
        uuid_of[(pid, tid)] = uuid
        p = builder.add_packet()
        p.track_descriptor.uuid = uuid
        p.track_descriptor.name = name
        # the JSON's order (groups and units in natural order), not the UI's alphabetical one
        p.track_descriptor.sibling_order_rank = rank
        if tid:
            p.track_descriptor.parent_uuid = uuid_of[(pid, 0)]
        else:
            p.track_descriptor.child_ordering = p.track_descriptor.EXPLICIT
    counter_uuid = {}
    next_uuid = max(uuid_of.values(), default=0) + 1
    for e in doc["traceEvents"]:
        if e["ph"] == "X":
            uuid = uuid_of[(e["pid"], e["tid"])]
            for ts, kind in ((e["ts"], TrackEvent.TYPE_SLICE_BEGIN), (e["ts"] + e["dur"], TrackEvent.TYPE_SLICE_END)):
                p = builder.add_packet()
                p.timestamp = ts * 1000
                p.trusted_packet_sequence_id = seq
                p.track_event.type = kind
                p.track_event.track_uuid = uuid
                if kind == TrackEvent.TYPE_SLICE_BEGIN:
                    p.track_event.name = e["name"]
        elif e["ph"] == "C":
            key = (e["pid"], e["name"])
            if key not in counter_uuid:
                counter_uuid[key] = next_uuid
                d = builder.add_packet()
                d.track_descriptor.uuid = next_uuid
                d.track_descriptor.name = e["name"]
                d.track_descriptor.parent_uuid = uuid_of[(e["pid"], 0)]
                d.track_descriptor.sibling_order_rank = len(uuid_of) + len(counter_uuid)  # after the units
                d.track_descriptor.counter.SetInParent()
                next_uuid += 1
            p = builder.add_packet()
            p.timestamp = e["ts"] * 1000
            p.trusted_packet_sequence_id = seq
            p.track_event.type = TrackEvent.TYPE_COUNTER
            p.track_event.track_uuid = counter_uuid[key]
            value = next(iter(e["args"].values()))
            if isinstance(value, float):
                p.track_event.double_counter_value = value
            else:
                p.track_event.counter_value = value
    # what was merged or cut (the JSON form's metadata): one instant event on a "stepsim notes" track
    p = builder.add_packet()
    p.track_descriptor.uuid = next_uuid
    p.track_descriptor.name = "stepsim notes"
    p = builder.add_packet()
    p.timestamp = 0
    p.trusted_packet_sequence_id = seq
    p.track_event.type = TrackEvent.TYPE_INSTANT
    p.track_event.track_uuid = next_uuid
    p.track_event.name = json.dumps(doc["metadata"], sort_keys=True, separators=(",", ":"))
    return builder.serialize()


def write_timeline(path, intervals, counters=None, **kwargs) -> None:
    """Write a trace by ``path``'s suffix: ``.json`` / ``.json.gz`` (Chrome JSON) or ``.pftrace`` /
    ``.perfetto-trace`` (Perfetto protobuf); atomically."""
    from stepsim.base.errors import ConfigError

    path = os.fspath(path)
    if path.endswith((".json", ".json.gz")):
        write_chrome_trace(path, intervals, counters, **kwargs)
        return
    if not path.endswith((".pftrace", ".perfetto-trace")):
        raise ConfigError(f"--timeline {path}: unknown trace format (use .json, .json.gz, .pftrace or "
                           ".perfetto-trace)")
    _atomic_write(path, perfetto_trace_bytes(intervals, counters, **kwargs))


def _atomic_write(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temp file renamed into place (:func:`stepsim.base.files.atomic_output`)."""
    from stepsim.base.files import atomic_output

    with atomic_output(path) as tmp:
        tmp.write_bytes(data)
