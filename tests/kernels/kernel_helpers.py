"""Shared helpers for the engine tests (imported as a plain module: tests/ is not a package)."""

from __future__ import annotations

import numpy as np

from stepsim.base.hardware import Hardware
from stepsim.kernels import abi
from stepsim.kernels.program import ProgramBuilder


def builder(preset: str = "step-eval", **overrides) -> ProgramBuilder:
    """A ProgramBuilder on a preset (STEP_TIMING §9 common setup: step-eval, depth 2, PMU 64 B/cycle)."""
    return ProgramBuilder(Hardware.preset(preset, **overrides))


def fork_join_program(direct_depth: int | None = None):
    """A reconvergent path: a Broadcast forks 8 tiles into a fast branch ('direct', straight into the join) and
    a slow one (Bufferize + Streamify: nothing leaves it before all 8 tiles arrived); a binary Map joins them.
    Deadlocks at the default depth 2 of 'direct'; depth 8 finishes (in 918 cycles)."""
    b = builder()
    src, buffered, buf, replay, out = (b.add_channel(name=n) for n in ("src", "to_buffer", "buf", "replay", "out"))
    direct = b.add_channel(capacity=direct_depth, name="direct")
    b.offchip_load(out=src, tile_rows=16, tile_cols=64, elem_bytes=2, view_shape=(8,), name="load")
    b.broadcast(inp=src, outs=[direct, buffered], name="fanout")
    b.bufferize(inp=buffered, out=buf, rank=1, name="bufferize")
    b.streamify(inp=buf, out=replay, rank=1, name="streamify")
    b.map(ins=[direct, replay], out=out, fn="add", name="join")
    b.sink(inp=out, name="sink")
    return b.build()


def final_clock(result, unit: int) -> int:
    """A unit's final clock (cycles) from an EngineResult."""
    return int(result.unit_counters[unit, abi.CNT_CLOCK])


def check_timeline_against_counters(timeline, result, depths) -> None:
    """The exact relations between a complete timeline and a run's counters (``depths``: FIFO depth per channel)."""
    assert timeline.complete and timeline.horizon is None and timeline.dropped == 0
    index = {name: i for i, name in enumerate(result.unit_names)}
    sums = np.zeros((len(index), 3), dtype=np.int64)
    iv = timeline.intervals.to_pydict()
    previous_end = {}
    for unit, state, start, end in zip(iv["unit"], iv["state"], iv["start"], iv["end"]):
        assert end > start
        assert previous_end.get(unit, 0) == start  # a unit's intervals tile its time without gaps or overlaps
        previous_end[unit] = end
        sums[index[unit], ("busy", "blocked_in", "blocked_out").index(state)] += end - start
    np.testing.assert_array_equal(sums, result.unit_counters[:, 1:4])
    for unit, i in index.items():  # ... up to the final clock
        assert previous_end.get(unit, 0) == result.unit_counters[i, 4]
    fifo = timeline.fifo.to_pydict()
    peak = {}
    depth_of = dict(zip(result.channel_names, depths))
    for ch, occupancy in zip(fifo["channel"], fifo["occupancy"]):
        assert 0 <= occupancy <= depth_of[ch]
        peak[ch] = max(peak.get(ch, 0), occupancy)
    assert [peak.get(ch, 0) for ch in result.channel_names] == result.channel_counters[:, 1].tolist()
