"""Deadlock diagnosis: the shared record, the wait cycle, the fix channel and a depth checked by reruns.

The Qwen3-30B-A3B case runs the full-size layer (D=2048, F=768, 128 experts, top-8) at B=1024, static tile
32, one region per expert and the experiments' FIFO depth of 2, on a synthetic skewed routing batch made
here (Dirichlet alpha 0.3, seed 1: the hottest expert gets 718 of the 8192 slots).
"""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest
from kernel_helpers import fork_join_program

from stepsim.analysis.deadlock import MAX_LINES, diagnosed, run_diagnosed, suggest_fix
from stepsim.base.errors import BlockedUnit, DeadlockError
from stepsim.base.hardware import Hardware
from stepsim.cli import main
from stepsim.kernels import reference as reference_engine
from stepsim.kernels import run
from stepsim.kernels.program import ProgramBuilder
from stepsim.models.presets import moe_model
from stepsim.simulation.simulate import simulate
from stepsim.trace_io.synthetic import synthetic_routing
from stepsim.workloads.moe.build import build_moe

CYCLE = [
    "cycle 1: 4 hop(s), in a group of 4 unit(s) waiting on each other:",
    "  fanout (Broadcast) waits for a free slot in 'direct' (full, 2/2), read by join (Map)",
    "  join (Map) waits for data on 'replay' (empty, 0/2), written by streamify (Streamify)",
    "  streamify (Streamify) waits for data on 'buf' (empty, 0/2), written by bufferize (Bufferize)",
    "  bufferize (Bufferize) waits for data on 'to_buffer' (empty, 0/2), written by fanout (Broadcast)",
    "fix: a deeper FIFO on 1 full channel(s) of the cycle(s) breaks them: 'direct' (depth now 2)",
]


def test_reconvergent_fork_join_names_exactly_the_shallow_channel():
    with pytest.raises(DeadlockError) as info:
        run_diagnosed(fork_join_program())
    err = info.value
    lines = str(err).splitlines()
    assert lines[0] == "deadlock: no unit can make progress; 6 unit(s) blocked (2 on a full FIFO), 1 wait cycle(s)"
    assert lines[1:7] == CYCLE
    assert len(lines) <= MAX_LINES
    assert err.diagnosis.fix_channels == ["direct"]  # 'src' is full too, but not on the cycle
    assert all(isinstance(b, BlockedUnit) for b in err.blocked)
    fix = suggest_fix(err.program, err.diagnosis)
    assert (fix.channels, fix.depth, fix.verified, fix.cycles) == ({"direct": 8}, 8, True, 918)
    assert run(fork_join_program(direct_depth=8)).cycles == 918  # the checked depth, applied, finishes
    with pytest.raises(DeadlockError):
        run(fork_join_program(direct_depth=7))  # and it is the smallest that does


def test_the_shown_cycle_starts_at_a_full_channel_even_when_an_empty_wait_comes_first():
    """The fork-join program with its units added join first: the first blocked unit on the cycle (the join)
    waits on an empty channel, yet the cycle is shown from the full FIFO that a deeper depth would fix."""
    b = ProgramBuilder(Hardware.preset("step-eval"))
    src, buffered, buf, replay, out = (b.add_channel(name=n) for n in ("src", "to_buffer", "buf", "replay", "out"))
    direct = b.add_channel(name="direct")
    b.map(ins=[direct, replay], out=out, fn="add", name="join")
    b.streamify(inp=buf, out=replay, rank=1, name="streamify")
    b.bufferize(inp=buffered, out=buf, rank=1, name="bufferize")
    b.broadcast(inp=src, outs=[direct, buffered], name="fanout")
    b.offchip_load(out=src, tile_rows=16, tile_cols=64, elem_bytes=2, view_shape=(8,), name="load")
    b.sink(inp=out, name="sink")
    with pytest.raises(DeadlockError) as info:
        run_diagnosed(b.build())
    assert info.value.blocked[0].unit == "join" and info.value.blocked[0].waiting_for == "empty"
    assert str(info.value).splitlines()[1:7] == CYCLE


def test_both_engines_give_the_same_records_and_diagnosis():
    with pytest.raises(DeadlockError) as fast:
        run_diagnosed(fork_join_program())
    with pytest.raises(DeadlockError) as ref:
        run_diagnosed(fork_join_program(), reference_engine.run)
    key = lambda e: {(b.unit, b.opcode, b.channel, b.waiting_for, b.occupancy, b.capacity) for b in e.blocked}  # noqa: E731
    assert key(fast.value) == key(ref.value)
    assert all(type(b) is BlockedUnit for b in ref.value.blocked)
    assert ref.value.diagnosis.fix_channels == ["direct"]
    assert str(ref.value).splitlines()[1:7] == CYCLE


def test_the_engines_raise_raw_records_and_the_diagnosis_is_attached_above_them():
    """The engine layer imports no analysis: its error lists the blocked units; diagnosed() explains it."""
    for engine in (run, reference_engine.run):
        with pytest.raises(DeadlockError) as info:
            engine(fork_join_program())
        raw = info.value
        lines = str(raw).splitlines()
        assert raw.diagnosis is None and raw.program is not None
        assert lines[:2] == [f"deadlock: no unit can make progress; {len(raw.blocked)} record(s) of blocked units",
                             "blocked units:"]
        assert lines[2:] == raw.unit_lines and len(raw.unit_lines) == len(raw.blocked)
        explained = diagnosed(raw)
        assert explained.diagnosis.fix_channels == ["direct"]
        assert str(explained).splitlines()[1:7] == CYCLE
        assert (explained.blocked, explained.unit_lines, explained.program) == (raw.blocked, raw.unit_lines,
                                                                               raw.program)
        assert diagnosed(explained) is explained


def test_the_error_pickles_without_its_program():
    """Sweep workers send errors back to the parent process."""
    with pytest.raises(DeadlockError) as info:
        run_diagnosed(fork_join_program())
    back = pickle.loads(pickle.dumps(info.value))
    assert (str(back), back.blocked, back.diagnosis, back.program) == (
        str(info.value), info.value.blocked, info.value.diagnosis, None)


def test_a_bad_deadlock_report_path_fails_before_the_run(tmp_path, capsys):
    (tmp_path / "file").write_text("")
    assert main(["run", "swiglu", "--deadlock-report", str(tmp_path / "file" / "x.json")]) == 2
    err = capsys.readouterr().err
    assert err == (f"stepsim: error: --deadlock-report {tmp_path / 'file' / 'x.json'}: {tmp_path / 'file'} is a "
                   f"file, not a folder\n")


def test_a_loop_without_initial_tokens_has_no_fifo_fix():
    b = ProgramBuilder(Hardware.preset("step-eval"))
    x, y = b.add_channel(name="x"), b.add_channel(name="y")
    b.map(ins=[x], out=y, fn="exp", name="first")
    b.map(ins=[y], out=x, fn="exp", name="second")
    with pytest.raises(DeadlockError) as info:
        run_diagnosed(b.build())
    assert info.value.diagnosis.fix_channels == []
    assert ("fix: no FIFO on the cycle is full, so no FIFO depth breaks it: the loop needs an initial token "
            "(a feedback channel without one never starts)") in str(info.value).splitlines()


def _routing_b1024() -> np.ndarray:
    table = synthetic_routing(1024, 128, 8, seed=1, skew="dirichlet", alpha=0.3)
    return np.stack(table.column("expert_ids").to_numpy(zero_copy_only=False)).astype(np.int64)


@pytest.mark.slow
def test_qwen_b1024_static_tile_32_reports_a_cycle_and_a_depth_that_finishes():
    workload = build_moe(moe_model("qwen3-30b-a3b"), _routing_b1024(), tiling="static", tile_n=32)
    with pytest.raises(DeadlockError) as info:
        simulate(workload)  # the experiments' FIFOs of 2
    err = info.value
    lines = str(err).splitlines()
    assert len(lines) <= MAX_LINES
    assert err.diagnosis.n_blocked == 2444 and len(err.blocked) == 2444
    assert lines[0] == ("deadlock: no unit can make progress; 2,444 unit(s) blocked (113 on a full FIFO), "
                        "1 wait cycle(s)")
    assert lines[1] == "cycle 1: 24 hop(s), in a group of 24 unit(s) waiting on each other:"
    assert lines[2].startswith("  Partition_5 (Partition) waits for a free slot in 'Partition_5[11]' (full, 2/2)")
    assert len(err.diagnosis.fix_channels) == 12
    fix = suggest_fix(err.program, err.diagnosis)
    assert fix.verified and fix.depth == 6 and len(fix.channels) == 83
    assert set(err.diagnosis.fix_channels) <= set(fix.channels)
    # applied, the suggested depths finish, in the cycles the check reported
    assert simulate(workload, channel_depths=fix.channels).cycles == fix.cycles == 3_170_886


def test_cli_deadlock_report_writes_every_blocked_unit(tmp_path, capsys):
    routing = _routing_b1024()
    trace = tmp_path / "routing.npz"
    np.savez(trace, data=routing)
    report = tmp_path / "deadlock.json"
    status = main(["run", "moe", "--model", "custom", "--hidden", "32", "--intermediate", "192", "--experts", "128",
                   "--top-k", "8", "--trace", str(trace), "--tiling", "static", "--tile-n", "32",
                   "--channel-depth", "2", "--deadlock-report", str(report)])
    err = capsys.readouterr().err
    assert status == 3  # a deadlock has its own exit status (stepsim.errors.EXIT_DEADLOCK)
    lines = err.splitlines()
    assert lines[0].startswith("stepsim: error: deadlock: no unit can make progress; 2,444 unit(s) blocked")
    assert len(lines) <= MAX_LINES + 1  # + the line naming the report file
    verified = [ln for ln in lines if ln.startswith("  verified: depth 5 on those 63 channel(s)")]
    assert len(verified) == 1
    assert lines[-1] == f"(full diagnosis written to {report})"
    doc = json.loads(report.read_text())
    assert len(doc["blocked"]) == 2444 and doc["n_blocked"] == 2444
    assert set(doc["blocked"][0]) == {"unit", "opcode", "clock", "channel", "waiting_for", "occupancy", "capacity"}
    assert doc["fix"]["verified"] is True and doc["fix"]["depth"] == 5
    assert doc["diagnosis"]["fix_channels"][0] == "Partition_5[11]"
