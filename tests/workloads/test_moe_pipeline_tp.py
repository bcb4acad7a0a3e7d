"""A stack of tensor-parallel MoE layers (``stepsim run moe --layers L --tp T [--pp P]``, moe/pipeline_tp.py): values
against the one-chip stack (the all-reduce's sum order: float32 tolerance) and the NumPy reference, bytes over every
link equal to the symbolic metric, symbolic off-chip bytes equal to the engine's, both engines agree (cycles
pinned), the CLI record read back, one-line errors."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest
from engines_agree import both_engines
from small_routing import small_routing, small_stack_config, write_layered_routing

from stepsim.base.errors import ConfigError
from stepsim.base.hardware import Hardware
from stepsim.cli import main
from stepsim.graph.lower import lower
from stepsim.results.records import run_config
from stepsim.simulation.simulate import simulate
from stepsim.workloads.config import workload_from_config
from stepsim.workloads.reference import check_outputs, make_inputs

B, D, LAYERS = 24, 16, 4


@pytest.fixture
def layered(tmp_path):
    return write_layered_routing(tmp_path, LAYERS)[0]


STACKS = [({"layers": 2, "tp": 2}, "static"), ({"layers": 2, "tp": 4}, "dynamic"),
          ({"layers": 2, "pp": 2, "tp": 2, "system": "ring-4"}, "static"),
          ({"layers": 4, "pp": 2, "tp": 2, "algorithm": "direct", "system": "ring-4"}, "dynamic")]
ATOL = 1e-6  # float32 rounding of the all-reduce's sum order


@pytest.mark.parametrize("knobs, tiling", STACKS)
def test_values_against_the_one_chip_stack_and_the_reference(layered, knobs, tiling):
    """Chip t holds columns t F/T .. of every layer's experts; after the last all-reduce every chip holds every chunk
    of y, equal to the one-chip stack's y within float32 rounding (the partial sums are added in the all-reduce's
    order), and to the reference."""
    w = workload_from_config(small_stack_config(layered, tiling, **knobs))
    one = workload_from_config(small_stack_config(layered, tiling, layers=knobs["layers"]))
    inputs = make_inputs(w, seed=7)
    assert {"x", "layer1.routing_weights", "layer1.expert007_down.1", "layer0.expert000_gate.0"} <= set(inputs)
    assert "layer0.expert000_gate" not in inputs
    r, r1 = simulate(w, functional=True, inputs=inputs), simulate(one, functional=True, inputs=make_inputs(one, 7))
    checks = check_outputs(w, r.inputs, r.outputs)
    tp = knobs["tp"]
    assert sorted(checks) == sorted(f"y{t}.{k}" for t in range(tp) for k in range(tp))
    assert all(c.passed for c in checks.values()), checks
    for t in range(tp):
        y = np.concatenate([r.outputs[f"y{t}.{k}"] for k in range(tp)])
        np.testing.assert_allclose(y, r1.outputs["y"], rtol=0, atol=ATOL)
    # the comparison above is not between near-zero outputs (no residual: 4 layers shrink y to about 0.02)
    assert np.abs(r1.outputs["y"]).max() > 1e4 * ATOL
    last = (knobs.get("pp", 1) - 1) * tp  # the last stage's chips store y
    assert {op.chip for op in w.graph.ops if op.kind == "LinearOffChipStore"} == set(range(last, last + tp))


def test_shared_experts_split_by_columns_too():
    """Shared experts (F_s = 32): chip t holds columns t F_s/T .. of them too (``layer<i>.shared_<part>.<t>``);
    values against the reference and the one-chip stack, both engines agree."""
    from stepsim.base.system import from_dict
    from stepsim.models.presets import MoEModel
    from stepsim.workloads.moe.build import build_moe

    model = MoEModel("custom", hidden=D, intermediate=64, experts=8, top_k=2, shared_intermediate=32)
    system = from_dict({"name": "s", "chips": 2, "topology": "fully-connected", "link_bandwidth": 64,
                        "link_latency": 500}, source="test", name="s")
    routings = [small_routing(0), small_routing(1)]
    w = build_moe(model, routings, tile_n=4, tile_f=16, layers=2, tp=2, system=system)
    one = build_moe(model, routings, tile_n=4, tile_f=16, layers=2)
    inputs = make_inputs(w, 3)
    assert {"layer0.shared_gate.0", "layer1.shared_down.1"} <= set(inputs)
    r, r1 = simulate(w, functional=True, inputs=inputs), simulate(one, functional=True, inputs=make_inputs(one, 3))
    checks = check_outputs(w, r.inputs, r.outputs)
    assert all(c.passed for c in checks.values()), checks
    np.testing.assert_allclose(np.concatenate([r.outputs["y1.0"], r.outputs["y1.1"]]), r1.outputs["y"], rtol=0,
                               atol=ATOL)
    program = lower(w.graph, Hardware.preset(w.hardware), channel_depth=w.channel_depth)
    assert both_engines(program).cycles == r.cycles


@pytest.mark.parametrize("knobs, tiling, cycles", [
    ({"layers": 2, "tp": 2}, "static", 3858),
    ({"layers": 2, "tp": 4}, "static", 8307),
    ({"layers": 2, "pp": 2, "tp": 2, "system": "ring-4"}, "static", 4863),
    ({"layers": 2, "pp": 2, "tp": 2, "system": "ring-4"}, "dynamic", 5074),
])
def test_bytes_and_both_engines_with_the_cycles_pinned(layered, knobs, tiling, cycles):
    w = workload_from_config(small_stack_config(layered, tiling, **knobs))
    program = lower(w.graph, Hardware.preset(w.hardware), channel_depth=w.channel_depth)
    fast, r = both_engines(program), simulate(w)
    assert fast.cycles == r.cycles == cycles
    links = {op.name for op in w.graph.ops if op.kind == "Link"}
    measured = {r.unit_names[u]: int(b) for u, b in enumerate(r.link_bytes) if r.unit_names[u] in links}
    assert w.params["link_bytes"] == measured and sum(measured.values()) > 0
    row = run_config({**small_stack_config(layered, tiling, **knobs), "mode": "simulate"}).row
    assert row["off_chip_bytes_symbolic"] == row["off_chip_bytes_measured"] == row["off_chip_bytes"]


def test_a_stage_boundary_carries_each_chip_s_rows_once(layered):
    """--pp 2 --tp 2 on a ring of 4: chip t's all-reduced rows (all B of them) cross to chip 2 + t; chip 0's through
    chip 1 (ring: 0 -> 1 -> 2), so chip1->chip2 carries both chips' rows, 2 B D values at 2 bytes each, plus the
    stage-0 all-reduce's share of it."""
    w = workload_from_config(small_stack_config(layered, layers=2, pp=2, tp=2, system="ring-4"))
    one_stage = workload_from_config(small_stack_config(layered, layers=1, tp=2, system="ring-2"))
    assert w.params["link_bytes"]["chip1->chip2"] == 2 * B * D * 2
    assert w.params["link_bytes"]["chip0->chip1"] == one_stage.params["link_bytes"]["chip0->chip1"] + B * D * 2


@pytest.mark.parametrize("extra, message", [
    ({"tp": 2, "micro_batches": 2}, "--micro-batches 2 does not combine with --tp yet (a tensor-parallel stack's "
                                    "layer all-reduces the whole batch)"),
    ({"tp": 3}, "--tp 3: the intermediate size 64 must split into 3 column blocks of whole --tile-f 16 tiles (a "
                "multiple of 48)"),
    ({"tp": 2, "ep": 2}, "--layers / --pp / --micro-batches do not combine with --regions or --tp with --ep yet (a "
                         "stack runs each layer on one chip or over E (--ep) or T (--tp) chips, one region per "
                         "expert)"),
    ({"tp": 2, "pp": 2, "system": "ring-2"}, "--pp 2 --tp 2 needs a system of 4 chips (pp x tp); system 'ring-2' "
                                             "has 2"),
    ({"algorithm": "direct"}, "--algorithm applies to the MoE layer with --tp N (its all-reduce)"),
])
def test_bad_combinations_are_one_line(layered, extra, message):
    with pytest.raises(ConfigError) as info:
        workload_from_config(small_stack_config(layered, layers=2, **extra))
    assert str(info.value) == message


def test_run_moe_with_pp_and_tp_and_the_record_reads_back(layered, tmp_path, capsys):
    out = tmp_path / "run.parquet"
    assert main(["run", "moe", "--model", "custom", "--hidden", "16", "--intermediate", "64", "--experts", "8",
                 "--top-k", "2", "--trace", layered, "--tile-n", "4", "--tile-f", "16", "--layers", "2", "--pp", "2",
                 "--tp", "2", "--system", "ring-4", "--functional", "--check", "--out", str(out), "--json"]) == 0
    row = json.loads(capsys.readouterr().out)
    params = json.loads(row["params"])
    assert (row["layers"], row["pp"], row["tp"], row["cycles"], params["system"], params["algorithm"]) == (
        2, 2, 2, 4863, "ring-4", "ring")
    assert row["check_passed"] is True
    assert row["off_chip_bytes_symbolic"] == row["off_chip_bytes_measured"] == row["off_chip_bytes"]
    (back,) = pq.read_table(out).to_pylist()
    assert (back["layers"], back["pp"], back["tp"], back["cycles"]) == (2, 2, 2, 4863)
    links = [u for u in pq.read_table(tmp_path / "run_units.parquet").to_pylist() if u["kind"] == "Link"]
    assert {u["name"]: u["bytes"] for u in links} == params["link_bytes"]
