"""FIFO depths of batch sizes the paper did not run (stepsim.reproduce.fifos): Qwen's time-multiplexing at
B=1024 deadlocks with the experiments' FIFOs of 2, so reproduce runs it with the artifact's unbounded 1024 and
says so in the table (``channel_depth``) and the summary."""

import numpy as np
import pytest
from repro_traces import write_routing

from stepsim.base.errors import DeadlockError
from stepsim.models.presets import moe_model
from stepsim.reproduce import reproduce
from stepsim.reproduce.dynamic_tiling import plan as tiling_plan
from stepsim.reproduce.fifos import fifo_depth, fifo_note
from stepsim.reproduce.time_multiplexing import plan as timeshare_plan
from stepsim.reproduce.time_multiplexing import summary
from stepsim.simulation.simulate import simulate
from stepsim.trace_io.synthetic import synthetic_routing
from stepsim.workloads.moe.build import build_moe


def _skewed(batch):
    table = synthetic_routing(batch, 128, 8, seed=1, skew="dirichlet", alpha=0.3)
    return np.stack(table.column("expert_ids").to_numpy(zero_copy_only=False)).astype(np.int64)


def test_depths_and_notes_per_experiment_model_and_batch():
    assert [fifo_depth("time-multiplexing", "qwen3-30b-a3b", b) for b in (64, 128, 1024)] == [2, 1024, 1024]
    assert [fifo_depth("dynamic-tiling", m, b) for m in ("mixtral-8x7b", "qwen3-30b-a3b") for b in (32, 64, 1024)] \
        == [2, 2, 2, 1024, 2, 1024]
    assert fifo_note("time-multiplexing", "qwen3-30b-a3b", 64) == "FIFOs 2 deep (the paper's setting)"
    assert fifo_note("dynamic-tiling", "qwen3-30b-a3b", 1024) == "FIFOs 1024 deep (the artifact's unbounded None)"
    assert fifo_note("time-multiplexing", "qwen3-30b-a3b", 1024) == (
        "FIFOs 1024 deep (the artifact's unbounded None for Qwen beyond B=64; the paper did not run B=1024, and "
        "depth 2 can deadlock; stepsim size-fifos gives the depths it needs)")
    assert fifo_note("dynamic-tiling", "mixtral-8x7b", 32) == (
        "FIFOs 2 deep (the experiments' default; the paper did not run B=32)")


def test_plans_use_unbounded_fifos_for_qwen_batches_the_paper_did_not_run(tmp_path):
    write_routing(tmp_path, "qwen_b1024", _skewed(1024))
    write_routing(tmp_path, "qwen_b256", _skewed(256))
    write_routing(tmp_path, "mixtral_b256", np.argsort(np.random.default_rng(0).random((256, 8)), 1)[:, :2])
    points = timeshare_plan(tmp_path, regions=(64,))
    assert [(p.labels["batch"], p.config["tiling"], p.config["regions"], p.config["channel_depth"])
            for p in points] == [(b, t, r, 1024) for b in (256, 1024) for t in ("static", "dynamic") for r in (128, 64)]
    tiling = {(p.labels["model"], p.labels["batch"], p.config.get("channel_depth")) for p in tiling_plan(tmp_path)}
    assert tiling == {("mixtral-8x7b", 256, None), ("qwen3-30b-a3b", 256, 1024), ("qwen3-30b-a3b", 1024, 1024)}


@pytest.mark.slow
def test_time_multiplexing_at_b1024_finishes_and_says_which_fifos(tmp_path):
    routing = _skewed(1024)
    write_routing(tmp_path, "qwen_b1024", routing)
    with pytest.raises(DeadlockError):  # what reproduce used to run: the experiments' FIFOs of 2
        simulate(build_moe(moe_model("qwen3-30b-a3b"), routing, tiling="static", tile_n=32, regions=64))
    result, = reproduce("time-multiplexing", tmp_path, tmp_path / "out",
                        options={"time-multiplexing": {"regions": (64,)}})
    rows = result.table.to_pylist()
    assert [(r["batch"], r["tiling"], r["regions"], r["channel_depth"]) for r in rows] == [
        (1024, t, r, 1024) for t in ("static", "dynamic") for r in (128, 64)]
    lines = summary(result.table, result.headline, result.details)
    note = fifo_note("time-multiplexing", "qwen3-30b-a3b", 1024)
    assert lines.count(f"qwen_b1024/000_001.npz static: {note}") == 1
    assert lines.count(f"qwen_b1024/000_001.npz dynamic: {note}") == 1


def test_reproduce_applies_a_depths_file_to_the_points_it_was_sized_for(tmp_path):
    from stepsim.base.errors import ConfigError
    from stepsim.passes import size_fifos
    from stepsim.passes.depths_writer import write_depths_file

    routing = np.argsort(np.random.default_rng(3).random((32, 8)), 1)[:, :2]
    trace = write_routing(tmp_path, "mixtral_b32", routing)
    options = {"dynamic-tiling": {"tiles": {32: (8,)}, "model_dims": {"mixtral-8x7b": {"hidden": 64,
                                                                                         "intermediate": 128}}}}
    config = {"workload": "moe", "model": "custom", "hidden": 64, "intermediate": 128, "experts": 8, "top_k": 2,
              "trace": str(trace), "tiling": "static", "tile_n": 8}
    depths = write_depths_file(size_fifos(config, uniform=False), tmp_path / "d.toml")
    lines = []
    result, = reproduce("dynamic-tiling", tmp_path, tmp_path / "out", options=options, fifo_depths=[depths],
                        progress=lines.append)
    assert f"sized FIFOs from {depths} (instead of uniform depths) for 1 point(s): dynamic-tiling " \
           "mixtral_b32/000_001.npz" in lines
    static, dynamic = result.table.to_pylist()
    from stepsim.graph.depths_file import apply_depths_file
    from stepsim.workloads.config import workload_from_config

    assert static["cycles"] == simulate(apply_depths_file(workload_from_config(config), depths)).cycles
    assert dynamic["cycles"] == simulate(workload_from_config({**config, "tiling": "dynamic", "tile_n": None})).cycles
    other = write_depths_file(size_fifos({**config, "tile_n": 16}, uniform=False), tmp_path / "other.toml")
    with pytest.raises(ConfigError, match=rf"--fifo-depths {other}: made for graph moe-custom-static \(config .*\), "
                                          r"which no point of dynamic-tiling runs on these traces"):
        reproduce("dynamic-tiling", tmp_path, tmp_path / "out2", options=options, fifo_depths=[other])
    assert not (tmp_path / "out2").exists()
