"""Every way a model can fail to lower is one typed line (issue 33)."""

import sys
from pathlib import Path

import numpy as np
import pytest
from onnx import helper

from stepsim.base.errors import FrontendError
from stepsim.frontend import from_onnx

sys.path.insert(0, str(Path(__file__).parent))
from ort_check import model  # noqa: E402

SUPPORTED = ("Add, Cast, Concat, Div, Dropout, Einsum, Erf, Exp, Expand, Flatten, Gather, Gelu, Gemm, Identity, LayerNormalization, MatMul, "
             "Max, Min, MoE, Mul, Neg, Pow, RMSNormalization, Reciprocal, ReduceMax, ReduceMean, ReduceSum, Relu, Reshape, "
             "Sigmoid, SimplifiedLayerNormalization, SinkSoftmax, Softmax, Split, Sqrt, Squeeze, Sub, Swish, Tanh, Transpose, Unsqueeze")


def one(op, inputs, outputs, init=None, name="n0", **attrs):
    ins = {k: v for k, v in inputs.items()}
    return model([helper.make_node(op, list(inputs) + list(init or {}), list(outputs), name=name, **attrs)],
                 ins, outputs, init)


def lowering_error(source, **kw) -> str:
    with pytest.raises(FrontendError) as err:
        from_onnx(source, **kw)
    return str(err.value)


def test_unsupported_op_names_node_type_and_the_supported_list():
    assert lowering_error(one("Sin", {"x": [4, 8]}, {"y": [4, 8]}, name="sin0")) == (
        f"node 'sin0' (Sin): unsupported operator; supported: {SUPPORTED}")


def test_unbound_dynamic_dim():
    m = one("Relu", {"x": ["batch", 8]}, {"y": ["batch", 8]}, name="relu0")
    assert lowering_error(m) == ("node 'relu0' (Relu): input 'x' has the dynamic dimension 'batch'; bind it with "
                                 "from_onnx(..., dims={'batch': size})")
    assert from_onnx(m, dims={"batch": 4}).frontend.tile_m == 4


def test_malformed_and_missing_files(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"this is not an onnx model\x00\x01")
    assert lowering_error(bad) == (f"{bad}: not a readable ONNX model (Error parsing message with type "
                                   "'onnx.ModelProto': Wire format was corrupt)")
    assert lowering_error(tmp_path / "none.onnx") == f"{tmp_path / 'none.onnx'}: no such ONNX file"
    assert lowering_error(42) == "from_onnx takes a path or an onnx.ModelProto, got int"


def test_unsupported_forms_of_supported_ops():
    two = one("MatMul", {"x": [2, 4, 8], "z": [8, 4]}, {"y": [2, 4, 4]}, name="qk")
    assert lowering_error(two) == ("node 'qk' (MatMul): operands [2, 4, 8] and [8, 4] must have the same leading "
                                   "dims (no broadcasting of the right operand)")
    pow_base = model([helper.make_node("Pow", ["c", "x"], ["y"], name="p")], {"x": [4, 8]}, {"y": [4, 8]},
                     {"c": np.array(2.0, np.float32)})
    assert lowering_error(pow_base) == "node 'p' (Pow): a constant base of Pow is not supported"
    axis0 = one("ReduceSum", {"x": [4, 8]}, {"y": [1, 8]}, {"a": np.array([0])}, name="r")
    assert lowering_error(axis0) == ("node 'r' (ReduceSum): only the last axis can be reduced or normalized (got "
                                     "axes [0] of a rank-2 tensor)")
    gather = model([helper.make_node("Gather", ["table", "ids"], ["y"], name="embed")], {"ids": [4]},
                   {"y": [4, 8]}, {"table": np.zeros((10, 8), np.float32)})
    gather.graph.input[0].type.tensor_type.elem_type = 7  # int64 token ids
    assert lowering_error(gather) == ("node 'embed' (Gather): the integer input 'ids' is read at run time; give its "
                                      "values with from_onnx(..., values={'ids': array})")


def test_tile_sizes_that_do_not_divide():
    m = one("MatMul", {"x": [4, 8]}, {"y": [4, 6]}, {"w": np.zeros((8, 6), np.float32)}, name="mm")
    assert lowering_error(m, tiling={"tile_n": 4}) == "node 'mm' (MatMul): tile_n 4 does not divide N = 6"
    assert lowering_error(m, tiling={"tile_m": 3}) == "tile_m 3 does not divide the 4 rows of 'x'"
