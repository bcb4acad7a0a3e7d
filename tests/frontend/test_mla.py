"""Multi-head latent attention (DeepSeek-V3 prefill, the expanded form) as transformers' DeepseekV3Attention
exports it (issue 43): q_a -> RMSNorm -> q_b split per head into nope / rope, kv_a split into the latent and the
rope part, the latent RMSNormed -> kv_b split per head into nope keys and values, RoPE (rotate_half) on the rope
parts, the rope key Expanded over the heads, scores of the concatenated heads. The front end rewrites the per-head
splits as one MatMul per part and the scores as a sum of two MatMuls (stepsim.frontend.mla), names them in
``params["patterns"]``, and matches onnx's reference evaluator; mismatched parts are one line."""

import math
import sys
from pathlib import Path

import numpy as np
import pytest
from onnx import helper

from stepsim.base.errors import FrontendError
from stepsim.frontend import from_onnx
from stepsim.frontend.check import check_outputs
from stepsim.simulation.simulate import simulate

sys.path.insert(0, str(Path(__file__).parent))
from ort_check import model, rand  # noqa: E402

B, S, D, H, QL, KL, NOPE, ROPE, V = 2, 8, 32, 4, 16, 16, 8, 4, 8
QD = NOPE + ROPE


def node(op, ins, out, **attrs):
    outs = [out] if isinstance(out, str) else out
    return helper.make_node(op, ins, outs, name=outs[0], **attrs)


def rms(x, g, out):
    """RMSNorm decomposed as exported: x * 1 / sqrt(mean(x^2) + eps) * g."""
    return [node("Pow", [x, "two"], f"{out}.sq"), node("ReduceMean", [f"{out}.sq", "last"], f"{out}.ms", keepdims=1),
            node("Add", [f"{out}.ms", "eps"], f"{out}.mse"), node("Sqrt", [f"{out}.mse"], f"{out}.rt"),
            node("Reciprocal", [f"{out}.rt"], f"{out}.inv"), node("Mul", [x, f"{out}.inv"], f"{out}.n"),
            node("Mul", [f"{out}.n", g], out)]


def rope(x, out, cos="cos", sin="sin"):
    """x * cos + rotate_half(x) * sin (``cos`` / ``sin``: the constants' names)."""
    return [node("Slice", [x, "h0", "h1", "last"], f"{out}.lo"), node("Slice", [x, "h1", "h2", "last"], f"{out}.hi"),
            node("Neg", [f"{out}.hi"], f"{out}.nh"), node("Concat", [f"{out}.nh", f"{out}.lo"], f"{out}.rh", axis=-1),
            node("Mul", [x, cos], f"{out}.c"), node("Mul", [f"{out}.rh", sin], f"{out}.s"),
            node("Add", [f"{out}.c", f"{out}.s"], out)]


def mla(swapped_keys=False):
    """x [B, S, D] -> MLA prefill attention -> o_proj -> y. ``swapped_keys`` concatenates the key as (rope, nope)
    (a wrong export: its parts do not pair with the query's)."""
    init = {"wqa": rand((D, QL), 1, D ** -0.5), "wqb": rand((QL, H * QD), 2, QL ** -0.5),
            "wkva": rand((D, KL + ROPE), 3, D ** -0.5), "wkvb": rand((KL, H * (NOPE + V)), 4, KL ** -0.5),
            "wo": rand((H * V, D), 5, (H * V) ** -0.5), "gq": rand((QL,), 6, 0.1) + 1, "gkv": rand((KL,), 7, 0.1) + 1,
            "two": np.array(2, np.float32), "eps": np.array(1e-6, np.float32), "last": np.array([-1], np.int64),
            "qheads": np.array([B, S, H, QD], np.int64), "kvheads": np.array([B, S, H, NOPE + V], np.int64),
            "kr_shape": np.array([B, 1, S, ROPE], np.int64), "kr_full": np.array([B, H, S, ROPE], np.int64),
            "split_q": np.array([NOPE, ROPE], np.int64), "split_kv": np.array([KL, ROPE], np.int64),
            "split_kvb": np.array([NOPE, V], np.int64), "merged": np.array([B, S, H * V], np.int64),
            "h0": np.array([0], np.int64), "h1": np.array([ROPE // 2], np.int64), "h2": np.array([ROPE], np.int64),
            "scale": np.array(1 / math.sqrt(QD), np.float32)}
    angles = np.arange(S)[:, None] * (10000.0 ** (-np.arange(ROPE // 2) / (ROPE // 2)))[None]
    for f, name in ((np.cos, "cos"), (np.sin, "sin")):
        init[name] = f(np.concatenate([angles, angles], -1)).astype(np.float32).reshape(1, 1, S, ROPE)
    nodes = [node("MatMul", ["x", "wqa"], "q_a")] + rms("q_a", "gq", "q_an")
    nodes += [node("MatMul", ["q_an", "wqb"], "q"), node("Reshape", ["q", "qheads"], "q4"),
              node("Transpose", ["q4"], "qh", perm=[0, 2, 1, 3]),
              node("Split", ["qh", "split_q"], ["q_pass", "q_rot"], axis=-1),
              node("MatMul", ["x", "wkva"], "ckv"), node("Split", ["ckv", "split_kv"], ["k_lat", "k_rot0"], axis=-1)]
    nodes += rms("k_lat", "gkv", "k_latn")
    nodes += [node("MatMul", ["k_latn", "wkvb"], "kvb"), node("Reshape", ["kvb", "kvheads"], "kv4"),
              node("Transpose", ["kv4"], "kvh", perm=[0, 2, 1, 3]),
              node("Split", ["kvh", "split_kvb"], ["k_pass", "vh"], axis=-1),
              node("Reshape", ["k_rot0", "kr_shape"], "k_rot1")]
    nodes += rope("q_rot", "q_rope") + rope("k_rot1", "k_rope")
    keys = ["k_rope_e", "k_pass"] if swapped_keys else ["k_pass", "k_rope_e"]
    nodes += [node("Expand", ["k_rope", "kr_full"], "k_rope_e"),
              node("Concat", ["q_pass", "q_rope"], "qs", axis=-1), node("Concat", keys, "ks", axis=-1),
              node("Transpose", ["ks"], "kt", perm=[0, 1, 3, 2]), node("MatMul", ["qs", "kt"], "sc"),
              node("Mul", ["sc", "scale"], "z"), node("Softmax", ["z"], "p", axis=-1), node("MatMul", ["p", "vh"], "o"),
              node("Transpose", ["o"], "o1", perm=[0, 2, 1, 3]), node("Reshape", ["o1", "merged"], "o2"),
              node("MatMul", ["o2", "wo"], "y")]
    return model(nodes, {"x": [B, S, D]}, {"y": [B, S, D]}, init, name="mla")


PATTERNS = {"q_pass": "split projection 'q' (K 16): parts [8, 4] per head of 4 (one MatMul each)",
            "k_pass": "split projection 'kvb' (K 16): parts [8, 8] per head of 4 (one MatMul each)",
            "sc": "split rope / nope heads: 8 + 4 per head (one MatMul each)",
            "k_lat": "latent / rope split of 'ckv': latent 16 + rope 4"}


@pytest.mark.parametrize("tile_m", [1, 4])
def test_mla_prefill_is_recognised_and_matches_the_reference(tile_m):
    w = from_onnx(mla(), tiling={"tile_m": tile_m})
    assert w.params["patterns"] == PATTERNS
    # each part a MatMul of its own columns of q_b / kv_b: the q_b weight is read as two tensors, not one
    loads = {op.tensor.name for op in w.graph if getattr(op, "tensor", None) is not None}
    assert {"q_pass.part0.w", "q_pass.part1.w", "k_pass.part0.w", "k_pass.part1.w"} <= loads
    assert not {"wqb", "wkvb"} & loads
    r = simulate(w, functional=True, inputs={"x": rand((B, S, D), 9)})
    (c,) = check_outputs(w, r.inputs, r.outputs).values()  # onnx.reference.ReferenceEvaluator
    print(f"mla tile_m {tile_m}: max rel error {c.error:.2e} (tolerance {c.tolerance:.2e})")
    assert c.passed
    # the parts' FLOPs are the export's products, each 2 K N per row: q_b's nope and rope columns, kv_b's nope keys
    # and values, and the scores over nope and over rope
    values = w.op_values()
    flops = {}
    for op in w.graph:
        if isinstance(op.group, tuple):
            flops[op.group[1]] = flops.get(op.group[1], 0) + int(values[op.name].flops)
    assert {k: flops[k] for k in ("q_pass.part0.matmul", "q_pass.part1.matmul", "k_pass.part0.matmul",
                                  "k_pass.part1.matmul", "sc.part0", "sc.part1")} == {
        "q_pass.part0.matmul": 2 * B * S * QL * H * NOPE, "q_pass.part1.matmul": 2 * B * S * QL * H * ROPE,
        "k_pass.part0.matmul": 2 * B * S * KL * H * NOPE, "k_pass.part1.matmul": 2 * B * S * KL * H * V,
        "sc.part0": 2 * B * H * S * S * NOPE, "sc.part1": 2 * B * H * S * S * ROPE}


def test_mismatched_parts_are_one_line_naming_the_scores():
    with pytest.raises(FrontendError) as err:
        from_onnx(mla(swapped_keys=True))
    assert str(err.value) == ("node 'sc' (MatMul): the query's parts [8, 4] ('qs') and the key's [4, 8] ('ks') must "
                              "pair up (nope with nope, rope with rope)")


@pytest.mark.parametrize("fuse, cycles, off_chip", [(True, 737, 39_168), (False, 4_585, 165_120)])
def test_fused_and_spilled_runs_check_and_cost(fuse, cycles, off_chip):
    w = from_onnx(mla(), fuse=fuse)  # default tiling: tile_m 8
    r = simulate(w, functional=True, seed=1)
    assert all(c.passed for c in check_outputs(w, r.inputs, r.outputs).values())
    assert (simulate(w).cycles, w.metrics()["off_chip_bytes"]) == (cycles, off_chip)


def test_a_bf16_models_split_projections_keep_their_weights_bf16():
    """Each part's columns of a bf16 q_b / kv_b are the model's weight, stored as it stores it: read as 2-byte
    elements (before, as fp32: 51,776 B off chip and 1,177 cycles instead of 37,440 and 1,173)."""
    from test_bf16 import to_bf16

    w = from_onnx(to_bf16(mla()), tiling={"tile_m": 4})
    r = simulate(w, functional=True, seed=1)
    assert all(c.passed for c in check_outputs(w, r.inputs, r.outputs).values())
    parts = {op.tensor.name: op.tensor.dtype.name for op in w.graph
             if getattr(op, "tensor", None) is not None and ".part" in op.tensor.name}
    assert parts == dict.fromkeys(["q_pass.part0.w", "q_pass.part1.w", "k_pass.part0.w", "k_pass.part1.w"], "bf16")
    assert (simulate(w).cycles, w.metrics()["off_chip_bytes"]) == (1_173, 37_440)
