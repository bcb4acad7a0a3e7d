"""Expert parallelism (stepsim.workloads.moe.parallel): placements, per-chip token counts equal to the trace's
(from the trace and counted on the links in the engine), values equal to the one-chip layer, one-line errors."""

from __future__ import annotations

import json

import numpy as np
import pytest
from engines_agree import both_engines
from small_routing import write_small_routing

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


def test_load_balanced_with_static_tiles_balances_tiles_then_tokens():
    """Tiles of 4 rows: 2, 3, 2, 1, 2, 2. Most tiles first onto the chip with the fewest tiles (ties: fewer
    tokens): e1 (3) -> 0, e0 (2, 8 tokens) -> 1, e2 (2, 8) -> 1 (2 < 3), e4 (2, 6) -> 0 (3, 9 < 4), e5 (2, 5)
    -> 1 (4, 16 < 5), e3 -> 0 (chip 1 full): 6 tiles each, where the token greedy puts 7 and 5."""
    counts = [8, 9, 8, 1, 6, 5]
    for tile_n, chip_of, tiles in ((4, [1, 0, 1, 0, 0, 1], [6, 6]), (None, [1, 0, 1, 1, 0, 0], [7, 5])):
        assert place_experts(counts, 2, "load-balanced", tile_n) == chip_of
        assert [sum(-(-c // 4) for c, k in zip(counts, chip_of) if k == chip) for chip in (0, 1)] == tiles


def test_load_balanced_keeps_contiguous_blocks_at_the_least_tiles():
    """Contiguous halves with 4 and 5 of the 9 tiles: no placement puts fewer than ceil(9 / 2) = 5 on a chip."""
    assert place_experts([5, 1, 1, 9, 4, 4], 2, "load-balanced", 4) == [0, 0, 0, 1, 1, 1]
    assert place_experts([5, 1, 1, 9, 4, 4], 2, "load-balanced") == [1, 1, 0, 0, 1, 0]  # tokens: 14 and 10


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
    return write_small_routing(tmp_path)


def _config(path, **kw):
    return {"workload": "moe", "model": "custom", "hidden": 16, "intermediate": 32, "experts": 8, "top_k": 2,
            "trace": path, "tile_n": 4, "tile_f": 16, **kw}


def _pairs(routing, bounds, chip_of, src, dst):
    """(token, expert) pairs of the tokens held by chip src whose expert is on chip dst (from the trace)."""
    return sum(int(chip_of[e] == dst) for row in routing[bounds[src]:bounds[src + 1]] for e in row)


@pytest.mark.parametrize("chips", [2, 4, 8])
@pytest.mark.parametrize("placement", ["contiguous", "round-robin", "load-balanced"])
def test_each_chip_receives_exactly_the_trace_tokens_of_its_experts(trace, chips, placement):
    """All-to-all: chip c holds tokens bounds[c]..; link c -> p carries its tokens' rows routed to p's experts
    (dispatch) and p's tokens' rows coming back from c's experts (combine), as counted on the links."""
    path, routing = trace
    w = workload_from_config(_config(path, ep=chips, placement=placement))
    counts = expert_counts(routing, 8)
    chip_of = w.params["expert_chips"]
    bounds = w.params["shard_bounds"]
    assert bounds == [24 * c // chips for c in range(chips + 1)]  # 24 tokens shard evenly on 2, 4 and 8 chips
    want = [int(sum(counts[e] for e in range(8) if chip_of[e] == k)) for k in range(chips)]
    assert w.params["chip_tokens"] == want and sum(want) == 24 * 2
    assert w.params["busiest_chip"] == int(np.argmax(want))
    assert w.params["imbalance"] == round(max(want) / (48 / chips), 6)
    rows = {f"chip{c}->chip{p}": _pairs(routing, bounds, chip_of, c, p) + _pairs(routing, bounds, chip_of, p, c)
            for c in range(chips) for p in range(chips) if c != p}
    # every chip holds experts, so every ordered pair has a link (carrying 0 rows when the trace sends none)
    # rows of D = 16 values, timed at 2 bytes each (fp32 streams of bf16 tensors, lower.fp32_timing_bytes)
    assert w.params["link_bytes"] == {name: n * 16 * 2 for name, n in rows.items()}
    r = simulate(w)
    names = list(r.channel_names)
    pushes = r.channel_counters[:, 0]
    links = {op.name: op for op in w.graph.ops if op.kind == "Link"}
    assert sorted(links) == sorted(rows)
    for name, link in links.items():
        assert sum(int(pushes[names.index(f"{name}[{i}]")]) for i in range(len(link.outputs))) == rows[name]
    measured = {r.unit_names[u]: int(b) for u, b in enumerate(r.link_bytes) if r.unit_names[u] in links}
    assert measured == w.params["link_bytes"]


@pytest.mark.parametrize("placement", ["contiguous", "load-balanced"])
@pytest.mark.parametrize("chips", [4, 5])
def test_expert_parallel_values_equal_the_one_chip_layer(trace, placement, chips):
    """Each chip stores its shard of y (y.<c>); together they are the one-chip layer's y, bit for bit."""
    path, _ = trace
    one = workload_from_config(_config(path))
    w = workload_from_config(_config(path, ep=chips, placement=placement))
    inputs = make_inputs(w, seed=2)
    inputs1 = make_inputs(one, seed=2)
    bounds = w.params["shard_bounds"]
    assert bounds == ([0, 6, 12, 18, 24] if chips == 4 else [0, 5, 10, 15, 20, 24])
    for c in range(chips):
        np.testing.assert_array_equal(inputs[f"x.{c}"], inputs1["x"][bounds[c]:bounds[c + 1]])
        np.testing.assert_array_equal(inputs[f"routing_weights.{c}"],
                                      inputs1["routing_weights"][bounds[c]:bounds[c + 1]])
    r = simulate(w, functional=True, inputs=inputs)
    checks = check_outputs(w, r.inputs, r.outputs)
    assert sorted(checks) == [f"y.{c}" for c in range(chips)] and all(c.passed for c in checks.values()), checks
    r1 = simulate(one, functional=True, inputs=inputs1)
    np.testing.assert_array_equal(np.concatenate([r.outputs[f"y.{c}"] for c in range(chips)]), r1.outputs["y"])


@pytest.mark.parametrize("system, tiling", [("ring-4", "static"), (None, "dynamic")])
def test_both_engines_agree_on_the_expert_parallel_layer(trace, system, tiling):
    """Over a ring (multi-hop routes through chips) and fully connected; static and dynamic tiling."""
    from stepsim.graph.lower import lower

    path, _ = trace
    cfg = _config(path, ep=4, placement="round-robin", tiling=tiling, **({"system": system} if system else {}))
    if tiling == "dynamic":
        del cfg["tile_n"]
    w = workload_from_config(cfg)
    program = lower(w.graph, channel_depth=w.channel_depth)
    fast = both_engines(program)
    assert fast.cycles == simulate(w).cycles


def test_run_moe_with_ep_reports_the_chips(trace, capsys):
    path, _ = trace
    assert main(["run", "moe", "--model", "custom", "--hidden", "16", "--intermediate", "32", "--experts", "8",
                 "--top-k", "2", "--trace", path, "--tile-n", "4", "--tile-f", "16", "--ep", "4", "--placement", "load-balanced",
                 "--json"]) == 0
    row = json.loads(capsys.readouterr().out)
    params = json.loads(row["params"])
    assert (row["ep"], row["placement"], params["system"]) == (4, "load-balanced", "fully-connected-4")
    assert sum(params["chip_tokens"]) == 48 and params["links_used"] == 12  # all-to-all: every ordered pair


@pytest.mark.parametrize("extra, message", [
    ({"placement": "round-robin"}, "--placement and --system apply to the MoE layer with --ep N (expert "
                                   "parallelism)"),
    ({"ep": 2, "system": "ring-4"}, "--ep 2 needs a system of 2 chips; system 'ring-4' has 4"),
    ({"ep": 9}, "--ep 9 places 8 experts on more chips than experts: a chip without experts has nothing to do (use "
                "--ep 8 or fewer)"),
    # * built the sharded graph on one chip: another run (other cycles) than the layer without --ep
    ({"ep": 1}, "--ep must be an int >= 2 (chips), got 1"),
    ({"ep": 1, "layers": 2}, "--ep must be an int >= 2 (chips), got 1"),
])
def test_bad_expert_parallel_configs_are_one_line(trace, extra, message):
    path, _ = trace
    with pytest.raises(ConfigError) as info:
        workload_from_config(_config(path, **extra))
    assert str(info.value) == message


def test_the_cycle_bounds_count_one_hbm_per_chip():
    """Qwen3 on the bundled B=64 trace over 8 chips is HBM-bound: a bound that put every chip's weight reads on
    one HBM (747,313 cycles) would exceed the run (133,578); per chip it is 119,925."""
    from stepsim.results.records import run_config

    row = run_config({"workload": "moe", "model": "qwen3-30b-a3b", "ep": 8, "mode": "simulate"}).row
    assert (row["cycles"], row["hbm_request_cycles"], row["pipeline_cycles"]) == (133578, 119925, 123926)
    assert all(row[c] <= row["cycles"] for c in ("hbm_request_cycles", "pipeline_cycles", "load_unit_cycles",
                                                 "compute_unit_cycles"))


def test_ep_accepts_a_batch_smaller_than_the_chips(tmp_path, capsys):
    """3 tokens on 8 chips: chips 3..7 hold no tokens (no x/routing_weights/y tensors, nothing of their own on
    the links) and still run their experts for the others' tokens. Values equal the one-chip layer's bit for bit,
    the engine's bytes per link equal the symbolic metric (one 16-wide row = 32 bytes per (token, remote expert)
    pair, each way), both engines agree."""
    from stepsim.graph.lower import lower

    path = tmp_path / "three.npz"
    np.savez(path, data=np.array([[0, 1], [2, 3], [4, 5]]))
    one = workload_from_config(_config(str(path), tile_n=2))
    w = workload_from_config(_config(str(path), ep=8, tile_n=2))
    assert w.params["shard_bounds"] == [0, 1, 2, 3, 3, 3, 3, 3, 3]
    assert w.params["chip_tokens"] == [1, 1, 1, 1, 1, 1, 0, 0]
    # token 0 (chip 0) -> experts 0 (local), 1 (chip 1); token 1 (chip 1) -> 2, 3; token 2 (chip 2) -> 4, 5
    sent = {"chip0->chip1", "chip1->chip0", "chip1->chip2", "chip1->chip3", "chip2->chip1", "chip3->chip1",
            "chip2->chip4", "chip2->chip5", "chip4->chip2", "chip5->chip2"}
    assert {k: v for k, v in w.params["link_bytes"].items() if v} == {name: 32 for name in sent}
    inputs, inputs1 = make_inputs(w, seed=2), make_inputs(one, seed=2)
    assert sorted(k for k in inputs if "." in k) == ["routing_weights.0", "routing_weights.1", "routing_weights.2",
                                                     "x.0", "x.1", "x.2"]
    r = simulate(w, functional=True, inputs=inputs)
    checks = check_outputs(w, r.inputs, r.outputs)
    assert sorted(checks) == ["y.0", "y.1", "y.2"] and all(c.passed for c in checks.values()), checks
    r1 = simulate(one, functional=True, inputs=inputs1)
    np.testing.assert_array_equal(np.concatenate([r.outputs[f"y.{c}"] for c in range(3)]), r1.outputs["y"])
    program = lower(w.graph, channel_depth=w.channel_depth)
    fast = both_engines(program)
    assert fast.cycles == r.cycles == 1152
    measured = {fast_name: int(b) for fast_name, b in zip(r.unit_names, r.link_bytes) if "->" in fast_name}
    assert measured == w.params["link_bytes"]
    # the CLI runs it too (it refused a batch smaller than --ep before)
    assert main(["run", "moe", "--model", "custom", "--hidden", "16", "--intermediate", "32", "--experts", "8",
                 "--top-k", "2", "--trace", str(path), "--tile-n", "2", "--tile-f", "16", "--ep", "8", "--json"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert (row["cycles"], row["ep"]) == (1152, 8)


def test_expert_parallel_with_shared_experts_equals_the_one_chip_layer(trace):
    """Every chip runs the shared experts on its own shard of tokens (their weights in each chip's HBM)."""
    from stepsim.workloads.moe.build import build_moe
    from stepsim.workloads.reference import small_moe_model

    _, routing = trace
    model = small_moe_model("mixtral-8x7b", hidden=16, intermediate=32, shared_intermediate=32)
    one = build_moe(model, routing, tile_n=4, tile_f=16)
    w = build_moe(model, routing, tile_n=4, tile_f=16, ep=2, placement="load-balanced")
    shared_loads = [op.chip for op in w.graph.ops if op.kind == "LinearOffChipLoad" and op.tensor.name == "shared_up"]
    assert shared_loads == [0, 1]
    inputs, inputs1 = make_inputs(w, seed=5), make_inputs(one, seed=5)
    r = simulate(w, functional=True, inputs=inputs)
    assert all(c.passed for c in check_outputs(w, r.inputs, r.outputs).values())
    r1 = simulate(one, functional=True, inputs=inputs1)
    np.testing.assert_array_equal(np.concatenate([r.outputs["y.0"], r.outputs["y.1"]]), r1.outputs["y"])


def test_the_text_report_names_the_busiest_chip_and_the_imbalance(trace, capsys):
    path, _ = trace
    assert main(["run", "moe", "--model", "custom", "--hidden", "16", "--intermediate", "32", "--experts", "8",
                 "--top-k", "2", "--trace", path, "--tile-n", "4", "--tile-f", "16", "--ep", "4"]) == 0
    lines = capsys.readouterr().out.splitlines()
    # contiguous: experts 0-1 on chip 0, 2-3 on chip 1, ...; the tokens are the trace's (test above)
    assert lines[-2:] == [f"{'chip_tokens':35s}16, 11, 7, 14 token rows (chips 0..3)",
                          f"{'busiest_chip':35s}chip 0: 16 token rows, imbalance 1.333 (max / mean)"]
    hbm = next(line for line in lines if line.startswith("hbm_bytes_per_cycle"))
    assert hbm.split()[1] == "4,096"  # four chips' HBMs of 1,024 bytes/cycle each (step-eval)
