"""Chrome trace-event JSON export (stepsim.simulation.timeline_export) on hand-built timelines."""
import gzip
import json

from stepsim.simulation.timeline_export import chrome_trace, write_chrome_trace

INTERVALS = [
    {"unit": "load_a", "group": "expert 0", "state": "busy", "start": 0, "end": 4, "channel": None},
    {"unit": "map_b", "group": "expert 0", "state": "blocked_in", "start": 0, "end": 4, "channel": "a->b"},
    {"unit": "map_b", "group": "expert 0", "state": "busy", "start": 4, "end": 5, "channel": None},
    {"unit": "map_b", "group": "expert 0", "state": "busy", "start": 5, "end": 6, "channel": None},
    {"unit": "sink", "group": None, "state": "busy", "start": 6, "end": 7, "channel": None},
]
COUNTERS = [{"channel": "a->b", "t": 4, "occupancy": 1}, {"channel": "a->b", "t": 5, "occupancy": 0}]


def test_whole_document():
    doc = chrome_trace(INTERVALS, COUNTERS)
    ev = doc["traceEvents"]
    assert [(e["ph"], e["pid"], e["tid"], e["name"], e.get("ts"), e.get("dur")) for e in ev] == [
        ("M", 1, 0, "process_name", None, None),
        ("M", 1, 0, "process_sort_index", None, None),
        ("M", 2, 0, "process_name", None, None),
        ("M", 2, 0, "process_sort_index", None, None),
        ("M", 1, 1, "thread_name", None, None),
        ("M", 1, 1, "thread_sort_index", None, None),
        ("X", 1, 1, "busy", 0, 4),
        ("M", 1, 2, "thread_name", None, None),
        ("M", 1, 2, "thread_sort_index", None, None),
        ("X", 1, 2, "blocked_in", 0, 4),
        ("X", 1, 2, "busy", 4, 1),
        ("X", 1, 2, "busy", 5, 1),
        ("M", 2, 3, "thread_name", None, None),
        ("M", 2, 3, "thread_sort_index", None, None),
        ("X", 2, 3, "busy", 6, 1),
        ("M", 3, 0, "process_name", None, None),  # "a->b" names no producer unit: the fifos process
        ("M", 3, 0, "process_sort_index", None, None),
        ("C", 3, 0, "a->b", 4, None),
        ("C", 3, 0, "a->b", 5, None),
    ]
    assert [e["args"]["name"] for e in ev if e["name"] == "process_name"] == ["expert 0", "graph", "fifos"]
    assert [e["args"]["sort_index"] for e in ev if e["name"].endswith("_sort_index")] == [1, 2, 1, 2, 3, 3]
    assert ev[9]["args"] == {"channel": "a->b"}
    assert [e["args"]["occupancy"] for e in ev if e["ph"] == "C"] == [1, 0]
    assert doc["metadata"]["aggregated"] == {} and doc["metadata"]["dropped"] == {}
    # the trace-event format's unit is the microsecond, and one microsecond is one cycle: no "ns" display unit
    assert "displayTimeUnit" not in doc and doc["metadata"]["time_unit"] == "1 us = 1 cycle"


def test_groups_and_units_in_natural_order_and_fifos_with_their_producers_group():
    """expert 2 before expert 10 before expert 100 (not 10, 100, 2); Map_9 before Map_10; a FIFO's counter in
    the process of the group whose unit produces into it."""
    intervals = [{"unit": u, "group": g, "state": "busy", "start": 0, "end": 1, "channel": None}
                 for g, u in (("expert 100", "Map_300"), ("expert 10", "Map_30"), ("expert 2", "Map_10"),
                              ("expert 2", "Map_9"), ("shared", "Partition_1"))]
    counters = [{"channel": ch, "t": 0, "occupancy": 1}
                for ch in ("Partition_1[2]", "Map_30[0]", "Partition_1[10]", "Map_9[0]", "Other_5[0]")]
    ev = chrome_trace(intervals, counters)["traceEvents"]
    processes = {e["pid"]: e["args"]["name"] for e in ev if e["name"] == "process_name"}
    assert list(processes.values()) == ["expert 2", "expert 10", "expert 100", "shared", "fifos"]
    assert [e["args"]["name"] for e in ev if e["name"] == "thread_name"] == [
        "Map_9", "Map_10", "Map_30", "Map_300", "Partition_1"]
    assert [(processes[e["pid"]], e["name"]) for e in ev if e["ph"] == "C"] == [
        ("expert 2", "Map_9[0]"), ("expert 10", "Map_30[0]"), ("fifos", "Other_5[0]"),
        ("shared", "Partition_1[2]"), ("shared", "Partition_1[10]")]


def test_aggregation_and_cap_are_stated():
    doc = chrome_trace(INTERVALS, COUNTERS, min_dur=2, max_events_per_track=1)
    x = [(e["tid"], e["name"], e["ts"], e["dur"], e["args"]) for e in doc["traceEvents"] if e["ph"] == "X"]
    # map_b: the blocked_in interval (4 cycles) is kept; the two 1-cycle busy ones merge, then the cap drops it
    assert x == [(1, "busy", 0, 4, {}), (2, "blocked_in", 0, 4, {"channel": "a->b"}), (3, "busy", 6, 1, {})]
    assert doc["metadata"]["aggregated"] == {"map_b": 1}
    assert doc["metadata"]["dropped"] == {"map_b": 1, "a->b": 1}


def test_files_load_with_json_and_have_required_fields(tmp_path):
    for name in ("t.json", "t.json.gz"):
        p = tmp_path / name
        write_chrome_trace(p, INTERVALS, COUNTERS)
        raw = p.read_bytes()
        doc = json.loads(gzip.decompress(raw) if name.endswith(".gz") else raw)
        assert len(doc["traceEvents"]) == 19
        for e in doc["traceEvents"]:
            assert {"name", "ph", "pid", "tid"} <= e.keys()
            if e["ph"] in ("X", "C"):
                assert isinstance(e["ts"], int)
            if e["ph"] == "X":
                assert isinstance(e["dur"], int) and e["dur"] >= 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.json", "t.json.gz"]  # no temp file left


def test_perfetto_trace_decodes_with_the_writers_protos(tmp_path):
    from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import Trace, TrackEvent

    from stepsim.simulation.timeline_export import write_timeline

    p = tmp_path / "t.pftrace"
    write_timeline(p, INTERVALS, COUNTERS)
    trace = Trace()
    trace.ParseFromString(p.read_bytes())
    tracks = {pk.track_descriptor.uuid: (pk.track_descriptor.name, pk.track_descriptor.parent_uuid)
              for pk in trace.packet if pk.HasField("track_descriptor")}
    assert sorted(tracks.values()) == [("a->b", 3000001), ("expert 0", 0), ("fifos", 0), ("graph", 0),
                                       ("load_a", 1000001), ("map_b", 1000001), ("sink", 2000001),
                                       ("stepsim notes", 0)]
    ev = [(pk.timestamp, pk.track_event.type, tracks[pk.track_event.track_uuid][0], pk.track_event.name,
           pk.track_event.counter_value) for pk in trace.packet if pk.HasField("track_event")]
    B, E, C = TrackEvent.TYPE_SLICE_BEGIN, TrackEvent.TYPE_SLICE_END, TrackEvent.TYPE_COUNTER
    assert ev == [(0, B, "load_a", "busy", 0), (4000, E, "load_a", "", 0),
                  (0, B, "map_b", "blocked_in", 0), (4000, E, "map_b", "", 0),
                  (4000, B, "map_b", "busy", 0), (5000, E, "map_b", "", 0),
                  (5000, B, "map_b", "busy", 0), (6000, E, "map_b", "", 0),
                  (6000, B, "sink", "busy", 0), (7000, E, "sink", "", 0),
                  (4000, C, "a->b", "", 1), (5000, C, "a->b", "", 0),
                  (0, TrackEvent.TYPE_INSTANT, "stepsim notes", json.dumps(
                      chrome_trace(INTERVALS, COUNTERS)["metadata"], sort_keys=True, separators=(",", ":")), 0)]


def test_unknown_suffix_is_a_config_error(tmp_path):
    import pytest

    from stepsim.base.errors import ConfigError
    from stepsim.simulation.timeline_export import write_timeline

    with pytest.raises(ConfigError, match=r"^--timeline .*t\.txt: unknown trace format"):
        write_timeline(tmp_path / "t.txt", INTERVALS)
    assert list(tmp_path.iterdir()) == []
