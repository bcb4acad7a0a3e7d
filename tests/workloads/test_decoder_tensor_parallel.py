"""Tensor parallelism of the decoder layer (``--tp N``, stepsim.workloads.decoder.parallel): KV heads and FFN
columns over N chips, an all-reduce after the output projection and one after the FFN; values equal to the one-chip
layer, bytes per link equal to the metric and to two all-reduces' closed form, both engines agree, cycles pinned,
one-line errors."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from engines_agree import both_engines, link_unit_bytes

from stepsim.base.errors import ArgumentError, ConfigError
from stepsim.cli import main
from stepsim.graph.lower import lower
from stepsim.models.presets import resolve_model
from stepsim.simulation.simulate import simulate
from stepsim.workloads.config import workload_from_config
from stepsim.workloads.decoder.build import build_decoder
from stepsim.workloads.reference import check_outputs, make_inputs

KV = np.array([5, 40, 17, 64, 3, 33, 100, 31])
#: four KV heads of two query heads each, so 2 and 4 chips both own whole KV heads
QWEN_TP = dataclasses.replace(resolve_model("qwen"), hidden=64, heads=8, kv_heads=4, head_dim=16,
                              expert_intermediate=64, experts=8, top_k=2)
SHARED_TP = dataclasses.replace(QWEN_TP, shared_experts=1, shared_intermediate=32)
DENSE_TP = dataclasses.replace(resolve_model("llama"), hidden=64, heads=8, kv_heads=4, head_dim=16,
                               dense_intermediate=64)
#: one all-reduce's vector: the batch's 8 rows of D = 64, timed at 2 bytes a value (fp32 streams of bf16 tensors)
S = 8 * 64 * 2


def _routing(batch=8):
    rng = np.random.default_rng(0)
    return np.stack([rng.choice(8, 2, replace=False) for _ in range(batch)])


def _build(model, **kw):
    return build_decoder(model, KV[:kw.pop("batch", 8)], _routing() if model.is_moe else None, tile_f=16, **kw)


@pytest.mark.parametrize("model, tp, algorithm, kw", [
    (QWEN_TP, 2, "ring", dict(strategy="dynamic")),
    (QWEN_TP, 4, "ring", dict(strategy="interleave")),
    (QWEN_TP, 2, "ring", dict(strategy="dynamic", tiling="dynamic")),
    (SHARED_TP, 2, "direct", dict(strategy="coarse")),
    (DENSE_TP, 4, "direct", dict(strategy="dynamic")),
])
def test_values_equal_the_one_chip_layer_on_every_chip(model, tp, algorithm, kw):
    one = _build(model, softmax="stable", **kw)
    w = _build(model, softmax="stable", tp=tp, algorithm=algorithm, **kw)
    inputs, whole = make_inputs(w, seed=3), make_inputs(one, seed=3)
    # the chips' weights are the one-chip layer's, cut: heads whole, FFN columns in blocks
    part = "expert005_up" if model.is_moe else "shared_up"
    cols = 64 // tp
    np.testing.assert_array_equal(inputs[f"{part}.1"], whole[part][:, cols:2 * cols])
    np.testing.assert_array_equal(inputs["wo_h3_q1"], whole["wo_h3_q1"])
    r = simulate(w, functional=True, inputs=inputs)
    checks = check_outputs(w, r.inputs, r.outputs)
    assert sorted(checks) == sorted([f"h{h}_{c}_cache" for h in range(4) for c in "kv"]
                                    + [f"y{c}.{k}" for c in range(tp) for k in range(tp)])
    assert all(c.passed for c in checks.values()), checks
    r1 = simulate(one, functional=True, inputs=whole)
    for name in (f"h{h}_{c}_cache" for h in range(4) for c in "kv"):
        np.testing.assert_array_equal(r.outputs[name], r1.outputs[name])
    y0 = np.concatenate([r.outputs[f"y0.{k}"] for k in range(tp)])
    for c in range(tp):  # every chip holds all of y after the all-reduce, bit-equal to chip 0's
        np.testing.assert_array_equal(np.concatenate([r.outputs[f"y{c}.{k}"] for k in range(tp)]), y0)
    np.testing.assert_allclose(y0, r1.outputs["y"], rtol=0, atol=1e-5)
    assert np.abs(y0).max() > 0.1  # the comparison above is not between two near-zero outputs


def test_a_head_counts_only_on_its_own_chip():
    """A wrong output projection on chip 1's head changes y; the reference sees the head on its chip."""
    w = _build(QWEN_TP, softmax="stable", tp=2)
    inputs = make_inputs(w, seed=3)
    r = simulate(w, functional=True, inputs=dict(inputs, wo_h3_q0=inputs["wo_h3_q0"] * 2))
    assert not all(c.passed for name, c in check_outputs(w, inputs, r.outputs).items() if name.startswith("y"))
    assert {op.chip for op in w.graph.ops if op.kind == "LinearOffChipLoad" and op.tensor.name == "wo_h3_q0"} == {1}
    assert {op.chip for op in w.graph.ops if op.kind == "LinearOffChipLoad" and op.tensor.name == "wo_h1_q0"} == {0}
    assert {op.chip for op in w.graph.ops if op.kind == "LinearOffChipLoad" and op.tensor.name == "x"} == {0, 1}


@pytest.mark.parametrize("tp, algorithm, cycles, per_link", [
    (None, "ring", 1279, {}),
    # two ring all-reduces: 2 x 2 (n-1) S / n bytes on every link of the logical ring
    (2, "ring", 3450, {"chip0->chip1": 2 * 2 * S // 2, "chip1->chip0": 2 * 2 * S // 2}),
    (4, "ring", 6875, {f"chip{c}->chip{(c + 1) % 4}": 2 * 2 * 3 * S // 4 for c in range(4)}),
    # direct: every chip sends every other its chunk in the reduce-scatter and the sum in the all-gather
    (4, "direct", 2895, {f"chip{c}->chip{k}": 2 * 2 * S // 4 for c in range(4) for k in range(4) if c != k}),
])
def test_link_bytes_cycles_and_both_engines(tp, algorithm, cycles, per_link):
    """The tiny layer is latency-bound: each all-reduce's 500-cycle hops outweigh the halved compute."""
    w = _build(QWEN_TP, tp=tp, algorithm=algorithm)
    assert w.params.get("link_bytes", {}) == per_link
    program = lower(w.graph, channel_depth=w.channel_depth)
    fast = both_engines(program)
    assert fast.cycles == simulate(w).cycles == cycles
    assert link_unit_bytes(program, fast) == per_link


@pytest.mark.parametrize("model, kw, message", [
    (QWEN_TP, dict(tp=3), "--tp 3: the 4 KV heads (--kv-heads) must split evenly over 3 chips"),
    (QWEN_TP, dict(tp=2, kv_heads=3), "--tp 2: the 3 KV heads (--kv-heads) must split evenly over 2 chips"),
    (QWEN_TP, dict(tp=4, batch=6), "--tp 4: the all-reduces cut the 6 rows into 4 chunks; the batch must be a "
                                   "multiple of 4"),
    (QWEN_TP, dict(tp=4, tile_f=32), "--tp 4: the intermediate size 64 must split into 4 column blocks of whole "
                                     "--tile-f 32 tiles (a multiple of 128)"),
    (SHARED_TP, dict(tp=4), "--tp 4: the shared intermediate size 32 must split into 4 column blocks of whole "
                            "--tile-f 16 tiles (a multiple of 64)"),
    (DENSE_TP, dict(tp=4, tile_f=32), "--tp 4: the dense intermediate size 64 must split into 4 column blocks of "
                                      "whole --tile-f 32 tiles (a multiple of 128)"),
    (QWEN_TP, dict(tp=1), "--tp must be an int >= 2 (chips), got 1"),
    (QWEN_TP, dict(tp=2, regions=4), "--tp does not combine with --regions (time-multiplexed expert regions) yet"),
])
def test_bad_tensor_parallel_layers_are_one_line(model, kw, message):
    batch = kw.pop("batch", 8)
    with pytest.raises(ArgumentError) as info:
        build_decoder(model, KV[:batch], _routing(batch) if model.is_moe else None, **{"tile_f": 16, **kw})
    assert str(info.value) == message


@pytest.mark.parametrize("extra, message", [
    ({"tp": 3}, "--tp 3: the 4 KV heads (--kv-heads) must split evenly over 3 chips"),
    ({"tp": 4, "system": "ring-2"}, "--tp 4 needs a system of 4 chips; system 'ring-2' has 2"),
    ({"system": "ring-2"}, "--system and --algorithm apply to the decoder layer with --tp N or --ep N"),
    ({"algorithm": "direct"}, "--system and --algorithm apply to the decoder layer with --tp N or --ep N"),
    ({"tp": 2, "system": "ring-2", "hardware": "sn40l"}, "--hardware does not apply with --system: the system file "
                                                         "names the chips' hardware"),
])
def test_bad_configs_are_one_line(qwen_b64_traces, extra, message):
    with pytest.raises(ConfigError) as info:
        workload_from_config({"workload": "decoder", "model": "qwen", **qwen_b64_traces, **extra})
    assert str(info.value) == message


def test_cli_refuses_heads_that_do_not_split(qwen_b64_traces, capsys):
    argv = ["run", "decoder", "--model", "qwen", "--routing", qwen_b64_traces["routing"], "--kv-lengths",
            qwen_b64_traces["kv_lengths"], "--tp", "8", "--json"]
    assert main(argv) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "stepsim: error: --tp 8: the 4 KV heads (--kv-heads) must split evenly over 8 chips"]


def test_the_attention_kind_points_to_the_decoder(capsys):
    """The attention kind is one KV head without an output projection: its heads split in the decoder layer."""
    assert main(["run", "attention", "--tp", "2", "--json"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "stepsim: error: --tp does not apply to workload 'attention' (it applies to: moe, swiglu, decoder)"]


@pytest.mark.parametrize("flags, cycles, off_chip, per_link", [
    ([], 773297, 730989568, None),
    (["--tp", "2", "--system", "ring-2"], 408773, 731777024, {"chip0->chip1": 2 * 64 * 2048 * 2,
                                                              "chip1->chip0": 2 * 64 * 2048 * 2}),
    (["--tp", "4"], 252287, 733351936, {f"chip{c}->chip{(c + 1) % 4}": 2 * 2 * 3 * 64 * 2048 * 2 // 4
                                        for c in range(4)}),
    (["--tp", "4", "--algorithm", "direct"], 248450, 733351936,
     {f"chip{c}->chip{k}": 2 * 2 * 64 * 2048 * 2 // 4 for c in range(4) for k in range(4) if c != k}),
])
def test_qwen_on_the_shared_b64_traces(qwen_b64_traces, capsys, flags, cycles, off_chip, per_link):
    """Every KV head of Qwen3-30B-A3B (D = 2048: an all-reduce's S is 64 rows at 2 bytes a value)."""
    assert main(["run", "decoder", "--model", "qwen", "--routing", qwen_b64_traces["routing"], "--kv-lengths",
                 qwen_b64_traces["kv_lengths"], *flags, "--json"]) == 0
    row = json.loads(capsys.readouterr().out)
    params = json.loads(row["params"])
    assert (row["cycles"], row["off_chip_bytes_measured"], row["off_chip_bytes_symbolic"]) == (cycles, off_chip,
                                                                                                 off_chip)
    assert params.get("link_bytes") == per_link
    if flags:
        assert (params["tp"], params["system"], params["algorithm"]) == (
            int(flags[1]), "ring-2" if "ring-2" in flags else "fully-connected-4",
            "direct" if "direct" in flags else "ring")
