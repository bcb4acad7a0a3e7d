"""The functional check of a lowered model: its stored outputs against onnx's reference evaluator on the same
inputs, within the fp32 tolerance of :func:`stepsim.workloads.reference.tolerance_for` whose ``n`` is the
model's longest chain of fp32 operations (:func:`chain_length`).

A model stored in bf16 is lowered as stepsim runs bf16 layers: bf16 values loaded into fp32 tiles, fp32 compute,
fp32 stores. Its reference is therefore the model evaluated in fp32 on the same bf16 values (initializers and
inputs upcast, casts between float types kept in fp32), the first of ../shared/design/FRONTEND.md's two bf16
oracles; the outputs are fp32, so the fp32 rule applies."""

from __future__ import annotations

import numpy as np

from stepsim.frontend.ir import Model, scalar
from stepsim.frontend.load import onnx_module
from stepsim.workloads.reference import OutputCheck, max_rel_error, tolerance_for

#: fp32 operations per element of each elementwise op (Pointwise FLOPs: a transcendental counts 4, sigmoid and
#: tanh 7, SiLU 8, GELU 8 (erf form) or 14 (tanh form)); binary ops count 1, Pow 4 (1 for a square)
_ELEMENTWISE = {"Relu": 1, "Sigmoid": 7, "Tanh": 7, "Erf": 4, "Sqrt": 4, "Neg": 1, "Reciprocal": 1, "Exp": 4,
                "Swish": 8, "Add": 1, "Sub": 1, "Mul": 1, "Div": 1, "Max": 0, "Min": 0}


def node_length(model: Model, node) -> int:
    """The fp32 operations ``node`` chains onto its inputs' (see the module docstring)."""
    op, x = node.op_type, node.inputs[0] if node.inputs else ""
    n = model.shapes[x][-1] if x and model.shapes.get(x) else 1
    if op in ("MatMul", "Gemm"):
        k = model.shapes[x][-1]
        return k + (len(node.inputs) > 2 and bool(node.inputs[2])) + (node.attrs.get("alpha", 1.0) != 1.0)
    if op in ("ReduceSum", "ReduceMean"):
        return n + (op == "ReduceMean")
    if op == "Softmax":
        return n + 6  # subtract the max, exp (4), sum, divide
    if op == "SinkSoftmax":
        return n + 12  # the max with the sink, subtract, exp (4), sum, plus the sink's exp (5), divide
    if op == "LayerNormalization":
        return 2 * n + 13
    if op in ("RMSNormalization", "SimplifiedLayerNormalization"):
        return n + 11
    if op == "Gelu":
        return 8 if node.attrs.get("approximate", "none") in ("none", b"none") else 14
    if op == "MoE":  # the expert SwiGLU (K = D, SiLU, product, K = F), its gate, the sum over k
        f = model.shapes[node.attrs["experts"][0]["gate"]][1]
        return n + 8 + 1 + f + 1 + node.attrs["k"] + (node.attrs.get("scale", 1.0) != 1.0)
    if op == "Pow":
        c = model.consts.get(node.inputs[1])
        return 1 if c is not None and scalar(c) == 2.0 else 4
    return _ELEMENTWISE.get(op, 0)


def chain_length(model: Model) -> dict:
    """``{value: n}``: the longest chain of fp32 operations from the inputs to each value."""
    depth = {v: 0 for v in model.inputs}
    for node in model.nodes:
        d = max((depth.get(v, 0) for v in node.inputs if v), default=0) + node_length(model, node)
        for v in node.outputs:
            depth[v] = d
    return depth


def fp32_copy(proto):
    """``proto`` with its bf16 / fp16 initializers, inputs and outputs upcast to fp32 and its casts to a float type
    made casts to fp32 (the values are unchanged: every bf16 / fp16 value is an fp32 value)."""
    onnx = onnx_module()
    m = type(proto).FromString(proto.SerializeToString())
    low = (onnx.TensorProto.BFLOAT16, onnx.TensorProto.FLOAT16)
    for i, t in enumerate(m.graph.initializer):
        if t.data_type in low:
            a = onnx.numpy_helper.to_array(t).astype(np.float32)
            m.graph.initializer[i].CopyFrom(onnx.numpy_helper.from_array(a, t.name))
    for vi in list(m.graph.input) + list(m.graph.output) + list(m.graph.value_info):
        if vi.type.tensor_type.elem_type in low:
            vi.type.tensor_type.elem_type = onnx.TensorProto.FLOAT
    for n in m.graph.node:
        for a in n.attribute:
            if n.op_type == "Cast" and a.name == "to" and a.i in low:
                a.i = onnx.TensorProto.FLOAT
    return m


def reference_outputs(proto, inputs: dict) -> dict:
    """The model's outputs on ``inputs`` (graph inputs by name) from onnx's reference evaluator."""
    from onnx.reference import ReferenceEvaluator

    names = [o.name for o in proto.graph.output]
    initializers = {t.name for t in proto.graph.initializer}
    onnx = onnx_module()
    feeds = {}
    for i in proto.graph.input:
        if i.name not in initializers:
            dtype = onnx.helper.tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type)
            feeds[i.name] = np.asarray(inputs[i.name], dtype).reshape([d.dim_value for d in i.type.tensor_type.shape.dim])
    return dict(zip(names, ReferenceEvaluator(proto).run(names, feeds)))


def check_reference_fits(workload, available: int | None = None) -> None:
    """FrontendError (one line) when onnx's reference evaluator would need more memory than is available for the
    model's values (``report.reference_bytes``: every value of the model, as written, at once); called before the
    functional run whose outputs it checks, so that nothing long runs first. ``available``: bytes (default: the
    machine's, :func:`stepsim.kernels.run_size.available_memory`)."""
    from stepsim.frontend.inputs import check_evaluation
    from stepsim.kernels.run_size import available_memory

    report = workload.frontend
    check_evaluation(f"model {report.proto.graph.name!r}: the check's reference (onnx's evaluator)",
                     report.reference_bytes, available_memory() if available is None else available,
                     "check a model with smaller dims (the timing run needs no reference: drop --check)")


def check_outputs(workload, inputs: dict, outputs: dict) -> dict:
    """``{output: OutputCheck}`` of a functional run of a lowered model (see the module docstring)."""
    report = workload.frontend
    check_reference_fits(workload)
    expected = reference_outputs(fp32_copy(report.proto), {**inputs, **report.bound})
    checks = {}
    for name, ref in expected.items():
        tol = tolerance_for("fp32", report.chain_length[name])  # stepsim stores fp32 outputs (module docstring)
        err = max_rel_error(np.asarray(outputs[name]).reshape(ref.shape), ref)
        checks[name] = OutputCheck(name, err, tol, err <= tol)
    return checks
