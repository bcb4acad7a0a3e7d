"""The bottleneck report on workloads whose answer is known, from Python and from the CLI."""

from __future__ import annotations

import json
import math

import numpy as np

from stepsim.cli import main
from stepsim.insight.report import build_report, format_report, load_run, report_run_dir, write_png
from stepsim.results.records import run_config
from stepsim.trace_io.load import load_routing
from stepsim.workloads.config import bundled_trace

KEYS = {"run_id", "workload", "bound", "roofline", "critical_path", "top_units", "imbalance", "full_fifos", "spills"}
HOP_KEYS = {"unit", "kind", "group", "busy_cycles", "blocked_input_cycles", "blocked_output_cycles"}


def _written(tmp_path, config):
    record = run_config({**config, "mode": "simulate"})
    record.write(tmp_path)
    return record, report_run_dir(tmp_path)[0]


def _check_path_is_connected(rep, record):
    """Every hop of the critical path is a neighbour (through one channel) of the hop before it."""
    from stepsim.insight.report import rebuild

    _, program = rebuild(record.row)
    index = {n: i for i, n in enumerate(program.unit_names)}
    units = record.unit_table().to_pylist()
    first = rep["critical_path"][0]
    # the unit finishing last (memory units' +1 for the HBM's end makes cycles one more at most)
    assert units[index[first["unit"]]]["final_clock"] == max(u["final_clock"] for u in units)
    assert record.row["cycles"] - units[index[first["unit"]]]["final_clock"] in (0, 1)
    for a, b in zip(rep["critical_path"], rep["critical_path"][1:], strict=False):
        i, j = index[a["unit"]], index[b["unit"]]
        if a["blocked_input_cycles"] >= a["blocked_output_cycles"]:  # starved: b produces one of a's inputs
            assert any(int(program.ch_producer[c]) == j for c in program.inputs(i))
        else:  # back-pressured: b consumes one of a's outputs
            assert any(int(program.ch_consumer[c]) == j for c in program.outputs(i))
    for hop in rep["critical_path"]:
        u = units[index[hop["unit"]]]
        assert (hop["busy_cycles"], hop["blocked_input_cycles"], hop["blocked_output_cycles"]) == (
            u["busy_cycles"], u["blocked_in_cycles"], u["blocked_out_cycles"])


def test_memory_bound_moe_layer(tmp_path):
    record, rep = _written(tmp_path, {"workload": "moe", "model": "qwen3-30b-a3b"})
    assert set(rep) == KEYS and rep["spills"] is None  # not an ONNX model
    assert rep["bound"] == "memory-bound"
    roof = rep["roofline"]
    assert roof["memory_cycles"] == 765_199_360 / 1024 == 747_265.0  # off-chip bytes / peak B/cycle
    assert roof["compute_cycles"] == 57_078_079_488 / 3_149_824
    assert roof["cycles"] == 800_809 and roof["hbm_utilization"] == record.row["off_chip_bw_utilization"]
    assert roof["compute_utilization"] == record.row["compute_utilization"]
    assert all(set(h) == HOP_KEYS for h in rep["critical_path"])
    _check_path_is_connected(rep, record)
    # the straggler expert is one with the most token tiles (static tile 32) in the trace
    counts = np.bincount(load_routing(bundled_trace("qwen3-30b-a3b"), 128).ravel(), minlength=128)
    tiles = [math.ceil(c / 32) for c in counts]
    assert tiles[31] == max(tiles) and sum(c == 0 for c in counts) == 48
    units = record.unit_table().to_pylist()
    labels = _group_labels(record)
    expert_31 = [u["busy_cycles"] for u in units if labels.get(u["name"]) == "expert 31"]
    # an expert's bottleneck is its busiest unit (a weight load), busy at most the run's cycles; the sum over its
    # 19 units (2,652,699) exceeds the run and is no measure of when it finishes
    assert max(expert_31) == 787_144 < roof["cycles"] and sum(expert_31) == 2_652_699
    assert rep["imbalance"] == {
        "kind": "expert", "groups": 128, "idle_groups": 48, "max_busy_cycles": 787_144,
        "mean_busy_cycles": rep["imbalance"]["mean_busy_cycles"], "ratio": 787_144 / rep["imbalance"]["mean_busy_cycles"],
        "busiest": "expert 31", "lead_cycles": 787_144 - 741_319, "straggler": "expert 31",
        "straggler_final_clock": 800_711}
    group_rows = rep["top_units"]["groups"]
    active = [g["max_unit_busy_cycles"] for g in group_rows if g["group"].startswith("expert")
              and g["max_unit_busy_cycles"] > 0]
    assert len(active) == 80 and rep["imbalance"]["mean_busy_cycles"] == sum(active) / 80
    assert group_rows[1]["group"] == "expert 121" and group_rows[1]["max_unit_busy_cycles"] == 741_319
    text = format_report(rep).splitlines()
    assert text[2] == ("imbalance across 128 experts (48 idle): busiest unit max/mean 1.10; straggler expert 31: its "
                       "busiest unit is busy 45,825 cycles (5.7 % of the run) longer than any other expert's, "
                       "finishes at 800,711")
    fifos = rep["full_fifos"]
    assert fifos["source"] == "timeline"  # the report simulated the run again with a timeline
    assert fifos["n_full"] == 493
    assert [(f["channel"], f["stall_cycles"], f["full_cycles"]) for f in fifos["full"][:3]] == [
        ("Broadcast_2251[0]", 90_112, 787_128), ("Broadcast_2315[0]", 40_960, 685_345),
        ("Broadcast_2393[0]", 40_960, 685_261)]
    stalls = [(f["stall_cycles"], f["full_cycles"]) for f in fifos["full"]]
    assert stalls == sorted(stalls, reverse=True)
    assert all(f["peak_occupancy"] == f["capacity"] for f in fifos["full"])
    assert len(format_report(rep).splitlines()) <= 40
    # the time at full depth and the stall, counted cycle by cycle from the timeline
    _, timeline = report_run_dir(tmp_path)
    for top in fifos["full"][:2]:
        steps = [(r["t"], r["occupancy"]) for r in timeline.fifo.to_pylist() if r["channel"] == top["channel"]]
        per_cycle = np.repeat([o for _, o in steps[:-1]], np.diff([t for t, _ in steps]))
        assert top["full_cycles"] == int((per_cycle == top["capacity"]).sum())
        assert top["stall_cycles"] == _stall_by_cycle(timeline, top, roof["cycles"])
    # without a timeline: the same full channels, ordered by their producers' back-pressure
    proxy, none = report_run_dir(tmp_path, with_timeline=False)
    assert none is None and proxy["full_fifos"]["source"] == "producer back-pressure"
    blocked = [f["producer_blocked_output_cycles"] for f in proxy["full_fifos"]["full"]]
    assert blocked == sorted(blocked, reverse=True) and proxy["full_fifos"]["n_full"] == fifos["n_full"]
    assert all(f["full_cycles"] is None and f["stall_cycles"] is None for f in proxy["full_fifos"]["full"])


def _group_labels(record):
    from stepsim.insight.report import rebuild
    from stepsim.simulation.timeline import graph_labels

    return graph_labels(rebuild(record.row)[0].graph)[0]


def _stall_by_cycle(timeline, fifo, cycles):
    """Cycles the producer spent blocked on ``fifo`` while the consumer was busy, one cycle at a time."""
    blocked = np.zeros(cycles + 2, dtype=bool)
    busy = np.zeros(cycles + 2, dtype=bool)
    for r in timeline.intervals.to_pylist():
        if r["unit"] == fifo["producer"] and r["state"] == "blocked_out" and r["channel"] == fifo["channel"]:
            blocked[r["start"]:r["end"]] = True
        if r["unit"] == fifo["consumer"] and r["state"] == "busy":
            busy[r["start"]:r["end"]] = True
    return int((blocked & busy).sum())


def test_memory_bound_moe_with_even_experts_names_no_straggler(tmp_path):
    """Dynamic tiling on the same trace: every active expert's loads are 97 % busy, so no expert is a straggler
    (the summed busy cycles over an expert's units used to name expert 66)."""
    record, rep = _written(tmp_path, {"workload": "moe", "model": "qwen3-30b-a3b", "tiling": "dynamic"})
    assert rep["bound"] == "memory-bound" and rep["roofline"]["cycles"] == 760_903
    imb = rep["imbalance"]
    assert (imb["busiest"], imb["max_busy_cycles"], imb["lead_cycles"], imb["straggler"],
            imb["straggler_final_clock"]) == ("expert 31", 738_170, 2, None, None)
    assert format_report(rep).splitlines()[2] == (
        "imbalance across 128 experts (48 idle): busiest unit max/mean 1.03; no straggler (the busiest, expert 31, "
        "is busy 2 cycles (0.0 % of the run) longer than the next)")
    assert [u["busy_cycles"] for u in rep["top_units"]["by_busy"][:5]] == [738_170, 738_168, 738_167, 738_163,
                                                                          738_158]
    _check_path_is_connected(rep, record)


SLOW_AND_FAST = """
from stepsim.graph import BF16, FP32, Add, Graph, LinearOffChipLoad, LinearOffChipStore, Map, Silu, Tensor


def slow_and_fast():
    g = Graph("slow-and-fast")
    x = LinearOffChipLoad(g, Tensor("x", (64, 256), BF16), tile=(16, 256), out_shape_tiled=(4, 1), stride=(1, 0),
                          stream_dtype=FP32, name="load_x")
    y = LinearOffChipLoad(g, Tensor("y", (64, 256), BF16), tile=(16, 256), out_shape_tiled=(4, 1), stride=(1, 0),
                          stream_dtype=FP32, name="load_y")
    slow = Map(g, x, Silu(), compute_bw=8, name="slow_silu")
    LinearOffChipStore(g, Map(g, [slow, y], Add(), compute_bw=1024, name="add"), tensor_name="z")
    return g
"""


def test_a_fifo_full_because_its_consumer_waits_elsewhere_causes_no_stall(tmp_path, capsys):
    """``add`` waits on the slow SiLU; the fast load's FIFO into ``add`` is full longer (12,273 cycles) than the
    one into the SiLU (12,144), but only the SiLU's own work holds a FIFO full: it comes first."""
    program = tmp_path / "graph.py"
    program.write_text(SLOW_AND_FAST)
    assert main(["run", f"{program}:slow_and_fast", "--out", str(tmp_path / "run")]) == 0
    capsys.readouterr()
    rep, timeline = report_run_dir(tmp_path / "run")
    full = rep["full_fifos"]["full"]
    assert [(f["channel"], f["consumer"], f["full_cycles"], f["stall_cycles"], f["producer_blocked_output_cycles"])
            for f in full] == [("load_x[0]", "slow_silu", 12_144, 7_756, 7_756),
                               ("load_y[0]", "add", 12_273, 256, 7_885)]
    for f in full:
        assert f["stall_cycles"] == _stall_by_cycle(timeline, f, rep["roofline"]["cycles"])
    assert main(["report", str(tmp_path / "run")]) == 0
    text = capsys.readouterr().out.splitlines()
    # neither roofline is near (HBM 0.8 %, compute 0.9 %), but the SiLU never rests: the verdict says so
    assert text[:3] == [
        "verdict: latency-or-imbalance-bound (16,808 cycles; memory roofline 128, compute roofline 143 cycles)",
        "  HBM: 7.8 of 1,024 B/cycle (0.8 %); compute: 9 of 1,032 FLOP/cycle (0.9 %)",
        "  one unit sets the pace: slow_silu (Map, shared) busy 97.5 % of the run"]
    assert text[-4:] == [
        "FIFOs full at some point: 2 (largest stall first: cycles the producer waited on the FIFO while its "
        "consumer was busy):",
        "  load_x[0] depth 2: stall 7,756 cycles; full 12,144 cycles; consumer slow_silu",
        "  load_y[0] depth 2: stall 256 cycles; full 12,273 cycles; consumer add",
        "FIFOs never above one element: 2"]


def test_swiglu_64x256_on_the_hdl_preset_and_a_compute_bound_point(tmp_path):
    """At tile_m 64 x tile_n 256 the validation's roofline (16,384 FLOP/cycle peak) calls the point
    compute-bound (7,170 vs 6,912 cycles); with the compute the graph really allocates (5 nodes of 4,096
    FLOP/cycle) its compute roofline is 5,736 cycles, below the memory roofline. With a quarter of the compute
    per node the same point is compute-bound by any measure, and the busiest units are the matmuls."""
    config = {"workload": "swiglu", "tile_m": 64, "tile_n": 256, "hardware": "step-hdl"}
    _, rep = _written(tmp_path / "a", config)
    roof = rep["roofline"]
    assert (roof["cycles"], roof["memory_cycles"], roof["compute_cycles"]) == (11_087, 6_912.0, 5_736.0)
    assert rep["bound"] == "memory-bound"  # 6,912 >= half of 11,087 cycles
    record, rep = _written(tmp_path / "b", {**config, "compute_bw": 1024})
    assert rep["bound"] == "compute-bound"
    assert rep["roofline"]["compute_cycles"] == 117_473_280 / (5 * 1024)
    assert [u["kind"] for u in rep["top_units"]["by_busy"][:3]] == ["MapAccum"] * 3
    _check_path_is_connected(rep, record)


def test_coarse_attention_names_the_straggler_region(tmp_path):
    lengths = np.full(64, 256, dtype=np.int64)
    lengths[32:48] = 2048  # coarse gives requests 32-47 (block 2) to region 2
    trace = tmp_path / "kv.npy"
    np.save(trace, lengths)
    record, rep = _written(tmp_path / "run", {"workload": "attention", "strategy": "coarse", "trace": str(trace)})
    assert rep["bound"] == "latency-or-imbalance-bound"
    imb = rep["imbalance"]
    assert (imb["kind"], imb["groups"], imb["straggler"]) == ("region", 4, "region 2")
    assert imb["straggler_final_clock"] == max(u["final_clock"] for u in record.unit_table().to_pylist())
    assert imb["ratio"] > 2
    assert rep["critical_path"][0]["group"] == "region 2"
    _check_path_is_connected(rep, record)
    # dynamic parallelization spreads the same requests evenly
    _, dyn = _written(tmp_path / "dyn", {"workload": "attention", "strategy": "dynamic", "trace": str(trace)})
    assert dyn["imbalance"]["ratio"] < imb["ratio"]


def test_cli_report_and_run_report(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["run", "swiglu", "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["report", str(out), "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep == json.loads(json.dumps(report_run_dir(out)[0]))
    png = tmp_path / "report.png"
    assert main(["report", str(out), "--png", str(png)]) == 0
    text = capsys.readouterr().out
    assert text.startswith(f"verdict: {rep['bound']} ")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["run", "swiglu", "--report", "--json"]) == 0
    both = json.loads(capsys.readouterr().out)
    assert both["report"]["critical_path"] == rep["critical_path"] and both["record"]["cycles"] == rep["roofline"]["cycles"]
    assert main(["run", "swiglu", "--report"]) == 0
    assert "critical path (" in capsys.readouterr().out
    # `run --out NAME.parquet` writes the record file and its tables beside it
    assert main(["run", "swiglu", "--out", str(tmp_path / "one.parquet")]) == 0
    capsys.readouterr()
    assert main(["report", str(tmp_path / "one.parquet"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["critical_path"] == rep["critical_path"]
    assert main(["compare", str(out), str(tmp_path / "one.parquet"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["worse"] == []


def test_report_errors_are_one_line(tmp_path, capsys):
    assert main(["report", str(tmp_path)]) == 2
    assert capsys.readouterr().err == (f"stepsim: error: {tmp_path}: no part-*.parquet file (write a run folder "
                                       f"with `stepsim run ... --out {tmp_path}`)\n")
    metrics = tmp_path / "m"
    assert main(["metrics", "swiglu", "--out", str(metrics)]) == 0
    capsys.readouterr()
    assert main(["report", str(metrics)]) == 2
    assert "a metrics run (no simulation)" in capsys.readouterr().err


def test_png_is_written_atomically(tmp_path):
    record = run_config({"workload": "swiglu", "mode": "simulate"})
    record.write(tmp_path)
    rep = build_report(*load_run(tmp_path))
    path = write_png(rep, tmp_path / "r.png")
    assert path.stat().st_size > 0
    assert sorted(p.name for p in tmp_path.iterdir() if p.suffix == ".png") == ["r.png"]


def test_a_single_region_is_no_straggler(tmp_path):
    """The bundled B=16 batch on coarse attention has one region: nothing can lag behind it."""
    _, rep = _written(tmp_path, {"workload": "attention", "strategy": "coarse"})
    imb = rep["imbalance"]
    assert (imb["kind"], imb["groups"], imb["busiest"], imb["lead_cycles"], imb["straggler"]) == (
        "region", 1, "region 0", None, None)
    assert format_report(rep).splitlines()[2:4] == [
        "  one unit sets the pace: RandomOffChipLoad_13 (RandomOffChipLoad, region 0) busy 93.7 % of the run",
        "imbalance: none (one region, region 0)"]
