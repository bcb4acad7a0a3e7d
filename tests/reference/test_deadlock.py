"""Deadlocks on the reference engine raise DeadlockError naming the blocked units and their channels."""

from __future__ import annotations

import pytest

from stepsim.base.errors import DeadlockError
from stepsim.base.hardware import Hardware
from stepsim.kernels.program import ProgramBuilder
from stepsim.kernels.reference import run


def test_cycle_without_initial_tokens_deadlocks_naming_units_and_channels():
    b = ProgramBuilder(Hardware.preset("step-eval"))
    src, fb, y, out = (b.add_channel(name=n) for n in ("src", "feedback", "y", "out"))
    b.metadata_gen(out=src, values=list(range(8)), name="source")
    b.map(ins=[src, fb], out=y, fn="add", compute_bw=1, name="adder")
    b.broadcast(inp=y, outs=[out, fb], name="fanout")
    b.sink(inp=out, name="sink")
    with pytest.raises(DeadlockError) as info:
        run(b.build())
    msg = str(info.value)
    assert "adder (Map) waits on empty channel 'feedback' (occupancy 0/2)" in msg
    assert "source (MetadataGen) waits on full channel 'src' (occupancy 2/2)" in msg
    assert "fanout (Broadcast) waits on empty channel 'y' (occupancy 0/2)" in msg
    blocked = {e.unit: e for e in info.value.blocked}
    assert set(blocked) == {"source", "adder", "fanout", "sink"}
    assert blocked["adder"].channel == "feedback" and blocked["adder"].waiting_for == "empty"
    assert (blocked["source"].occupancy, blocked["source"].capacity) == (2, 2)


def _reconvergent(depth_b):
    b = ProgramBuilder(Hardware.preset("step-eval"))
    src = b.add_channel(name="src")
    a = b.add_channel(capacity=1, name="a")
    short = b.add_channel(capacity=depth_b, name="short")
    buf, long_, y = (b.add_channel(name=n) for n in ("buf", "long", "y"))
    b.metadata_gen(out=src, values=[1, 2, 3, 4], name="source")
    b.broadcast(inp=src, outs=[a, short], name="fanout")
    b.bufferize(inp=a, out=buf, rank=1, name="bufferize")
    b.streamify(inp=buf, out=long_, rank=1, name="streamify")
    b.map(ins=[long_, short], out=y, fn="add", compute_bw=1, name="join")
    b.sink(inp=y, name="sink")
    return b.build()


def test_too_shallow_fifo_on_a_reconvergent_path_deadlocks():
    with pytest.raises(DeadlockError) as info:
        run(_reconvergent(depth_b=1))
    msg = str(info.value)
    assert "fanout (Broadcast) waits on full channel 'short' (occupancy 1/1)" in msg
    assert "join (Map) waits on empty channel 'long' (occupancy 0/2)" in msg
    assert "bufferize (Bufferize) waits on empty channel 'a' (occupancy 0/1)" in msg


def test_the_same_reconvergent_path_with_a_deep_enough_fifo_completes():
    r = run(_reconvergent(depth_b=4))  # the short path must hold the whole group of 4
    assert r.cycles > 0
    assert r.channel_counters[5, 0] == 4  # four sums reach the sink


def test_a_deadlocked_eager_merge_names_its_input_channels():
    b = ProgramBuilder(Hardware.preset("step-eval"))
    a, fb, d, s, o = (b.add_channel(name=n) for n in ("a", "fb", "data", "sel", "out"))
    b.eager_merge(ins=[a, fb], data_out=d, sel_out=s, rank=1, name="merge")
    b.map(ins=[d], out=o, fn="exp", compute_bw=1, name="body")
    b.broadcast(inp=o, outs=[fb, a], name="loop")
    b.sink(inp=s, name="selsink")
    with pytest.raises(DeadlockError) as info:
        run(b.build(), max_steps=10_000)
    assert "merge (EagerMerge) waits on empty channels 'a' (occupancy 0/2), 'fb' (occupancy 0/2)" in str(info.value)


def test_both_engines_report_the_same_blocked_records():
    """One record type (errors.BlockedUnit) from the numba and the reference engine, field for field but the
    clock: a deadlocked run has no final clocks, and the engines stop stepping at different points (here the
    reference engine has already charged the adder's first cycle)."""
    import dataclasses

    from stepsim.base.errors import BlockedUnit
    from stepsim.kernels import run as fast_run

    b = ProgramBuilder(Hardware.preset("step-eval"))
    src, fb, y, out = (b.add_channel(name=n) for n in ("src", "feedback", "y", "out"))
    b.metadata_gen(out=src, values=list(range(8)), name="source")
    b.map(ins=[src, fb], out=y, fn="add", compute_bw=1, name="adder")
    b.broadcast(inp=y, outs=[out, fb], name="fanout")
    b.sink(inp=out, name="sink")
    program = b.build()
    records = []
    for engine in (run, fast_run):
        with pytest.raises(DeadlockError) as info:
            engine(program)
        assert all(isinstance(r, BlockedUnit) for r in info.value.blocked)
        records.append(sorted((dataclasses.replace(r, clock=0) for r in info.value.blocked),
                              key=lambda r: (r.unit, r.channel or "")))
    assert records[0] == records[1]
    assert {r.unit: (r.channel, r.waiting_for, r.occupancy, r.capacity) for r in records[0]} == {
        "source": ("src", "full", 2, 2), "adder": ("feedback", "empty", 0, 2), "fanout": ("y", "empty", 0, 2),
        "sink": ("out", "empty", 0, 2)}
