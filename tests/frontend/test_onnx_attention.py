"""Attention as PyTorch exports it (issue 33): MatMuls of two activations (the right operand packed per batch x
head and replayed per row block), head splits as MatMul stripes, [B, S, H, hd] <-> [B, H, S, hd] Transposes as
reorder converters of the least buffer, a causal mask read per group; values against onnxruntime."""

import math
import sys
from pathlib import Path

import numpy as np
import pytest
from onnx import helper

from stepsim.graph.layout import converter_buffer
from stepsim.graph.ops_convert import ConverterPartition

sys.path.insert(0, str(Path(__file__).parent))
from ort_check import check, model, rand  # noqa: E402

B, S, D, H = 2, 8, 32, 4
HD = D // H


def node(op, ins, out, **attrs):
    return helper.make_node(op, ins, [out], name=out, **attrs)


def single_head():
    nodes = [node("Transpose", ["k"], "kt", perm=[0, 2, 1]), node("MatMul", ["q", "kt"], "s"),
             node("Div", ["s", "scale"], "z"), node("Softmax", ["z"], "p", axis=-1), node("MatMul", ["p", "v"], "y")]
    return model(nodes, {"q": [B, S, HD], "k": [B, S, HD], "v": [B, S, HD]}, {"y": [B, S, HD]},
                 {"scale": np.array(math.sqrt(HD), np.float32)}, name="single_head")


def attention_block(causal=True):
    """x -> q, k, v projections (+ bias) -> [B, S, H, hd] -> [B, H, S, hd] -> softmax(q k^T / sqrt(hd) + mask) v ->
    [B, S, H, hd] -> [B, S, D] -> output projection (+ bias) -> + x."""
    init = {f"w_{p}": rand((D, D), i, D ** -0.5) for i, p in enumerate("qkvo")}
    init |= {f"b_{p}": rand((D,), 10 + i, 0.1) for i, p in enumerate("qkvo")}
    init |= {"heads": np.array([B, S, H, HD], np.int64), "merged": np.array([B, S, D], np.int64),
             "scale": np.array(math.sqrt(HD), np.float32)}
    nodes = []
    for p in "qkv":
        nodes += [node("MatMul", ["x", f"w_{p}"], f"{p}0"), node("Add", [f"{p}0", f"b_{p}"], f"{p}1"),
                  node("Reshape", [f"{p}1", "heads"], f"{p}2"), node("Transpose", [f"{p}2"], f"{p}3", perm=[0, 2, 1, 3])]
    nodes += [node("Transpose", ["k3"], "kt", perm=[0, 1, 3, 2]), node("MatMul", ["q3", "kt"], "s"),
              node("Div", ["s", "scale"], "z")]
    logits = "z"
    if causal:
        init["mask"] = np.triu(np.full((S, S), -1e9, np.float32), 1).reshape(1, 1, S, S)
        nodes.append(node("Add", ["z", "mask"], "zm"))
        logits = "zm"
    nodes += [node("Softmax", [logits], "p", axis=-1), node("MatMul", ["p", "v3"], "o"),
              node("Transpose", ["o"], "o1", perm=[0, 2, 1, 3]), node("Reshape", ["o1", "merged"], "o2"),
              node("MatMul", ["o2", "w_o"], "o3"), node("Add", ["o3", "b_o"], "o4"), node("Add", ["x", "o4"], "y")]
    return model(nodes, {"x": [B, S, D]}, {"y": [B, S, D]}, init, name="attention_block")


@pytest.mark.parametrize("tile_m", [1, 2, 8])
def test_single_head(tile_m):
    feeds = {n: rand((B, S, HD), i) for i, n in enumerate("qkv")}
    # scores K = hd, softmax S + 6, probabilities x values K = S
    check(single_head(), feeds, HD + 1 + S + 6 + S, tiling={"tile_m": tile_m})


@pytest.mark.parametrize("tile_m", [1, 2, 4, 8])
@pytest.mark.parametrize("causal", [False, True])
def test_attention_block(tile_m, causal):
    w, _, _ = check(attention_block(causal), {"x": rand((B, S, D), 20)}, 2 * D + HD + 2 + S + 6 + S + 2 + 1,
                    tiling={"tile_m": tile_m})
    convs = w.frontend.converters
    assert sorted(convs) == ["k3", "o1", "q3", "v3"]  # the four head Transposes
    sm = S // tile_m  # row blocks per sequence: each head Transpose reorders an (sm x H) grid per batch
    want = ((sm - 1) * (H - 1) + 1) * tile_m * HD * 4 if sm > 1 else 0
    for name, conv in convs.items():
        assert conv.buffer.bytes == want == converter_buffer(conv.producer, conv.consumer).bytes, name
    # the converters' slots hold exactly those bytes in the graph
    held = sum(op.on_chip_bytes() for op in w.graph if isinstance(op, ConverterPartition))
    assert held == 4 * want
