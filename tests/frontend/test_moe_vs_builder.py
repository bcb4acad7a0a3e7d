"""The hand-written MoE layer and an ONNX export of the same layer (issue 33), on the same routing trace (a
synthetic trace file, read as ``stepsim run moe --trace`` reads it): a Qwen3-MoE-style block (router, TopK,
renormalized gates, per-expert SwiGLU, weighted sum) lowered by the front end, against ``build_moe`` with the same
dims (dynamic tiling and one F tile, as the front end packs each expert's tokens into one tile and multiplies whole
weights).

Every metric difference is attributed to named operators with exact numbers: each active expert's FLOPs are
identical; its weights are the same three D x F matrices read once, in fp32 in the export (ONNX's TopK takes no
bf16) and bf16 in the builder (likewise x); the export computes the gates on chip (the router MatMul and Softmax,
the trace's mask, each expert's one-hot gate pick) where the builder loads a routing-weights tensor; its expert
products keep MapAccum accumulators where the builder's single-chunk Maps repeat the token tile; the builder keeps
idle experts' weight tiles (not active), the export makes no operator for them. The cycles (1,015 and 1,225)
follow each graph's gate path, pinned operator by operator on both critical paths."""

import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from stepsim.frontend import from_onnx
from stepsim.models.presets import moe_model
from stepsim.simulation.simulate import simulate
from stepsim.trace_io.load import load_routing
from stepsim.trace_io.synthetic import synthetic_routing
from stepsim.trace_io.writers import write_trace
from stepsim.workloads.moe.build import build_moe

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from onnx_models import _Builder, _moe_ffn  # noqa: E402

T, D, F, E, K = 16, 32, 64, 8, 2
NODE = "moe.topk.moe"
BF16, FP32 = 2, 4  # bytes per element


def moe_onnx() -> onnx.ModelProto:
    """y = MoE(x), x [T, D], in fp32 (ONNX's TopK takes no bf16, so the export cannot store as the builder does)."""
    b = _Builder(3)
    y = _moe_ffn(b, "moe", "x", D, E, K, F)
    init = [numpy_helper.from_array(v, k) for k, v in b.init.items()]
    graph = helper.make_graph(b.nodes, "moe_layer", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [T, D])],
                              [helper.make_tensor_value_info(y, TensorProto.FLOAT, [T, D])], init)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    m.ir_version = 10
    return m


def trace_file(tmp_path) -> Path:
    path = tmp_path / "routing.arrow"
    write_trace(synthetic_routing(T, E, K, seed=0), path)
    return path


def lowered(tmp_path):
    routing = load_routing(trace_file(tmp_path), E)
    hand = build_moe(moe_model("custom", hidden=D, intermediate=F, experts=E, top_k=K), routing, tiling="dynamic",
                     tile_f=F)
    ours = from_onnx(moe_onnx(), routing=routing, hardware=hand.hardware, channel_depth=hand.channel_depth,
                     tiling={"compute_bw": hand.params["compute_bw"]})
    return routing, hand, ours


def _add(roles, role, v):
    roles.setdefault(role, [0, 0, 0])
    for i, x in enumerate((v.off_chip_bytes, v.on_chip_bytes, v.flops)):
        roles[role][i] += x


def hand_roles(w) -> dict:
    """role -> [off-chip bytes, on-chip bytes, FLOPs] of the builder's operators."""
    roles, vals = {}, w.op_values()
    for op in w.graph:
        v = vals[op.name]
        if not (v.off_chip_bytes or v.on_chip_bytes or v.flops):
            continue
        tensor = getattr(getattr(op, "tensor", None), "name", None)
        if op.group is not None and op.group[0] == "expert":
            role = f"expert {op.group[1]} {'weights' if op.kind == 'LinearOffChipLoad' else 'FFN'}"
        else:
            role = {"x": "x", "routing_weights": "gates"}.get(tensor, {"Accum": "sum", "LinearOffChipStore": "y"}.get(
                op.kind))
        _add(roles, role, v)
    return roles


def onnx_roles(w) -> dict:
    """The same roles for the lowered export: the experts' operators follow their pack in graph order; an
    expert's gate pick is its one-hot column's load, the MatMul reading it and the Accum packing its result."""
    roles, vals = {}, w.op_values()
    pick, readers = set(), w.graph.consumers()
    for op in w.graph:
        if op.kind == "LinearOffChipLoad" and ".onehot" in op.tensor.name:
            ((mm, _),) = readers[op.id, 0]
            ((acc, _),) = readers[mm.id, 0]
            pick |= {op.name, mm.name, acc.name}
    expert = None
    for op in w.graph:
        v = vals[op.name]
        if op.name.startswith(f"{NODE}.pack"):
            expert = int(op.name.removeprefix(f"{NODE}.pack"))
        if not (v.off_chip_bytes or v.on_chip_bytes or v.flops):
            continue
        tensor = getattr(getattr(op, "tensor", None), "name", "")
        if tensor == "x":
            role = "x"
        elif op.group in (("node", "moe.logits"), ("node", "moe.probs")):
            role = "router"
        elif op.name == f"{NODE}.sum":
            role = "sum"
        elif op.kind == "LinearOffChipStore":
            role = "y"
        elif expert is None:
            role = "gates"  # the trace's mask times the probabilities, renormalized, before the first expert
        elif op.name in pick:
            role = f"expert {expert} gate pick"
        else:
            role = f"expert {expert} {'weights' if op.kind == 'LinearOffChipLoad' else 'FFN'}"
        _add(roles, role, v)
    return roles


def test_every_metric_difference_is_attributed_to_named_operators(tmp_path):
    routing, hand, ours = lowered(tmp_path)
    counts = np.bincount(routing.ravel(), minlength=E).tolist()
    assert counts == [7, 5, 0, 0, 3, 10, 2, 5] and routing.shape == (T, K)  # experts 2 and 3 idle
    h, o = hand_roles(hand), onnx_roles(ours)
    mh, mo = hand.metrics(), ours.metrics()
    # the roles cover every operator with a cost: they sum to the metrics (the builder keeps the idle experts'
    # weight tiles, counted in on_chip_bytes but not in on_chip_bytes_active; the export makes no idle operator)
    assert [sum(r[i] for r in h.values()) for i in range(3)] == [mh["off_chip_bytes"], mh["on_chip_bytes"],
                                                                 mh["graph_flops"]]
    assert [sum(r[i] for r in o.values()) for i in range(3)] == [mo["off_chip_bytes"], mo["on_chip_bytes"],
                                                                 mo["graph_flops"]]
    assert mh["on_chip_bytes"] - mh["on_chip_bytes_active"] == 2 * 3 * D * F * BF16
    assert mo["on_chip_bytes"] == mo["on_chip_bytes_active"]
    want_h, want_o = {}, {}
    for e, c in enumerate(counts):
        w = 3 * D * F  # gate, up, down elements, read once
        want_h[f"expert {e} weights"] = [w * BF16 if c else 0, w * BF16, 0]
        if not c:
            continue
        want_o[f"expert {e} weights"] = [w * FP32, w * FP32, 0]
        # the same FLOPs: gate and up 2cDF each, down 2cFD, SiLU 8cF (its FLOP count), the product cF, scale cD
        flops = 2 * c * D * F * 3 + 8 * c * F + c * F + c * D
        # builder: the packed tile, its RepeatStatic over the one F tile, down's accumulator [c, D]
        want_h[f"expert {e} FFN"] = [0, 3 * c * D * FP32, flops]
        # export: the packed tile, gate's and up's MapAccum accumulators [c, F], down's [c, D]
        want_o[f"expert {e} FFN"] = [0, 2 * c * D * FP32 + 2 * c * F * FP32, flops]
        # the export's gate pick: a one-hot column [E, 1] read per token, a [1, E] x [E, 1] MatMul per token,
        # the Accum packing the expert's c gates
        want_o[f"expert {e} gate pick"] = [c * E * FP32, E * FP32 + c * FP32, 2 * c * E]
    shared = {"sum": [0, D * FP32, T * K * D], "y": [T * D * FP32, D * FP32, 0]}  # the Accum of k rows a token; the store
    want_h |= {"x": [T * D * BF16, D * BF16, 0], "gates": [T * K * BF16, BF16, 0], **shared}  # gates loaded
    want_o |= {"x": [T * D * FP32, D * FP32, 0], **shared,
               # router: its weights [D, E] read per one-token row tile, its tile, the MatMul's accumulator row;
               # 2TDE FLOPs and the Softmax's 8 per element (RowMax, Sub, Exp (4), RowSum, Div)
               "router": [T * D * E * FP32, D * E * FP32 + E * FP32, 2 * T * D * E + 8 * T * E],
               # gates computed: the trace's mask [T, E] read, times the probabilities, renormalized (3 per element)
               "gates": [T * E * FP32, E * FP32, 3 * T * E]}
    assert h == want_h
    assert o == want_o
    assert (mh["off_chip_bytes"], mo["off_chip_bytes"]) == (76864, 169472)
    assert (mh["on_chip_bytes_active"], mo["on_chip_bytes"]) == (86338, 173824)
    assert (mh["graph_flops"], mo["graph_flops"]) == (413696, 423808)


def clocks(w) -> dict:
    """Unit name -> its final clock (the cycle of its last event) in a timing run of ``w``."""
    r = simulate(w)
    return dict(zip(r.unit_names, (int(c) for c in r.unit_counters[:, 4]))) | {"cycles": r.cycles}


def test_cycles_follow_the_gate_path(tmp_path):
    """Where the cycles go, operator by operator (each operator's last event): in both graphs the experts finish
    long before the end (543 and 743: the export's expert weights are fp32, twice the bytes) and the last cycles
    are the gate path's. The builder streams its routing weights as 32 one-element loads (the last lands at 984),
    then its Partition, Reassemble, sum and the store of the last row follow within 31 cycles: its store overlaps
    the loads. The export needs each token's gates from the router: the router's [D, E] weights are re-read per
    one-token row tile (16 reads, the last at 849), then its MatMul (868), the Softmax, mask and renormalization
    and the gates' Partition (890); every scaled row waits for its gate, so the combine, the sum and the store
    (which waited 904 cycles for input) drain the 16 rows after it, the store's last at 1224."""
    _, hand, ours = lowered(tmp_path)
    h, o = clocks(hand), clocks(ours)

    def named(w, test):
        (op,) = [op for op in w.graph if test(op)]
        return op.name

    def tensor(op):
        return getattr(getattr(op, "tensor", None), "name", None)

    experts_h = max(h[op.name] for op in hand.graph if op.group is not None and op.kind == "MapAccum")
    experts_o = max(o[op.name] for op in ours.graph if op.kind == "MapAccum" and op.group == ("node", NODE))
    assert (experts_h, experts_o) == (543, 743)
    hand_path = [named(hand, lambda op: tensor(op) == "routing_weights"),
                 [op.name for op in hand.graph if op.kind == "Partition"][-1],
                 named(hand, lambda op: op.kind == "Reassemble"),
                 [op.name for op in hand.graph if op.kind == "Accum"][-1],
                 named(hand, lambda op: op.kind == "LinearOffChipStore")]
    ours_path = [named(ours, lambda op: tensor(op) == "moe.router"),
                 named(ours, lambda op: op.kind == "MapAccum" and op.group == ("node", "moe.logits")),
                 f"{NODE}.route_gates", f"{NODE}.combine", f"{NODE}.sum",
                 named(ours, lambda op: op.kind == "LinearOffChipStore")]
    assert [h[n] for n in hand_path] + [h["cycles"]] == [984, 987, 991, 993, 1014, 1015]
    assert [o[n] for n in ours_path] + [o["cycles"]] == [849, 868, 890, 1148, 1185, 1224, 1225]
