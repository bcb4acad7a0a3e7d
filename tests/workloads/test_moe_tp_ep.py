"""Tensor x expert parallelism of the MoE layer (``--tp N --ep M``, stepsim.workloads.moe.parallel.
expert_tensor_parallel): the experts on M groups of N chips, each expert's columns over its group's chips.

Values equal the one-chip layer on every chip; bytes per link equal the symbolic metric and the trace's
all-to-all pairs plus the ring all-reduce's chunks; both engines agree; bad combinations are one line."""

from __future__ import annotations

import json

import numpy as np
import pytest
from engines_agree import both_engines, link_unit_bytes
from small_routing import write_small_routing

from stepsim.base.errors import ConfigError
from stepsim.cli import main
from stepsim.graph.lower import lower
from stepsim.kernels.api import run as fast_run
from stepsim.simulation.simulate import simulate
from stepsim.workloads.config import workload_from_config
from stepsim.workloads.moe.build import build_moe
from stepsim.workloads.moe.sharded import shard_bounds
from stepsim.workloads.reference import check_outputs, make_inputs, small_moe_model

D = 16
ROW_BYTES = D * 2  # one token row, timed at 2 bytes a value (fp32 streams of bf16 tensors)


@pytest.fixture
def trace(tmp_path):
    return write_small_routing(tmp_path)


def _config(path, **kw):
    return {"workload": "moe", "model": "custom", "hidden": D, "intermediate": 64, "experts": 8, "top_k": 2,
            "trace": path, "tile_n": 4, "tile_f": 16, **kw}


@pytest.mark.parametrize("tp, ep, placement", [(2, 2, "round-robin"), (2, 4, "load-balanced"), (4, 2, "contiguous")])
def test_values_equal_the_one_chip_layer_on_every_chip(trace, tp, ep, placement):
    path, _ = trace
    one = workload_from_config(_config(path))
    w = workload_from_config(_config(path, tp=tp, ep=ep, placement=placement))
    assert (w.params["tp"], w.params["ep"], w.params["system"]) == (tp, ep, f"fully-connected-{tp * ep}")
    inputs, whole = make_inputs(w, seed=3), make_inputs(one, seed=3)
    cols = 64 // tp
    np.testing.assert_array_equal(inputs["expert005_gate.1"], whole["expert005_gate"][:, cols:2 * cols])
    np.testing.assert_array_equal(inputs["x.1"], whole["x"][24 // ep:2 * 24 // ep])  # group 1's shard
    r = simulate(w, functional=True, inputs=inputs)
    checks = check_outputs(w, r.inputs, r.outputs)
    assert sorted(checks) == sorted(f"y{p}.{k}" for p in range(tp * ep) for k in range(tp))
    assert all(c.passed for c in checks.values()), checks
    y1 = simulate(one, functional=True, inputs=whole).outputs["y"]
    bounds = shard_bounds(24, ep)
    for p in range(tp * ep):  # every chip of group g holds all of g's rows, equal on the group's chips
        g = p // tp
        rows = np.concatenate([r.outputs[f"y{p}.{k}"] for k in range(tp)])
        np.testing.assert_array_equal(rows, np.concatenate([r.outputs[f"y{g * tp}.{k}"] for k in range(tp)]))
        np.testing.assert_allclose(rows, y1[bounds[g]:bounds[g + 1]], rtol=0, atol=1e-5)


def test_shared_experts_split_over_the_group(trace):
    _, routing = trace
    model = small_moe_model("mixtral-8x7b", hidden=D, intermediate=32, shared_intermediate=32)
    w = build_moe(model, routing, tile_n=4, tile_f=16, tp=2, ep=2)
    loads = sorted(op.tensor.name for op in w.graph.ops if op.kind == "LinearOffChipLoad"
                   and op.tensor.name.startswith("shared_up"))
    assert loads == ["shared_up.0", "shared_up.0", "shared_up.1", "shared_up.1"]  # rank t on both groups
    r = simulate(w, functional=True, inputs=make_inputs(w, seed=3))
    assert all(c.passed for c in check_outputs(w, r.inputs, r.outputs).values())


def _expected_link_bytes(routing, tp, ep, chip_of):
    """Link ``p -> q`` between chips of one rank t (groups g != h): rows of g's tokens routed to h's experts
    (dispatch) plus h's tokens' rows from g's experts (combine); a ring all-reduce within group g: each chip
    sends its neighbour 2 (tp - 1) chunks of rows / tp rows."""
    bounds = shard_bounds(routing.shape[0], ep)

    def pairs(src, dst):
        return sum(int(chip_of[e] == dst) for row in routing[bounds[src]:bounds[src + 1]] for e in row)

    expected = {}
    for t in range(tp):
        for g in range(ep):
            for h in range(ep):
                if g != h:
                    expected[f"chip{g * tp + t}->chip{h * tp + t}"] = (pairs(g, h) + pairs(h, g)) * ROW_BYTES
    for g in range(ep):
        chunk = (bounds[g + 1] - bounds[g]) // tp
        for t in range(tp):
            expected[f"chip{g * tp + t}->chip{g * tp + (t + 1) % tp}"] = 2 * (tp - 1) * chunk * ROW_BYTES
    return expected


@pytest.mark.parametrize("tp, ep, placement, cycles", [
    (2, 2, "round-robin", 2478), (2, 4, "load-balanced", 2329), (4, 2, "contiguous", 4404)])
def test_link_bytes_equal_the_metric_and_both_engines_agree(trace, tp, ep, placement, cycles):
    path, routing = trace
    w = workload_from_config(_config(path, tp=tp, ep=ep, placement=placement))
    group_of = [p // tp for p in w.params["expert_chips"]]
    expected = {k: v for k, v in _expected_link_bytes(routing, tp, ep, group_of).items() if v}
    assert w.params["link_bytes"] == expected
    program = lower(w.graph, channel_depth=w.channel_depth)
    fast = both_engines(program)
    assert fast.cycles == simulate(w).cycles == cycles
    assert link_unit_bytes(program, fast) == expected


def test_dynamic_tiles_and_a_direct_all_reduce(trace):
    """Dynamic tiling, the direct all-reduce (with tp 2 each group link carries 2 chunks, as the ring's)."""
    path, routing = trace
    config = {k: v for k, v in _config(path).items() if k != "tile_n"}
    w = workload_from_config({**config, "tp": 2, "ep": 2, "placement": "load-balanced", "tiling": "dynamic",
                              "algorithm": "direct"})
    r = simulate(w, functional=True, inputs=make_inputs(w, seed=3))
    assert all(c.passed for c in check_outputs(w, r.inputs, r.outputs).values())
    expected = {k: v for k, v in _expected_link_bytes(routing, 2, 2, [p // 2 for p in w.params["expert_chips"]])
                .items() if v}
    assert w.params["link_bytes"] == expected
    program = lower(w.graph, channel_depth=w.channel_depth)
    fast = both_engines(program)
    assert fast.cycles == r.cycles == 2482


def test_on_a_ring_the_transfers_are_routed_and_still_equal_the_metric(trace):
    """ring-4: group 0 = chips 0, 1, group 1 = chips 2, 3; chip 0 -> chip 2 (rank 0's all-to-all) relays
    through chip 1 or chip 3, so the links carry more than the pairs alone; the engine counts the metric."""
    path, _ = trace
    w = workload_from_config(_config(path, tp=2, ep=2, system="ring-4"))
    program = lower(w.graph, channel_depth=w.channel_depth)
    links = link_unit_bytes(program, fast_run(program))
    assert links == w.params["link_bytes"] and w.params["system"] == "ring-4"
    assert sum(links.values()) > sum(_expected_link_bytes(w.trace["routing"], 2, 2, [p // 2 for p in
                                                          w.params["expert_chips"]]).values())


def test_run_reports_tp_and_ep(trace, capsys):
    path, _ = trace
    assert main(["run", "moe", "--model", "custom", "--hidden", "16", "--intermediate", "64", "--experts", "8",
                 "--top-k", "2", "--trace", path, "--tile-n", "4", "--tile-f", "16", "--tp", "2", "--ep", "2",
                 "--placement", "round-robin", "--json"]) == 0
    row = json.loads(capsys.readouterr().out)
    params = json.loads(row["params"])
    assert (row["tp"], row["ep"], row["cycles"], params["system"]) == (2, 2, 2478, "fully-connected-4")
    assert params["chip_tokens"] == [params["chip_tokens"][0]] * 2 + [params["chip_tokens"][2]] * 2
    assert sum(params["chip_tokens"]) == 2 * 48


@pytest.mark.parametrize("extra, message", [
    ({"tp": 4, "ep": 4}, "--tp 4 --ep 4: each of the 4 expert groups' shards of the batch is cut into 4 all-reduce "
                         "chunks; the batch of 24 tokens must be a multiple of 16"),
    ({"tp": 2, "ep": 2, "system": "ring-8"}, "--tp 2 --ep 2 needs a system of 4 chips (tp x ep); system 'ring-8' "
                                             "has 8"),
    ({"tp": 4, "ep": 2, "tile_f": 32}, "--tp 4: the intermediate size 64 must split into 4 column blocks of whole "
                                       "--tile-f 32 tiles (a multiple of 128)"),
    ({"tp": 2, "ep": 2, "regions": 4}, "--tp does not combine with --regions: a time-multiplexed region fetches "
                                       "whole experts' weights by address, not a chip's column block"),
])
def test_bad_combinations_are_one_line(trace, extra, message):
    path, _ = trace
    with pytest.raises(ConfigError) as info:
        workload_from_config(_config(path, **extra))
    assert str(info.value) == message


def test_a_bad_combination_exits_2_on_the_command_line(trace, capsys):
    path, _ = trace
    assert main(["run", "moe", "--model", "custom", "--hidden", "16", "--intermediate", "64", "--experts", "8",
                 "--top-k", "2", "--trace", path, "--tile-n", "4", "--tile-f", "16", "--tp", "4", "--ep", "4"]) == 2
    assert capsys.readouterr().err.strip() == (
        "stepsim: error: --tp 4 --ep 4: each of the 4 expert groups' shards of the batch is cut into 4 all-reduce "
        "chunks; the batch of 24 tokens must be a multiple of 16")
