"""A bf16 model (issue 33): initializers and inputs stored as bfloat16 load as 2-byte elements into fp32 tiles
(compute and stores fp32: stepsim's bf16 layers, the artifact's accounting), checked against the model evaluated in
fp32 on the same bf16 values (stepsim.frontend.check; onnxruntime's CPU provider has no bf16 kernels) within the
fp32 tolerance, and against onnx's reference evaluator running every op in bf16 by FRONTEND.md's bf16 criterion
(elementwise ``|sim - ref| <= 1e-2 max|ref| + 2e-2 |ref|`` and cosine >= 0.999)."""

import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from stepsim.frontend import from_onnx
from stepsim.frontend.check import check_outputs
from stepsim.simulation.simulate import simulate
from stepsim.workloads.reference import tolerance_for

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from onnx_blocks import BLOCKS  # noqa: E402

B, S, D, F = 2, 8, 64, 128


def to_bf16(m: onnx.ModelProto) -> onnx.ModelProto:
    """The model with every float initializer, input and output in bfloat16."""
    m = onnx.ModelProto.FromString(m.SerializeToString())
    for i, t in enumerate(m.graph.initializer):
        if t.data_type == TensorProto.FLOAT:
            a = numpy_helper.to_array(t).astype(ml_dtypes.bfloat16)
            m.graph.initializer[i].CopyFrom(numpy_helper.from_array(a, t.name))
    for vi in list(m.graph.input) + list(m.graph.output):
        if vi.type.tensor_type.elem_type == TensorProto.FLOAT:
            vi.type.tensor_type.elem_type = TensorProto.BFLOAT16
    onnx.checker.check_model(m)
    return m


def test_bf16_llama_block():
    m = to_bf16(BLOCKS["llama"](B, S, D, F))
    w = from_onnx(m)
    x = np.random.default_rng(0).standard_normal((B, S, D)).astype(ml_dtypes.bfloat16).astype(np.float32)
    r = simulate(w, functional=True, inputs={"x": x})
    (c,) = check_outputs(w, r.inputs, r.outputs).values()
    print(f"bf16 llama block: max rel error {c.error:.2e} against fp32 on the bf16 values (tolerance "
          f"{c.tolerance:.2e})")
    assert c.passed and c.tolerance == tolerance_for("fp32", w.frontend.chain_length["y"])
    from onnx.reference import ReferenceEvaluator

    ref = np.asarray(ReferenceEvaluator(m).run(["y"], {"x": x.astype(ml_dtypes.bfloat16)})[0], np.float64)
    sim = r.outputs["y"].reshape(ref.shape).astype(np.float64)
    cosine = (sim * ref).sum() / np.sqrt((sim * sim).sum() * (ref * ref).sum())
    print(f"bf16 llama block: max rel error {np.abs(sim - ref).max() / np.abs(ref).max():.2e}, cosine "
          f"{cosine:.6f} against every op in bf16")
    assert np.all(np.abs(sim - ref) <= 1e-2 * np.abs(ref).max() + 2e-2 * np.abs(ref)) and cosine >= 0.999
    # x and the weights move 2 bytes an element (each weight once per row block: one here), y 4 (an fp32 store)
    assert w.frontend.tile_m == S
    assert w.metrics()["off_chip_bytes"] == 2 * B * S * D + 2 * (B * S // S) * 3 * D * F + 2 * D + 4 * B * S * D


def test_a_folded_transpose_of_a_bf16_weight_is_read_as_bf16():
    """``MatMul(x, Transpose(W))`` with W a bf16 initializer (an exporter's spelling of ``x W^T``): the folded
    constant is the model's weight, stored bf16 as W is (it was read as fp32: 704 B off chip instead of 512)."""
    w = (np.random.default_rng(0).standard_normal((6, 8)) * 0.3).astype(ml_dtypes.bfloat16)
    bf = TensorProto.BFLOAT16
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Transpose", ["w"], ["wt"], name="wt", perm=[1, 0]),
         onnx.helper.make_node("MatMul", ["x", "wt"], ["y"], name="y")], "t",
        [onnx.helper.make_tensor_value_info("x", bf, [2, 4, 8])],
        [onnx.helper.make_tensor_value_info("y", bf, [2, 4, 6])], [numpy_helper.from_array(w, "w")])
    m = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 18)])
    m.ir_version = 10
    workload = from_onnx(m, tiling={"tile_m": 4})
    r = simulate(workload, functional=True, seed=1)
    assert all(c.passed for c in check_outputs(workload, r.inputs, r.outputs).values())
    dtypes = {op.tensor.name: op.tensor.dtype.name for op in workload.graph if getattr(op, "tensor", None) is not None}
    assert dtypes == {"x": "bf16", "wt": "bf16"}  # the loads (the store of y writes fp32)
    # x (2 x 4 x 8 bf16) once, W^T (8 x 6 bf16) once per row block (2), y (2 x 4 x 6 fp32)
    assert workload.metrics()["off_chip_bytes"] == 2 * 4 * 8 * 2 + 2 * 8 * 6 * 2 + 2 * 4 * 6 * 4 == 512
