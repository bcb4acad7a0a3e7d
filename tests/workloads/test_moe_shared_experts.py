"""Shared experts in the MoE layer (DeepSeek, Qwen2-MoE): every token visits them besides its routed experts.

Checked: functional runs against the NumPy reference (static, dynamic and time-multiplexed routed experts); the
reference really contains the shared term; measured off-chip bytes equal the symbolic metric and exceed the
routed-only layer's by exactly the shared weights read once per token tile; the paper's layers (no shared
experts) build the same graph as before; the DeepSeek preset runs from the command line.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from stepsim.base.errors import ArgumentError
from stepsim.cli import main
from stepsim.models.presets import MoEModel
from stepsim.simulation.simulate import simulate
from stepsim.workloads.moe.build import algorithmic_flops, build_moe
from stepsim.workloads.reference import check_outputs, max_rel_error, moe_reference, tolerance_for
from stepsim.workloads.routing import expert_counts

D, F, FS, E, K, B = 64, 128, 256, 8, 2, 64
SHARED = MoEModel("shared-test", hidden=D, intermediate=F, experts=E, top_k=K, shared_intermediate=FS)
ROUTED = MoEModel("shared-test", hidden=D, intermediate=F, experts=E, top_k=K)
VARIANTS = {"static16": dict(tiling="static", tile_n=16), "dynamic": dict(tiling="dynamic"),
            "timeshared": dict(tiling="static", tile_n=32, regions=2, tile_f=64)}


@pytest.fixture(scope="module")
def routing():
    r = np.random.default_rng(3).integers(0, E, size=(B, K))
    r[:, 1] = (r[:, 0] + 1 + r[:, 1] % (E - 1)) % E  # two distinct experts per token
    return r


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_functional_run_matches_the_reference_with_the_shared_term(routing, variant):
    w = build_moe(SHARED, routing, **VARIANTS[variant])
    r = simulate(w, functional=True)
    (check,) = check_outputs(w, r.inputs, r.outputs).values()
    assert check.passed and check.error < 1e-6
    assert check.tolerance == tolerance_for("fp32", D + FS + K + 1)
    if variant != "timeshared":  # without the shared rows the stored y is far off: the graph really adds them
        experts = [np.stack([r.inputs[f"expert{e:03d}_{part}"] for e in range(E)]) for part in ("gate", "up", "down")]
        routed_only = moe_reference(r.inputs["x"], routing, r.inputs["routing_weights"], *experts)
        assert max_rel_error(r.outputs["y"], routed_only) > 100 * check.tolerance


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_off_chip_bytes_add_the_shared_weights_once_per_token_tile(routing, variant):
    kw = VARIANTS[variant]
    shared, routed = build_moe(SHARED, routing, **kw), build_moe(ROUTED, routing, **kw)
    s, r = simulate(shared), simulate(routed)
    assert s.off_chip_bytes == shared.metrics()["off_chip_bytes"]
    tile_n = kw.get("tile_n", 32)  # dynamic tiling: the shared experts use tiles of 32 tokens
    weight_bytes = 3 * D * FS * 2  # gate, up, down in bf16
    assert s.off_chip_bytes - r.off_chip_bytes == weight_bytes * math.ceil(B / tile_n)
    assert s.cycles >= r.cycles
    counts = expert_counts(routing, E)
    tn = kw.get("tile_n") if kw["tiling"] == "static" else None
    padded = math.ceil(B / tile_n) * tile_n
    assert shared.algorithmic_flops == algorithmic_flops(counts, ROUTED, tn) + (
        2 * padded * D * FS * 3 + padded * FS + 8 * padded * D * FS)


def test_layers_without_shared_experts_are_unchanged(routing):
    """The paper's layers build the same operators as before (no shared branch, no extra knob in params)."""
    w = build_moe(ROUTED, routing, tiling="static", tile_n=16)
    assert not any(op.group == ("shared_expert", 0) for op in w.graph.ops)
    assert "shared_intermediate" not in w.params
    shared = build_moe(SHARED, routing, tiling="static", tile_n=16)
    assert shared.params["shared_intermediate"] == FS
    assert {t.name for op in shared.graph.ops if (t := getattr(op, "tensor", None)) is not None} >= {
        "shared_gate", "shared_up", "shared_down"}


def test_tile_f_must_divide_the_shared_width(routing):
    odd = MoEModel("odd", hidden=D, intermediate=F, experts=E, top_k=K, shared_intermediate=96)
    with pytest.raises(ArgumentError, match=r"^tile_f must also divide the shared experts' intermediate size 96, "
                                            r"got 64$"):
        build_moe(odd, routing, tiling="static", tile_n=16, tile_f=64)


def test_deepseek_preset_from_the_command_line(tmp_path, capsys):
    trace = tmp_path / "deepseek_b64.arrow"
    assert main(["trace", "synth", "routing", "--tokens", "64", "--model", "deepseek", "--seed", "1",
                 "--out", str(trace)]) == 0
    capsys.readouterr()
    assert main(["run", "moe", "--model", "deepseek", "--trace", str(trace), "--json"]) == 0
    row = json.loads(capsys.readouterr().out)
    params = json.loads(row["params"])
    assert (row["model"], params["experts"], params["top_k"], params["shared_intermediate"]) == (
        "deepseek-moe-16b", 64, 6, 2816)
    assert row["off_chip_bytes_measured"] == row["off_chip_bytes_symbolic"] and row["cycles"] > 0
