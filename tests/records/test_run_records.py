"""RunResult rows hold exactly what the simulation and the symbolic metrics say, under a fixed schema."""

import hashlib
import json

import numpy as np
import pyarrow as pa
import pytest

from stepsim.base.errors import ConfigError
from stepsim.base.files import file_sha256
from stepsim.cli import main
from stepsim.results.records import (
    CHANNEL_SCHEMA,
    SCHEMA,
    UNIT_SCHEMA,
    NotSimulatedError,
    RunResult,
    allocated_compute_flops,
    concat_runs,
    run_config,
    run_identity,
    trace_sha256,
)
from stepsim.simulation.simulate import SimResult, simulate
from stepsim.workloads.config import KNOBS, bundled_trace, workload_from_config

SWIGLU = {"workload": "swiglu", "tile_m": 32, "tile_n": 64}


@pytest.fixture(scope="module")
def swiglu_run():
    """(workload, SimResult, RunResult) of one real SwiGLU simulation."""
    workload = workload_from_config(SWIGLU)
    sim = simulate(workload)
    return workload, sim, RunResult.from_simulation(workload, sim, SWIGLU)


def _fake_sim(cycles, read, written, unit_names=("a_0",), channel_names=("a_0[0]",)):
    """A SimResult with chosen integers (counters zero) for checking the derived columns exactly."""
    return SimResult(cycles=cycles, off_chip_bytes_read=read, off_chip_bytes_written=written, events=7, fires=5,
                     sim_wall_s=0.5, compile_s=0.25, lower_s=0.125, unit_names=list(unit_names),
                     channel_names=list(channel_names), unit_counters=np.zeros((len(unit_names), 5), np.int64),
                     channel_counters=np.zeros((len(channel_names), 2), np.int64))


# --- schema -------------------------------------------------------------------------------------------------
def test_schema_order_types_and_units():
    assert SCHEMA.names[:6] == ["run_id", "mode", "stepsim_version", "trace_path", "trace_sha256", "hardware_name"]
    assert SCHEMA.names[6:6 + len(KNOBS)] == list(KNOBS)
    units = {f.name: f.metadata[b"unit"].decode() for f in SCHEMA if f.metadata}
    assert units == {
        "cycles": "cycles", "off_chip_bytes": "bytes", "off_chip_bytes_read": "bytes",
        "off_chip_bytes_written": "bytes", "off_chip_bytes_measured": "bytes", "off_chip_bytes_symbolic": "bytes",
        "on_chip_bytes": "bytes", "on_chip_bytes_active": "bytes", "flops": "FLOP", "graph_flops": "FLOP",
        "algorithmic_flops": "FLOP", "allocated_compute_flops_per_cycle": "FLOP/cycle",
        "hbm_bytes_per_cycle": "bytes/cycle", "load_unit_cycles": "cycles", "compute_unit_cycles": "cycles",
        "hbm_request_cycles": "cycles", "pipeline_cycles": "cycles", "link_cycles": "cycles",
        "compute_utilization": "ratio",
        "off_chip_bw_utilization": "ratio",
        "events": "count", "fires": "count", "build_s": "s", "metrics_s": "s", "lower_s": "s", "compile_s": "s",
        "sim_wall_s": "s", "total_s": "s", "check_max_rel_error": "ratio", "check_tolerance": "ratio"}
    assert SCHEMA.names[-3:] == ["check_max_rel_error", "check_tolerance", "check_passed"]
    assert SCHEMA.field("check_passed").type == pa.bool_()
    assert SCHEMA.field("tile_n").type == pa.int64() and SCHEMA.field("tiling").type == pa.string()
    assert SCHEMA.field("compute_utilization").type == pa.float64()
    assert UNIT_SCHEMA.names == ["run_id", "name", "kind", "group", "label", "fires", "busy_cycles",
                                 "blocked_in_cycles", "blocked_out_cycles", "final_clock", "utilization", "bytes"]
    assert CHANNEL_SCHEMA.names == ["run_id", "name", "pushes", "peak_occupancy"]


def test_to_arrow_is_one_row_with_the_schema_and_equals_row(swiglu_run):
    _, _, run = swiglu_run
    table = run.to_arrow()
    assert table.num_rows == 1 and table.schema.equals(SCHEMA, check_metadata=True)
    assert table.to_pylist() == [run.row]
    assert list(run.row) == SCHEMA.names


# --- simulation rows ----------------------------------------------------------------------------------------
def test_simulation_row_equals_the_sim_result_and_the_metrics(swiglu_run):
    workload, sim, run = swiglu_run
    row, metrics = run.row, workload.metrics()
    assert (row["mode"], row["workload"], row["tile_m"], row["tile_n"], row["hardware_name"]) == \
        ("simulate", "swiglu", 32, 64, "step-hdl")
    assert row["cycles"] == sim.cycles and isinstance(row["cycles"], int)
    assert (row["off_chip_bytes_read"], row["off_chip_bytes_written"]) == \
        (sim.off_chip_bytes_read, sim.off_chip_bytes_written) == (3_670_016, 65_536)
    assert row["off_chip_bytes"] == row["off_chip_bytes_measured"] == sim.off_chip_bytes == 3_735_552
    assert row["off_chip_bytes_symbolic"] == metrics["off_chip_bytes"] == 3_735_552
    assert (row["on_chip_bytes"], row["on_chip_bytes_active"]) == (metrics["on_chip_bytes"],
                                                                   metrics["on_chip_bytes_active"])
    assert (row["flops"], row["graph_flops"], row["algorithmic_flops"]) == (117_473_280, 50_626_560, 117_473_280)
    assert (row["events"], row["fires"]) == (sim.events, sim.fires)
    assert (row["sim_wall_s"], row["compile_s"], row["lower_s"]) == (sim.sim_wall_s, sim.compile_s, sim.lower_s)
    assert row["trace_path"] is None and row["trace_sha256"] is None
    assert json.loads(row["params"]) == workload.params


def test_run_config_simulates_the_same_cycles_and_times_the_whole_run(swiglu_run):
    _, sim, run = swiglu_run
    again = run_config({**SWIGLU, "mode": "simulate"})
    assert again.run_id == run.run_id
    assert (again.row["cycles"], again.row["off_chip_bytes"], again.row["fires"]) == \
        (sim.cycles, sim.off_chip_bytes, sim.fires)
    parts = again.row["build_s"] + again.row["metrics_s"] + again.row["lower_s"] + again.row["sim_wall_s"]
    assert 0 < parts <= again.row["total_s"]
    assert run.row["build_s"] is None and run.row["total_s"] is None  # not measured by from_simulation


def test_utilizations_follow_the_paper_formulas_on_exact_integers():
    workload = workload_from_config(SWIGLU)
    # SwiGLU: 5 compute nodes at 4096 FLOPs/cycle; step-hdl HBM peak 8 channels * 64 B / 2 = 256 B/cycle
    assert allocated_compute_flops(workload) == 20_480
    # 117_473_280 FLOP = 5736 cycles at 20_480 FLOPs/cycle: 4x that many cycles is 25 % compute utilization
    cycles = 4 * 5736
    written = 65_536
    read = cycles * 256 // 2 - written  # half the peak bandwidth
    row = RunResult.from_simulation(workload, _fake_sim(cycles, read, written), SWIGLU).row
    assert (row["allocated_compute_flops_per_cycle"], row["hbm_bytes_per_cycle"]) == (20_480, 256)
    assert row["compute_utilization"] == 0.25
    assert row["off_chip_bw_utilization"] == 0.5
    zero = RunResult.from_simulation(workload, _fake_sim(0, 0, 0), SWIGLU).row
    assert zero["compute_utilization"] is None and zero["off_chip_bw_utilization"] is None


@pytest.mark.parametrize("regions, allocated", [(128, 787_456), (64, 459_776), (32, 295_936), (16, 214_016),
                                                (8, 173_056), (4, 152_576)])
def test_allocated_compute_reproduces_the_time_multiplexing_experiment(regions, allocated):
    """STEP_SEMANTICS §5.4: 5*1024*regions + 1024*128 (weight-scale maps) + 1024 (final accum)."""
    workload = workload_from_config({"workload": "moe", "model": "qwen3-30b-a3b", "tile_n": 32,
                                     "regions": regions})
    assert allocated_compute_flops(workload) == allocated == 5 * 1024 * regions + 1024 * 128 + 1024


def test_unit_and_channel_tables_cover_every_unit_and_channel(swiglu_run):
    workload, sim, run = swiglu_run
    units, channels = run.unit_table(), run.channel_table()
    assert units.schema.equals(UNIT_SCHEMA, check_metadata=True)
    assert channels.schema.equals(CHANNEL_SCHEMA, check_metadata=True)
    assert units.num_rows == len(sim.unit_names) == len(workload.graph.ops) == 12
    assert channels.num_rows == len(sim.channel_names) == 12
    assert units.column("name").to_pylist() == sim.unit_names
    assert set(units.column("run_id").to_pylist()) == set(channels.column("run_id").to_pylist()) == {run.run_id}
    assert sum(units.column("fires").to_pylist()) == sim.fires == run.row["fires"]
    assert units.column("busy_cycles").to_pylist() == sim.unit_counters[:, 1].tolist()
    assert channels.column("pushes").to_pylist() == sim.channel_counters[:, 0].tolist()
    assert channels.column("peak_occupancy").to_pylist() == sim.channel_counters[:, 1].tolist()
    kinds = dict(zip(units.column("name").to_pylist(), units.column("kind").to_pylist()))
    assert kinds == {op.name: op.kind for op in workload.graph.ops}
    for r in units.to_pylist():
        assert r["utilization"] == r["busy_cycles"] / sim.cycles
        assert r["final_clock"] <= sim.cycles


def test_unit_kind_falls_back_to_the_name_for_units_without_an_operator():
    workload = workload_from_config(SWIGLU)
    sim = _fake_sim(10, 0, 0, unit_names=("Map_5", "Foo_12", "MapAccum_3[0].implicit_sink"))
    kinds = RunResult.from_simulation(workload, sim, SWIGLU).unit_table().column("kind").to_pylist()
    assert kinds == ["Map", "Foo", "Sink"]


# --- metrics rows -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("config", [
    {"workload": "swiglu", "tile_m": 64, "tile_n": 128},
    {"workload": "moe", "tile_n": 8},
    {"workload": "moe", "model": "qwen3-30b-a3b", "tiling": "dynamic", "convention": "paper"},
    {"workload": "attention", "strategy": "coarse"},
])
def test_metrics_row_equals_workload_metrics(config):
    workload = workload_from_config(config)
    metrics = workload.metrics(config.get("convention", "published"))
    run = run_config(config)
    row = run.row
    assert row["mode"] == "metrics" and not run.simulated
    assert row["off_chip_bytes"] == row["off_chip_bytes_symbolic"] == metrics["off_chip_bytes"]
    assert (row["on_chip_bytes"], row["on_chip_bytes_active"], row["flops"], row["graph_flops"]) == \
        (metrics["on_chip_bytes"], metrics["on_chip_bytes_active"], metrics["flops"], metrics["graph_flops"])
    assert row["algorithmic_flops"] == workload.algorithmic_flops
    for key in ("cycles", "off_chip_bytes_read", "off_chip_bytes_written", "off_chip_bytes_measured", "events",
                "fires", "compute_utilization", "off_chip_bw_utilization", "lower_s", "compile_s", "sim_wall_s"):
        assert row[key] is None, key
    assert json.loads(row["params"]) == workload.params


def test_published_swiglu_numbers_and_trace_identity():
    row = run_config({"workload": "swiglu", "tile_m": 64, "tile_n": 128}).row
    assert (row["off_chip_bytes"], row["on_chip_bytes"], row["flops"]) == (1_900_544, 655_360, 117_473_280)
    moe = run_config({"workload": "moe", "model": "qwen3-30b-a3b", "tile_n": 16}).row
    trace = bundled_trace("qwen3-30b-a3b")
    assert (moe["trace"], moe["trace_path"], moe["trace_sha256"]) == (None, trace, file_sha256(trace))
    assert (moe["model"], moe["tiling"], moe["hardware_name"]) == ("qwen3-30b-a3b", "static", "step-eval")


def test_convention_argument_overrides_the_config():
    workload = workload_from_config({"workload": "moe", "tile_n": 16})
    run = RunResult.from_metrics(workload, {"workload": "moe", "tile_n": 16}, convention="paper")
    assert run.row["convention"] == "paper"
    assert run.row["on_chip_bytes"] == workload.metrics("paper")["on_chip_bytes"] != \
        workload.metrics("published")["on_chip_bytes"]


def test_metrics_run_has_no_unit_or_channel_tables():
    run = run_config({"workload": "swiglu"})
    with pytest.raises(NotSimulatedError) as err:
        run.unit_table()
    assert str(err.value) == (f"run {run.run_id[:16]} (swiglu) is a metrics run (mode 'metrics'); "
                              f"unit counters exist only for mode 'simulate'")
    with pytest.raises(NotSimulatedError, match="channel counters exist only for mode 'simulate'"):
        run.channel_table()
    assert isinstance(err.value, ConfigError)


def test_workload_and_config_must_agree():
    with pytest.raises(ConfigError) as err:
        RunResult.from_metrics(workload_from_config(SWIGLU), {"workload": "attention"}, source="x.toml")
    assert str(err.value) == "x.toml: config key 'workload' is 'attention' but the workload given is 'swiglu'"


# --- identity -----------------------------------------------------------------------------------------------
def test_run_id_is_the_normalized_config_mode_and_trace_content():
    a = run_config({"workload": "swiglu"})
    assert a.run_id == run_config({"workload": "swiglu", "tile_m": 16, "tile_n": 16, "mode": "metrics"}).run_id
    assert a.run_id != run_config({"workload": "swiglu", "tile_n": 32}).run_id
    assert a.run_id != run_config({"workload": "swiglu", "convention": "paper"}).run_id
    assert len(a.run_id) == 64 and int(a.run_id, 16) >= 0


def test_run_identity_predicts_the_record_without_running_it():
    config = {"workload": "moe", "model": "qwen3-30b-a3b", "tile_n": 16, "mode": "simulate"}
    trace = bundled_trace("qwen3-30b-a3b")
    run_id, path, sha = run_identity(config)
    assert (path, sha) == (trace, file_sha256(trace))
    metrics = run_config({**config, "mode": "metrics"})
    assert run_identity({**config, "mode": "metrics"})[0] == metrics.run_id != run_id
    assert run_identity({"workload": "swiglu"}) == (run_config({"workload": "swiglu"}).run_id, None, None)


def test_trace_hash_of_a_file_and_of_a_folder(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "a.npy").write_bytes(b"abc")
    (tmp_path / "sub" / "b.npy").write_bytes(b"xyz")
    (tmp_path / ".hidden").write_bytes(b"ignored")
    lines = f"a.npy\0{hashlib.sha256(b'abc').hexdigest()}\nsub/b.npy\0{hashlib.sha256(b'xyz').hexdigest()}\n"
    assert trace_sha256(tmp_path) == hashlib.sha256(lines.encode()).hexdigest()
    assert trace_sha256(tmp_path / "a.npy") == hashlib.sha256(b"abc").hexdigest()
    with pytest.raises(ConfigError, match="cannot read trace .*missing"):
        trace_sha256(tmp_path / "missing")


# --- collections ----------------------------------------------------------------------------------------------
def test_concat_runs_unifies_metrics_and_simulation_rows(swiglu_run):
    _, sim, sim_run = swiglu_run
    metrics_run = run_config({"workload": "attention"})
    rows = concat_runs([metrics_run, sim_run])
    assert rows.schema.equals(SCHEMA, check_metadata=True)
    assert rows.column("cycles").to_pylist() == [None, sim.cycles]
    assert rows.column("workload").to_pylist() == ["attention", "swiglu"]
    units = concat_runs([metrics_run, sim_run, sim_run], kind="units")
    assert units.num_rows == 2 * len(sim.unit_names)
    assert concat_runs([metrics_run], kind="channels").num_rows == 0
    assert concat_runs([]).num_rows == 0
    with pytest.raises(ConfigError, match="kind must be one of runs, units, channels, got 'unit'"):
        concat_runs([sim_run], kind="unit")


# --- CLI ------------------------------------------------------------------------------------------------------
def test_cli_json_prints_the_record_row_with_the_legacy_keys(capsys):
    assert main(["metrics", "swiglu", "--tile-m", "64", "--tile-n", "128", "--json"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert list(row) == SCHEMA.names
    assert row == run_config({"workload": "swiglu", "tile_m": 64, "tile_n": 128}).row | {
        k: row[k] for k in ("build_s", "metrics_s", "total_s")}
    assert main(["run", "swiglu", "--json"]) == 0
    row = json.loads(capsys.readouterr().out)
    legacy = ("cycles", "off_chip_bytes", "off_chip_bytes_symbolic", "on_chip_bytes", "on_chip_bytes_active",
              "flops", "events", "sim_wall_s", "compile_s")
    assert all(row[k] is not None for k in legacy)


def test_cli_refuses_a_flag_the_workload_does_not_use(capsys):
    assert main(["metrics", "moe", "--tile-m", "16"]) == 2
    assert capsys.readouterr().err.strip() == (
        "stepsim: error: --tile-m does not apply to workload 'moe' (it applies to: swiglu, prefill_attention, mla_prefill)")  # the flag typed


# --- MoE simulation -------------------------------------------------------------------------------------------
def test_moe_simulation_row_matches_its_sim_result_and_symbolic_traffic():
    config = {"workload": "moe", "tile_n": 64}
    workload = workload_from_config(config)
    sim = simulate(workload)
    run = RunResult.from_simulation(workload, sim, config)
    row = run.row
    assert (row["cycles"], row["off_chip_bytes"], row["fires"]) == (sim.cycles, sim.off_chip_bytes, sim.fires)
    assert row["off_chip_bytes_measured"] == row["off_chip_bytes_symbolic"] == 2_820_145_408
    assert row["hbm_bytes_per_cycle"] == 1024
    assert row["off_chip_bw_utilization"] == sim.off_chip_bytes / (sim.cycles * 1024)
    assert row["compute_utilization"] == row["flops"] / (sim.cycles * row["allocated_compute_flops_per_cycle"])
    units = run.unit_table()
    assert units.num_rows == len(sim.unit_names) and sum(units.column("fires").to_pylist()) == sim.fires
    assert run.channel_table().num_rows == len(sim.channel_names)
