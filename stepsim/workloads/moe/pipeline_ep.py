"""A stack of expert-parallel MoE layers (``stepsim run moe --layers L --ep E [--pp P]``): P x E chips.

Stage s (layers ``s L/P .. (s+1) L/P - 1``; P = 1 without ``--pp``) runs on chips ``s E .. s E + E - 1``; each of
its layers is the sharded expert-parallel layer of :mod:`stepsim.workloads.moe.sharded` over those E chips, its
experts placed by ``--placement`` from the layer's own routing (:func:`stepsim.workloads.moe.parallel.place_experts`).
The batch keeps one sharding all the way (``shard_bounds``: chip ``s E + c`` of every stage holds shard c's
tokens): layer 0 loads ``x.<c>`` on chip c, a later layer takes the previous layer's output rows of shard c as its
home rows (``build_sharded(home_in=)``), and the last layer stores ``y.<c>``. Within a stage a shard's rows stay on
its chip; across a stage boundary shard c's rows cross from chip ``(s-1) E + c`` to ``s E + c``, an ordinary
cross-chip edge routed over the system by :func:`stepsim.graph.network.place_on_chips` (with the layers'
all-to-alls). Layer i's tensors are ``layer<i>.routing_weights.<c>``, ``layer<i>.expert<e>_gate`` / ``_up`` /
``_down`` (and ``layer<i>.shared_*``, on every chip of its stage); its groups ``("layer<i>.expert", e)``.

``--micro-batches M`` > 1: every layer is :mod:`stepsim.workloads.moe.sharded_micro`'s (each chip's rows split
into M pieces before dispatch, one merge per micro-batch and expert, the tiles back in micro-batch order), so
micro-batch m (the m-th piece of every shard) flows to the next layer, and across a stage boundary, before later
micro-batches' tokens arrive; M = 1 builds exactly the graph of one micro-batch.
"""

from __future__ import annotations

from functools import partial


def build_ep_stack(g, model, routings: list, *, ep: int, pp: int | None, placement: str, system, build: dict,
                   ffns_of, shared_of, expert_counts, micro_batches: int = 1) -> tuple[dict, dict, dict]:
    """Add the stack (module docstring) to ``g`` and route its transfers over ``system`` (``(pp or 1) x ep``
    chips). ``build``: :func:`~stepsim.workloads.moe.sharded.build_sharded`'s tiling keywords (``dynamic``,
    ``tile_n``, ``tile_f``, ``compute_bw``, ``packing_compute_bw``); ``ffns_of(i)`` / ``shared_of(i)``: layer i's
    ``ffns`` and ``shared_ffn`` for it (the builder passes them in, so this module does not import it);
    ``expert_counts(routing)``: tokens per expert. Returns ``(bindings, tile_rows, params)``; ``params``: ``ep``,
    ``placement``, ``system``, ``shard_bounds``, ``expert_chips`` (per layer, the chip of every expert within its
    stage), ``links_used`` and ``link_bytes`` (the symbolic per-link bytes on the trace). ``micro_batches``: M
    (module docstring; the caller checks that every shard splits into M)."""
    import sympy

    from stepsim.graph.lower import fp32_timing_bytes
    from stepsim.graph.network import place_on_chips
    from stepsim.workloads.moe.parallel import place_experts
    from stepsim.workloads.moe.sharded import build_sharded
    from stepsim.workloads.moe.sharded_micro import build_sharded_micro

    layers = len(routings)
    per_stage = layers // (pp or 1)
    op_chip: dict[int, int] = {}
    bindings, tile_rows, expert_chips = {}, {}, []
    rows_in: dict | None = None  # the previous layer's output rows by shard
    bounds = None
    layer_of = build_sharded if micro_batches == 1 else partial(build_sharded_micro, micro_batches=micro_batches)
    for i, routing in enumerate(routings):
        stage, prefix = i // per_stage, f"layer{i}."
        chip_of = place_experts(expert_counts(routing), ep, placement, None if build["dynamic"] else build["tile_n"])
        expert_chips.append(chip_of)
        rows_out: dict = {}
        home_in = None if rows_in is None else (lambda c, n, rows=rows_in: rows[c])
        home_out = None if i == layers - 1 else rows_out.__setitem__
        before = len(g.ops)
        layer_chip, layer_bindings, bounds, rows = layer_of(
            g, model, routing, chip_of, ep, ffns=ffns_of(i), shared_ffn=shared_of(i), home_in=home_in,
            home_out=home_out, prefix=prefix, **build)
        for op in g.ops[before:]:
            op_chip[op.id] = stage * ep + layer_chip[op.id]
            if isinstance(op.group, tuple):  # expert e of layer i is not expert e of layer j (channel labels)
                op.group = (f"layer{i}.{op.group[0]}", op.group[1])
        bindings.update(layer_bindings)
        tile_rows.update(rows)
        rows_in = rows_out
    net = place_on_chips(g, system, lambda op: op_chip[op.id])
    values = {sym: sympy.Integer(v) for sym, v in bindings.items()}  # xreplace: subs is quadratic here
    link_bytes = {name: int(sympy.sympify(b).xreplace(values))
                  for name, b in net.link_bytes(fp32_timing_bytes(g)).items()}
    params = {"ep": ep, "placement": placement, "system": system.name, "shard_bounds": bounds,
              "expert_chips": expert_chips, "links_used": len(net.links), "link_bytes": link_bytes}
    return bindings, tile_rows, params
