"""An ONNX-lowered graph on many chips through the sharding pass (issue 43): ``sharding.pipeline_graph`` takes the
lowered workload and a placement (``--pp P`` over its layers: the ONNX node names' prefixes, as
:func:`stepsim.frontend.layers.part_of` reads them) and returns the graph placed on P chips, every stage boundary
a transfer over the system's links. A 4-layer MLP (MatMul + Relu per layer, nodes ``l<i>.fc`` / ``l<i>.act``): y
bit-equal to the one-chip run (and within fp32 tolerance of onnxruntime), one crossing of the activation per
stage boundary, and the one-line errors. ``from_onnx(model, pp=P)`` is the same pass."""

import sys
from pathlib import Path

import numpy as np
import pytest
from onnx import helper

from stepsim.base.errors import ArgumentError
from stepsim.frontend import from_onnx
from stepsim.frontend.layers import part_of
from stepsim.simulation.simulate import simulate
from stepsim.workloads.reference import max_rel_error, tolerance_for
from stepsim.workloads.sharding import pipeline_graph

sys.path.insert(0, str(Path(__file__).parent))
from ort_check import model, ort_run, rand  # noqa: E402

B, S, D, L = 2, 4, 32, 4


def mlp():
    """x [B, S, D] -> L x (MatMul w<i> [D, D] -> Relu) -> y, node names ``l<i>.fc``, ``l<i>.act``."""
    nodes, init, x = [], {}, "x"
    for i in range(L):
        nodes += [helper.make_node("MatMul", [x, f"w{i}"], [f"h{i}"], name=f"l{i}.fc"),
                  helper.make_node("Relu", [f"h{i}"], [f"a{i}"], name=f"l{i}.act")]
        init[f"w{i}"] = rand((D, D), i + 1, D ** -0.5)
        x = f"a{i}"
    nodes[-1].output[0] = "y"
    return model(nodes, {"x": [B, S, D]}, {"y": [B, S, D]}, init, name=f"mlp{L}")


def layer(op):
    """The layer of an operator (None for the loads of graph inputs and the stores of outputs)."""
    part = part_of(op, ".")
    return None if part == "-" else part


@pytest.fixture(scope="module")
def runs():
    feeds = {"x": rand((B, S, D), 9)}
    one = simulate(from_onnx(mlp()), functional=True, inputs=feeds)
    placed = {2: pipeline_graph(from_onnx(mlp()), 2, layer), 4: from_onnx(mlp(), pp=4)}  # the pass; from_onnx's pp
    return feeds, one, placed, {pp: simulate(w, functional=True, inputs=feeds) for pp, w in placed.items()}


def test_values_equal_one_chip(runs):
    feeds, one, _, sims = runs
    ref = ort_run(mlp(), feeds)["y"]
    assert max_rel_error(one.outputs["y"].reshape(ref.shape), ref) <= tolerance_for("fp32", D * L)
    for sim in sims.values():  # the same operators, the same order of every sum: bit for bit
        assert np.array_equal(sim.outputs["y"], one.outputs["y"])


def test_one_crossing_per_stage_boundary(runs):
    _, _, placed, _ = runs
    act = B * S * D * 4  # the activation between two layers, fp32
    assert {k: placed[2].params[k] for k in ("pp", "system", "links_used", "link_bytes")} == {
        "pp": 2, "system": "fully-connected-2", "links_used": 1, "link_bytes": {"chip0->chip1": act}}
    assert placed[4].params["link_bytes"] == {f"chip{s}->chip{s + 1}": act for s in range(3)}
    assert placed[4].params["links_used"] == 3
    chips = {op.name: op.chip for op in placed[4].graph.ops}  # layer i on chip i, the store of y on the last
    assert {chips[op.name] for op in placed[4].graph.ops if layer(op) == "l2"} == {2}
    assert [op.chip for op in placed[4].graph.ops if op.kind == "LinearOffChipStore"] == [3]


def test_cycles_pinned(runs):
    """One chip 480 cycles; every stage boundary adds 507 (the 500-cycle link latency of the default system and
    the activation's 1,024 bytes behind it)."""
    _, one, _, sims = runs
    assert (one.cycles, sims[2].cycles, sims[4].cycles) == (480, 987, 2001)


@pytest.mark.parametrize("pp, message", [
    (3, "--pp 3: the graph's 4 parts (layers) must split into 3 stages of equal size (a multiple of 3)"),
    (1, "--pp must be an int >= 2 (chips), got 1"),
])
def test_errors(pp, message):
    with pytest.raises(ArgumentError) as err:
        pipeline_graph(from_onnx(mlp()), pp, layer)
    assert str(err.value) == message
