"""Tensor parallelism of the SwiGLU layer (``--tp N``): F's columns over N chips, the collectives' all-reduce
after; values equal to the one-chip layer's reference, bytes over every link equal to the symbolic metric and to
the all-reduce's closed form, both engines agree, one-line errors."""

from __future__ import annotations

import json

import numpy as np
import pytest
from engines_agree import both_engines

from stepsim.base.errors import ConfigError
from stepsim.base.hardware import Hardware
from stepsim.cli import main
from stepsim.graph.lower import lower
from stepsim.simulation.simulate import simulate
from stepsim.workloads.config import workload_from_config
from stepsim.workloads.reference import check_outputs, make_inputs

Y_BYTES = 64 * 256 * 4  # y of the default layer (B = 64, D = 256, fp32)


@pytest.mark.parametrize("tp, algorithm", [(2, "ring"), (4, "ring"), (4, "direct")])
def test_values_equal_the_one_chip_layer_on_every_chip(tp, algorithm):
    one = workload_from_config({"workload": "swiglu"})
    w = workload_from_config({"workload": "swiglu", "tp": tp, "algorithm": algorithm})
    inputs = make_inputs(w, seed=4)
    whole = make_inputs(one, seed=4)
    cols = 512 // tp
    np.testing.assert_array_equal(inputs["w_gate.1"], whole["w_gate"][:, cols:2 * cols])
    np.testing.assert_array_equal(inputs["w_down.1"], whole["w_down"][cols:2 * cols])
    r = simulate(w, functional=True, inputs=inputs)
    checks = check_outputs(w, r.inputs, r.outputs)
    assert sorted(checks) == sorted(f"y{c}.{k}" for c in range(tp) for k in range(tp))
    assert all(c.passed for c in checks.values()), checks
    r1 = simulate(one, functional=True, inputs=whole)
    for c in range(tp):  # after the all-reduce every chip holds the same y (bit for bit), the one-chip y's values
        y = np.concatenate([r.outputs[f"y{c}.{k}"] for k in range(tp)])
        np.testing.assert_array_equal(y, np.concatenate([r.outputs[f"y0.{k}"] for k in range(tp)]))
        np.testing.assert_allclose(y, r1.outputs["y"], rtol=0, atol=4e-6)


@pytest.mark.parametrize("tp, algorithm, per_link", [
    (2, "ring", {"chip0->chip1": Y_BYTES, "chip1->chip0": Y_BYTES}),
    (4, "ring", {f"chip{c}->chip{(c + 1) % 4}": 2 * 3 * Y_BYTES // 4 for c in range(4)}),
    (4, "direct", {f"chip{c}->chip{k}": 2 * Y_BYTES // 4 for c in range(4) for k in range(4) if c != k}),
])
def test_bytes_over_each_link_equal_the_metric_and_the_all_reduce(tp, algorithm, per_link):
    """Ring: every link of the logical ring carries 2 (n-1) chunks of S / n; direct: one chunk each way of the
    reduce-scatter and one of the all-gather."""
    w = workload_from_config({"workload": "swiglu", "tp": tp, "algorithm": algorithm})
    assert w.params["link_bytes"] == per_link
    r = simulate(w)
    links = {op.name for op in w.graph.ops if op.kind == "Link"}
    assert {r.unit_names[u]: int(b) for u, b in enumerate(r.link_bytes) if r.unit_names[u] in links} == per_link


@pytest.mark.parametrize("tp, algorithm, cycles", [(2, "ring", 18549), (4, "ring", 13381), (4, "direct", 10485)])
def test_both_engines_agree_and_the_cycles_are_pinned(tp, algorithm, cycles):
    """One chip: 33,288 cycles."""
    w = workload_from_config({"workload": "swiglu", "tp": tp, "algorithm": algorithm})
    program = lower(w.graph, Hardware.preset(w.hardware), channel_depth=w.channel_depth)  # step-hdl
    fast = both_engines(program)
    assert fast.cycles == simulate(w).cycles == cycles


def test_run_swiglu_with_tp(capsys):
    assert main(["run", "swiglu", "--tp", "2", "--system", "ring-2", "--json"]) == 0
    row = json.loads(capsys.readouterr().out)
    params = json.loads(row["params"])
    assert (row["tp"], params["system"], params["links_used"]) == (2, "ring-2", 2)
    assert params["link_bytes"] == {"chip0->chip1": Y_BYTES, "chip1->chip0": Y_BYTES}


@pytest.mark.parametrize("extra, message", [
    ({"tp": 3}, "--tp 3: the intermediate size 512 must split into 3 column blocks of whole --tile-n 16 tiles (a "
                "multiple of 48)"),
    ({"tp": 8}, "--tp 8: the all-reduce cuts y's 4 row tiles (--tile-m 16) into 8 chunks; their number must be a "
                "multiple of 8"),
    ({"tp": 1}, "--tp must be an int >= 2 (chips), got 1"),
    ({"tp": 2, "system": "ring-4"}, "--tp 2 needs a system of 2 chips; system 'ring-4' has 4"),
    ({"algorithm": "direct"}, "--system and --algorithm apply to the SwiGLU layer with --tp N (tensor "
                              "parallelism)"),
])
def test_bad_tensor_parallel_configs_are_one_line(extra, message):
    with pytest.raises(ConfigError) as info:
        workload_from_config({"workload": "swiglu", **extra})
    assert str(info.value) == message
