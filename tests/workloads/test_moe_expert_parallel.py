"""Expert parallelism (stepsim.workloads.moe.parallel): placements, per-chip token counts equal to the trace's
(from the trace and counted on the links in the engine), values equal to the one-chip layer, one-line errors."""

from __future__ import annotations

import json

import numpy as np
import pytest

from stepsim.base.errors import ArgumentError, ConfigError
from stepsim.cli import main
from stepsim.simulation.simulate import simulate
from stepsim.workloads.config import workload_from_config
from stepsim.workloads.moe.parallel import place_experts
from stepsim.workloads.reference import check_outputs, make_inputs
from stepsim.workloads.routing import expert_counts

COUNTS = [67, 59, 27, 25, 22, 19, 18, 19]


@pytest.mark.parametrize("chips, placement, chip_of", [
    (4, "contiguous", [0, 0, 1, 1, 2, 2, 3, 3]),
    (4, "round-robin", [0, 1, 2, 3, 0, 1, 2, 3]),
    # most tokens first onto the least loaded chip with room (2 experts each): e0 67 -> 0, e1 59 -> 1, e2 27 -> 2,
    # e3 25 -> 3, e4 22 -> 3 (25), e5 19 -> 2 (27), e7 19 -> 1 (59; chips 2, 3 are full), e6 18 -> 0
    (4, "load-balanced", [0, 1, 2, 3, 3, 2, 0, 1]),
    (3, "contiguous", [0, 0, 0, 1, 1, 1, 2, 2]),
    (8, "load-balanced", [0, 1, 2, 3, 4, 5, 7, 6]),
])
def test_placements(chips, placement, chip_of):
    assert place_experts(COUNTS, chips, placement) == chip_of


def test_load_balanced_places_the_heaviest_experts_apart_and_evens_the_tokens():
    chip_of = place_experts(COUNTS, 4, "load-balanced")
    tokens = [sum(c for c, chip in zip(COUNTS, chip_of) if chip == k) for k in range(4)]
    assert tokens == [85, 78, 46, 47]  # contiguous: [126, 52, 41, 37]
    assert all(chip_of.count(k) == 2 for k in range(4))


@pytest.mark.parametrize("chips, placement, message", [
    (9, "contiguous", "--ep 9 places 8 experts on more chips than experts: a chip without experts has nothing to "
                      "do (use --ep 8 or fewer)"),
    (2, "random", "placement must be one of contiguous, round-robin, load-balanced, got 'random'"),
])
def test_bad_placements_are_one_line(chips, placement, message):
    with pytest.raises(ArgumentError) as info:
        place_experts(COUNTS, chips, placement)
    assert str(info.value) == message


@pytest.fixture
def trace(tmp_path):
    routing = np.random.default_rng(3).integers(0, 8, size=(24, 2))
    routing[:, 1] = (routing[:, 0] + 1 + routing[:, 1] % 7) % 8  # two different experts per token
    path = tmp_path / "routing.npz"
    np.savez(path, data=routing)
    return str(path), routing


def _config(path, **kw):
    return {"workload": "moe", "model": "custom", "hidden": 16, "intermediate": 32, "experts": 8, "top_k": 2,
            "trace": path, "tile_n": 4, "tile_f": 16, **kw}


@pytest.mark.parametrize("chips", [2, 4, 8])
@pytest.mark.parametrize("placement", ["contiguous", "round-robin", "load-balanced"])
def test_each_chip_receives_exactly_the_trace_tokens_of_its_experts(trace, chips, placement):
    path, routing = trace
    w = workload_from_config(_config(path, ep=chips, placement=placement))
    counts = expert_counts(routing, 8)
    chip_of = w.params["expert_chips"]
    want = [int(sum(counts[e] for e in range(8) if chip_of[e] == k)) for k in range(chips)]
    assert w.params["chip_tokens"] == want and sum(want) == 24 * 2
    assert w.params["busiest_chip"] == int(np.argmax(want))
    assert w.params["imbalance"] == round(max(want) / (48 / chips), 6)
    r = simulate(w)
    names = list(r.channel_names)
    pushes = r.channel_counters[:, 0]
    # token rows (1 x 16 tiles) leaving chip 0 for chip k over its link, and the expert outputs coming back
    links = {op.name: op for op in w.graph.ops if op.kind == "Link"}
    for k in range(1, chips):
        out = links[f"chip0->chip{k}"]
        rows = [i for i, s in enumerate(out.outputs) if s.dtype.cols == 16]
        assert sum(int(pushes[names.index(f"chip0->chip{k}[{i}]")]) for i in rows) == want[k]
        back = links[f"chip{k}->chip0"]
        assert sum(int(pushes[names.index(f"chip{k}->chip0[{i}]")]) for i in range(len(back.outputs))) == want[k]


@pytest.mark.parametrize("placement", ["contiguous", "load-balanced"])
def test_expert_parallel_values_equal_the_one_chip_layer(trace, placement):
    path, _ = trace
    one = workload_from_config(_config(path))
    w = workload_from_config(_config(path, ep=4, placement=placement))
    inputs = make_inputs(w, seed=2)
    assert sorted(inputs) == sorted(make_inputs(one, seed=2))
    r = simulate(w, functional=True, inputs=inputs)
    checks = check_outputs(w, r.inputs, r.outputs)
    assert checks and all(c.passed for c in checks.values()), checks
    r1 = simulate(one, functional=True, inputs=inputs)
    np.testing.assert_allclose(r.outputs["y"], r1.outputs["y"], rtol=0, atol=1e-5)


def test_run_moe_with_ep_reports_the_chips(trace, capsys):
    path, _ = trace
    assert main(["run", "moe", "--model", "custom", "--hidden", "16", "--intermediate", "32", "--experts", "8",
                 "--top-k", "2", "--trace", path, "--tile-n", "4", "--tile-f", "16", "--ep", "4", "--placement", "load-balanced",
                 "--json"]) == 0
    row = json.loads(capsys.readouterr().out)
    params = json.loads(row["params"])
    assert (row["ep"], row["placement"], params["system"]) == (4, "load-balanced", "fully-connected-4")
    assert sum(params["chip_tokens"]) == 48 and params["links_used"] == 6  # 0 <-> 1, 2, 3


@pytest.mark.parametrize("extra, message", [
    ({"placement": "round-robin"}, "--placement and --system apply to the MoE layer with --ep N (expert "
                                   "parallelism)"),
    ({"ep": 2, "system": "ring-4"}, "--ep 2 needs a system of 2 chips; system 'ring-4' has 4"),
    ({"ep": 9}, "--ep 9 places 8 experts on more chips than experts: a chip without experts has nothing to do (use "
                "--ep 8 or fewer)"),
])
def test_bad_expert_parallel_configs_are_one_line(trace, extra, message):
    path, _ = trace
    with pytest.raises(ConfigError) as info:
        workload_from_config(_config(path, **extra))
    assert str(info.value) == message


def test_the_cycle_bounds_count_one_hbm_per_chip():
    """Qwen3 on the bundled B=64 trace over 8 chips is HBM-bound: a bound that put every chip's weight reads on
    one HBM (747,313 cycles) would exceed the run (144,577); per chip it is 119,825."""
    from stepsim.results.records import run_config

    row = run_config({"workload": "moe", "model": "qwen3-30b-a3b", "ep": 8, "mode": "simulate"}).row
    assert (row["cycles"], row["hbm_request_cycles"], row["pipeline_cycles"]) == (144577, 119825, 123929)
    assert all(row[c] <= row["cycles"] for c in ("hbm_request_cycles", "pipeline_cycles", "load_unit_cycles",
                                                 "compute_unit_cycles"))
