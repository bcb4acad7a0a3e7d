"""Each supported ONNX op in its own small model, lowered and run in functional mode against onnxruntime
(issue 33). Tolerances are the fp32 rule of stepsim.workloads.reference.tolerance_for, whose ``n`` counts the
chained fp32 operations on the longest path to the output: a reduction's length, plus each elementwise function
at its FLOPs per element (a transcendental as 4 or 7, as stepsim.graph.functions counts them: its library
implementations, numba's and onnxruntime's, differ by a few ulps). The max relative error is printed (-s)."""

import sys
from pathlib import Path

import numpy as np
import pytest
from onnx import helper

from stepsim.base.errors import FrontendError

sys.path.insert(0, str(Path(__file__).parent))
from ort_check import check, model, rand  # noqa: E402

R, N = 8, 16  # rows, features
X = {"x": [R, N]}
Y = {"y": [R, N]}


def one(op, inputs=("x",), attrs=None, init=None, out_shape=(R, N), in_shapes=None, opset=18):
    node = helper.make_node(op, list(inputs), ["y"], **(attrs or {}))
    ins = in_shapes or {k: [R, N] for k in inputs if not (init and k in init)}
    return model([node], ins, {"y": list(out_shape)}, init, opset=opset, name=op)


#: op -> its chained fp32 operations per element (Pointwise FLOPs per element)
UNARY = {"Relu": 1, "Sigmoid": 7, "Tanh": 7, "Erf": 4, "Neg": 1, "Exp": 4, "Identity": 0}


@pytest.mark.parametrize("op", sorted(UNARY))
def test_unary(op):
    check(one(op), {"x": rand((R, N))}, UNARY[op])


def test_sqrt_and_reciprocal():
    x = np.abs(rand((R, N))) + 0.1
    check(one("Sqrt"), {"x": x}, 4)
    check(one("Reciprocal"), {"x": x}, 1)


@pytest.mark.parametrize("approximate, n", [("none", 8), ("tanh", 14)])
def test_gelu(approximate, n):
    check(one("Gelu", attrs={"approximate": approximate}, opset=20), {"x": rand((R, N))}, n)


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div"])
def test_binary_two_activations(op):
    feeds = {"x": rand((R, N)), "z": rand((R, N), 1) + (4.0 if op == "Div" else 0.0)}
    check(one(op, ("x", "z")), feeds, 0)


@pytest.mark.parametrize("op, side", [(op, side) for op in ["Add", "Sub", "Mul", "Div", "Pow", "Max", "Min"]
                                       for side in ["right", "left"] if (op, side) != ("Pow", "left")])
def test_binary_with_scalar_constant(op, side):  # a constant base of Pow is an error (test_errors)
    c = np.array(3.0 if op == "Pow" else 1.5, np.float32)
    inputs = ("x", "c") if side == "right" else ("c", "x")
    check(one(op, inputs, init={"c": c}, in_shapes=X), {"x": rand((R, N))}, 4 if op == "Pow" else 1)


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div"])
def test_binary_with_row_vector_and_full_constant(op):
    vec = rand((N,), 2) + (3.0 if op == "Div" else 0.0)
    check(one(op, ("x", "b"), init={"b": vec}, in_shapes=X), {"x": rand((R, N))}, 0)
    full = rand((R, N), 3) + (3.0 if op == "Div" else 0.0)
    check(one(op, ("b", "x"), init={"b": full}, in_shapes=X), {"x": rand((R, N))}, 0)


def test_softmax_last_axis():
    check(one("Softmax", attrs={"axis": -1}), {"x": rand((R, N), scale=4.0)}, N)


@pytest.mark.parametrize("op", ["ReduceMean", "ReduceSum", "ReduceMax"])
def test_reduce_last_axis_keepdims(op):
    axes = np.array([-1], np.int64)
    check(one(op, ("x", "axes"), init={"axes": axes}, in_shapes=X, out_shape=(R, 1)), {"x": rand((R, N))}, N)


def test_layer_normalization():
    init = {"scale": rand((N,), 4), "bias": rand((N,), 5)}
    m = one("LayerNormalization", ("x", "scale", "bias"), {"axis": -1, "epsilon": 1e-5}, init, in_shapes=X)
    check(m, {"x": rand((R, N), scale=3.0) + 1.0}, 2 * N)


def test_rms_normalization_op():
    m = one("RMSNormalization", ("x", "scale"), {"axis": -1, "epsilon": 1e-6}, {"scale": rand((N,), 4)},
            in_shapes=X, opset=23)
    check(m, {"x": rand((R, N))}, N)


@pytest.mark.parametrize("tile_n", [None, 8, 4])
def test_matmul_weights(tile_n):
    k, n = N, 24
    w = rand((k, n), 6, scale=k ** -0.5)
    m = one("MatMul", ("x", "w"), init={"w": w}, in_shapes=X, out_shape=(R, n))
    check(m, {"x": rand((R, k))}, k, tiling={"tile_n": tile_n})


@pytest.mark.parametrize("trans_b", [0, 1])
def test_gemm_with_bias(trans_b):
    k, n = N, 12
    w = rand((n, k) if trans_b else (k, n), 7, scale=k ** -0.5)
    m = one("Gemm", ("x", "w", "c"), {"transB": trans_b, "alpha": 0.5, "beta": 2.0},
            {"w": w, "c": rand((n,), 8)}, in_shapes=X, out_shape=(R, n))
    check(m, {"x": rand((R, k))}, k, tiling={"tile_n": 4})


def test_reshape_of_leading_dims_streams_unchanged():
    shape = np.array([2, 4, N], np.int64)
    nodes = [helper.make_node("Reshape", ["x", "s"], ["r"]), helper.make_node("Relu", ["r"], ["y"])]
    m = model(nodes, X, {"y": [2, 4, N]}, {"s": shape}, name="reshape")
    w, r, _ = check(m, {"x": rand((R, N))}, 0)
    assert r.outputs["y"].shape == (2, 4, N)  # a 3-D output is stored as a 3-D tensor


def test_squeeze_unsqueeze_flatten_cast_3d_input():
    nodes = [helper.make_node("Unsqueeze", ["x", "ax"], ["u"]), helper.make_node("Squeeze", ["u", "ax"], ["s"]),
             helper.make_node("Cast", ["s"], ["c"], to=1), helper.make_node("Flatten", ["c"], ["f"], axis=2),
             helper.make_node("Sigmoid", ["f"], ["y"])]
    m = model(nodes, {"x": [2, 4, N]}, {"y": [8, N]}, {"ax": np.array([0], np.int64)}, name="shape_ops")
    check(m, {"x": rand((2, 4, N))}, 0)


def test_shape_subgraph_is_folded():
    nodes = [helper.make_node("Shape", ["x"], ["shp"]), helper.make_node("Gather", ["shp", "zero"], ["b"], axis=0),
             helper.make_node("Concat", ["b", "minus1"], ["target"], axis=0),
             helper.make_node("Reshape", ["x", "target"], ["r"]), helper.make_node("Tanh", ["r"], ["y"])]
    m = model(nodes, {"x": [2, 4, N]}, {"y": [2, 4 * N]},
              {"zero": np.array([0], np.int64), "minus1": np.array([-1], np.int64)}, name="shape_fold")
    # the reshape merges rows into the last dim: not a row-preserving reshape -> a one-line error (test_errors)
    from stepsim.base.errors import FrontendError
    with pytest.raises(FrontendError, match="changes the last dim"):
        check(m, {"x": rand((2, 4, N))}, 0)


def test_gather_on_constant_table_and_indices_is_folded():
    table = rand((10, N), 9)
    nodes = [helper.make_node("Gather", ["table", "ids"], ["e"], axis=0), helper.make_node("Add", ["x", "e"], ["y"])]
    m = model(nodes, X, Y, {"table": table, "ids": np.arange(R, dtype=np.int64) % 10}, name="gather")
    check(m, {"x": rand((R, N))}, 0)


def test_transpose_of_leading_dims_is_one_converter():
    # of a computed value (a graph input's Transpose is read transposed from memory: test_transpose_input.py)
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Transpose", ["a"], ["t"], perm=[1, 0, 2]),
             helper.make_node("Relu", ["t"], ["y"])]
    m = model(nodes, {"x": [3, 4, N]}, {"y": [4, 3, N]}, name="transpose")
    w, r, _ = check(m, {"x": rand((3, 4, N))}, 0)
    (conv,) = w.frontend.converters.values()
    # row-major over the (3, 4) grid of one-row tiles, read column-major: (3 - 1) * (4 - 1) + 1 tiles
    assert conv.kind == "reorder" and conv.buffer.bytes == 7 * N * 4
    part = next(op for op in w.graph if op.kind == "Partition")
    assert part.on_chip_bytes() == 7 * N * 4


def test_silu_as_sigmoid_times_x_becomes_one_silu_map():
    nodes = [helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("Mul", ["s", "x"], ["y"])]
    w, _, _ = check(model(nodes, X, Y, name="silu"), {"x": rand((R, N))}, 8)
    maps = [op.fn for op in w.graph if op.kind == "Map"]
    assert [type(f).__name__ for f in maps] == ["Silu"]


def test_sigmoid_read_twice_is_not_rewritten():
    nodes = [helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("Mul", ["x", "s"], ["m"]),
             helper.make_node("Add", ["m", "s"], ["y"])]
    w, _, _ = check(model(nodes, X, Y, name="silu_plus"), {"x": rand((R, N))}, 9)
    assert sorted(type(op.fn).__name__ for op in w.graph if op.kind == "Map") == ["Add", "Mul", "Pointwise"]


def test_swish_op():
    check(one("Swish", attrs={"alpha": 1.0}, opset=24), {"x": rand((R, N))}, 8)


def test_concat_along_rows():
    nodes = [helper.make_node("Concat", ["past", "x"], ["c"], axis=2), helper.make_node("Relu", ["c"], ["y"])]
    m = model(nodes, {"past": [2, 3, 5, N], "x": [2, 3, 1, N]}, {"y": [2, 3, 6, N]}, name="concat")
    check(m, {"past": rand((2, 3, 5, N), 1), "x": rand((2, 3, 1, N), 2)}, 1)


def test_expand_of_one_leading_dim():
    shape = np.array([2, 3, 4, N], np.int64)
    nodes = [helper.make_node("Expand", ["x", "s"], ["e"]), helper.make_node("Relu", ["e"], ["y"])]
    m = model(nodes, {"x": [2, 1, 4, N]}, {"y": [2, 3, 4, N]}, {"s": shape}, name="expand")
    w, _, _ = check(m, {"x": rand((2, 1, 4, N))}, 1, tiling={"tile_m": 2})
    (buf,) = [op for op in w.graph if op.kind == "Bufferize"]
    assert buf.stream.dtype.size_in_bytes() == 4 * N * 4  # the repeated block: one group's 4 rows, 2 tiles


def test_split_of_a_fused_projection():
    """A MatMul to 3 parts split along the last dim: the MatMul streams part-wide stripes, a Partition routes them."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]),
             helper.make_node("Split", ["h", "sizes"], ["a", "b", "c"], axis=-1),
             helper.make_node("Mul", ["a", "b"], ["ab"]), helper.make_node("Add", ["ab", "c"], ["y"])]
    m = model(nodes, X, {"y": [R, 8]}, {"w": rand((N, 24), 3, N ** -0.5), "sizes": np.array([8, 8, 8], np.int64)},
              name="split")
    w, _, _ = check(m, {"x": rand((R, N))}, N + 2)
    assert w.frontend.tn["h"] == 8  # the split fixed the MatMul's tile_n


def test_split_of_whole_rows_is_an_error():
    nodes = [helper.make_node("Split", ["x", "sizes"], ["a", "b"], axis=-1, name="sp"),
             helper.make_node("Add", ["a", "b"], ["y"])]
    m = model(nodes, X, {"y": [R, 8]}, {"sizes": np.array([8, 8], np.int64)}, name="split_rows")
    with pytest.raises(FrontendError) as err:
        check(m, {"x": rand((R, N))}, 1)
    assert str(err.value) == ("node 'sp' (Split): supported is a split along the last dim into parts that are whole "
                              "column stripes of its input (stripes 16 wide; the producing MatMul's tile_n)")
