"""A stack of tensor-parallel decoder layers (``stepsim run decoder --layers L --tp T [--pp P]``): P x T chips.

Stage s (layers ``s L/P .. (s+1) L/P - 1``; P = 1 without ``--pp``) runs on chips ``s T .. s T + T - 1``; each of
its layers is the one-layer decoder's ``--tp`` (:mod:`stepsim.workloads.decoder.parallel`: chip t owns KV heads
``t H/T ..``, columns ``t F/T ..`` of the FFN, an all-reduce after the output projection and one after the FFN)
with the stack's one change (:mod:`stepsim.workloads.decoder.pipeline`): q, k and v are computed from the layer's
input rows, which every chip holds whole. After the FFN's all-reduce chip t puts the reduced chunks back in row
order (a Reassemble by a static selector) and adds its ``h`` rows: the next layer's input on chip t; the last layer
stores chunk k on chip t as ``y<t>.<k>``, as the one-layer ``--tp``. Layer 0 reads ``x`` on every chip of stage 0.
Across a stage boundary chip t's rows cross once to chip ``s T + t``. One micro-batch.

The partial sums are added in the all-reduces' order, so the values equal the one-chip stack's within float32
rounding (the one-layer ``--tp`` tests' tolerance), not bit for bit. All transfers share the system's links.
"""

from __future__ import annotations

import numpy as np

from stepsim.graph import (
    BF16,
    FP32,
    Add,
    Flatten,
    LinearOffChipLoad,
    LinearOffChipStore,
    Map,
    Partition,
    Promote,
    Reassemble,
    RetileStreamify,
    SelectorSource,
    Tensor,
)


def build_decoder_tp_stack(g, layers: int, *, tp: int, pp: int | None, system, algorithm: str, n_heads: int,
                           batch: int, hidden: int, bw: dict, stage: dict, heads, qkv_streams, input_tiles,
                           ffn_partial) -> dict:
    """Add the stack (module docstring) to ``g`` over ``system`` (``(pp or 1) x tp`` chips, checked by the
    caller). ``heads(hs, prefix, qkv_of, region_base)`` builds KV heads ``hs``' attention and output projection and
    returns their summed products; ``qkv_streams(g, tiles, prefix, h)`` and ``input_tiles(g, rows)`` are
    ``decoder/pipeline.py``'s; ``ffn_partial(g, rows, i, t)`` chip t's FFN partial of layer i on its ``h`` rows
    (``decoder/build.py`` passes them, so this module imports neither). Returns the record's parallel params."""
    import sympy

    from stepsim.graph.lower import fp32_timing_bytes
    from stepsim.graph.network import Network, place_on_chips
    from stepsim.workloads.chips import all_reduce_partials, cross_stage
    from stepsim.workloads.moe.parallel import _GroupNetwork

    per_stage, per_head, chunk = layers // (pp or 1), n_heads // tp, batch // tp
    bindings = stage["bindings"]
    net = Network(g, system)
    op_chip: dict[int, int] = {}
    chunk_of_row = np.eye(tp, dtype=np.int8)[np.arange(batch) // chunk]

    def in_order(chunks):  # the T reduced chunks back in row order: [1, B] rows
        ordered = Reassemble(g, chunks, SelectorSource(g, chunk_of_row, tp), 0)
        bindings[ordered.ragged_symbol] = 1  # one row per selector element
        flat = Flatten(g, ordered, 0, 2)
        flat.assume_shape(0, (batch,))
        return Promote(g, flat, 1)

    rows_in: dict = {}
    for t in range(tp):
        before = len(g.ops)
        rows_in[t] = Flatten(g, LinearOffChipLoad(g, Tensor("x", (batch, hidden), BF16), (1, hidden), (batch, 1),
                                                  (1, 1), stream_dtype=FP32), 0, 1)
        op_chip.update({op.id: t for op in g.ops[before:]})
    for i in range(layers):
        base, prefix = (i // per_stage) * tp, f"layer{i}."
        chips = [base + t for t in range(tp)]
        if i and i % per_stage == 0:
            cross_stage(g, rows_in, chips, op_chip)
        start = len(g.ops)
        for t in range(tp):  # the rows wait for the attention's all-reduce before the residual reads them
            rows_in[t].fanout_depth = batch
        group = _GroupNetwork(net, chips)

        def attention_partial(t, prefix=prefix, i=i, rows=dict(rows_in)):
            tiles = input_tiles(g, rows[t])

            def qkv_of(h):
                q, k, v, ragged = qkv_streams(g, tiles, prefix, h)
                bindings[ragged] = 1  # one query head's row per selector element
                return q, k, v

            products = heads(range(t * per_head, (t + 1) * per_head), prefix, qkv_of,
                             i * n_heads * stage["attention_regions"])
            return Promote(g, RetileStreamify(g, products, split_row=True), 1)

        attn = all_reduce_partials(g, group, tp, attention_partial, batch, algorithm=algorithm,
                                   compute_bw=bw["compute_bw"], prefix=f"{prefix}attn_allreduce.")
        h_rows = {}
        for t in range(tp):  # h = x + attn @ W_o on chip t, [1, B] rows
            before = len(g.ops)
            h_rows[t] = Map(g, [in_order([attn[(t, k)] for k in range(tp)]), rows_in[t]], Add(), **bw)
            h_rows[t].fanout_depth = batch  # the rows wait for the FFN's all-reduce (the decoder's h_rows)
            for op in g.ops[before:]:
                op.chip = t

        def partial_of(t, i=i):
            return ffn_partial(g, h_rows[t], i, t)

        ffn = all_reduce_partials(g, group, tp, partial_of, batch, algorithm=algorithm, compute_bw=bw["compute_bw"],
                                  prefix=f"{prefix}ffn_allreduce.")
        for t in range(tp):
            before = len(g.ops)
            if i == layers - 1:  # y chunk k = reduced FFN chunk k + h chunk k
                part = Partition(g, h_rows[t], SelectorSource(g, chunk_of_row, tp), 0, tp)
                part.channel_depth = chunk
                for k in range(tp):
                    part.assume_shape(k, (chunk,))
                    LinearOffChipStore(g, Map(g, [ffn[(t, k)], part[k]], Add(), **bw), tensor_name=f"y{t}.{k}")
            else:
                rows_in[t] = Map(g, [in_order([ffn[(t, k)] for k in range(tp)]), h_rows[t]], Add(), **bw)
            for op in g.ops[before:]:
                op.chip = t
        op_chip.update({op.id: chips[op.chip] for op in g.ops[start:] if hasattr(op, "chip")})
        for tr in net.transfers:  # a chunk delivered to a chip is read there (the send's placeholder)
            op_chip[tr.delivered.id] = tr.dst
        for op in g.ops[start:]:  # expert e of layer i is not expert e of layer j (channel labels)
            if isinstance(op.group, tuple) and op.group[0] in ("expert", "shared_expert", "ffn"):
                op.group = (f"layer{i}.{op.group[0]}", op.group[1])
    net = place_on_chips(g, system, lambda op: op_chip[op.id], network=net)
    values = {sym: sympy.sympify(v) for sym, v in bindings.items()}  # xreplace: subs is quadratic here
    link_bytes = {name: int(sympy.sympify(b).xreplace(values))
                  for name, b in net.link_bytes(fp32_timing_bytes(g)).items()}
    return {"tp": tp, "algorithm": algorithm, "system": system.name, "links_used": len(net.links),
            "link_bytes": link_bytes}
