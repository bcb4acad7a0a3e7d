"""``--timeline PATH``: a serve run as a Perfetto trace: protobuf (``.pftrace`` / ``.perfetto-trace``, written with
the ``perfetto`` package) or Chrome trace-event JSON (``.json`` / ``.json.gz``, which Perfetto's UI opens too), as
``stepsim run --timeline`` chooses by suffix.

Tracks (docs/serving.md §7):

* ``requests``: one child track per request (``request <request_id>``, in trace order) with up to three
  consecutive slices: ``queued`` (arrival to first scheduled), ``prefill`` (first scheduled to first token) and
  ``decode`` (first token to last token; none for a one-token output). The ``queued`` slice carries the
  request's ``prompt_tokens``, ``output_tokens`` and ``preemptions`` as debug annotations (a preempted request
  is recomputed inside its prefill / decode span; the requests table does not keep the stalls apart).
* ``engine``: a ``steps`` track with one slice per scheduler step (``step <i>``, from its start for its
  duration, annotated with its tokens, sequences, prefill / decode split and any ``cycles_<kind>``), and two
  counter tracks sampled at every step's start: ``waiting requests`` and ``KV blocks used`` (both after
  scheduling, as in iterations.parquet). A mapped exact run (``--schedule auto`` on one chip) has a third,
  ``cycles hidden by weights streamed ahead``: per step the cycles its pieces saved because later pieces' weights
  streamed into free on-chip memory while earlier ones ran (``cycles_hidden``, :mod:`stepsim.serve.projections`;
  the step's duration is its attention, FFN and weights cycles less these).

Times are the run's seconds as integer nanoseconds (``round(seconds x 1e9)``, the protobuf trace's clock; the
JSON form writes them as microseconds, its unit, with three decimals), so the Perfetto UI shows the run's own time
axis. In the JSON form a top-level track is a process, a child track a thread of it, a counter a ``"C"`` event
of its parent's process; its ``metadata.tracks`` lists the tracks in creation order so that the reader gives back
the protobuf form's track ids. The file is written atomically; the same run gives the same bytes.
:func:`read_timeline` reads either form back (tracks, slices, counters) into the same structure.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from stepsim.base.errors import ConfigError

#: file name endings of a Perfetto protobuf trace and of a Chrome trace-event JSON one
PROTO_SUFFIXES = (".pftrace", ".perfetto-trace")
JSON_SUFFIXES = (".json", ".json.gz")
SUFFIXES = (*PROTO_SUFFIXES, *JSON_SUFFIXES)
#: the one sequence every event packet is on
_SEQUENCE = 1
#: the counter track of the cycles a mapped exact run's steps hid by streaming weights ahead (``cycles_hidden``)
HIDDEN_TRACK = "cycles hidden by weights streamed ahead"
#: iterations.parquet columns annotated on a step's slice (and every cycles_<kind> column)
STEP_ANNOTATIONS = ("tokens", "sequences", "prefill_tokens", "decode_tokens")


def check_timeline_path(path) -> Path:
    """``path`` if it names a trace this module writes (before any work); else a one-line ConfigError."""
    import importlib.util

    from stepsim.base.outputs import check_out_file

    text = str(path)
    if text == "":
        raise ConfigError("--timeline: empty path")
    if not text.endswith(SUFFIXES):
        raise ConfigError(f"--timeline {text}: unknown trace format (use .pftrace or .perfetto-trace for Perfetto "
                          f"protobuf, .json or .json.gz for Chrome JSON)")
    if text.endswith(PROTO_SUFFIXES) and importlib.util.find_spec("perfetto") is None:
        raise ConfigError(f"--timeline {text}: writing a Perfetto trace needs the perfetto package; install it "
                          f"with pip install 'stepsim[timeline]'")
    return check_out_file(path, "--timeline")  # a folder, or a parent that is a file: now, not after the run


def _ns(seconds: float) -> int:
    return int(round(seconds * 1e9))


class _ProtoWriter:
    """Track descriptors and events on one TraceProtoBuilder (uuids handed out in order: deterministic)."""

    def __init__(self):
        from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import TrackEvent
        from perfetto.trace_builder.proto_builder import TraceProtoBuilder

        self.builder, self.kinds, self.next_uuid = TraceProtoBuilder(), TrackEvent, 1

    def track(self, name: str, parent: int = 0, *, counter: bool = False, ordered: bool = False) -> int:
        uuid = self.next_uuid
        self.next_uuid += 1
        d = self.builder.add_packet().track_descriptor
        d.uuid, d.name = uuid, name
        d.sibling_order_rank = uuid  # creation order, not the UI's alphabetical order
        if parent:
            d.parent_uuid = parent
        if counter:
            d.counter.SetInParent()
        if ordered:
            d.child_ordering = d.EXPLICIT
        return uuid

    def _event(self, ts: int, track: int, kind):
        p = self.builder.add_packet()
        p.timestamp, p.trusted_packet_sequence_id = ts, _SEQUENCE
        p.track_event.type, p.track_event.track_uuid = kind, track
        return p.track_event

    def slice(self, track: int, name: str, start: int, end: int, annotations: dict | None = None) -> None:
        event = self._event(start, track, self.kinds.TYPE_SLICE_BEGIN)
        event.name = name
        for key, value in (annotations or {}).items():
            a = event.debug_annotations.add()
            a.name, a.int_value = key, int(value)
        self._event(end, track, self.kinds.TYPE_SLICE_END)

    def counter(self, track: int, ts: int, value: int) -> None:
        self._event(ts, track, self.kinds.TYPE_COUNTER).counter_value = int(value)

    def finish(self) -> bytes:
        return self.builder.serialize()


def _us(ns: int):
    """Nanoseconds as the JSON form's microseconds: an int when whole (exact either way, below 2^53 ns)."""
    return ns // 1000 if ns % 1000 == 0 else ns / 1000


class _JsonWriter:
    """The same tracks as Chrome trace events (module docstring)."""

    def __init__(self):
        self.events, self.tracks, self.where = [], [], {}  # where: track id -> (pid, tid, counter name or None)
        self.threads: dict[int, int] = {}  # pid -> threads so far

    def track(self, name: str, parent: int = 0, *, counter: bool = False, ordered: bool = False) -> int:
        uuid = len(self.tracks) + 1
        self.tracks.append([name, parent, "counter" if counter else "track"])
        if not parent:
            pid = len(self.threads) + 1
            self.threads[pid] = 0
            self.where[uuid] = (pid, 0, None)
            self.events += [{"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": name}},
                            {"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0,
                             "args": {"sort_index": pid}}]
        elif counter:
            self.where[uuid] = (self.where[parent][0], 0, name)
        else:
            pid = self.where[parent][0]
            tid = self.threads[pid] = self.threads[pid] + 1
            self.where[uuid] = (pid, tid, None)
            self.events += [{"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": name}},
                            {"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tid,
                             "args": {"sort_index": tid}}]
        return uuid

    def slice(self, track: int, name: str, start: int, end: int, annotations: dict | None = None) -> None:
        pid, tid, _ = self.where[track]
        self.events.append({"name": name, "ph": "X", "pid": pid, "tid": tid, "ts": _us(start),
                            "dur": _us(end - start), "args": {k: int(v) for k, v in (annotations or {}).items()}})

    def counter(self, track: int, ts: int, value: int) -> None:
        pid, _, name = self.where[track]
        self.events.append({"name": name, "ph": "C", "pid": pid, "tid": 0, "ts": _us(ts),
                            "args": {name: int(value)}})

    def finish(self) -> bytes:
        import json

        doc = {"traceEvents": self.events, "metadata": {"time_unit": "us", "tracks": self.tracks}}
        return json.dumps(doc, separators=(",", ":")).encode()


def timeline_bytes(requests: pa.Table, iterations: pa.Table, *, chrome: bool = False) -> bytes:
    """The trace of a serve run's ``requests`` and ``iterations`` tables (module docstring): Perfetto protobuf,
    or Chrome JSON with ``chrome``."""
    w = _JsonWriter() if chrome else _ProtoWriter()
    root = w.track("requests", ordered=True)
    req = requests.to_pydict()
    for i, rid in enumerate(req["request_id"]):
        track = w.track(f"request {rid}", root)
        arrival, scheduled = _ns(req["arrival_s"][i]), _ns(req["first_scheduled_s"][i])
        first, finish = _ns(req["first_token_s"][i]), _ns(req["finish_s"][i])
        w.slice(track, "queued", arrival, scheduled, {k: req[k][i] for k in ("prompt_tokens", "output_tokens",
                                                                            "preemptions")})
        w.slice(track, "prefill", scheduled, first)
        if finish > first:
            w.slice(track, "decode", first, finish)
    engine = w.track("engine", ordered=True)
    steps = w.track("steps", engine)
    waiting = w.track("waiting requests", engine, counter=True)
    blocks = w.track("KV blocks used", engine, counter=True)
    # a mapped exact run's steps stream the next pieces' weights ahead (stepsim.serve.projections): what it hid
    streamed = "cycles_hidden" in iterations.column_names
    hidden = w.track(HIDDEN_TRACK, engine, counter=True) if streamed else 0
    it = iterations.to_pydict()
    annotated = [*STEP_ANNOTATIONS, *(c for c in iterations.column_names if c.startswith("cycles_"))]
    for i, index in enumerate(it["iteration"]):
        start = it["start_s"][i]
        w.slice(steps, f"step {index}", _ns(start), _ns(start + it["duration_s"][i]),
                {k: it[k][i] for k in annotated})
        w.counter(waiting, _ns(start), it["waiting"][i])
        w.counter(blocks, _ns(start), it["kv_blocks_used"][i])
        if streamed:
            w.counter(hidden, _ns(start), it["cycles_hidden"][i])
    return w.finish()


def write_timeline(path, requests: pa.Table, iterations: pa.Table) -> Path:
    """Write :func:`timeline_bytes` to ``path`` in the form its suffix names, atomically (temp file renamed into
    place; ``.json.gz`` compressed with mtime 0: the same run gives the same bytes); returns the path."""
    import gzip

    from stepsim.base.files import atomic_output

    path = check_timeline_path(path)
    data = timeline_bytes(requests, iterations, chrome=str(path).endswith(JSON_SUFFIXES))
    if str(path).endswith(".gz"):
        data = gzip.compress(data, mtime=0)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_output(path) as tmp:
        tmp.write_bytes(data)
    return path


def read_timeline(path) -> dict:
    """A serve timeline read back: ``{"tracks": {uuid: (name, parent uuid or 0)}, "slices": {track name:
    [(slice name, start ns, end ns, {annotation: int})]}, "counters": {track name: [(ns, value)]}}``, events
    in file order."""
    if str(path).endswith(JSON_SUFFIXES):
        return _read_json(path)
    from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import Trace, TrackEvent

    trace = Trace()
    trace.ParseFromString(Path(path).read_bytes())
    tracks, slices, counters, open_ = {}, {}, {}, {}
    for p in trace.packet:
        if p.HasField("track_descriptor"):
            d = p.track_descriptor
            tracks[d.uuid] = (d.name, d.parent_uuid)
            continue
        e = p.track_event
        name = tracks[e.track_uuid][0]
        if e.type == TrackEvent.TYPE_SLICE_BEGIN:
            open_[e.track_uuid] = (e.name, p.timestamp, {a.name: a.int_value for a in e.debug_annotations})
        elif e.type == TrackEvent.TYPE_SLICE_END:
            label, start, notes = open_.pop(e.track_uuid)
            slices.setdefault(name, []).append((label, start, p.timestamp, notes))
        elif e.type == TrackEvent.TYPE_COUNTER:
            counters.setdefault(name, []).append((p.timestamp, e.counter_value))
    return {"tracks": tracks, "slices": slices, "counters": counters}


def _read_json(path) -> dict:
    """:func:`read_timeline` of the JSON form: the tracks from ``metadata.tracks`` (ids in creation order, as the
    protobuf form's), slices and counters from the events."""
    import gzip
    import json

    raw = Path(path).read_bytes()
    doc = json.loads(gzip.decompress(raw) if str(path).endswith(".gz") else raw)
    listed = doc["metadata"]["tracks"]
    tracks = {i + 1: (name, parent) for i, (name, parent, _) in enumerate(listed)}
    names = {}  # (pid, tid) -> thread track name
    for e in doc["traceEvents"]:
        if e["ph"] == "M" and e["name"] == "thread_name":
            names[(e["pid"], e["tid"])] = e["args"]["name"]
    slices, counters = {}, {}
    for e in doc["traceEvents"]:
        if e["ph"] == "X":
            start = round(e["ts"] * 1000)
            slices.setdefault(names[(e["pid"], e["tid"])], []).append(
                (e["name"], start, start + round(e["dur"] * 1000), dict(e["args"])))
        elif e["ph"] == "C":
            counters.setdefault(e["name"], []).append((round(e["ts"] * 1000), e["args"][e["name"]]))
    return {"tracks": tracks, "slices": slices, "counters": counters}
