"""Expert-parallel MoE stacks with micro-batches (``stepsim run moe --layers L --ep E --micro-batches M``,
moe/sharded_micro.py): values equal to the one-chip stack (bit for bit) and the NumPy reference, bytes over every
link equal to the symbolic metric, symbolic off-chip bytes equal to the engine's, exact FLOPs as one micro-batch's,
both engines agree (cycles pinned), idle and shared experts, the CLI record read back, one-line errors."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest
from engines_agree import both_engines
from small_routing import small_routing, small_stack_config, write_layered_routing

from stepsim.base.errors import ArgumentError, ConfigError
from stepsim.base.hardware import Hardware
from stepsim.cli import main
from stepsim.graph.lower import lower
from stepsim.results.records import run_config
from stepsim.simulation.simulate import simulate
from stepsim.workloads.config import workload_from_config
from stepsim.workloads.moe.sharded_micro import micro_batch_tokens
from stepsim.workloads.reference import check_outputs, make_inputs

B, D, F, LAYERS = 24, 16, 64, 4


@pytest.fixture
def layered(tmp_path):
    return write_layered_routing(tmp_path, LAYERS)[0]


STACKS = [({"layers": 2, "ep": 2, "micro_batches": 2}, "static"),
          ({"layers": 2, "ep": 2, "micro_batches": 3}, "dynamic"),
          ({"layers": 2, "pp": 2, "ep": 2, "micro_batches": 2, "system": "ring-4"}, "static"),
          ({"layers": 4, "pp": 2, "ep": 4, "micro_batches": 3, "placement": "load-balanced", "system": "ring-8"},
           "dynamic")]


def test_micro_batch_m_is_the_m_th_piece_of_every_shard():
    assert [t.tolist() for t in micro_batch_tokens(24, 2, 3)] == [
        [0, 1, 2, 3, 12, 13, 14, 15], [4, 5, 6, 7, 16, 17, 18, 19], [8, 9, 10, 11, 20, 21, 22, 23]]


@pytest.mark.parametrize("knobs, tiling", STACKS)
def test_values_equal_the_one_chip_stack_and_the_reference(layered, knobs, tiling):
    """Each token's top-k rows are gathered in expert order, as on one chip: y.<c> put together is the one-chip
    stack's y (one micro-batch), bit for bit."""
    w = workload_from_config(small_stack_config(layered, tiling, **knobs))
    one = workload_from_config(small_stack_config(layered, tiling, layers=knobs["layers"]))
    r, r1 = simulate(w, functional=True, inputs=make_inputs(w, 7)), simulate(one, functional=True,
                                                                             inputs=make_inputs(one, 7))
    checks = check_outputs(w, r.inputs, r.outputs)
    ep = knobs["ep"]
    assert sorted(checks) == [f"y.{c}" for c in range(ep)] and all(c.passed for c in checks.values()), checks
    np.testing.assert_array_equal(np.concatenate([r.outputs[f"y.{c}"] for c in range(ep)]), r1.outputs["y"])
    assert w.params["micro_batches"] == knobs["micro_batches"]


def test_one_merge_per_micro_batch_and_expert(layered):
    """Every (layer, micro-batch, expert) with tokens has its merge; the static tiles per expert are the sum of
    each micro-batch's padded tiles (the FLOPs count them: more than one micro-batch's)."""
    w = workload_from_config(small_stack_config(layered, **STACKS[0][0]))
    routings = [small_routing(i) for i in range(2)]
    parts = micro_batch_tokens(B, 2, 2)
    used = sum(int(np.unique(r[p]).size) for r in routings for p in parts)
    assert sum(op.kind == "EagerMerge" for op in w.graph.ops) == used == 31
    one = workload_from_config(small_stack_config(layered, layers=2, ep=2))
    assert sum(op.kind == "EagerMerge" for op in one.graph.ops) == 16
    tiles = sum(-(-int(np.sum(r[p] == e)) // 4) for r in routings for p in parts for e in range(8))
    tiles_one = sum(-(-int(np.sum(r == e)) // 4) for r in routings for e in range(8))
    assert (tiles, tiles_one) == (32, 29)
    per_tile = 4 * (14 * D * F + F)  # moe/build.py algorithmic_flops per padded row: 2 D F x 3 + F + 8 D F
    assert w.algorithmic_flops - one.algorithmic_flops == (tiles - tiles_one) * per_tile


def test_dynamic_exact_flops_are_one_micro_batch_s(layered):
    """Dynamic tiles hold exactly their tokens: the exact FLOPs of M = 3 are M = 1's, the formula of the one-chip
    stack (per token-expert pair: 6 D F matmuls, 8 F SiLU, F gate * up, D scale, D sum)."""
    exact = [sum(workload_from_config(small_stack_config(layered, "dynamic", layers=4, ep=2, micro_batches=m))
                 .op_flops().values()) for m in (1, 3)]
    assert exact == [4 * B * 2 * (6 * D * F + 8 * F + F + D + D)] * 2


@pytest.mark.parametrize("knobs, tiling", STACKS[2:])
def test_bytes_over_each_link_and_off_chip_equal_the_metric(layered, knobs, tiling):
    w = workload_from_config(small_stack_config(layered, tiling, **knobs))
    r = simulate(w)
    links = {op.name for op in w.graph.ops if op.kind == "Link"}
    measured = {r.unit_names[u]: int(b) for u, b in enumerate(r.link_bytes) if r.unit_names[u] in links}
    assert w.params["link_bytes"] == measured and sum(measured.values()) > 0
    # the same rows cross the same links as with one micro-batch: only how they are grouped changes
    m1 = workload_from_config(small_stack_config(layered, tiling, **{**knobs, "micro_batches": 1}))
    assert w.params["link_bytes"] == m1.params["link_bytes"]
    row = run_config({**small_stack_config(layered, tiling, **knobs), "mode": "simulate"}).row
    assert row["off_chip_bytes_symbolic"] == row["off_chip_bytes_measured"] == row["off_chip_bytes"]


@pytest.mark.parametrize("knobs, tiling, cycles", [
    ({"layers": 2, "ep": 2, "micro_batches": 2}, "static", 3030),
    ({"layers": 2, "pp": 2, "ep": 2, "micro_batches": 2, "system": "ring-4"}, "static", 4030),
    ({"layers": 2, "ep": 2, "micro_batches": 3}, "dynamic", 3019),
    ({"layers": 4, "pp": 2, "ep": 4, "micro_batches": 3, "placement": "load-balanced", "system": "ring-8"},
     "dynamic", 15506),
])
def test_both_engines_agree_and_the_cycles_are_pinned(layered, knobs, tiling, cycles):
    w = workload_from_config(small_stack_config(layered, tiling, **knobs))
    program = lower(w.graph, Hardware.preset(w.hardware), channel_depth=w.channel_depth)
    assert both_engines(program).cycles == simulate(w).cycles == cycles


@pytest.mark.parametrize("shared, tiling", [(0, "static"), (32, "static"), (0, "dynamic")])
def test_idle_experts_and_shared_experts(shared, tiling):
    """Expert 7 gets no token in any layer (it keeps micro-batch 0's empty merge), expert 6 one token of chip 1's
    second piece only (one merge, no split of its rows); with shared experts (tiles of 4 tokens within pieces of
    4): values equal the reference and the one-chip stack, both engines agree, link bytes as the metric."""
    from stepsim.base.system import from_dict
    from stepsim.models.presets import MoEModel
    from stepsim.workloads.moe.build import build_moe

    routings = []
    for i in range(2):
        r = small_routing(10 + i) % 6
        r[:, 1] = (r[:, 0] + 1 + i) % 6
        r[12 + 5, 1] = 6  # chip 1's tokens 12..23: its second piece of 4 is 16..19
        routings.append(r)
    model = MoEModel("custom", hidden=D, intermediate=F, experts=8, top_k=2, shared_intermediate=shared)
    system = from_dict({"name": "s", "chips": 2, "topology": "fully-connected", "link_bandwidth": 64,
                        "link_latency": 500}, source="test", name="s")
    tiles = dict(tiling=tiling, tile_n=4 if tiling == "static" else None, tile_f=16)
    w = build_moe(model, routings, layers=2, ep=2, micro_batches=3, system=system, **tiles)
    one = build_moe(model, routings, layers=2, **tiles)
    assert w.idle_groups == {("layer0.expert", 7), ("layer1.expert", 7)}
    r = simulate(w, functional=True, inputs=make_inputs(w, 3))
    checks = check_outputs(w, r.inputs, r.outputs)
    assert all(c.passed for c in checks.values()), checks
    r1 = simulate(one, functional=True, inputs=make_inputs(one, 3))
    np.testing.assert_array_equal(np.concatenate([r.outputs["y.0"], r.outputs["y.1"]]), r1.outputs["y"])
    program = lower(w.graph, Hardware.preset(w.hardware), channel_depth=w.channel_depth)
    assert both_engines(program).cycles == r.cycles
    measured = {r.unit_names[u]: int(b) for u, b in enumerate(r.link_bytes)
                if r.unit_names[u] in {op.name for op in w.graph.ops if op.kind == "Link"}}
    assert w.params["link_bytes"] == measured


@pytest.mark.parametrize("extra, message", [
    ({"micro_batches": 8}, "--micro-batches 8 --ep 2: each chip's shard of the batch of 24 tokens must split into "
                           "8 equal micro-batches (the batch a multiple of 16)"),
    ({"micro_batches": 4, "ep": 4}, "--micro-batches 4 --ep 4: each chip's shard of the batch of 24 tokens must "
                                    "split into 4 equal micro-batches (the batch a multiple of 16)"),
    ({"micro_batches": 5}, "--micro-batches 5: the batch of 24 tokens must split into 5 equal micro-batches"),
])
def test_bad_combinations_are_one_line(layered, extra, message):
    cfg = {**small_stack_config(layered, layers=2, ep=2), **extra}
    with pytest.raises(ConfigError) as info:
        workload_from_config(cfg)
    assert str(info.value) == message


def test_shared_expert_tiles_must_not_span_a_chip_s_micro_batches():
    from stepsim.models.presets import MoEModel
    from stepsim.workloads.moe.build import build_moe

    model = MoEModel("custom", hidden=D, intermediate=F, experts=8, top_k=2, shared_intermediate=32)
    with pytest.raises(ArgumentError) as info:
        build_moe(model, [small_routing(0)] * 2, tile_n=4, tile_f=16, layers=2, ep=2, micro_batches=2)
    assert str(info.value) == ("--micro-batches 2 --ep 2: the shared experts' tiles of --tile-n 4 tokens must not "
                               "span a chip's micro-batches of 6 tokens (a multiple of 4)")


def test_run_moe_with_ep_and_micro_batches_the_record_reads_back(layered, tmp_path, capsys):
    out = tmp_path / "run.parquet"
    assert main(["run", "moe", "--model", "custom", "--hidden", "16", "--intermediate", "64", "--experts", "8",
                 "--top-k", "2", "--trace", layered, "--tile-n", "4", "--tile-f", "16", "--layers", "2", "--pp", "2",
                 "--ep", "2", "--micro-batches", "2", "--system", "ring-4", "--functional", "--check",
                 "--out", str(out), "--json"]) == 0
    row = json.loads(capsys.readouterr().out)
    params = json.loads(row["params"])
    assert (row["layers"], row["pp"], row["ep"], row["micro_batches"], params["system"]) == (2, 2, 2, 2, "ring-4")
    assert row["check_passed"] is True and row["cycles"] == 4030
    assert row["off_chip_bytes_symbolic"] == row["off_chip_bytes_measured"] == row["off_chip_bytes"]
    (back,) = pq.read_table(out).to_pylist()
    assert (back["layers"], back["pp"], back["ep"], back["micro_batches"], back["cycles"]) == (2, 2, 2, 2, 4030)
    links = [u for u in pq.read_table(tmp_path / "run_units.parquet").to_pylist() if u["kind"] == "Link"]
    assert {u["name"]: u["bytes"] for u in links} == params["link_bytes"]


def test_bad_micro_batches_with_ep_on_the_cli_is_one_line_with_status_2(layered, capsys):
    assert main(["run", "moe", "--model", "custom", "--hidden", "16", "--intermediate", "64", "--experts", "8",
                 "--top-k", "2", "--trace", layered, "--tile-n", "4", "--tile-f", "16", "--layers", "2",
                 "--ep", "2", "--micro-batches", "8"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "stepsim: error: --micro-batches 8 --ep 2: each chip's shard of the batch of 24 tokens must split into 8 "
        "equal micro-batches (the batch a multiple of 16)"]
