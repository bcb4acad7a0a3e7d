"""Tensor parallelism of the MoE layer (``--tp N``): every expert's F columns over N chips, the collectives'
all-reduce after; values equal to the one-chip reference, bytes per link equal to the metric and to the
all-reduce's closed form, both engines agree, one-line errors."""

from __future__ import annotations

import numpy as np
import pytest
from engines_agree import both_engines, link_unit_bytes
from small_routing import write_small_routing

from stepsim.base.errors import ConfigError
from stepsim.graph.lower import lower
from stepsim.simulation.simulate import simulate
from stepsim.workloads.config import workload_from_config
from stepsim.workloads.moe.build import build_moe
from stepsim.workloads.reference import check_outputs, make_inputs, small_moe_model

Y_BYTES = 24 * 16 * 2  # y's 24 rows of D = 16, timed at 2 bytes a value (fp32 streams of bf16 tensors)


@pytest.fixture
def trace(tmp_path):
    return write_small_routing(tmp_path)


def _config(path, **kw):
    return {"workload": "moe", "model": "custom", "hidden": 16, "intermediate": 64, "experts": 8, "top_k": 2,
            "trace": path, "tile_n": 4, "tile_f": 16, **kw}


@pytest.mark.parametrize("tp, algorithm", [(2, "ring"), (4, "ring"), (4, "direct")])
def test_values_equal_the_one_chip_layer_on_every_chip(trace, tp, algorithm):
    path, _ = trace
    one = workload_from_config(_config(path))
    w = workload_from_config(_config(path, tp=tp, algorithm=algorithm))
    inputs, whole = make_inputs(w, seed=3), make_inputs(one, seed=3)
    cols = 64 // tp
    np.testing.assert_array_equal(inputs["expert005_up.1"], whole["expert005_up"][:, cols:2 * cols])
    np.testing.assert_array_equal(inputs["expert005_down.1"], whole["expert005_down"][cols:2 * cols])
    r = simulate(w, functional=True, inputs=inputs)
    checks = check_outputs(w, r.inputs, r.outputs)
    assert sorted(checks) == sorted(f"y{c}.{k}" for c in range(tp) for k in range(tp))
    assert all(c.passed for c in checks.values()), checks
    r1 = simulate(one, functional=True, inputs=whole)
    for c in range(tp):
        y = np.concatenate([r.outputs[f"y{c}.{k}"] for k in range(tp)])
        np.testing.assert_array_equal(y, np.concatenate([r.outputs[f"y0.{k}"] for k in range(tp)]))
        np.testing.assert_allclose(y, r1.outputs["y"], rtol=0, atol=1e-5)


def test_shared_experts_split_too(trace):
    _, routing = trace
    model = small_moe_model("mixtral-8x7b", hidden=16, intermediate=32, shared_intermediate=32)
    w = build_moe(model, routing, tile_n=4, tile_f=16, tp=2)
    assert sorted(op.tensor.name for op in w.graph.ops if op.kind == "LinearOffChipLoad"
                  and op.tensor.name.startswith("shared_up")) == ["shared_up.0", "shared_up.1"]
    r = simulate(w, functional=True, inputs=make_inputs(w, seed=3))
    assert all(c.passed for c in check_outputs(w, r.inputs, r.outputs).values())


@pytest.mark.parametrize("tp, algorithm, cycles, per_link", [
    (2, "ring", 2093, {"chip0->chip1": Y_BYTES, "chip1->chip0": Y_BYTES}),
    (4, "ring", 4068, {f"chip{c}->chip{(c + 1) % 4}": 2 * 3 * Y_BYTES // 4 for c in range(4)}),
    (4, "direct", 2066, {f"chip{c}->chip{k}": 2 * Y_BYTES // 4 for c in range(4) for k in range(4) if c != k}),
])
def test_link_bytes_and_both_engines(trace, tp, algorithm, cycles, per_link):
    """One chip: 1,161 cycles (this tiny layer is latency-bound: the all-reduce's 500-cycle hops dominate)."""
    path, _ = trace
    w = workload_from_config(_config(path, tp=tp, algorithm=algorithm))
    assert w.params["link_bytes"] == per_link
    program = lower(w.graph, channel_depth=w.channel_depth)
    fast = both_engines(program)
    assert fast.cycles == simulate(w).cycles == cycles
    assert link_unit_bytes(program, fast) == per_link


@pytest.mark.parametrize("extra, message", [
    ({"tp": 3}, "--tp 3: the intermediate size 64 must split into 3 column blocks of whole --tile-f 16 tiles (a "
                "multiple of 48)"),
    ({"tp": 2, "tile_f": 64}, "--tp 2: the intermediate size 64 must split into 2 column blocks of whole --tile-f "
                              "64 tiles (a multiple of 128)"),
    ({"tp": 2, "regions": 4}, "--tp does not combine with --regions: a time-multiplexed region fetches whole "
                              "experts' weights by address, not a chip's column block"),
    ({"tp": 2, "placement": "round-robin"}, "--placement applies to the MoE layer with --ep N (expert "
                                            "parallelism)"),
    ({"algorithm": "ring"}, "--algorithm applies to the MoE layer with --tp N (its all-reduce)"),
    ({"tp": 4, "system": "ring-2"}, "--tp 4 needs a system of 4 chips; system 'ring-2' has 2"),
])
def test_bad_tensor_parallel_configs_are_one_line(trace, extra, message):
    path, _ = trace
    with pytest.raises(ConfigError) as info:
        workload_from_config(_config(path, **extra))
    assert str(info.value) == message
