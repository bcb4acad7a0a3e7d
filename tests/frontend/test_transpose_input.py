"""A Transpose of a graph input that keeps the last dim last is read straight from memory in the transposed order
(issue 33, :meth:`stepsim.frontend.emit.Emitter.load_transposed`): no converter, no on-chip reorder, and exactly
one read of the input, as if it were not transposed. Values equal onnxruntime's; both engines agree; the engine's
bytes equal the metric and the dims' bytes. Perms that no converter streams (``[2, 0, 1, 3]``, leading dims with
``tile_m`` above 1) work too."""

import sys
from pathlib import Path

import numpy as np
import pytest
from onnx import helper

from stepsim.frontend import from_onnx
from stepsim.graph.ops_convert import ConverterPartition

sys.path.insert(0, str(Path(__file__).parent))
from ort_check import check, model, rand  # noqa: E402
from test_spill import engines_agree  # noqa: E402


def relu_of(perm, shape):
    """y = Relu(Transpose(x, perm)), x a graph input of ``shape``."""
    out = [shape[p] for p in perm]
    nodes = [helper.make_node("Transpose", ["x"], ["t"], name="t", perm=list(perm)),
             helper.make_node("Relu", ["t"], ["y"], name="act")]
    return model(nodes, {"x": list(shape)}, {"y": out}, name="relu_of_transpose")


def merge_heads(b=2, h=4, s=8, hd=8):
    """x [B, H, S, hd] (a graph input) -> Transpose [B, S, H, hd] -> Reshape [B, S, H * hd] -> MatMul w -> y."""
    d = h * hd
    nodes = [helper.make_node("Transpose", ["x"], ["t"], name="t", perm=[0, 2, 1, 3]),
             helper.make_node("Reshape", ["t", "shape"], ["m"], name="merge"),
             helper.make_node("MatMul", ["m", "w"], ["y"], name="proj")]
    init = {"shape": np.array([b, s, d], np.int64), "w": rand((d, d), 1, d ** -0.5)}
    return model(nodes, {"x": [b, h, s, hd]}, {"y": [b, s, d]}, init, name="merge_heads")


CASES = [  # (perm, shape, tile_m)
    ((1, 0, 2), (3, 4, 16), 1),  # leading dims, one-row tiles (a 7-tile reorder converter if x were computed)
    ((1, 0, 2), (4, 6, 16), 2),  # leading dims, two-row tiles: no converter streams it
    ((0, 2, 1, 3), (2, 8, 4, 8), 4),  # [B, S, H, hd] -> [B, H, S, hd] without a head split before it
    ((2, 0, 1, 3), (2, 3, 4, 8), 1),  # any perm keeping the last dim
    ((1, 2, 0, 3), (2, 4, 6, 8), 2),
]


@pytest.mark.parametrize("perm, shape, tile_m", CASES)
def test_a_transposed_graph_input_is_read_once_in_the_transposed_order(perm, shape, tile_m):
    m = relu_of(perm, shape)
    w, r, _ = check(m, {"x": rand(shape, 3)}, 1, tiling={"tile_m": tile_m})  # values: onnxruntime's, exactly
    assert w.frontend.tile_m == tile_m and w.frontend.converters == {}
    assert not [op for op in w.graph if isinstance(op, ConverterPartition)]
    nbytes = int(np.prod(shape)) * 4
    fast = engines_agree(w)
    assert (fast.bytes_read, fast.bytes_written) == (nbytes, nbytes)  # x read once, y stored
    assert w.metrics()["off_chip_bytes"] == 2 * nbytes
    # on chip: the load's tile and the store's (published convention: one tile each; Relu holds none), as for
    # Relu(x) without the Transpose
    row = tile_m * shape[-1] * 4
    plain = from_onnx(model([helper.make_node("Relu", ["x"], ["y"], name="act")], {"x": list(shape)},
                            {"y": list(shape)}, name="plain"), tiling={"tile_m": tile_m})
    assert w.metrics()["on_chip_bytes"] == plain.metrics()["on_chip_bytes"] == 2 * row


def test_a_head_merge_of_a_graph_input_needs_no_reorder():
    b, h, s, hd = 2, 4, 8, 8
    w, r, _ = check(merge_heads(), {"x": rand((b, h, s, hd), 5)}, h * hd, tiling={"tile_m": 4})
    assert w.frontend.converters == {} and not [op for op in w.graph if isinstance(op, ConverterPartition)]
    x, y, weight = b * h * s * hd * 4, b * s * h * hd * 4, (h * hd) ** 2 * 4
    fast = engines_agree(w)
    # x once; the weight once per row block of the MatMul's input (B * S / tile_m blocks); y stored
    assert (fast.bytes_read, fast.bytes_written) == (x + (b * s // 4) * weight, y)
    assert w.metrics()["off_chip_bytes"] == fast.bytes_read + fast.bytes_written


def test_a_computed_transpose_still_goes_through_its_converter():
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="pre"),
             helper.make_node("Transpose", ["r"], ["t"], name="t", perm=[1, 0, 2]),
             helper.make_node("Relu", ["t"], ["y"], name="act")]
    w = from_onnx(model(nodes, {"x": [3, 4, 16]}, {"y": [4, 3, 16]}, name="computed"))
    assert list(w.frontend.converters) == ["t"] and w.frontend.converters["t"].buffer.bytes == 7 * 16 * 4


def test_a_transposed_initializer_is_folded_and_read_once():
    # the constant pass folds Transpose(c) into a constant, stored transposed: read like any full-size constant
    nodes = [helper.make_node("Transpose", ["c"], ["ct"], name="t", perm=[1, 0, 2]),
             helper.make_node("Add", ["x", "ct"], ["y"], name="add")]
    m = model(nodes, {"x": [4, 3, 16]}, {"y": [4, 3, 16]}, {"c": rand((3, 4, 16), 2)}, name="transposed_constant")
    w, r, _ = check(m, {"x": rand((4, 3, 16), 1)}, 1)
    assert w.frontend.converters == {}
    assert sorted(op.tensor.name for op in w.graph if op.kind == "LinearOffChipLoad") == ["ct", "x"]
    nbytes = 4 * 3 * 16 * 4
    fast = engines_agree(w)
    assert (fast.bytes_read, fast.bytes_written) == (2 * nbytes, nbytes)  # x and ct read once, y stored
    assert w.metrics()["off_chip_bytes"] == 3 * nbytes
