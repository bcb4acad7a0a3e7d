"""No candidate completes: an empty front is an answer (said, written to optimize.json, the plot skipped with its
reason), not a matplotlib traceback; and a deadlock has its own exit status, 3, with advice naming size-fifos."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest

from stepsim.cli import main

pytestmark = pytest.mark.traces

WINDOW = "conv_stdev0174_1845_1860.npy"


def test_a_space_where_every_candidate_fails_gives_an_empty_front(shared_traces, tmp_path, capsys):
    swiglu = tmp_path / "swiglu.toml"  # a depths file for another graph: every candidate fails to build
    assert main(["size-fifos", "swiglu", "--out", str(swiglu), "--json"]) == 0
    space = tmp_path / "space.toml"
    space.write_text(f'[axes]\nstrategy = ["interleave"]\nregions = [2, 4]\nfifo_depths = ["{swiglu}"]\n')
    out = tmp_path / "opt"
    capsys.readouterr()
    status = main(["optimize", "attention", "--trace", str(shared_traces / "kv_lengths" / "b16" / WINDOW),
                   "--space", str(space), "--jobs", "1", "--no-progress", "--out", str(out)])
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    lines = captured.out.splitlines()
    assert status == 0
    assert lines[-1] == "  pareto.png not drawn: no candidate completed a simulation, so there is no point to plot"
    assert lines[-2].startswith(f"  no candidate completed a simulation: the front is empty, no recommendation "
                                f"(every status is in {out / 'candidates.parquet'}; e.g. strategy=interleave "
                                f"regions=2 fifo_depths={swiglu}: {swiglu}: FIFO depths made for another graph")
    doc = json.loads((out / "optimize.json").read_text())
    assert (doc["pareto"], doc["recommended"], doc["failed_simulations"]) == ([], None, 2)
    assert doc["plot_skipped"] == "no candidate completed a simulation, so there is no point to plot"
    assert sorted(doc["files"]) == ["candidates", "json", "pareto"]
    assert not (out / "pareto.png").exists()
    assert pq.read_table(out / "pareto.parquet").num_rows == 0
    assert pq.read_table(out / "candidates.parquet").column("status").to_pylist() == ["failed", "failed"]


def test_a_deadlock_exits_3_and_advises_size_fifos(tmp_path, capsys):
    from stepsim.trace_io.synthetic import synthetic_routing

    table = synthetic_routing(1024, 32, 4, seed=1, skew="dirichlet", alpha=0.3)
    trace = tmp_path / "skewed.npz"
    np.savez(trace, data=np.stack(table.column("expert_ids").to_numpy(zero_copy_only=False)).astype(np.int64))
    status = main(["run", "moe", "--model", "custom", "--hidden", "32", "--intermediate", "64", "--experts", "32",
                   "--top-k", "4", "--trace", str(trace), "--tile-n", "32", "--channel-depth", "2"])
    err = capsys.readouterr().err
    assert status == 3  # not 2: the flags were fine, the configuration deadlocks
    assert "Traceback" not in err
    advice = [line for line in err.splitlines() if "size-fifos" in line]
    assert advice == ["  run `stepsim size-fifos` with this run's flags and --out depths.toml, then rerun with "
                      "--fifo-depths depths.toml, or --channel-depth 5 for every FIFO (more on-chip memory)"]
