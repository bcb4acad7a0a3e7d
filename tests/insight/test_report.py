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

KEYS = {"run_id", "workload", "bound", "roofline", "critical_path", "top_units", "imbalance", "full_fifos"}
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
    assert set(rep) == KEYS
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
    imb = rep["imbalance"]
    assert (imb["kind"], imb["groups"], imb["straggler"]) == ("expert", 128, "expert 31")
    assert tiles[31] == max(tiles)
    assert imb["ratio"] == imb["max_busy_cycles"] / imb["mean_busy_cycles"]
    fifos = rep["full_fifos"]
    assert fifos["source"] == "timeline"  # the report simulated the run again with a timeline
    full = [f["full_cycles"] for f in fifos["full"]]
    assert full == sorted(full, reverse=True) and fifos["n_full"] >= len(fifos["full"]) and 0 < full[-1]
    assert all(f["peak_occupancy"] == f["capacity"] for f in fifos["full"])
    assert len(format_report(rep).splitlines()) <= 40
    # the time at full depth, counted cycle by cycle from the timeline's occupancy steps
    _, timeline = report_run_dir(tmp_path)
    top = fifos["full"][0]
    steps = [(r["t"], r["occupancy"]) for r in timeline.fifo.to_pylist() if r["channel"] == top["channel"]]
    per_cycle = np.repeat([o for _, o in steps[:-1]], np.diff([t for t, _ in steps]))
    assert top["full_cycles"] == int((per_cycle == top["capacity"]).sum())
    # without a timeline: the same full channels, ordered by their producers' back-pressure
    proxy, none = report_run_dir(tmp_path, with_timeline=False)
    assert none is None and proxy["full_fifos"]["source"] == "producer back-pressure"
    blocked = [f["producer_blocked_output_cycles"] for f in proxy["full_fifos"]["full"]]
    assert blocked == sorted(blocked, reverse=True) and proxy["full_fifos"]["n_full"] == fifos["n_full"]
    assert all(f["full_cycles"] is None for f in proxy["full_fifos"]["full"])


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
