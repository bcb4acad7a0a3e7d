"""make_inputs and the whole-workload reference for the graph that needs no trace (SwiGLU), and the
scaled-down model helper."""

import numpy as np
import pytest

from stepsim.base.errors import ArgumentError
from stepsim.workloads.reference import (
    check_outputs,
    graph_tensors,
    make_inputs,
    small_moe_model,
    swiglu_reference,
    workload_reference,
)
from stepsim.workloads.swiglu.build import build_swiglu

SMALL = {"batch": 16, "hidden": 32, "intermediate": 64}


def test_swiglu_inputs_match_the_graph_tensors():
    w = build_swiglu(tile_m=8, tile_n=16, **SMALL)
    inputs = make_inputs(w, seed=0)
    loaded = {op.tensor.name: tuple(op.tensor.shape) for op in w.graph.ops if op.kind == "LinearOffChipLoad"}
    assert {n: a.shape for n, a in inputs.items()} == loaded == {
        "x": (16, 32), "w_gate": (32, 64), "w_up": (32, 64), "w_down": (64, 32)}
    assert all(a.dtype == np.float32 for a in inputs.values())
    specs = graph_tensors(w)
    assert (specs["y"].shape, specs["y"].dtype, specs["y"].stored, specs["y"].loaded) == ((16, 32), "fp32", True,
                                                                                           False)


def test_swiglu_workload_reference_does_not_depend_on_the_tiling():
    """Same dims, other tiles: the same tensors and the same stored y (the tiling only reorders work)."""
    a = build_swiglu(tile_m=8, tile_n=16, **SMALL)
    b = build_swiglu(tile_m=16, tile_n=64, **SMALL)
    ins_a, ins_b = make_inputs(a, seed=11), make_inputs(b, seed=11)
    assert all(np.array_equal(ins_a[n], ins_b[n]) for n in ins_a)
    y = workload_reference(a, ins_a)["y"]
    assert np.array_equal(y, workload_reference(b, ins_b)["y"])
    assert np.array_equal(y, swiglu_reference(ins_a["x"], ins_a["w_gate"], ins_a["w_up"], ins_a["w_down"]))
    check = check_outputs(a, ins_a, {"y": y})["y"]
    assert check.passed and check.error == 0.0


def test_swiglu_inputs_keep_activations_of_order_one():
    inputs = make_inputs(build_swiglu(tile_m=8, tile_n=16, **SMALL), seed=0)
    y = swiglu_reference(inputs["x"], inputs["w_gate"], inputs["w_up"], inputs["w_down"])
    assert 0.05 < float(np.std(y)) < 5.0  # weights scaled by 1/sqrt(fan-in): no blow-up, no vanishing


def test_small_moe_model_keeps_the_preset_routing_shape():
    m = small_moe_model("qwen3-30b-a3b", hidden=16, intermediate=48)
    assert (m.name, m.experts, m.top_k, m.hidden, m.intermediate) == ("qwen3-30b-a3b-small", 128, 8, 16, 48)
    with pytest.raises(ArgumentError, match="unknown MoE preset 'llama'"):
        small_moe_model("llama")
