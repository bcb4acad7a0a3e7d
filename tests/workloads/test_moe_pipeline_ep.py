"""A stack of expert-parallel MoE layers (``stepsim run moe --layers L --ep E [--pp P]``, moe/pipeline_ep.py):
values equal to the one-chip stack (bit for bit) and the NumPy reference, bytes over every link equal to the
symbolic metric, symbolic off-chip bytes equal to the engine's, both engines agree (cycles pinned), the CLI
record read back."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest
from engines_agree import both_engines
from small_routing import small_stack_config, write_layered_routing

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


STACKS = [({"layers": 2, "ep": 2}, "static"), ({"layers": 2, "ep": 2}, "dynamic"),
          ({"layers": 2, "pp": 2, "ep": 2, "system": "ring-4"}, "static"),
          ({"layers": 4, "pp": 2, "ep": 4, "placement": "load-balanced", "system": "ring-8"}, "dynamic")]


@pytest.mark.parametrize("knobs, tiling", STACKS)
def test_values_equal_the_one_chip_stack_and_the_reference(layered, knobs, tiling):
    """Chip c of every stage holds shard c's rows; y.<c> put together is the one-chip stack's y, bit for bit."""
    w = workload_from_config(small_stack_config(layered, tiling, **knobs))
    one = workload_from_config(small_stack_config(layered, tiling, layers=knobs["layers"]))
    inputs = make_inputs(w, seed=7)
    assert {"x.0", "x.1", "layer0.routing_weights.0", "layer1.routing_weights.1", "layer1.expert007_down"} <= \
        set(inputs) and "x" not in inputs
    r, r1 = simulate(w, functional=True, inputs=inputs), simulate(one, functional=True, inputs=make_inputs(one, 7))
    checks = check_outputs(w, r.inputs, r.outputs)
    ep = knobs["ep"]
    assert sorted(checks) == [f"y.{c}" for c in range(ep)] and all(c.passed for c in checks.values()), checks
    np.testing.assert_array_equal(np.concatenate([r.outputs[f"y.{c}"] for c in range(ep)]), r1.outputs["y"])
    last = (knobs.get("pp", 1) - 1) * ep  # the last stage's chips store y, the first stage's load x
    assert {op.chip for op in w.graph.ops if op.kind == "LinearOffChipStore"} == set(range(last, last + ep))
    assert {op.chip for op in w.graph.ops if op.kind == "LinearOffChipLoad" and op.tensor.name.startswith("x.")} \
        == set(range(ep))


@pytest.mark.parametrize("knobs, tiling", STACKS[2:])
def test_bytes_over_each_link_and_off_chip_equal_the_metric(layered, knobs, tiling):
    w = workload_from_config(small_stack_config(layered, tiling, **knobs))
    r = simulate(w)
    links = {op.name for op in w.graph.ops if op.kind == "Link"}
    measured = {r.unit_names[u]: int(b) for u, b in enumerate(r.link_bytes) if r.unit_names[u] in links}
    assert w.params["link_bytes"] == measured and sum(measured.values()) > 0
    row = run_config({**small_stack_config(layered, tiling, **knobs), "mode": "simulate"}).row
    assert row["off_chip_bytes_symbolic"] == row["off_chip_bytes_measured"] == row["off_chip_bytes"]


def test_a_stage_boundary_carries_every_shard_once(layered):
    """--pp 2 --ep 2 on a ring of 4: the layers' all-to-alls use chip0<->chip1 and chip2<->chip3; shard c's rows
    cross from chip c to chip 2 + c, shard 0's through chip 1 (ring: 0 -> 1 -> 2), so chip1->chip2 carries both
    shards' rows: the batch, D values at 2 bytes each (the fp32 rows' timed width)."""
    w = workload_from_config(small_stack_config(layered, layers=2, pp=2, ep=2, system="ring-4"))
    assert w.params["link_bytes"]["chip1->chip2"] == B * D * 2
    assert "chip2->chip1" not in w.params["link_bytes"] and "chip3->chip0" not in w.params["link_bytes"]


@pytest.mark.parametrize("knobs, tiling, cycles", [
    ({"layers": 2, "ep": 2}, "static", 2904),
    ({"layers": 2, "pp": 2, "ep": 2, "system": "ring-4"}, "static", 3904),
    ({"layers": 4, "pp": 2, "ep": 4, "placement": "load-balanced", "system": "ring-8"}, "dynamic", 14983),
])
def test_both_engines_agree_and_the_cycles_are_pinned(layered, knobs, tiling, cycles):
    w = workload_from_config(small_stack_config(layered, tiling, **knobs))
    program = lower(w.graph, Hardware.preset(w.hardware), channel_depth=w.channel_depth)
    assert both_engines(program).cycles == simulate(w).cycles == cycles


def test_run_moe_with_pp_and_ep_functional_check_and_the_record_reads_back(layered, tmp_path, capsys):
    out = tmp_path / "run.parquet"
    assert main(["run", "moe", "--model", "custom", "--hidden", "16", "--intermediate", "64", "--experts", "8",
                 "--top-k", "2", "--trace", layered, "--tile-n", "4", "--tile-f", "16", "--layers", "2", "--pp", "2",
                 "--ep", "2", "--placement", "round-robin", "--system", "ring-4", "--functional", "--check",
                 "--out", str(out), "--json"]) == 0
    row = json.loads(capsys.readouterr().out)
    params = json.loads(row["params"])
    assert (row["layers"], row["pp"], row["ep"], row["placement"], params["system"]) == (2, 2, 2, "round-robin",
                                                                                         "ring-4")
    assert params["expert_chips"] == [[0, 1] * 4, [0, 1] * 4] and params["shard_bounds"] == [0, 12, 24]
    assert row["check_passed"] is True
    assert row["off_chip_bytes_symbolic"] == row["off_chip_bytes_measured"] == row["off_chip_bytes"]
    (back,) = pq.read_table(out).to_pylist()
    assert (back["layers"], back["pp"], back["ep"], back["cycles"]) == (2, 2, 2, row["cycles"])
    links = [u for u in pq.read_table(tmp_path / "run_units.parquet").to_pylist() if u["kind"] == "Link"]
    assert {u["name"]: u["bytes"] for u in links} == params["link_bytes"]
