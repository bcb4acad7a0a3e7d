"""Timelines recorded by the engine (``simulate(..., timeline=...)``, ``kernels.run(..., timeline=N)``).

What must hold exactly: recording changes no result; per unit, the intervals of each state sum to the unit's
busy / blocked-in / blocked-out counters and tile its time from 0 to its final clock; FIFO occupancy stays in
[0, depth] and its maximum equals the peak counter; the HBM windows hold every request the HBM took; a full
buffer gives a prefix of the complete timeline, cut at its horizon.
"""

from __future__ import annotations

import numpy as np
import pytest
from kernel_helpers import builder, check_timeline_against_counters, fork_join_program

from stepsim.base.errors import ArgumentError, DeadlockError
from stepsim.base.hardware import Hardware
from stepsim.graph.lower import lower
from stepsim.kernels import run
from stepsim.models.presets import moe_model
from stepsim.simulation.simulate import simulate
from stepsim.simulation.timeline import decode, graph_labels
from stepsim.workloads.attention.build import build_attention
from stepsim.workloads.config import workload_from_config
from stepsim.workloads.moe.build import build_moe


def _moe(tiling, **kw):
    routing = np.random.default_rng(3).integers(0, 8, size=(64, 2))
    routing[:, 1] = (routing[:, 0] + 1 + routing[:, 1] % 7) % 8  # two distinct experts per token
    return build_moe(moe_model("custom", hidden=256, intermediate=512, experts=8, top_k=2), routing, tiling=tiling,
                     **kw)


WORKLOADS = {
    "moe-static16": lambda: _moe("static", tile_n=16),
    "moe-dynamic": lambda: _moe("dynamic"),
    "moe-timeshared": lambda: _moe("static", tile_n=32, regions=2, tile_f=64),
    "attention-dynamic": lambda: build_attention(
        np.array([100, 900, 3000, 40, 64, 1200, 7, 2500, 333, 4000, 50, 61, 800, 90, 1, 2048]), "dynamic"),
    "qwen-static32-bundled": lambda: workload_from_config({"workload": "moe", "model": "qwen", "tile_n": 32}),
    "swiglu": lambda: workload_from_config({"workload": "swiglu"}),
}


def _program(w):
    """The program ``simulate(w)`` runs (the workload's hardware and FIFO depth)."""
    return lower(w.graph, Hardware.preset(w.hardware) if isinstance(w.hardware, str) else w.hardware,
                 channel_depth=w.channel_depth)


@pytest.mark.parametrize("name", list(WORKLOADS))
def test_timeline_matches_every_counter_and_changes_no_result(name):
    w = WORKLOADS[name]()
    off = simulate(w)
    on = simulate(w, timeline=True)
    assert (on.cycles, on.events, on.fires, on.off_chip_bytes_read, on.off_chip_bytes_written) == (
        off.cycles, off.events, off.fires, off.off_chip_bytes_read, off.off_chip_bytes_written)
    np.testing.assert_array_equal(on.unit_counters, off.unit_counters)
    np.testing.assert_array_equal(on.channel_counters, off.channel_counters)
    assert off.timeline is None
    program = _program(w)
    check_timeline_against_counters(on.timeline, on, program.ch_capacity.tolist())
    # the HBM windows hold every request the HBM took, in closed form or tick by tick alike
    closed = run(program, timeline=10)
    per_tick = run(program, timeline=10, hbm_closed_form=False)
    hbm = decode(closed.timeline, program).hbm
    assert sum(hbm.column("requests").to_pylist()) == closed.hbm_requests
    assert hbm.equals(decode(per_tick.timeline, program).hbm)
    assert hbm.num_rows <= 2048
    # groups come from the builders' labels: expert / region units are grouped, others are "shared"
    groups = set(on.timeline.intervals.column("group").to_pylist())
    expected = set(graph_labels(w.graph)[0].values()) | {"shared"}
    assert groups <= expected and (groups != {"shared"}) == name.startswith(("moe", "qwen", "attention"))


def test_s10_repeat_static_at_depth_2_whole_timeline():
    """STEP_TIMING §9 S10 (depth 2): load of one 64x64 bf16 tile (arrives at 147) -> RepeatStatic(4) -> sink.

    * load: its tile is complete at 146 (the §9 building block): busy waiting for the HBM over [0, 146).
    * repeat: waits for the tile until 147; copies 0 and 1 fill both slots at 147; copy 2 waits for the credit
      of the sink's first dequeue (148 + 1) and copy 3 for the second (149 + 1): blocked on output [147, 150);
      then its own 4 cycles, ending at 154.
    * sink: waits for copy 0 (arrival 148), dequeues 0, 1, 2 at 148, 149, 150 (1 cycle each), waits for copy 3
      (arrival 152), dequeues it, then observes the repeater's close at 154.
    """
    b = builder()
    x, y = b.add_channel(), b.add_channel()
    b.offchip_load(out=x, tile_rows=64, tile_cols=64, elem_bytes=2, view_shape=(1,))
    b.repeat_static(inp=x, out=y, count=4)
    b.sink(inp=y)
    program = b.build()
    result = run(program, timeline=100)
    assert result.cycles == 154
    t = decode(result.timeline, program)
    rows = [(r["unit"], r["state"], r["start"], r["end"], r["channel"], r["hbm"]) for r in t.intervals.to_pylist()]
    assert rows == [
        ("OffChipLoad_0", "busy", 0, 146, None, True),
        ("RepeatStatic_1", "blocked_in", 0, 147, "ch0", False),
        ("RepeatStatic_1", "blocked_out", 147, 150, "ch1", False),
        ("RepeatStatic_1", "busy", 150, 154, None, False),
        ("Sink_2", "blocked_in", 0, 148, "ch1", False),
        ("Sink_2", "busy", 148, 151, None, False),
        ("Sink_2", "blocked_in", 151, 152, "ch1", False),
        ("Sink_2", "busy", 152, 153, None, False),
        ("Sink_2", "blocked_in", 153, 154, "ch1", False),
    ]
    # a slot is held from the send until its credit is back (dequeue + 1): the tile holds ch0 until the
    # repeater releases it after its last copy (154 + 1); ch1's credits return at 149, 150, 151, 153
    assert t.fifo.to_pylist() == [
        {"channel": "ch0", "t": 146, "occupancy": 1, "bytes": 8192},
        {"channel": "ch0", "t": 155, "occupancy": 0, "bytes": 0},
        {"channel": "ch1", "t": 147, "occupancy": 2, "bytes": 16384},
        {"channel": "ch1", "t": 149, "occupancy": 2, "bytes": 16384},
        {"channel": "ch1", "t": 150, "occupancy": 2, "bytes": 16384},
        {"channel": "ch1", "t": 151, "occupancy": 1, "bytes": 8192},
        {"channel": "ch1", "t": 153, "occupancy": 0, "bytes": 0},
    ]
    assert t.onchip.to_pylist() == [{"t": 146, "fifo_bytes": 8192}, {"t": 147, "fifo_bytes": 24576},
                                    {"t": 149, "fifo_bytes": 24576}, {"t": 150, "fifo_bytes": 24576},
                                    {"t": 151, "fifo_bytes": 16384}, {"t": 153, "fifo_bytes": 8192},
                                    {"t": 155, "fifo_bytes": 0}]
    # 128 requests, chunk j taken at tick 1 + j (window 1 cycle, 64-byte requests)
    assert t.hbm_window == 1
    assert t.hbm.column("requests").to_pylist() == [0] + [1] * 128
    assert t.hbm.column("bytes_per_cycle").to_pylist() == [0.0] + [64.0] * 128


@pytest.mark.parametrize("capacity, horizon", [(1, 0), (300, 167), (3000, 9200)])
def test_a_full_buffer_gives_the_complete_timeline_cut_at_its_horizon(capacity, horizon):
    """Records arrive out of time order (units run ahead); the engine keeps those before the latest cycle at
    which they fit (a second run with that cutoff), so the cut trace is the complete one up to its horizon."""
    w = WORKLOADS["moe-dynamic"]()
    program = _program(w)
    full = decode(run(program, timeline=1_000_000).timeline, program)
    cut = decode(run(program, timeline=capacity).timeline, program)
    assert full.complete and not cut.complete
    h = cut.horizon
    assert h == horizon and cut.records <= capacity and cut.records + cut.dropped == full.records
    expected = [dict(r, end=min(r["end"], h)) for r in full.intervals.to_pylist() if r["start"] < h]
    assert cut.intervals.to_pylist() == expected
    assert cut.fifo.to_pylist() == [r for r in full.fifo.to_pylist() if r["t"] < h]
    assert cut.onchip.to_pylist() == [r for r in full.onchip.to_pylist() if r["t"] < h]
    assert cut.hbm.equals(full.hbm)  # the HBM windows never fill
    assert cut.status() == (f"timeline: over the limit of {capacity:,} records; kept the {cut.records:,} before "
                            f"cycle {h:,} and left out {cut.dropped:,} (raise the limit to record more)")


@pytest.mark.parametrize("bad", [0, -1, 2.5, "yes"])
def test_simulate_refuses_a_bad_timeline_argument(bad):
    with pytest.raises(ArgumentError, match=f"timeline must be True, False or a positive record limit, got {bad!r}"):
        simulate(WORKLOADS["moe-static16"](), timeline=bad)


def test_a_deadlocked_run_keeps_its_timeline_up_to_the_deadlock():
    """The reconvergent fork/join at depth 2: every blocked unit's intervals end at its clock, and 'direct'
    still holds its 2 elements (queued elements hold their slots to the end, as the peak counter counts them)."""
    program = fork_join_program()
    with pytest.raises(DeadlockError) as info:
        run(program, timeline=1000)
    t = decode(info.value.timeline, program)
    assert t.complete
    ends = {}
    for r in t.intervals.to_pylist():
        ends[r["unit"]] = r["end"]
    blocked = {b.unit: b.clock for b in info.value.blocked}
    assert set(blocked) == {"load", "fanout", "bufferize", "streamify", "join", "sink"}
    assert all(ends.get(unit, 0) == clock for unit, clock in blocked.items())
    direct = [r for r in t.fifo.to_pylist() if r["channel"] == "direct"]
    assert direct[-1]["occupancy"] == 2 and max(r["occupancy"] for r in direct) == 2
