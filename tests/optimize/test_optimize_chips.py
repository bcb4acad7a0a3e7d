"""``stepsim optimize --max-chips``: expert parallelism and placement under a chip budget (stepsim/optimize/chips.py).

The pruned search over one to four chips finds exactly the exhaustive front of the candidates within the budget
(four objectives: cycles, on-chip bytes, allocated compute, chips), every bound holds on every simulated point,
the scaled system files and the outputs are read back, and bad budgets are one line.
"""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest
from small_routing import write_small_routing

from stepsim.base.errors import ConfigError
from stepsim.base.system import System
from stepsim.cli import main
from stepsim.optimize import optimize
from stepsim.optimize.chips import chip_count, chip_counts, parallel_grids
from stepsim.optimize.pareto import dominates, pareto_front
from stepsim.results.records import run_config

#: a small MoE layer: 8 experts, top-2, 24 tokens (fast enough to simulate every candidate)
SMALL = {"model": "custom", "hidden": 512, "intermediate": 512, "experts": 8, "top_k": 2}
SPACE = [{"tiling": ("dynamic",), "tile_f": (64, 256)},
         {"tiling": ("static",), "tile_n": (8,), "tile_f": (256,), "regions": (2,)},
         {"tiling": ("dynamic", "static"), "tile_f": (64, 256), "ep": (2, 4, 8),
          "placement": ("contiguous", "load-balanced")}]


@pytest.fixture
def trace(tmp_path):
    return write_small_routing(tmp_path)[0]


def _exhaustive_within_budget(result) -> tuple[list, dict]:
    """Simulate every candidate the budgets admit (no pruning): the front ``[(run_id, *objectives)]`` and
    ``{run_id: cycles}``."""
    admitted = [c for c in result.candidate_list if c.status not in ("invalid", "over-budget")]
    cycles = {c.run_id: run_config({**c.config, "mode": "simulate"}).row["cycles"] for c in admitted}
    points = [(cycles[c.run_id], c.on_chip_bytes, c.allocated_flops_per_cycle, c.chips) for c in admitted]
    return sorted((admitted[i].run_id, *points[i]) for i in pareto_front(points)), cycles


def test_pruned_search_over_chips_equals_exhaustive(trace, tmp_path, serial):
    r = optimize("moe", out=tmp_path / "opt", executor=serial, max_chips=4, space=SPACE, trace=trace, **SMALL)
    statuses = {s: sum(c.status == s for c in r.candidate_list) for s in ("over-budget", "pruned", "simulated")}
    assert (r.candidates, statuses) == (27, {"over-budget": 8, "pruned": 9, "simulated": 10})
    assert sorted({c.chips for c in r.candidate_list if c.status == "over-budget"}) == [8]
    front, cycles = _exhaustive_within_budget(r)
    assert sorted((c.run_id, *c.objectives) for c in r.front) == front
    for c in r.candidate_list:
        if c.run_id in cycles:  # the bound the pruning relies on holds on every candidate, pruned ones too
            assert c.lower_bound <= cycles[c.run_id], c.config
        if c.status == "pruned":  # dominated in reality too
            real = (cycles[c.run_id], c.on_chip_bytes, c.allocated_flops_per_cycle, c.chips)
            assert any(dominates(p[1:], real) or tuple(p[1:]) == real for p in front)
    # four chips beat one here (the layer reads 8 experts' weights: 4 HBMs read them in parallel); with static
    # tiling every expert is one 32-row tile, so load-balanced keeps the contiguous blocks: the same point twice;
    # with dynamic tiling too (the ragged model: contiguous within one shared pass of its least)
    assert [(c.cycles, c.chips, c.config["tiling"], c.config.get("placement")) for c in r.front] == [
        (11899, 4, "dynamic", "contiguous"), (11899, 4, "dynamic", "load-balanced"), (11912, 4, "static", "contiguous"),
        (11912, 4, "static", "load-balanced"), (12327, 2, "dynamic", "contiguous"),
        (12358, 2, "static", "contiguous"), (12358, 2, "static", "load-balanced"), (16144, 1, "dynamic", None),
        (50243, 1, "static", None)]
    assert (r.recommended.config["ep"], r.recommended.config["placement"], r.recommended.cycles) == \
        (4, "contiguous", 11899)
    assert {n: p["cycles"] for n, p in r.per_chips().items()} == {1: 16144, 2: 12327, 4: 11899}
    from stepsim.optimize.search import recommend

    fewest = recommend(r.front, "chips")  # --objective chips: the fewest chips, then the fastest on them
    assert (fewest.chips, fewest.cycles) == (1, 16144)
    from stepsim.cli.optimize import format_result

    text = format_result(r).splitlines()
    assert text[4] == "  Pareto front (9 point(s)): cycles, on-chip bytes, FLOPs/cycle, chips"
    assert text[5] == ("  *       11,899      1,888,264    486,400    4  tiling=dynamic tile_f=64 ep=4 "
                       "placement=contiguous")
    assert "  fastest per chip count: 1 chip(s) 16,144 cycles; 2 chip(s) 12,327 cycles; 4 chip(s) 11,899 cycles" \
        in text


def test_outputs_name_the_chips_and_are_read_back(trace, tmp_path, serial):
    out = tmp_path / "opt"
    r = optimize("moe", out=out, executor=serial, max_chips=2, space=SPACE[:1] + SPACE[2:], trace=trace, **SMALL)
    doc = json.loads((out / "optimize.json").read_text())
    assert doc["max_chips"] == 2 and doc["pareto"] == [c.point() for c in r.front]
    assert [p["chips"] for p in doc["pareto"]] == [c.chips for c in r.front]
    assert doc["per_chips"] == {str(n): p for n, p in r.per_chips().items()} and sorted(doc["per_chips"]) == ["1", "2"]
    table = pq.read_table(out / "candidates.parquet")
    assert table.column("chips").to_pylist() == [c.chips for c in r.candidate_list]
    assert table.column("ep").to_pylist() == [c.config.get("ep") for c in r.candidate_list]
    assert pq.read_table(out / "pareto.parquet").column("chips").to_pylist() == [c.chips for c in r.front]
    assert r.files["plot"] == out / "pareto.png" and (out / "pareto.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_system_is_scaled_to_each_chip_count(trace, tmp_path, serial):
    """--system ring-8 with --max-chips 4: one chip on its hardware, rings of 2 and 4 chips written to
    OUT/systems and read back; the candidates run on them (their run commands name the files)."""
    slow = tmp_path / "slow.toml"
    slow.write_text('chips = 8\nhardware = "step-hdl"\ntopology = "ring"\nlink_bandwidth = 2\nlink_latency = 40\n')
    out = tmp_path / "opt"
    space = [{"tiling": ("dynamic",), "tile_f": (64,)},
             {"tiling": ("dynamic",), "tile_f": (64,), "ep": (2, 4), "placement": ("round-robin",)}]
    r = optimize("moe", out=out, executor=serial, max_chips=4, space=space, system=str(slow), trace=trace,
                 **SMALL)
    assert [(c.chips, c.config.get("hardware"), c.config.get("system")) for c in r.candidate_list] == [
        (1, "step-hdl", None), (2, None, (out / "systems" / "slow-2.toml").resolve().as_posix()),
        (4, None, (out / "systems" / "slow-4.toml").resolve().as_posix())]
    for n in (2, 4):
        system = System.load(str(out / "systems" / f"slow-{n}.toml"))
        assert (system.name, system.chips, system.hardware_spec, system.dimensions[0].topology,
                [(link.bandwidth, link.latency) for link in system.links][:1]) == \
            (f"slow-{n}", n, "step-hdl", "ring", [(2, 40)])
    multi = [c for c in r.candidate_list if c.chips > 1]
    assert all(f"--system {c.config['system']}" in run_command_of(c) for c in multi)
    # a slow ring: the links' serialization bounds the run (link_cycles), and the bound holds
    for c in multi:
        row = run_config({**c.config, "mode": "simulate"}).row
        assert row["link_cycles"] > 0 and c.lower_bound <= row["cycles"]


def run_command_of(candidate) -> str:
    from stepsim.optimize.output import run_command

    return run_command(candidate.config)


def test_chip_counts_are_divisors_of_the_experts_within_the_budget():
    assert chip_counts(128, 8) == [2, 4, 8]
    assert chip_counts(8, 6) == [2, 4]
    assert chip_counts(6, 16) == [2, 3, 6]
    assert chip_counts(128, 16, System.preset("torus-4x4")) == [16]  # not scalable: its own count only
    assert chip_counts(128, 8, System.preset("torus-4x4")) == []
    assert chip_count({"ep": 4}) == 4 and chip_count({"tiling": "static"}) == 1
    assert chip_count({"tp": 2}) == 2 and chip_count({"ep": 2, "tp": 4}) == 8
    assert chip_count({"tp": 2, "ep": 2, "pp": 2}) == 8 and chip_count({"pp": 3}) == 3


def test_the_default_space_adds_placements_per_chip_count():
    grids = parallel_grids([{"tiling": ("dynamic",), "tile_f": (32, 64)},
                            {"tiling": ("dynamic",), "tile_f": (32, 64), "regions": (2, 4)}], 4, experts=8)
    placements = ("contiguous", "round-robin", "load-balanced")
    assert grids == [
        {"tiling": ("dynamic",), "tile_f": (32, 64)},
        {"tiling": ("dynamic",), "tile_f": (32, 64), "regions": (2, 4)},
        {"tiling": ("dynamic",), "tile_f": (32, 64), "ep": (2,), "placement": placements},
        {"tiling": ("dynamic",), "tile_f": (32, 64), "regions": (2, 4), "ep": (2,), "placement": placements},
        {"tiling": ("dynamic",), "tile_f": (32, 64), "ep": (4,), "placement": placements},
        {"tiling": ("dynamic",), "tile_f": (32, 64), "regions": (4,), "ep": (4,), "placement": placements}]


def test_the_bound_counts_every_chips_hbm():
    """Qwen3-30B-A3B on the bundled B=64 trace over 8 chips: one HBM's roofline (747,265 cycles) would prune a
    run of 133,578 cycles; the search's bound over 8 HBMs and the per-chip unit bounds stays below it."""
    from stepsim.optimize.pareto import roofline_lower_bound
    from stepsim.optimize.search import BOUND_COLUMNS

    row = run_config({"workload": "moe", "model": "qwen3-30b-a3b", "ep": 8, "mode": "simulate"}).row
    assert row["hbm_bytes_per_cycle"] == 8 * 1024  # the record's peak counts every chip's HBM
    one_hbm = roofline_lower_bound(row["off_chip_bytes_symbolic"], 1024, row["graph_flops"],
                                   row["allocated_compute_flops_per_cycle"])
    eight = roofline_lower_bound(row["off_chip_bytes_symbolic"], row["hbm_bytes_per_cycle"], row["graph_flops"],
                                 row["allocated_compute_flops_per_cycle"])
    assert (one_hbm, eight, row["cycles"]) == (747265, 93409, 133578)
    assert [row[k] for k in BOUND_COLUMNS] == [98736, 98304, 119925, 123926, 2099]  # the link bound: 2,099
    assert max(eight, *(row[k] for k in BOUND_COLUMNS)) == 123926 <= row["cycles"]


@pytest.mark.parametrize("argv, message", [
    (["attention", "--max-chips", "4"], "stepsim: error: --max-chips searches the parallel axes (tp, ep, pp), which "
                                        "stepsim optimize builds for the MoE and decoder layers only, not "
                                        "'attention'"),
    (["moe", "--max-chips", "0"], "stepsim: error: --max-chips must be an integer >= 1, got 0"),
    (["moe", "--max-chips", "4", "--system", "ring-4", "--hardware", "sn40l"],
     "stepsim: error: --hardware does not apply with --system: the system file names the chips' hardware"),
    (["moe", "--max-chips", "4", "--system", "mesh-9"],
     "stepsim: error: --system: unknown system preset 'mesh-9'; known presets: fully-connected-8, ring-2, "
     "ring-4, ring-8, sn40l-16, sn40l-8, switch-8, torus-4x4"),
])
def test_bad_chip_budgets_are_one_line(tmp_path, capsys, argv, message):
    assert main(["optimize", *argv, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == message
    assert not (tmp_path / "o").exists()


def test_no_candidate_within_the_chip_budget_names_the_fewest(trace, tmp_path, serial):
    space = [{"tiling": ("dynamic",), "tile_f": (64,), "ep": (4, 8), "placement": ("contiguous",)}]
    with pytest.raises(ConfigError) as info:
        optimize("moe", out=tmp_path / "o", executor=serial, max_chips=2, space=space, trace=trace, **SMALL)
    assert str(info.value) == "--max-chips 2: no candidate fits; the fewest chips is 4 (tiling=dynamic tile_f=64 " \
                              "ep=4 placement=contiguous)"


def test_cli_default_space_over_chips(tmp_path, capsys):
    """``stepsim optimize moe --max-chips 2`` on a tiny layer (D 16, F 32, 8 experts, 24 tokens): the default space
    (24 one-chip candidates: dynamic and static tile_n 1..16 at tile_f 32, with and without regions 1, 2, 4) plus on
    2 chips the 6 tilings, without regions and with regions 2 or 4 (the multiples of 2), x 3 placements (54); the
    JSON report and optimize.json agree."""
    write_small_routing(tmp_path, "r.npz")
    out = tmp_path / "o"
    assert main(["optimize", "moe", "--model", "custom", "--hidden", "16", "--intermediate", "32", "--experts", "8",
                 "--top-k", "2", "--trace", str(tmp_path / "r.npz"), "--max-chips", "2", "--jobs", "1",
                 "--out", str(out), "--json", "--no-progress"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["candidates"], report["max_chips"], sorted(report["per_chips"])) == (78, 2, ["1", "2"])
    rows = pq.read_table(out / "candidates.parquet").to_pylist()
    assert sum(r["chips"] == 2 for r in rows) == 54
    assert sorted({r["regions"] for r in rows if r["chips"] == 2}, key=str) == [2, 4, None]
    assert {r["placement"] for r in rows if r["chips"] == 2} == {"contiguous", "round-robin", "load-balanced"}
    assert json.loads((out / "optimize.json").read_text())["pareto"] == report["pareto"]
    assert report["simulations"] + report["pruned_symbolically"] + report["invalid"] == 78


def test_a_fixed_ep_search_counts_its_chips(trace, tmp_path, serial):
    """``--ep 4`` fixed (no --max-chips): every candidate is on 4 chips and its bound divides the bytes by 4 HBMs;
    the bound holds on every simulated point and the front equals the exhaustive one."""
    space = [{"tiling": ("dynamic",), "tile_f": (64, 128, 256)}, {"tiling": ("static",), "tile_n": (8, 16)}]
    r = optimize("moe", out=tmp_path / "o", executor=serial, space=space, trace=trace, ep=4, placement="round-robin",
                 **SMALL)
    assert {c.chips for c in r.candidate_list} == {4} and r.budgets["max_chips"] is None
    front, cycles = _exhaustive_within_budget(r)
    assert sorted((c.run_id, *c.objectives) for c in r.front) == front
    assert all(c.lower_bound <= cycles[c.run_id] for c in r.candidate_list)
    assert [(c.status, c.lower_bound, cycles[c.run_id]) for c in r.candidate_list] == [
        ("simulated", 10265, 11886), ("pruned", 12314, 13862), ("pruned", 16411, 17923),
        ("simulated", 18457, 20032), ("simulated", 10266, 11909)]
    # one HBM's roofline would put the first candidate above its own cycles (12,361 > 11,886); the record's peak
    # counts the 4 chips' HBMs
    first = r.candidate_list[0]
    assert (first.off_chip_bytes, first.hbm_bytes_per_cycle, -(-first.off_chip_bytes // 1024)) == \
        (12_656_736, 4 * 1024, 12_361)
