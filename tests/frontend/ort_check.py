"""Helpers of the front-end tests: author small ONNX models with onnx.helper and compare stepsim's functional
run with onnxruntime (the oracle, graph optimizations off so it runs the nodes as written)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from stepsim.frontend import from_onnx
from stepsim.simulation.simulate import simulate
from stepsim.workloads.reference import max_rel_error, tolerance_for

F = TensorProto.FLOAT


def model(nodes, inputs: dict, outputs: dict, initializers: dict | None = None, opset: int = 18, name="m"):
    """An ONNX model: ``inputs`` / ``outputs`` map names to shapes (fp32), ``initializers`` names to arrays."""
    graph = helper.make_graph(
        nodes, name, [helper.make_tensor_value_info(k, F, s) for k, s in inputs.items()],
        [helper.make_tensor_value_info(k, F, s) for k, s in outputs.items()],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in (initializers or {}).items()])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 10  # what onnxruntime 1.17+ reads
    onnx.checker.check_model(m)
    return m


def ort_run(m, feeds: dict) -> dict:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feeds)))


def check(m, feeds: dict, reduction_length: int, **kw):
    """Lower ``m``, run it in functional mode and onnxruntime on ``feeds``; assert every output is within the
    fp32 tolerance for ``reduction_length`` (stepsim.workloads.reference.tolerance_for). Returns the workload,
    the run and the errors."""
    w = from_onnx(m, **kw)
    r = simulate(w, functional=True, inputs=feeds)
    want = ort_run(m, feeds)
    tol = tolerance_for("fp32", reduction_length)
    errors = {}
    for name, ref in want.items():
        got = r.outputs[name].reshape(ref.shape)
        errors[name] = max_rel_error(got, ref)
        print(f"{m.graph.name}/{name}: max rel error {errors[name]:.2e} (tolerance {tol:.2e})")
        assert errors[name] <= tol, (name, errors[name], tol)
    return w, r, errors


def rand(shape, seed=0, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)
