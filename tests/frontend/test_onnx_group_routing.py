"""DeepSeek-V3's sigmoid group-limited top-k router as exporters spell it (issue 43): Sigmoid scores + correction
bias, reshaped into n_group groups, each group's top-2 summed, TopK over the groups, a ScatterElements / Expand
mask, Where, TopK over the experts, the unbiased scores gathered, renormalized and scaled by
routed_scaling_factor, then the experts written densely. The front end recognises it as one MoE node (the
pattern named in ``params["patterns"]``), routes on the router's own choice (teacher) and matches onnx's reference
evaluator; its choice equals stepsim.workloads.group_routing's DeepSeek gate; a malformed router is one line."""

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from stepsim.base.errors import FrontendError
from stepsim.frontend import from_onnx
from stepsim.frontend.check import check_outputs
from stepsim.simulation.simulate import simulate
from stepsim.workloads.group_routing import GateConfig, deepseek_gate_reference

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(Path(__file__).parent))
from onnx_models import _Builder  # noqa: E402

T, D, F, E, K, G, KG, RSF = 16, 32, 48, 8, 2, 4, 2, 2.5


def deepseek_moe(biased_weights=False):
    """y = x + MoE(x), x [T, D], routed by DeepSeek-V3's gate (module docstring). ``biased_weights`` gathers the
    weights from the biased choice scores (a wrong export)."""
    b = _Builder(7)
    b.const("last", [-1], np.int64)
    b.const("two", [2], np.int64)
    b.const("kg", [KG], np.int64)
    b.const("k", [K], np.int64)
    b.const("groups", [T, G, E // G], np.int64)
    b.const("flat", [T, E], np.int64)
    b.const("zeros", np.zeros((T, G)), np.float32)
    b.const("ones", np.ones((T, KG)), np.float32)
    b.const("zero", 0.0)
    b.const("eps", 1e-20)
    b.const("rsf", RSF)
    b.init["bias"] = (np.random.default_rng(8).standard_normal(E) * 0.1).astype(np.float32)
    s = b.op("Sigmoid", [b.op("MatMul", ["x", b.w("router", (D, E))], "logits")], "scores")
    choice = b.op("Add", [s, "bias"], "choice")
    b.nodes.append(helper.make_node("TopK", [b.op("Reshape", [choice, "groups"], "grouped"), "two"],
                                    ["top2", "top2_i"], name="group_top2", axis=-1))
    gs = b.op("ReduceSum", ["top2", "last"], "group_scores", keepdims=0)
    b.nodes.append(helper.make_node("TopK", [gs, "kg"], ["kept_v", "kept"], name="group_topk", axis=-1))
    gm = b.op("ScatterElements", ["zeros", "kept", "ones"], "group_mask", axis=1)
    sm = b.op("Reshape", [b.op("Expand", [b.op("Unsqueeze", [gm, "last"], "gm3"), "groups"], "gm_e"), "flat"],
              "score_mask")
    hidden = b.op("Not", [b.op("Cast", [sm], "sm_b", to=TensorProto.BOOL)], "hidden")
    masked = b.op("Where", [hidden, "zero", choice], "masked")
    b.nodes.append(helper.make_node("TopK", [masked, "k"], ["topv", "topi"], name="expert_topk", axis=-1))
    gathered = b.op("GatherElements", [choice if biased_weights else s, "topi"], "topw", axis=1)
    den = b.op("Add", [b.op("ReduceSum", [gathered, "last"], "topw_sum", keepdims=1), "eps"], "topw_den")
    weights = b.op("Mul", [b.op("Div", [gathered, den], "topw_norm"), "rsf"], "weights")
    acc = None
    for e in range(E):
        q = f"e{e}"
        hit = b.op("Cast", [b.op("Equal", ["topi", b.const(f"{q}.id", e, np.int64)], f"{q}.eq")], f"{q}.hit",
                   to=TensorProto.FLOAT)
        w = b.op("ReduceSum", [b.op("Mul", [weights, hit], f"{q}.wk"), "last"], f"{q}.w", keepdims=1)
        gate = b.op("MatMul", ["x", b.w(f"{q}.w_gate", (D, F))], f"{q}.gate")
        silu = b.op("Mul", [gate, b.op("Sigmoid", [gate], f"{q}.sg")], f"{q}.silu")
        up = b.op("MatMul", ["x", b.w(f"{q}.w_up", (D, F))], f"{q}.up")
        down = b.op("MatMul", [b.op("Mul", [silu, up], f"{q}.z"), b.w(f"{q}.w_down", (F, D))], f"{q}.down")
        out = b.op("Mul", [down, w], f"{q}.out")
        acc = out if acc is None else b.op("Add", [acc, out], f"{q}.acc")
    b.op("Add", ["x", acc], "y")
    graph = helper.make_graph(b.nodes, "deepseek_moe", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [T, D])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [T, D])],
                              [onnx.numpy_helper.from_array(v, k) for k, v in b.init.items()])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    m.ir_version = 10
    onnx.checker.check_model(m)
    return m, b.init


def test_group_limited_router_is_one_moe_node_and_matches_the_reference():
    m, init = deepseek_moe()
    w = from_onnx(m, routing="teacher")  # the router's own choice on seeded inputs (what the CLI does)
    assert w.params["patterns"] == {"expert_topk": "sigmoid group-limited top-2 routing (4 groups, top 2 kept, "
                                                   "scale 2.5)"}
    assert any(op.group == ("node", "expert_topk.moe") for op in w.graph)
    # the selection (bias, groups, masks, the three TopKs) is the routing: none of it is lowered
    lowered = {op.group[1] for op in w.graph if isinstance(op.group, tuple)}
    assert not lowered & {"choice", "grouped", "group_top2", "group_topk", "masked", "expert_topk", "topw"}
    r = simulate(w, functional=True)
    (c,) = check_outputs(w, r.inputs, r.outputs).values()  # onnx.reference.ReferenceEvaluator on the same x
    print(f"deepseek moe: max rel error {c.error:.2e} (tolerance {c.tolerance:.2e})")
    assert c.passed
    # the experts routed are DeepSeek's gate (stepsim.workloads.group_routing's reference) on the same logits
    x = r.inputs["x"]
    ids, _ = deepseek_gate_reference(x.astype(np.float64) @ init["router"], GateConfig(E, K, G, KG, "sigmoid", RSF),
                                     init["bias"])
    hot = np.zeros((T, E), bool)
    hot[np.arange(T)[:, None], ids] = True
    mask = next(op for op in w.graph if getattr(op, "tensor", None) is not None
                and op.tensor.name == "expert_topk.moe.mask")
    assert (mask.tensor.data.astype(bool) == hot).all()
    # the groups matter here: without them (n_group 1) some token would pick another expert
    plain, _ = deepseek_gate_reference(x.astype(np.float64) @ init["router"], GateConfig(E, K, 1, 1, "sigmoid", RSF),
                                       init["bias"])
    assert sorted(map(sorted, plain.tolist())) != sorted(map(sorted, ids.tolist()))


def test_biased_weights_are_one_line_naming_the_gather():
    with pytest.raises(FrontendError) as err:
        from_onnx(deepseek_moe(biased_weights=True)[0])
    assert str(err.value) == ("node 'topw' (GatherElements): the routing weights must be gathered from the unbiased "
                              "sigmoid scores 'scores', got 'choice' (scores + e_score_correction_bias, which only "
                              "chooses the experts)")


@pytest.mark.parametrize("fuse, cycles, off_chip", [(True, 1_261, 169_472), (False, 2_260, 179_712)])
def test_fused_and_spilled_runs_check_and_cost(fuse, cycles, off_chip):
    w = from_onnx(deepseek_moe()[0], fuse=fuse, routing="teacher")  # one-token tiles (routing)
    r = simulate(w, functional=True, seed=1)
    assert all(c.passed for c in check_outputs(w, r.inputs, r.outputs).values())
    assert (simulate(w).cycles, w.metrics()["off_chip_bytes"]) == (cycles, off_chip)
