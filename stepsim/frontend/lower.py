"""The front end's driver: the passes in order, and the Workload they make."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import stepsim.frontend.ops_elementwise  # noqa: F401  (registers its emission handlers, as the two below)
import stepsim.frontend.ops_layout  # noqa: F401
import stepsim.frontend.ops_matmul  # noqa: F401
from stepsim.base.defaults import UNSET
from stepsim.base.errors import FrontendError
from stepsim.frontend import (
    attention,
    check,
    converters,
    einsum,
    emit,
    fusion,
    inputs,
    layouts,
    mla,
    moe,
    patterns,
    shapes,
)
from stepsim.frontend.layouts import Tiling
from stepsim.frontend.load import load_model
from stepsim.workloads.base import Workload

#: the hardware preset a lowered model runs on unless ``hardware=`` says otherwise
DEFAULT_HARDWARE = "step-eval"


@dataclass(frozen=True)
class FrontendReport:
    """What the lowering decided: ``tile_m`` (rows per activation tile), ``edges`` (each node-to-node edge:
    fused or spilled, and why), ``tn`` (value -> column tile: its last dim for row tiles, less for stripes),
    ``layouts`` (value -> its stream's :class:`~stepsim.graph.layout.Layout`; :meth:`describe` shows them),
    ``converters`` (a retiled value, or a Transpose node's name -> :class:`~stepsim.frontend.converters.Conversion`)
    and ``converter_ops`` (the same keys -> the operator holding that converter's buffer; not for a converter a
    spill replaced: ``spilled_converters``); ``chain_length``
    (value -> the longest chain of fp32 operations behind it, for the check's tolerance) and ``proto`` (the
    checked, dims-bound ONNX model, for the reference) and ``bound`` (the integer inputs' values given)."""

    tile_m: int
    tn: dict
    edges: tuple
    converters: dict
    converter_ops: dict
    chain_length: dict
    proto: object
    layouts: dict
    bound: dict
    #: the converters a spill replaced (their keys): the input is stored and read back in the consumer's order
    spilled_converters: frozenset = frozenset()
    #: bytes of every value of the model as written (inputs and node outputs, the dense MoE spelling's included):
    #: what onnx's reference evaluator holds for the functional check (:func:`stepsim.frontend.check.check_reference_fits`)
    reference_bytes: int = 0
    #: node name -> the pattern recognised there (:mod:`stepsim.frontend.attention`; the params' ``patterns``)
    patterns: dict = dataclasses.field(default_factory=dict)

    def spilled(self) -> list:
        return [e for e in self.edges if not e.fused]

    def spill_reasons(self) -> dict:
        """``{"VALUE->CONSUMER": why}`` of every spilled edge, in node order (the record's ``spill_reasons``)."""
        return {fusion.edge_name(e.value, e.consumer): e.reason.removeprefix("spilled: ") for e in self.spilled()}

    def replaced(self) -> dict:
        """``{converter key: "kind of VALUE (bytes B): producer layout -> consumer layout"}`` of the converters a
        spill replaced (the record's ``spilled_converters``): the on-chip buffer each spill saved."""
        return {k: f"{c.kind} of {c.value} ({c.buffer.bytes} B): {c.producer} -> {c.consumer}"
                for k, c in self.converters.items() if k in self.spilled_converters}

    def describe(self) -> str:
        """The layout of every activation stream, the converters and each edge's fusion decision, one per line."""
        width = max(map(len, self.layouts), default=0)
        lines = [f"pattern {k}: {v}" for k, v in self.patterns.items()] + [f"layouts (tile_m {self.tile_m}):"]
        lines += [f"  {v:<{width}}  {lay}" for v, lay in self.layouts.items()]
        lines.append("converters:" if self.converters else "converters: none")
        lines += [f"  {k:<{width}}  {c.kind}, {c.buffer.bytes} B ({c.buffer.method}): {c.producer} -> {c.consumer}"
                  + (": replaced by a spill (read back in the consumer's order)" if k in self.spilled_converters else "")
                  for k, c in self.converters.items()]
        lines.append("edges:")
        lines += [f"  {e.value} -> {e.consumer}: {e.reason}" for e in self.edges]
        return "\n".join(lines)


def check_knobs(budget, channel_depth, seed) -> None:
    """``from_onnx``'s integer knobs checked (FrontendError naming the knob): ``budget`` >= 0 bytes,
    ``channel_depth`` >= 1 elements (or None, or unset), ``seed`` >= 0."""
    for name, value, low in (("budget", budget, 0), ("channel_depth", channel_depth, 1), ("seed", seed, 0)):
        if value is None or value is UNSET:
            continue
        if not inputs.is_count(value, low):
            raise FrontendError(f"from_onnx: {name} must be an integer of at least {low}, got {value!r}")


def from_onnx(source, *, tiling: Tiling | dict | None = None, hardware: str = DEFAULT_HARDWARE,
              dims: dict | None = None, values: dict | None = None, routing=None, seed: int = 0, fuse: bool = True, spill=(), budget: int | None = None,
              channel_depth=UNSET, pp: int | None = None, system=None) -> Workload:
    """Lower an ONNX model to a STeP :class:`~stepsim.workloads.base.Workload` named ``onnx``.

    Parameters
    ----------
    source : str, os.PathLike or onnx.ModelProto
    tiling : Tiling or dict, optional
        Tile sizes (:class:`~stepsim.frontend.layouts.Tiling`; a dict of its fields).
    hardware : str
        Hardware preset of the workload.
    dims : dict, optional
        Sizes of the model's named dynamic input dims (``{"batch": 4}``).
    values : dict or "seeded", optional
        Values of the model's integer inputs (``{"input_ids": array}``): the token ids an embedding Gather looks
        up become the addresses of its reads, as a trace's values do; ``"seeded"`` draws them (seed 0).
    routing : array, dict, RoutingTrace or "teacher", optional
        The expert ids each token is routed to (``[tokens, k]``), per MoE block (a dict by its TopK node's name
        when the model has several): a trace, as the hand-written MoE layers take (:mod:`stepsim.frontend.moe`);
        a :class:`~stepsim.frontend.moe.RoutingTrace` reads them from a trace file.
        ``"teacher"``: the routers' own choice on seeded graph inputs (``seed``), which the workload's loads
        then carry as their values.
    fuse : bool
        False spills every node-to-node edge to off-chip memory.
    spill : iterable of str
        Edges that spill even when ``fuse`` is on: a value (all its edges) or one edge ``"VALUE->CONSUMER"`` (as
        :meth:`FrontendReport.describe` prints it); an unknown name is a one-line
        :class:`~stepsim.frontend.fusion.UnknownSpillError` listing the valid values.
    budget : int, optional
        Bytes of on-chip FIFO for fused edges (:mod:`stepsim.frontend.fusion`); default unlimited.
    channel_depth : int or None, optional
        The workload's default FIFO depth (elements; None: unbounded); default the workloads' default, deeper
        with attention (:func:`stepsim.frontend.layouts.default_depth`).
    pp, system : optional
        ``pp`` P: the model's layers (its node names' prefixes before the first ``.``, as
        :func:`stepsim.frontend.layers.part_of` reads them) in P pipeline stages on the P chips of ``system``
        (default: fully connected chips), each stage boundary a transfer: the sharding pass on the lowered graph
        (:func:`stepsim.workloads.sharding.pipeline_graph`).

    The result's ``frontend`` attribute is the :class:`FrontendReport`. Raises FrontendError (one line) for a
    malformed file, an unsupported operator (naming the node, its op type and the supported list) or a dynamic
    dim that is not bound; LayoutError when no converter can join two layouts.
    """
    tiling = layouts.tiling_of(tiling)
    check_knobs(budget, channel_depth, seed)
    if not isinstance(fuse, bool):
        raise FrontendError(f"from_onnx: fuse must be True or False, got {fuse!r}")
    if not isinstance(hardware, str) or not hardware:
        raise FrontendError(f"from_onnx: hardware must be a preset name or a TOML path (a string), got {hardware!r}")
    spill = (spill,) if isinstance(spill, str) else spill  # one name, not its characters
    proto = shapes.bind_dims(load_model(source), dims)
    inputs.check_declared(proto)  # element types and dims, before shape inference evaluates anything
    model = shapes.to_model(proto, values)
    model = moe.raise_moe(mla.raise_mla(attention.raise_attention(patterns.raise_patterns(einsum.lower_einsums(model)))))
    forced = layouts.head_tiles(model)  # head splits fix their MatMul's tile_n (a user's per_node wins)
    if forced:
        tiling = dataclasses.replace(tiling, per_node={**forced, **tiling.per_node})
    if tiling.tile_m is None and any(n.op_type == "MoE" for n in model.nodes):
        tiling = dataclasses.replace(tiling, tile_m=1)  # routing moves single tokens
    tile_m = layouts.choose_tile_m(model, tiling)
    tn = layouts.assign(model, tiling)
    conversions = converters.plan(model, tiling, tile_m, tn)
    if channel_depth is UNSET and layouts.default_depth(model, tile_m, tn) is not None:
        channel_depth = layouts.default_depth(model, tile_m, tn)
    tile_bytes = {v: tile_m * t * 4 for v, t in tn.items()}
    fifo_depth = 2 if channel_depth is UNSET or channel_depth is None else channel_depth
    edges = fusion.decide(model, tile_bytes, fuse=fuse, spill=spill, budget=budget, depth=fifo_depth)
    emitter = emit.Emitter(model, tiling, tile_m, tn, conversions, edges)
    if routing is not None and not isinstance(routing, (str, moe.RoutingTrace)) and not any(
            n.op_type == "MoE" for n in model.nodes):
        raise FrontendError(f"from_onnx: routing was given but model {model.name!r} has no MoE block (TopK of router "
                            f"probabilities, expert selection, weighted sum)")
    if isinstance(routing, str) and routing != "teacher":
        raise FrontendError(f"from_onnx: routing must be expert ids, a dict of them, a RoutingTrace or 'teacher', "
                            f"got {routing!r}")
    if isinstance(routing, str) and routing == "teacher":
        routing = None
        if any(n.op_type == "MoE" for n in model.nodes):  # only then is the model evaluated (its routers' part)
            feeds = moe.seeded_inputs(model, seed)
            emitter.input_data = feeds  # the loads carry them: simulate's default inputs are the ones routed on
            routing = moe.teacher_routing(proto, model, {**feeds, **model.bound})
    elif isinstance(routing, moe.RoutingTrace):
        routing = moe.routing_from_trace(routing, model)
    emitter.routing = routing
    graph = emitter.run()
    skip = layouts.views(model)
    stream_layouts = {v: layouts.stream_layout(model.shapes[v], tile_m, t) for v, t in tn.items() if v not in skip}
    report = FrontendReport(tile_m, tn, tuple(edges), conversions, dict(emitter.converter_ops),
                            check.chain_length(model), proto, stream_layouts, dict(model.bound),
                            frozenset(emitter.spilled_converters),
                            inputs.evaluation_bytes(model, [v for v in model.shapes if not model.is_const(v)]),
                            dict(model.patterns))
    depth = {} if channel_depth is UNSET else {"channel_depth": channel_depth}
    workload = Workload(name="onnx", graph=graph, hardware=hardware, **depth,
                        params=dict(model=model.name, tile_m=tile_m, tile_n=tiling.tile_n,
                                    compute_bw=tiling.compute_bw, fuse=fuse,
                                    spilled=sorted(f"{e.value}->{e.consumer}" for e in report.spilled()),
                                    spill_reasons=report.spill_reasons(), spilled_converters=report.replaced(),
                                    **({"patterns": dict(model.patterns)} if model.patterns else {})))
    workload.frontend = report  # not in params: params go into every result row as JSON
    if pp is not None:
        from stepsim.frontend.layers import part_of
        from stepsim.workloads.sharding import pipeline_graph

        workload = pipeline_graph(workload, pp, lambda op: None if part_of(op, ".") == "-" else part_of(op, "."),
                                  system)
    return workload

