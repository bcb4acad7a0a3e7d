"""``stepsim run ... --timeline PATH``: Chrome JSON (.json / .json.gz) and Perfetto protobuf (.pftrace) traces."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

from stepsim.cli import main
from stepsim.results.records import run_config

QWEN = ["run", "moe", "--model", "qwen", "--tile-n", "32"]


def _events(path):
    raw = path.read_bytes()
    return json.loads(gzip.decompress(raw) if path.suffix == ".gz" else raw)


@pytest.mark.parametrize("name", ["t.json", "t.json.gz"])
def test_json_trace_of_a_moe_layer(tmp_path, capsys, name):
    path = tmp_path / "new_folder" / name
    assert main([*QWEN, "--timeline", str(path), "--timeline-min-dur", "0"]) == 0
    out = capsys.readouterr().out
    record = run_config({"workload": "moe", "model": "qwen", "tile_n": 32, "mode": "simulate"}, timeline=10**7)
    timeline = record.timeline
    assert out.splitlines()[-1] == f"wrote timeline: {path} ({timeline.records:,} records (complete))"
    doc = _events(path)
    events = doc["traceEvents"]
    for e in events:  # the trace-event format's required fields
        assert {"name", "ph", "pid", "tid"} <= e.keys()
        if e["ph"] == "X":
            assert isinstance(e["ts"], int) and isinstance(e["dur"], int) and e["dur"] > 0
        if e["ph"] == "C":
            assert isinstance(e["ts"], int) and len(e["args"]) == 1
    # one slice per recorded interval (nothing merged at --timeline-min-dur 0, nothing capped)
    slices = [e for e in events if e["ph"] == "X"]
    assert len(slices) == timeline.intervals.num_rows
    assert sum(e["dur"] for e in slices) == sum(e - s for s, e in zip(timeline.intervals.column("start").to_pylist(),
                                                                      timeline.intervals.column("end").to_pylist()))
    processes = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    experts = [name for name in processes.values() if name.startswith("expert")]
    assert experts == [f"expert {i}" for i in range(128)]  # numeric order, not 0, 1, 10, 100, ...
    assert list(processes.values()) == [*experts, "shared", "memory"]
    assert [e["args"]["sort_index"] for e in events if e["name"] == "process_sort_index"] == list(processes)
    counters = {e["name"] for e in events if e["ph"] == "C"}
    assert {"on-chip FIFO bytes", "HBM bytes/cycle"} <= counters
    # every FIFO counter sits in the process of its producer's group
    group_of = dict(zip(timeline.intervals.column("unit").to_pylist(), timeline.intervals.column("group").to_pylist()))
    fifo_counters = [e for e in events if e["ph"] == "C" and e["name"] not in ("on-chip FIFO bytes", "HBM bytes/cycle")]
    assert len({e["name"] for e in fifo_counters}) == len(set(timeline.fifo.column("channel").to_pylist()))
    assert all(processes[e["pid"]] == group_of[e["name"].rsplit("[", 1)[0]] for e in fifo_counters)
    assert {"shared", "expert 31"} <= {processes[e["pid"]] for e in fifo_counters} <= {*experts, "shared"}
    assert "displayTimeUnit" not in doc
    meta = doc["metadata"]
    assert meta["status"] == f"timeline: {timeline.records:,} records (complete)" and meta["complete"] is True
    assert meta["aggregated"] == {} and meta["dropped"] == {} and meta["time_unit"] == "1 us = 1 cycle"


def test_default_aggregation_and_a_full_buffer_are_stated(tmp_path, capsys):
    path = tmp_path / "t.json"
    assert main([*QWEN, "--timeline", str(path), "--timeline-limit", "20000", "--json"]) == 0
    captured = capsys.readouterr()
    record = json.loads(captured.out)
    min_dur = record["cycles"] // 200_000
    line = captured.err.strip().splitlines()[-1]
    assert line.startswith(f"wrote timeline: {path} (over the limit of 20,000 records; kept the ")
    assert line.endswith(f"(raise the limit to record more); intervals under {min_dur} cycles merged)")
    meta = _events(path)["metadata"]
    assert meta["complete"] is False and meta["min_dur_cycles"] == min_dur
    assert meta["horizon_cycle"] > 0 and meta["status"].startswith("timeline: over the limit of 20,000 records")
    assert max(e["ts"] + e.get("dur", 0) for e in _events(path)["traceEvents"]
               if e["ph"] == "X") <= meta["horizon_cycle"]


def test_perfetto_protobuf_trace_decodes_with_the_writers_protos(tmp_path):
    from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import Trace, TrackEvent

    path = tmp_path / "t.pftrace"
    assert main(["run", "swiglu", "--timeline", str(path)]) == 0
    trace = Trace()
    trace.ParseFromString(path.read_bytes())
    names = {pk.track_descriptor.uuid: pk.track_descriptor.name for pk in trace.packet
             if pk.HasField("track_descriptor")}
    record = run_config({"workload": "swiglu", "mode": "simulate"}, timeline=10**6)
    units = set(record.timeline.intervals.column("unit").to_pylist())
    assert units <= set(names.values()) and {"shared", "memory", "stepsim notes"} <= set(names.values())
    tracks = [pk.track_descriptor for pk in trace.packet if pk.HasField("track_descriptor")]
    roots = [t for t in tracks if not t.parent_uuid and t.name != "stepsim notes"]
    assert [t.name for t in roots] == ["shared", "memory"]
    assert all(t.child_ordering == t.EXPLICIT for t in roots)
    ranks = [t.sibling_order_rank for t in tracks if t.parent_uuid and not t.HasField("counter")]
    assert ranks == sorted(ranks) and len(set(ranks)) == len(ranks)  # units in the JSON form's order
    begins = [pk for pk in trace.packet if pk.HasField("track_event") and
              pk.track_event.type == TrackEvent.TYPE_SLICE_BEGIN]
    assert len(begins) == record.timeline.intervals.num_rows  # a short run: nothing merged
    assert all(pk.timestamp % 1000 == 0 for pk in begins)  # 1 cycle = 1 us = 1000 ns


def test_a_deadlocked_run_writes_its_timeline_up_to_the_deadlock(tmp_path, capsys):
    from stepsim.trace_io.synthetic import synthetic_routing

    table = synthetic_routing(1024, 32, 4, seed=1, skew="dirichlet", alpha=0.3)
    trace = tmp_path / "skewed.npz"
    np.savez(trace, data=np.stack(table.column("expert_ids").to_numpy(zero_copy_only=False)).astype(np.int64))
    path = tmp_path / "stuck.json"
    status = main(["run", "moe", "--model", "custom", "--hidden", "32", "--intermediate", "64", "--experts", "32",
                   "--top-k", "4", "--trace", str(trace), "--tile-n", "32", "--channel-depth", "2",
                   "--timeline", str(path)])
    err = capsys.readouterr().err.splitlines()
    assert status == 3  # the deadlock status
    assert err[0].startswith(f"wrote timeline up to the deadlock: {path} (") and err[0].endswith(" (complete))")
    assert err[1].startswith("stepsim: error: deadlock: no unit can make progress; 620 unit(s) blocked")
    doc = _events(path)
    assert doc["metadata"]["complete"] is True
    assert any(e["ph"] == "X" and e["name"] == "blocked_out" for e in doc["traceEvents"])
