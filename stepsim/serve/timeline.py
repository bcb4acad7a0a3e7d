"""``--timeline PATH``: a serve run as a Perfetto trace (protobuf, written with the ``perfetto`` package).

Tracks (docs/serving.md §7):

* ``requests``: one child track per request (``request <request_id>``, in trace order) with up to three
  consecutive slices: ``queued`` (arrival to first scheduled), ``prefill`` (first scheduled to first token) and
  ``decode`` (first token to last token; none for a one-token output). The ``queued`` slice carries the
  request's ``prompt_tokens``, ``output_tokens`` and ``preemptions`` as debug annotations (a preempted request
  is recomputed inside its prefill / decode span; the requests table does not keep the stalls apart).
* ``engine``: a ``steps`` track with one slice per scheduler step (``step <i>``, from its start for its
  duration, annotated with its tokens, sequences, prefill / decode split and any ``cycles_<kind>``), and two
  counter tracks sampled at every step's start: ``waiting requests`` and ``KV blocks used`` (both after
  scheduling, as in iterations.parquet).

Times are the run's seconds as integer nanoseconds (``round(seconds x 1e9)``, the trace's clock), so the
Perfetto UI shows the run's own time axis. The file is written atomically; the same run gives the same bytes.
:func:`read_timeline` reads a trace back (tracks, slices, counters) with the same protos.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from stepsim.base.errors import ConfigError

#: file name endings of a Perfetto protobuf trace
SUFFIXES = (".pftrace", ".perfetto-trace")
#: the one sequence every event packet is on
_SEQUENCE = 1
#: iterations.parquet columns annotated on a step's slice (and every cycles_<kind> column)
STEP_ANNOTATIONS = ("tokens", "sequences", "prefill_tokens", "decode_tokens")


def check_timeline_path(path) -> Path:
    """``path`` if it names a Perfetto trace (before any work); else a one-line ConfigError."""
    import importlib.util

    text = str(path)
    if not text.endswith(SUFFIXES):
        raise ConfigError(f"--timeline {text}: a serve timeline is a Perfetto protobuf trace (use .pftrace or "
                          f".perfetto-trace)")
    if importlib.util.find_spec("perfetto") is None:
        raise ConfigError(f"--timeline {text}: writing a Perfetto trace needs the perfetto package; install it "
                          f"with pip install 'stepsim[timeline]'")
    return Path(path)


def _ns(seconds: float) -> int:
    return int(round(seconds * 1e9))


class _Writer:
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


def timeline_bytes(requests: pa.Table, iterations: pa.Table) -> bytes:
    """The Perfetto trace of a serve run's ``requests`` and ``iterations`` tables (module docstring)."""
    w = _Writer()
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
    it = iterations.to_pydict()
    annotated = [*STEP_ANNOTATIONS, *(c for c in iterations.column_names if c.startswith("cycles_"))]
    for i, index in enumerate(it["iteration"]):
        start = it["start_s"][i]
        w.slice(steps, f"step {index}", _ns(start), _ns(start + it["duration_s"][i]),
                {k: it[k][i] for k in annotated})
        w.counter(waiting, _ns(start), it["waiting"][i])
        w.counter(blocks, _ns(start), it["kv_blocks_used"][i])
    return w.builder.serialize()


def write_timeline(path, requests: pa.Table, iterations: pa.Table) -> Path:
    """Write :func:`timeline_bytes` to ``path`` atomically (temp file renamed into place); returns the path."""
    from stepsim.base.files import atomic_output

    path = check_timeline_path(path)
    data = timeline_bytes(requests, iterations)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_output(path) as tmp:
        tmp.write_bytes(data)
    return path


def read_timeline(path) -> dict:
    """A serve timeline read back: ``{"tracks": {uuid: (name, parent uuid or 0)}, "slices": {track name:
    [(slice name, start ns, end ns, {annotation: int})]}, "counters": {track name: [(ns, value)]}}``, events
    in file order."""
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
