"""A stack of tensor-parallel MoE layers (``stepsim run moe --layers L --tp T [--pp P]``): P x T chips.

Stage s (layers ``s L/P .. (s+1) L/P - 1``; P = 1 without ``--pp``) runs on chips ``s T .. s T + T - 1``; each of
its layers is the MoE layer's ``--tp`` (``moe/build.py``'s ``_tensor_parallel``) over those T chips: chip t runs the
whole layer (every token, every expert) on columns ``t F/T .. (t+1) F/T - 1`` of every expert's gate / up
projections and those rows of its down projection (tensors ``layer<i>.expert<e>_<part>.<t>``, the shared experts'
``layer<i>.shared_<part>.<t>``; ``layer<i>.routing_weights`` read by every chip), and the partial sums are
all-reduced over the stage's chips (operators ``layer<i>.allreduce.*``, the collectives' ring or direct graph).
After the all-reduce every chip holds every chunk k (rows ``k B/T ..``) of the layer's output; chip t puts them
back in token order (a Reassemble by a static selector) as its next layer's input, and the last layer stores chunk
k on chip t as ``y<t>.<k>`` (as the one-layer ``--tp``). Layer 0 reads ``x`` on every chip of stage 0. Across a
stage boundary chip t's rows cross to chip ``s T + t`` once (an ordinary cross-chip edge). One micro-batch.

The partial sums are added in the all-reduce's order, so y equals the one-chip stack to the one-layer ``--tp``
tests' tolerance (float32 rounding of another sum order), not bit for bit. All transfers share the system's links.
"""

from __future__ import annotations

import numpy as np

from stepsim.graph import (
    BF16,
    FP32,
    Flatten,
    LinearOffChipLoad,
    LinearOffChipStore,
    Promote,
    Reassemble,
    SelectorSource,
    Tensor,
)


def build_tp_stack(g, routings: list, *, tp: int, pp: int | None, system, algorithm: str, batch: int, hidden: int,
                   compute_bw: int, partial) -> tuple[dict, dict]:
    """Add the stack (module docstring) to ``g`` and route it over ``system`` (``(pp or 1) x tp`` chips, checked by
    the caller). ``partial(g, tokens, i, t)``: chip t's partial output rows of layer i on its input rows
    ``tokens`` (``moe_stage`` on the column shard; ``moe/build.py`` passes it, so this module does not import it);
    returns ``(rows, bindings)``. Returns ``(bindings, params)``."""
    import sympy

    from stepsim.graph.lower import fp32_timing_bytes
    from stepsim.graph.network import Network, place_on_chips
    from stepsim.workloads.chips import all_reduce_partials, cross_stage
    from stepsim.workloads.moe.parallel import _GroupNetwork

    layers = len(routings)
    per_stage, chunk = layers // (pp or 1), batch // tp
    net = Network(g, system)
    op_chip: dict[int, int] = {}
    bindings: dict = {}
    order = np.eye(tp, dtype=np.int8)[np.arange(batch) // chunk]  # row r: chunk r // (B / T)
    rows_in: dict = {}
    for i in range(layers):
        base, prefix = (i // per_stage) * tp, f"layer{i}."
        chips = [base + t for t in range(tp)]
        if i and i % per_stage == 0:
            cross_stage(g, rows_in, chips, op_chip)
        start = len(g.ops)

        def partial_of(t, i=i, rows=dict(rows_in)):
            if i == 0:
                x = Tensor("x", (batch, hidden), BF16)
                tokens = Flatten(g, LinearOffChipLoad(g, x, (1, hidden), (batch, 1), (1, 1), stream_dtype=FP32), 0, 1)
            else:
                tokens = rows[t]
            out, layer_bindings = partial(g, tokens, i, t)
            bindings.update(layer_bindings)
            return out

        reduced = all_reduce_partials(g, _GroupNetwork(net, chips), tp, partial_of, batch, algorithm=algorithm,
                                      compute_bw=compute_bw, prefix=f"{prefix}allreduce.")
        op_chip.update({op.id: chips[op.chip] for op in g.ops[start:] if hasattr(op, "chip")})
        for op in g.ops[start:]:  # expert e of layer i is not expert e of layer j (channel labels)
            if isinstance(op.group, tuple):
                op.group = (f"layer{i}.{op.group[0]}", op.group[1])
        for tr in net.transfers:  # a chunk delivered to a chip is read there (the send's placeholder)
            op_chip[tr.delivered.id] = tr.dst
        for t in range(tp):
            before = len(g.ops)
            if i == layers - 1:
                for k in range(tp):  # the all-reduce's rows are in on-chip memory, as the one-layer --tp stores them
                    LinearOffChipStore(g, reduced[(t, k)], tensor_name=f"y{t}.{k}")
            else:  # every chunk back in token order: the next layer's input rows on chip t
                ordered = Reassemble(g, [reduced[(t, k)] for k in range(tp)], SelectorSource(g, order, tp), 0)
                bindings[ordered.ragged_symbol] = 1  # one row per selector element
                flat = Flatten(g, ordered, 0, 2)
                flat.assume_shape(0, (batch,))
                rows_in[t] = Promote(g, flat, 1)
                rows_in[t].fanout_depth = batch  # tokens feed the partition and the shared experts
            op_chip.update({op.id: chips[t] for op in g.ops[before:]})
    net = place_on_chips(g, system, lambda op: op_chip[op.id], network=net)
    values = {sym: sympy.sympify(v) for sym, v in bindings.items()}  # xreplace: subs is quadratic here
    link_bytes = {name: int(sympy.sympify(b).xreplace(values))
                  for name, b in net.link_bytes(fp32_timing_bytes(g)).items()}
    return bindings, {"tp": tp, "algorithm": algorithm, "system": system.name, "links_used": len(net.links),
                      "link_bytes": link_bytes}
