"""The MoE pattern (pass 1b) and its STeP lowering: a dense-dispatch Mixture-of-Experts block routed by a trace.

Recognized (the loop-free spelling, as PyTorch exports a Qwen3-MoE-style block written densely): router
``probs = Softmax(x @ W_r)``, ``TopK(probs, k)``, optionally the Qwen3 renormalization ``values / ReduceSum(values)``,
and per expert ``e``: the gate ``w_e = ReduceSum(values * Cast(Equal(indices, e)))`` and a SwiGLU expert
``h_e = (silu(x @ Wg_e) * (x @ Wu_e)) @ Wd_e``, combined as ``Sum_e h_e * w_e`` (an Add chain). The whole block
becomes one ``MoE`` node (inputs ``x`` and ``probs``).

Which experts a token goes to is data dependent; as the hand-written MoE layers do, the lowering takes it as a trace
(``from_onnx(..., routing=[T, k] expert ids)``) and routes sparsely: a Partition sends each token row to its ``k``
experts, each expert packs its tokens into one tile (the dynamic tiling), runs its SwiGLU on it and scales the rows
by their gates, and a Reassemble collects each token's ``k`` results, summed by an Accum. The gates are computed
on chip from the router's probabilities: masked to the trace's experts (a constant mask), renormalized if the model
does, partitioned like the tokens and picked out per expert by a MatMul with a one-hot column. With the trace equal
to the router's own top-k (teacher forcing), the outputs equal the dense graph's.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from math import prod

import numpy as np

from stepsim.base.errors import FrontendError
from stepsim.frontend.emit import Act, Emitter, handles
from stepsim.frontend.group_gate import match_gate
from stepsim.frontend.ir import Model, Node, scalar
from stepsim.frontend.layouts import groups_rows_cols
from stepsim.graph import (
    FP32,
    Accum,
    AccumAdd,
    Div,
    Empty,
    Flatten,
    LinearOffChipLoad,
    Map,
    MapAccum,
    Matmul,
    Mul,
    Partition,
    Promote,
    Reassemble,
    RetileRow,
    RetileStreamify,
    RowSum,
    SelectorSource,
    Silu,
    Sink,
    Tensor,
    Tile,
    Zero,
)


def raise_moe(model: Model) -> Model:
    """``model`` with every recognized MoE block replaced by one ``MoE`` node (module docstring)."""
    producers, readers = model.producer(), model.consumers()
    for topk in [n for n in model.nodes if n.op_type == "TopK"]:
        found = _match(model, topk, producers, readers)
        if found is None:
            continue
        drop, node = found
        first = min(i for i, n in enumerate(model.nodes) if n.name in drop)
        kept = [n for n in model.nodes if n.name not in drop]
        kept.insert(sum(1 for n in model.nodes[:first] if n.name not in drop), node)
        model.nodes = kept
        producers, readers = model.producer(), model.consumers()
    return model


def _only(readers, v):
    r = readers.get(v, [])
    return r[0] if len(r) == 1 else None


def _match(model: Model, topk, producers, readers):
    """``(names of the nodes replaced, the MoE node)`` if ``topk`` heads the pattern, else None."""
    probs = topk.inputs[0]
    soft = producers.get(probs)
    k = model.consts.get(topk.inputs[1]) if len(topk.inputs) > 1 else None
    gate = match_gate(model, topk, producers, readers) if k is not None else None
    if gate is None and (soft is None or soft.op_type != "Softmax" or k is None or len(topk.outputs) != 2):
        return None
    values, indices = topk.outputs
    drop = {topk.name}
    normalize, scale = False, 1.0
    gates_of = values
    div = next((n for n in readers.get(values, []) if n.op_type == "Div" and n.inputs[0] == values), None)
    if gate is not None:  # DeepSeek-V3: sigmoid scores gathered at the experts, renormalized, scaled
        probs, gates_of, normalize, scale = gate.probs, gate.gates_of, gate.normalize, gate.scale
        drop |= gate.drop
        div = None
    if div is not None:  # Qwen3: values / ReduceSum(values)
        den = producers.get(div.inputs[1])
        if den is not None and den.op_type == "ReduceSum" and den.inputs[0] == values and \
                {n.name for n in readers.get(values, [])} == {div.name, den.name}:
            normalize, gates_of = True, div.outputs[0]
            drop |= {div.name, den.name}
    experts = {}
    combine = {}  # expert -> the Mul(h_e, w_e) node
    for eq in readers.get(indices, []):
        if gate is not None and eq.name == gate.gather:
            continue
        if eq.op_type != "Equal":
            return None
        e = scalar(model.consts.get(eq.inputs[1], np.array([]))) if eq.inputs[0] == indices else None
        cast = _only(readers, eq.outputs[0])
        mul = _only(readers, cast.outputs[0]) if cast is not None and cast.op_type == "Cast" else None
        red = _only(readers, mul.outputs[0]) if mul is not None and mul.op_type == "Mul" else None
        use = _only(readers, red.outputs[0]) if red is not None and red.op_type == "ReduceSum" else None
        if e is None or use is None or use.op_type != "Mul" or gates_of not in mul.inputs:
            return None
        h = next(v for v in use.inputs if v != red.outputs[0])
        ffn = _swiglu(model, producers, readers, h)
        if ffn is None:
            return None
        experts[int(e)] = ffn[0]
        combine[int(e)] = use
        drop |= {eq.name, cast.name, mul.name, red.name, use.name} | ffn[1]
    if not experts or sorted(experts) != list(range(len(experts))):
        return None
    # the Add chain summing the experts' scaled outputs
    total = None
    frontier = {u.outputs[0] for u in combine.values()}
    while True:
        step = [n for n in model.nodes if n.op_type == "Add" and set(n.inputs) <= frontier and n.name not in drop]
        if not step:
            break
        for n in step:
            frontier = (frontier - set(n.inputs)) | {n.outputs[0]}
            drop.add(n.name)
            total = n.outputs[0]
    if len(frontier) != 1 or total is None:
        return None
    xs = {ffn["x"] for ffn in experts.values()}
    if len(xs) != 1:
        return None
    (x,) = xs
    node = Node(f"{topk.name}.moe", "MoE", [x, probs], [total],
                {"experts": [experts[e] for e in range(len(experts))], "k": int(scalar(k)), "normalize": normalize,
                 "topk": topk.name, "indices": indices, "scale": scale})
    if gate is not None:
        model.patterns[topk.name] = gate.describe(int(scalar(k)))
    return drop, node


def _swiglu(model: Model, producers, readers, h):
    """``({x, gate, up, down weights}, node names)`` if ``h`` is ``(swish(x @ Wg) * (x @ Wu)) @ Wd``."""
    down = producers.get(h)
    if down is None or down.op_type != "MatMul" or not model.is_const(down.inputs[1]):
        return None
    mul = producers.get(down.inputs[0])
    if mul is None or mul.op_type != "Mul":
        return None
    a, b = (producers.get(v) for v in mul.inputs)
    swish, up = (a, b) if a is not None and a.op_type == "Swish" else (b, a)
    if swish is None or swish.op_type != "Swish" or up is None or up.op_type != "MatMul":
        return None
    gate = producers.get(swish.inputs[0])
    if gate is None or gate.op_type != "MatMul" or gate.inputs[0] != up.inputs[0]:
        return None
    if not (model.is_const(gate.inputs[1]) and model.is_const(up.inputs[1])):
        return None
    names = {down.name, mul.name, swish.name, up.name, gate.name}
    return {"x": gate.inputs[0], "gate": gate.inputs[1], "up": up.inputs[1], "down": down.inputs[1]}, names


def seeded_inputs(model: Model, seed: int) -> dict:
    """Standard normal fp32 values for the model's float graph inputs, each from ``seed`` and its name (the rule
    :func:`stepsim.simulation.simulate.default_inputs` uses for a graph's tensors; bf16-rounded for a bf16 input,
    as it does)."""
    from stepsim.workloads.reference import round_to_bf16

    out = {}
    for name in model.inputs:
        if name not in model.bound:
            rng = np.random.default_rng(np.random.SeedSequence([seed, zlib.crc32(name.encode())]))
            a = rng.standard_normal(model.shapes[name]).astype(np.float32)
            out[name] = round_to_bf16(a) if name in model.bf16 else a
    return out


def router_nodes(proto, outputs: list) -> list:
    """The nodes of ``proto``'s graph that ``outputs`` (value names) depend on, in graph order: what an evaluation
    of the routers needs (the experts after the last router, and the layers after it, are not evaluated)."""
    needed, keep = set(outputs), []
    for n in reversed(proto.graph.node):
        if needed.intersection(n.output):
            keep.append(n)
            needed.update(v for v in n.input if v)
    return keep[::-1]


def teacher_routing(proto, model: Model, feeds: dict) -> dict:
    """``{TopK node: [tokens, k] expert ids}``: the routing the model's own routers choose on ``feeds`` (graph
    inputs, integer ones included), from onnx's reference evaluator (teacher forcing) on the model's fp32 copy
    (a bf16 model's reference, :mod:`stepsim.frontend.check`) cut to the routers' inputs; its memory (every value
    it computes, at once) is checked against the memory available before it starts."""
    from onnx import helper
    from onnx.reference import ReferenceEvaluator

    from stepsim.frontend.check import fp32_copy
    from stepsim.frontend.inputs import check_evaluation, evaluation_bytes
    from stepsim.kernels.run_size import available_memory

    moes = [n for n in model.nodes if n.op_type == "MoE"]
    names = [n.attrs["indices"] for n in moes]
    probe = fp32_copy(proto)
    keep = router_nodes(probe, names)
    values = [*feeds, *(v for n in keep for v in n.output if v)]
    check_evaluation(f"model {model.name!r}: evaluating its routers on seeded inputs (teacher routing)",
                     evaluation_bytes(model, values), available_memory(),
                     "give the routing with a trace (--trace FILE, or from_onnx(..., routing=...))")
    del probe.graph.node[:]
    probe.graph.node.extend(keep)
    del probe.graph.output[:]
    probe.graph.output.extend(helper.make_value_info(v, helper.TypeProto()) for v in names)
    got = ReferenceEvaluator(probe).run(names, feeds)
    return {n.attrs["topk"]: np.asarray(v).reshape(-1, n.attrs["k"]) for n, v in zip(moes, got)}


@dataclass(frozen=True)
class RoutingTrace:
    """A routing trace file as ``from_onnx(..., routing=RoutingTrace(path))`` takes it (``stepsim run model.onnx
    --trace FILE [--iteration I] [--layer L]``), read as the moe workload reads its trace
    (:func:`stepsim.trace_io.load.load_routing`: any format it reads, one (iteration, layer) batch).

    A model with one MoE block reads the batch ``iteration`` / ``layer`` pick (either may be left out when the
    trace holds one value of it); a model with several reads layer ``i`` for its ``i``-th block (graph order), at
    ``iteration``, and ``layer`` must be None."""

    path: str
    iteration: int | None = None
    layer: int | None = None


def routing_from_trace(trace: RoutingTrace, model: Model) -> dict:
    """``{TopK node: [tokens, k] expert ids}`` for the model's MoE blocks from ``trace`` (:class:`RoutingTrace`).

    Raises FrontendError naming the file when the model has no MoE block, when ``layer`` is given for a model
    with several, or when a batch's tokens or top-k differ from its block's; TraceError / ConfigError (from the
    reader) for a file that cannot be read or holds no such batch."""
    from stepsim.trace_io.load import load_routing

    moes = [n for n in model.nodes if n.op_type == "MoE"]
    if not moes:
        raise FrontendError(f"{trace.path}: a routing trace was given but model {model.name!r} has no MoE block "
                            f"(TopK of router probabilities, expert selection, weighted sum)")
    if len(moes) > 1 and trace.layer is not None:
        raise FrontendError(f"{trace.path}: model {model.name!r} has {len(moes)} MoE blocks, which read the trace's "
                            f"layers 0..{len(moes) - 1} in order; --layer picks one layer and applies to a model "
                            f"with one block")
    out = {}
    for i, n in enumerate(moes):
        layer = trace.layer if len(moes) == 1 else i
        r = load_routing(trace.path, len(n.attrs["experts"]), iteration=trace.iteration, layer=layer)
        tokens, k = prod(model.shapes[n.inputs[0]][:-1]), n.attrs["k"]
        if r.shape != (tokens, k):
            at = "" if layer is None else f" layer {layer}"
            raise FrontendError(f"{trace.path}:{at} routes {r.shape[0]} tokens to {r.shape[1]} experts each; "
                                f"node {n.attrs['topk']!r} (TopK) routes {tokens} tokens to {k}")
        out[n.attrs["topk"]] = r
    return out


def check_routing(node, routing, tokens: int, experts: int, k: int) -> np.ndarray:
    """The trace for a MoE node: ``[tokens, k]`` distinct expert ids per token (FrontendError naming the node);
    ``routing`` is that array, or a dict of them by TopK node name (a model with several MoE blocks)."""
    where = f"node {node.attrs['topk']!r} (TopK)"
    if isinstance(routing, dict):
        routing = routing.get(node.attrs["topk"])
    if routing is None:
        raise FrontendError(f"{where}: a MoE block's routing is data dependent; give the trace with "
                            f"from_onnx(..., routing=[{tokens}, {k}] expert ids)")
    r = np.asarray(routing)
    if r.shape != (tokens, k) or not np.issubdtype(r.dtype, np.integer) or r.min() < 0 or r.max() >= experts:
        raise FrontendError(f"{where}: routing must be integers in [0, {experts}) of shape [{tokens}, {k}], got "
                            f"{r.dtype} {list(r.shape)}")
    if any(len(set(row)) != k for row in r.tolist()):
        raise FrontendError(f"{where}: routing repeats an expert within a token")
    return r.astype(np.int64)


# --- emission ------------------------------------------------------------------------------------------------
@handles("MoE")
def emit_moe(e: Emitter, node: Node):
    """The ``MoE`` node as STeP operators (module docstring)."""
    x, probs = node.inputs
    experts, k = node.attrs["experts"], node.attrs["k"]
    g, r, d = groups_rows_cols(e.model.shapes[x])
    tokens, n_exp = g * r, len(experts)
    routing = check_routing(node, e.routing, tokens, n_exp, k)
    if e.tm != 1:
        raise FrontendError(f"node {node.attrs['topk']!r} (TopK): routing tokens needs one-token tiles (tile_m=1), "
                            f"got tile_m {e.tm}")
    hot = np.zeros((tokens, n_exp), np.int8)
    hot[np.arange(tokens)[:, None], routing] = 1
    counts = hot.sum(axis=0)
    xa, pa = e.act(x, node), e.act(probs, node)
    # gates: the router's probabilities at the trace's experts (renormalized as the model does)
    mask = e.load(f"{node.name}.mask", (tokens, n_exp), n_exp, hot.astype(np.float32))
    gates = e.map([pa, mask], Mul())
    if node.attrs["normalize"]:
        gates = e.map([gates, e.map(gates, RowSum())], Div())
    if node.attrs.get("scale", 1.0) != 1.0:  # DeepSeek-V3's routed_scaling_factor
        gates = e.pw(gates, "mul_c", node.attrs["scale"])
    part_x = Partition(e.g, xa.s, SelectorSource(e.g, hot, n_exp), 0, n_exp, name=f"{node.name}.route")
    part_g = Partition(e.g, gates.s, SelectorSource(e.g, hot, n_exp), 0, n_exp, name=f"{node.name}.route_gates")
    outs, active = [], []
    for i, w in enumerate(experts):
        c = int(counts[i])
        if c == 0:  # an expert without tokens: nothing loaded, nothing computed
            part_x.assume_shape(i, (0,))
            part_g.assume_shape(i, (0,))
            Sink(e.g, part_x[i])
            Sink(e.g, part_g[i])
            continue
        part_x.assume_shape(i, (c,))
        part_g.assume_shape(i, (c,))
        f = e.model.shapes[w["gate"]][1]
        # the expert's tokens packed into one [c, D] tile (dynamic tiling), as (1, 1, 1) for a one-K-chunk product
        packed = Accum(e.g, Promote(e.g, part_x[i], 1), RetileRow(), Empty(0, d), 1, compute_bw=0,
                       out_dtype=Tile(FP32, c, d), name=f"{node.name}.pack{i}")
        xk = Promote(e.g, Promote(e.g, packed, 0), 0)

        def weight(name, shape):
            return LinearOffChipLoad(e.g, e.tensor(name, shape, e.model.consts[name]), shape, (1, 1), (0, 0),
                                     stream_dtype=FP32, par_dispatch=e.tiling.par_dispatch)

        bw = dict(compute_bw=e.bw)
        gate = MapAccum(e.g, xk, weight(w["gate"], (d, f)), Matmul(), Zero(c, f), 1, **bw)
        up = MapAccum(e.g, xk, weight(w["up"], (d, f)), Matmul(), Zero(c, f), 1, **bw)
        z = Map(e.g, [Map(e.g, gate, Silu(), **bw), up], Mul(), **bw)
        down = MapAccum(e.g, Promote(e.g, z, 0), weight(w["down"], (f, d)), Matmul(), Zero(c, d), 1, **bw)
        # this expert's gate per token: its column of the gate rows (a MatMul by a one-hot column), packed
        col = np.zeros((n_exp, 1), np.float32)
        col[i] = 1.0
        pick = LinearOffChipLoad(e.g, Tensor(f"{node.name}.onehot{i}", (n_exp, 1), FP32, col), (n_exp, 1), (c,),
                                 (0,))
        g_i = Map(e.g, [Promote(e.g, part_g[i], 1), pick], Matmul(), **bw)
        g_packed = Accum(e.g, g_i, RetileRow(), Empty(0, 1), 1, compute_bw=0, out_dtype=Tile(FP32, c, 1))
        scaled = Map(e.g, [down, Promote(e.g, g_packed, 0)], Mul(), **bw)
        outs.append(Flatten(e.g, RetileStreamify(e.g, scaled, split_row=True), 0, 1))  # (c,) token rows
        active.append(i)
    merged = Reassemble(e.g, outs, SelectorSource(e.g, hot[:, active], len(active)), 0, name=f"{node.name}.combine")
    merged.assume_shape(0, (1, tokens, k))
    y = Accum(e.g, merged, AccumAdd(), Zero(1, d), 1, compute_bw=e.bw, name=f"{node.name}.sum")
    e.val[node.outputs[0]] = Act(y, d, d)

