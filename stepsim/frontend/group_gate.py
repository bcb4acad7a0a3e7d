"""DeepSeek-V3's sigmoid group-limited router as exporters spell it (issue 43), recognised for the MoE pattern
(:mod:`stepsim.frontend.moe`).

transformers' ``DeepseekV3MoE.route_tokens_to_experts`` exported: ``s = Sigmoid(x @ W_r)``; the choice scores
``b = s + e_score_correction_bias``; ``Reshape(b, [T, n_group, E / n_group])``, ``TopK(.., 2)``, ``ReduceSum``
(each group's two best), ``TopK(.., topk_group)`` over the groups, a ``ScatterElements`` / ``Expand`` /
``Reshape`` mask of the kept groups' experts, ``Where`` (masked_fill) of the others; ``TopK(.., top_k)`` of the
masked choice scores gives the experts; their weights are ``GatherElements(s, indices)`` (the *unbiased* scores),
divided by their ``ReduceSum`` (``+ 1e-20``) and multiplied by ``routed_scaling_factor``.

Which experts are picked is the routing (a trace, or the model's own choice evaluated by onnx's reference
evaluator: teacher routing), so the selection nodes go; the MoE node's gates are ``s`` at the picked experts,
renormalised and scaled on chip (:func:`stepsim.frontend.moe.emit_moe`).
"""

from __future__ import annotations

from dataclasses import dataclass

from stepsim.base.errors import FrontendError
from stepsim.frontend.ir import Model, Node, scalar


@dataclass(frozen=True)
class Gate:
    """What the MoE node takes from a recognised router: ``probs`` (the unbiased sigmoid scores), ``gates_of``
    (the value the experts' one-hot picks multiply), ``normalize``, ``scale`` (``routed_scaling_factor``),
    ``drop`` (names of the router nodes that go), ``n_group``, ``topk_group`` and the ``GatherElements`` node."""

    probs: str
    gates_of: str
    normalize: bool
    scale: float
    drop: frozenset
    n_group: int
    topk_group: int
    gather: str

    def describe(self, k: int) -> str:
        return (f"sigmoid group-limited top-{k} routing ({self.n_group} groups, top {self.topk_group} kept, "
                f"scale {self.scale:g})")


def _one(readers, v, op_type):
    r = [n for n in readers.get(v, []) if n.op_type == op_type]
    return r[0] if len(r) == 1 else None


def match_gate(model: Model, topk: Node, producers: dict, readers: dict) -> Gate | None:
    """The :class:`Gate` whose expert choice is ``topk`` (module docstring), or None when ``topk``'s indices are
    not gathered into routing weights; FrontendError naming the node for a router that gathers its weights from
    the biased choice scores."""
    if len(topk.outputs) != 2:
        return None
    indices = topk.outputs[1]
    gather = _one(readers, indices, "GatherElements")
    if gather is None or gather.inputs[1] != indices:
        return None
    s = gather.inputs[0]
    sig = producers.get(s)
    if sig is not None and sig.op_type == "Add":  # s + bias: the choice scores, not the weights'
        inner = next((producers.get(v) for v in sig.inputs if producers.get(v) is not None
                      and producers[v].op_type == "Sigmoid"), None)
        if inner is not None:
            raise FrontendError(f"{gather.describe()}: the routing weights must be gathered from the unbiased "
                                f"sigmoid scores {inner.outputs[0]!r}, got {s!r} (scores + e_score_correction_bias,"
                                f" which only chooses the experts)")
    if sig is None or sig.op_type != "Sigmoid":
        return None
    drop = {topk.name, gather.name}
    gates_of, normalize = gather.outputs[0], False
    red = _one(readers, gates_of, "ReduceSum")
    div = _one(readers, gates_of, "Div")
    if red is not None and div is not None and div.inputs[0] == gates_of:
        den = producers.get(div.inputs[1])
        eps = den if den is not None and den.op_type == "Add" and red.outputs[0] in den.inputs else None
        if div.inputs[1] == red.outputs[0] or eps is not None:
            normalize, gates_of = True, div.outputs[0]
            drop |= {red.name, div.name} | ({eps.name} if eps is not None else set())
    scale = 1.0
    mul = _one(readers, gates_of, "Mul")
    if mul is not None:
        c = next((model.consts[v] for v in mul.inputs if v != gates_of and model.is_const(v)), None)
        if c is not None and scalar(c) is not None:
            scale, gates_of = scalar(c), mul.outputs[0]
            drop.add(mul.name)
    # the selection: every node between the sigmoid scores and the expert TopK
    selection, frontier = [], [topk.inputs[0]]
    while frontier:
        v = frontier.pop()
        n = producers.get(v)
        if v == s or n is None or n.name in {m.name for m in selection}:
            continue
        selection.append(n)
        frontier += [u for u in n.inputs if u and not model.is_const(u)]
    drop |= {n.name for n in selection}
    inside = drop | {sig.name}
    for n in selection + [gather]:
        for v in n.outputs:
            if v and v != gates_of and (v in model.outputs or any(r.name not in inside for r in readers.get(v, [])
                                                                 if r.op_type != "Equal")):
                return None  # a selection value read elsewhere: not this pattern
    groups = [n for n in selection if n.op_type == "TopK" and n.name != topk.name]
    shaped = [n for n in selection if n.op_type == "Reshape" and len(model.shapes[n.outputs[0]]) == 3]
    n_group, topk_group = 1, 1
    if shaped and len(groups) == 2:
        n_group = model.shapes[shaped[0].outputs[0]][1]
        last = max(groups, key=lambda n: [m.name for m in model.nodes].index(n.name))
        topk_group = int(scalar(model.consts[last.inputs[1]]))
    return Gate(s, gates_of, normalize, scale, frozenset(drop), n_group, topk_group, gather.name)
