"""``stepsim optimize``: the CLI (JSON keys, resume, bad input), budgets, and the reproduce command line."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from stepsim.base.errors import ConfigError
from stepsim.cli import build_parser, main
from stepsim.optimize import optimize

pytestmark = pytest.mark.traces

WINDOW = "conv_stdev0174_1845_1860.npy"
JSON_KEYS = ["workload", "objective", "max_on_chip", "max_compute", "max_chips", "pareto", "recommended",
             "candidates", "pruned_symbolically", "simulations", "per_chips", "pruned_by_budget", "pruned_by_bound", "proven_deadlocks", "invalid",
             "failed_simulations", "simulations_run_now", "rounds", "stages", "out", "plot_skipped", "files"]


@pytest.fixture
def window(shared_traces):
    return str(shared_traces / "kv_lengths" / "b16" / WINDOW)


def test_cli_json_resume_and_files(window, tmp_path, capsys):
    out = tmp_path / "opt"
    argv = ["optimize", "attention", "--trace", window, "--jobs", "2", "--out", str(out), "--json"]
    assert main(argv) == 0
    first = json.loads(capsys.readouterr().out)
    assert list(first) == JSON_KEYS
    # coarse uses min(ceil(16/16), regions) = 1 region at B=16: one coarse candidate, not five identical ones
    assert (first["candidates"], first["pruned_symbolically"], first["simulations"]) == (11, 0, 11)
    assert first["simulations_run_now"] == 11
    assert [(p["config"]["strategy"], p["config"]["regions"], p["cycles"], p["on_chip_bytes"],
             p["allocated_flops_per_cycle"]) for p in first["pareto"]] == [
        ("interleave", 16, 4724, 754944, 196608), ("interleave", 8, 6301, 378112, 98304),
        ("interleave", 4, 11754, 189696, 49152), ("dynamic", 2, 23094, 95504, 24576),
        ("interleave", 2, 23332, 95488, 24576), ("coarse", 1, 44691, 48384, 12288)]
    assert first["recommended"]["cycles"] == 4724
    assert first["recommended"]["command"] == (
        f"stepsim run attention --trace {Path(window).resolve()} --regions 16 --strategy interleave --softmax plain "
        f"--convention published")
    front = pq.read_table(out / "pareto.parquet")
    assert front.column("cycles").to_pylist() == [p["cycles"] for p in first["pareto"]]
    assert pq.read_table(out / "candidates.parquet").num_rows == 11
    assert (out / "pareto.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads((out / "optimize.json").read_text())["pareto"] == first["pareto"]
    # the same command again resumes: nothing is evaluated or simulated again, the answer is the same
    assert main(argv) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["simulations_run_now"] == 0
    assert {k: v for k, v in again.items() if k != "simulations_run_now"} == \
        {k: v for k, v in first.items() if k != "simulations_run_now"}


def test_reproduce_command_has_the_candidates_run_id(window, tmp_path, serial):
    from stepsim.cli.args import config_from_args
    from stepsim.results.records import run_identity

    result = optimize("attention", out=tmp_path / "opt", trace=window, executor=serial, objective="on-chip")
    assert (result.recommended.config["strategy"], result.recommended.config["regions"]) == ("coarse", 1)
    words = shlex.split(result.command)
    assert words[:2] == ["stepsim", "run"]
    args = build_parser().parse_args(words[1:])
    run_id, _, _ = run_identity({**config_from_args(args), "mode": "simulate"})
    assert run_id == result.recommended.run_id


def test_budgets_are_respected(window, tmp_path, serial):
    result = optimize("attention", out=tmp_path / "opt", trace=window, executor=serial, max_compute=24576,
                      max_on_chip=95500)
    assert (result.candidates, result.pruned_symbolically, result.simulations) == (11, 7, 4)
    assert [(c.config["strategy"], c.config["regions"], c.cycles) for c in result.front] == [
        ("interleave", 2, 23332), ("coarse", 1, 44691)]
    for c in result.candidate_list:
        if c.status in ("simulated", "failed"):
            assert c.on_chip_bytes <= 95500 and c.allocated_flops_per_cycle <= 24576
    assert result.recommended.config == {**result.front[0].config}


@pytest.mark.parametrize("budgets, message", [
    ({"max_on_chip": 1000}, "--max-on-chip 1,000: no candidate fits; the smallest on-chip footprint is 48,384 bytes "
                            "(strategy=coarse regions=1)"),
    ({"max_compute": 12287}, "--max-compute 12,287: no candidate fits; the smallest allocated compute is 12,288 "
                             "FLOPs/cycle (strategy=coarse regions=1)"),
    ({"max_on_chip": 95000, "max_compute": 20000}, None),
])
def test_budget_below_every_candidate(window, tmp_path, serial, budgets, message):
    if message is None:  # a budget pair that coarse regions=1 meets: no error
        result = optimize("attention", out=tmp_path / "opt", trace=window, executor=serial, **budgets)
        assert [c.cycles for c in result.front] == [44691]
        return
    with pytest.raises(ConfigError) as err:
        optimize("attention", out=tmp_path / "opt", trace=window, executor=serial, **budgets)
    assert str(err.value) == message


@pytest.mark.parametrize("argv, message", [
    (["optimize", "swiglu"], "stepsim: error: stepsim optimize searches moe, attention, decoder, not 'swiglu'"),
    (["optimize", "attention", "--max-on-chip", "0"], "stepsim: error: --max-on-chip must be an integer >= 1, got 0"),
    (["optimize", "attention", "--max-compute", "-5"],
     "stepsim: error: --max-compute must be an integer >= 1, got -5"),
    (["optimize", "attention", "--jobs", "0"], "stepsim: error: --jobs must be an int >= 1 (leave it out to use "
                                               "every CPU: {cpus}), got 0"),
    (["optimize", "moe", "--tile-f", "64"], "stepsim: error: knob 'tile_f' is both fixed (--tile-f) and an axis of "
                                            "the search space; leave one"),
])
def test_bad_input_one_line_exit_2(argv, message, tmp_path, capsys):
    assert main([*argv, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    from stepsim.batch.executors import default_jobs

    assert err == [message.format(cpus=default_jobs())]


def test_dask_executor_finds_the_same_front(window, tmp_path, serial):
    pytest.importorskip("distributed")
    space = [{"strategy": ("interleave", "dynamic"), "regions": (2, 4)}]
    local = optimize("attention", out=tmp_path / "serial", trace=window, executor=serial, space=space)
    dask = optimize("attention", out=tmp_path / "dask", trace=window, executor="dask", jobs=1, space=space)
    assert [c.point() for c in dask.front] == [c.point() for c in local.front]
    assert [(c.config["strategy"], c.config["regions"], c.cycles) for c in dask.front] == [
        ("interleave", 4, 11754), ("dynamic", 2, 23094), ("interleave", 2, 23332)]
    assert (dask.candidates, dask.simulations) == (4, 4)
