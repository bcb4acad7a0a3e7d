"""gpt-oss attention as exporters spell it (issue 43): a sliding-window mask built from Range / LessOrEqual /
Greater / And / Where (or the masked_fill order, or an additive -inf constant) and attention sinks (a per-head
logit Expanded and concatenated to the scores, minus the row max, Softmax, the sink column sliced off) are
recognised (stepsim.frontend.attention: ``params["patterns"]``, one SinkSoftmax node), lowered, and the functional
run matches onnx's reference evaluator (what ``--check`` runs); malformed variants are one line naming the node."""

import math
import sys
from pathlib import Path

import numpy as np
import pytest
from onnx import helper

from stepsim.base.errors import FrontendError
from stepsim.cli import main
from stepsim.frontend import from_onnx
from stepsim.frontend.check import check_outputs
from stepsim.simulation.simulate import simulate
from stepsim.workloads.sliding_attention.reference import sink_attention

sys.path.insert(0, str(Path(__file__).parent))
from ort_check import model, rand  # noqa: E402

B, S, D, H, W = 2, 8, 32, 4, 3
HD = D // H


def node(op, ins, out, **attrs):
    return helper.make_node(op, ins, [out], name=out, **attrs)


def mask_nodes(mask: str, init: dict, strict: bool = False, fill: float = -np.inf) -> list:
    """Nodes turning scores ``z`` into masked scores ``zm`` (``mask``: "where", "masked_fill", "additive" or
    "causal"); ``strict`` spells the causal part ``kv < q`` (a wrong export: query 0 sees nothing)."""
    if mask in ("additive", "causal"):
        i, j = np.arange(S)[:, None], np.arange(S)[None, :]
        keep = (j <= i) & ((j > i - W) if mask == "additive" else True)
        init["band"] = np.where(keep, 0, -np.inf).astype(np.float32).reshape(1, 1, S, S)
        return [node("Add", ["z", "band"], "zm")]
    init |= {"zero": np.array(0, np.int64), "len": np.array(S, np.int64), "one": np.array(1, np.int64),
             "window": np.array(W, np.int64), "ax0": np.array([0], np.int64), "ax1": np.array([1], np.int64),
             "neg_inf": np.array(fill, np.float32)}
    nodes = [node("Range", ["zero", "len", "one"], "pos"), node("Unsqueeze", ["pos", "ax1"], "q_idx"),
             node("Unsqueeze", ["pos", "ax0"], "kv_idx"),
             node("Less" if strict else "LessOrEqual", ["kv_idx", "q_idx"], "causal"),
             node("Sub", ["q_idx", "window"], "lo"), node("Greater", ["kv_idx", "lo"], "in_window"),
             node("And", ["causal", "in_window"], "allowed")]
    if mask == "where":
        return nodes + [node("Where", ["allowed", "z", "neg_inf"], "zm")]
    return nodes + [node("Not", ["allowed"], "hidden"), node("Where", ["hidden", "neg_inf", "z"], "zm")]


def gpt_oss_attention(mask="where", sinks=True, strict=False, keep=(0, -1), sink_rows=False, fill=-np.inf):
    """x -> q, k, v heads -> softmax(q k^T / sqrt(hd) + sliding mask, with sinks) v -> merged heads -> output
    projection. ``keep``: the Slice after the Softmax; ``sink_rows``: sinks that vary along the query rows."""
    init = {f"w_{p}": rand((D, D), i, D ** -0.5) for i, p in enumerate("qkvo")}
    init |= {"heads": np.array([B, S, H, HD], np.int64), "merged": np.array([B, S, D], np.int64),
             "scale": np.array(1 / math.sqrt(HD), np.float32)}
    nodes = []
    for p in "qkv":
        nodes += [node("MatMul", ["x", f"w_{p}"], f"{p}0"), node("Reshape", [f"{p}0", "heads"], f"{p}2"),
                  node("Transpose", [f"{p}2"], f"{p}3", perm=[0, 2, 1, 3])]
    nodes += [node("Transpose", ["k3"], "kt", perm=[0, 1, 3, 2]), node("MatMul", ["q3", "kt"], "s"),
              node("Mul", ["s", "scale"], "z")]
    nodes += mask_nodes(mask, init, strict, fill)
    probs = "p"
    if sinks:
        init |= {"sinks": rand((H,), 30), "sink_shape": np.array([1, H, 1, 1], np.int64),
                 "sink_full": np.array([B, H, S, 1], np.int64), "last": np.array([-1], np.int64),
                 "starts": np.array([keep[0]], np.int64), "ends": np.array([keep[1]], np.int64)}
        sink_src = "sinks"
        if sink_rows:
            init["sink_by_row"] = rand((H, S), 31)
            init["sink_shape"] = np.array([1, H, S, 1], np.int64)
            sink_src = "sink_by_row"
        nodes += [node("Reshape", [sink_src, "sink_shape"], "sinks4"), node("Expand", ["sinks4", "sink_full"], "sinks_e"),
                  node("Concat", ["zm", "sinks_e"], "combined", axis=-1),
                  node("ReduceMax", ["combined", "last"], "cmax", keepdims=1), node("Sub", ["combined", "cmax"], "shifted"),
                  node("Softmax", ["shifted"], "probs", axis=-1), node("Slice", ["probs", "starts", "ends", "last"], "p")]
    else:
        nodes.append(node("Softmax", ["zm"], "p", axis=-1))
    nodes += [node("MatMul", [probs, "v3"], "o"), node("Transpose", ["o"], "o1", perm=[0, 2, 1, 3]),
              node("Reshape", ["o1", "merged"], "o2"), node("MatMul", ["o2", "w_o"], "y")]
    return model(nodes, {"x": [B, S, D]}, {"y": [B, S, D]}, init, name="gpt_oss_attention"), init


def run_checked(m, tile_m):
    w = from_onnx(m, tiling={"tile_m": tile_m})
    r = simulate(w, functional=True, inputs={"x": rand((B, S, D), 20)})
    (c,) = check_outputs(w, r.inputs, r.outputs).values()  # against onnx.reference.ReferenceEvaluator
    print(f"{w.params['patterns']} tile_m {tile_m}: max rel error {c.error:.2e} (tolerance {c.tolerance:.2e})")
    assert c.passed, (c.error, c.tolerance)
    return w, r


@pytest.mark.parametrize("tile_m", [1, 4])
@pytest.mark.parametrize("mask", ["where", "masked_fill", "additive"])
def test_sliding_window_and_sinks_are_recognised_and_match_the_reference(mask, tile_m):
    m, init = gpt_oss_attention(mask)
    w, r = run_checked(m, tile_m)
    assert w.params["patterns"] == {"zm": "sliding-window mask (window 3)", "p": "attention sinks (4 heads)"}
    assert w.frontend.describe().splitlines()[:3] == [
        "pattern p: attention sinks (4 heads)", "pattern zm: sliding-window mask (window 3)", f"layouts (tile_m {tile_m}):"]
    # the Concat / ReduceMax / Sub / Softmax / Slice are one SinkSoftmax: the sinks' load, and its nine Maps (row
    # max, max with the sink, subtract, exp, row sum, sink minus max, its exp, add, divide; Broadcasts aside)
    ops = [op for op in w.graph if op.group == ("node", "p") and type(op).__name__ != "Broadcast"]
    assert [type(op).__name__ for op in ops] == ["LinearOffChipLoad", "Flatten"] + ["Map"] * 9
    assert not [op for op in w.graph if isinstance(op.group, tuple) and op.group[1] in ("combined", "cmax", "probs")]
    # gpt-oss's formula (stepsim.workloads.sliding_attention.reference.sink_attention) on the same projections
    x = r.inputs["x"].astype(np.float64)
    q, k, v = ((x @ init[f"w_{p}"]).reshape(B, S, H, HD).transpose(0, 2, 1, 3) for p in "qkv")
    o = np.zeros((B, H, S, HD))
    for b in range(B):
        for h in range(H):
            for i in range(S):
                lo = max(0, i - W + 1)
                o[b, h, i] = sink_attention(q[b, h, i:i + 1], k[b, h, lo:i + 1], v[b, h, lo:i + 1],
                                            init["sinks"][h:h + 1])[0]
    want = o.transpose(0, 2, 1, 3).reshape(B, S, D) @ init["w_o"]
    got = r.outputs["y"].reshape(B, S, D)
    assert np.abs(got - want).max() / np.abs(want).max() < 1e-5


def test_sinks_read_one_tile_per_row_block_and_a_causal_mask_is_named():
    tile_m = 4
    with_sinks, without = (from_onnx(gpt_oss_attention("additive", sinks)[0], tiling={"tile_m": tile_m})
                           for sinks in (True, False))
    assert without.params["patterns"] == {"zm": "sliding-window mask (window 3)"}
    # the sinks' view reads head h's tile_m x 1 tile once per row block: B * H * S / tile_m tiles of tile_m fp32
    assert with_sinks.metrics()["off_chip_bytes"] - without.metrics()["off_chip_bytes"] == B * H * S * 4
    causal = from_onnx(gpt_oss_attention("causal")[0], tiling={"tile_m": tile_m})
    assert causal.params["patterns"] == {"zm": "causal mask", "p": "attention sinks (4 heads)"}
    run_checked(gpt_oss_attention("causal")[0], 2)


def test_metrics_and_check_on_the_command_line_name_the_patterns(tmp_path, capsys):
    path = tmp_path / "gpt_oss.onnx"
    path.write_bytes(gpt_oss_attention("where")[0].SerializeToString())
    assert main(["run", str(path), "--functional", "--check"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [ln for ln in lines if ln.startswith("pattern ")] == [
        "pattern p                          attention sinks (4 heads)",
        "pattern zm                         sliding-window mask (window 3)"]
    assert "check_passed                       True" in lines


def test_a_model_without_the_patterns_keeps_its_params():
    from test_onnx_attention import attention_block

    assert "patterns" not in from_onnx(attention_block(causal=False)).params
    assert from_onnx(attention_block(causal=True)).params["patterns"] == {"zm": "causal mask"}


@pytest.mark.parametrize("variant, line", [
    (dict(strict=True),
     "node 'zm' (Where): the attention mask hides every key of query row 0 (its softmax is 0 / 0); a causal or "
     "sliding-window mask keeps each query's own position"),
    (dict(keep=(1, 9)),
     "node 'p' (Slice): after the attention sinks' Softmax ('probs') the slice must drop exactly the sink column "
     "(keep [0, 8) of the last dim), got [1, 9)"),
    (dict(sink_rows=True),
     "node 'combined' (Concat): the attention sinks 'sinks_e' must be one logit per head (the same for every batch and query "
     "row); they vary along the batch or the query rows"),
])
def test_malformed_variants_are_one_line_naming_the_node(variant, line):
    with pytest.raises(FrontendError) as err:
        from_onnx(gpt_oss_attention(**variant)[0])
    assert str(err.value) == line


@pytest.mark.parametrize("fuse, cycles, off_chip", [(True, 520, 39_168), (False, 3_169, 108_800)])
def test_fused_and_spilled_runs_check_and_cost(fuse, cycles, off_chip):
    w = from_onnx(gpt_oss_attention()[0], fuse=fuse)  # default tiling: tile_m 8
    r = simulate(w, functional=True, seed=1)
    assert all(c.passed for c in check_outputs(w, r.inputs, r.outputs).values())
    assert (simulate(w).cycles, w.metrics()["off_chip_bytes"]) == (cycles, off_chip)


@pytest.mark.parametrize("window, named", [(3, "sliding-window mask (window 3)"), (6, "causal mask")])
def test_masks_against_a_cache_are_classified_with_the_cache_offset(window, named):
    """Two new queries (positions 4, 5) against 6 keys (4 cached): query i sees keys i + 4 - window < j <= i + 4."""
    from stepsim.frontend.attention import raise_attention
    from stepsim.frontend.ir import Model, Node

    i, j = np.arange(2)[:, None] + 4, np.arange(6)[None, :]
    mask = np.where((j <= i) & (j > i - window), 0, np.finfo(np.float32).min).astype(np.float32)
    m = Model("cache", [Node("zm", "Add", ["z", "mask"], ["zm"]), Node("p", "Softmax", ["zm"], ["p"], {"axis": -1})],
              ["z"], ["p"], {"z": (1, 2, 2, 6), "mask": (1, 1, 2, 6), "zm": (1, 2, 2, 6), "p": (1, 2, 2, 6)},
              {"mask": mask.reshape(1, 1, 2, 6)})
    assert raise_attention(m).patterns == {"zm": named}


def test_a_where_that_is_no_mask_stays_unsupported():
    """A fill of 0 is no mask (Where keeps zeros, an Add would keep the scores): refused as Where, not rewritten;
    a finite fill of -1e9 read only by the sinks' Concat is a mask."""
    from test_errors import SUPPORTED

    with pytest.raises(FrontendError) as err:
        from_onnx(gpt_oss_attention(fill=0.0)[0])
    assert str(err.value) == f"node 'zm' (Where): unsupported operator; supported: {SUPPORTED}"
    assert from_onnx(gpt_oss_attention(fill=-1e9)[0]).params["patterns"]["zm"] == "sliding-window mask (window 3)"


def test_a_bf16_models_sinks_are_read_as_bf16():
    """The sinks are a parameter of the model: in a bf16 model they are read as 2-byte elements like its weights
    (they were read as fp32: 38,144 B off chip instead of 38,016)."""
    from test_bf16 import to_bf16

    w = from_onnx(to_bf16(gpt_oss_attention()[0]), tiling={"tile_m": 4})
    r = simulate(w, functional=True, seed=1)
    assert all(c.passed for c in check_outputs(w, r.inputs, r.outputs).values())
    sinks = [op for op in w.graph if getattr(op, "tensor", None) is not None and op.tensor.name.endswith(".sinks")]
    assert [op.tensor.dtype.name for op in sinks] == ["bf16"]
    assert (simulate(w).cycles, w.metrics()["off_chip_bytes"]) == (931, 38_016)
