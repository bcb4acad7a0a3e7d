"""A stack of expert-parallel decoder layers (``stepsim run decoder --layers L --ep E [--pp P]
[--micro-batches M]``): P x E chips.

Stage s (layers ``s L/P .. (s+1) L/P - 1``; P = 1 without ``--pp``) runs on chips ``s E .. s E + E - 1``; each of
its layers is the one-layer decoder's ``--ep`` (:mod:`stepsim.workloads.decoder.expert_parallel`) over those E
chips, with the stack's one change (:mod:`stepsim.workloads.decoder.pipeline`): q, k and v are computed from the
layer's input rows. The batch keeps one sharding all the way (``shard_bounds``, B a multiple of E): chip
``s E + c`` holds shard c's rows; layer 0 loads ``x.<c>`` on chip c, a later layer takes the previous layer's
output rows of shard c, the last stores ``y.<c>``. Per layer:

* **Gather.** Attention chip a (A = min(E, H) of them, chip ``a E/A``: KV heads ``a H/A ..``) needs every
  request's input rows for its q / k / v projections: it puts the E shards back in request order (a Reassemble by
  a static selector; the shards cross from their chips, routed over the system).
* **Attention, output projection, reduce-scatter** as the one-layer ``--ep`` (tensors ``layer<i>.h<h>_*``,
  ``layer<i>.w{q,k,v,o}_h<h>*``; operators ``layer<i>.attn_reducescatter.*``): chip c ends with its shard's rows of
  ``attn @ W_o`` and adds its input rows (the residual).
* **MoE** (routing of trace layer i, tensors ``layer<i>.routing_weights.<c>``, ``layer<i>.expert<e>_*``):
  :func:`stepsim.workloads.moe.sharded.build_sharded`, or with ``--micro-batches M`` > 1
  :func:`stepsim.workloads.moe.sharded_micro.build_sharded_micro`; the second residual gives the layer's output
  rows of shard c.

The attention's partial sums are added in the reduce-scatter's order, not the one-chip stack's, so the values
equal it to the one-layer ``--ep``'s tolerance (float32 rounding of a different sum order), not bit for bit.
All transfers share the system's links (one network).
"""

from __future__ import annotations

import numpy as np

from stepsim.base.errors import ArgumentError
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
    Reshape,
    RetileStreamify,
    SelectorSource,
    Tensor,
)


def build_decoder_ep_stack(g, model, routings: list, *, ep: int, pp: int | None, system, placement: str,
                           algorithm: str, micro_batches: int, n_heads: int, batch: int, o_tile: int, moe_kw: dict,
                           bw: dict, stage: dict, heads, qkv_streams, input_tiles) -> tuple[dict, set, dict]:
    """Add the stack (module docstring) to ``g``; ``heads(hs, prefix, qkv_of, region_base)`` builds KV heads
    ``hs``' attention and output projection and returns their summed products (``decoder/build.py`` passes it,
    with ``qkv_streams`` and ``input_tiles`` of ``decoder/pipeline.py``, so this module imports neither).
    Returns ``(params, idle groups, tile_rows)``."""
    import sympy

    from stepsim.graph.lower import fp32_timing_bytes
    from stepsim.graph.network import Network, place_on_chips
    from stepsim.workloads.chips import chips_system, reduce_scatter_partials
    from stepsim.workloads.decoder.expert_parallel import check_ep
    from stepsim.workloads.moe.build import DEFAULT_TILE_N, PACKING_COMPUTE_BW, _expert_ffn, shared_ffn
    from stepsim.workloads.moe.parallel import _GroupNetwork, place_experts
    from stepsim.workloads.moe.sharded import build_sharded
    from stepsim.workloads.moe.sharded_micro import build_sharded_micro
    from stepsim.workloads.routing import expert_counts

    moe, d, layers = model.moe, model.hidden, len(routings)
    if moe_kw["regions"] != moe.experts:
        raise ArgumentError("--regions does not combine with --layers / --pp / --micro-batches (a stack's MoE "
                            "layers have one region per expert)")
    for r in routings:
        check_ep(ep, model, n_heads, batch, None, placement, expert_counts(r, moe.experts))
    if micro_batches > 1 and batch % (ep * micro_batches):
        raise ArgumentError(f"--micro-batches {micro_batches} --ep {ep}: each chip's shard of the batch of {batch} "
                            f"requests must split into {micro_batches} equal micro-batches (the batch a multiple "
                            f"of {ep * micro_batches})")
    tile_n = moe_kw["tile_n"]
    if micro_batches > 1 and moe.shared_intermediate and (batch // (ep * micro_batches)) % (tile_n or DEFAULT_TILE_N):
        raise ArgumentError(f"--micro-batches {micro_batches} --ep {ep}: the shared experts' tiles of "
                            f"{tile_n or DEFAULT_TILE_N} tokens must not span a chip's micro-batches of "
                            f"{batch // (ep * micro_batches)} requests")
    if pp is not None and system is not None and system.chips != pp * ep:
        raise ArgumentError(f"--pp {pp} --ep {ep} needs a system of {pp * ep} chips (pp x ep); system "
                            f"{system.name!r} has {system.chips}")
    system = chips_system((pp or 1) * ep, system, "--ep")
    per_stage, shard = layers // (pp or 1), batch // ep
    attn_chips = min(ep, n_heads)
    per_head, gap = n_heads // attn_chips, ep // attn_chips
    dynamic, tile_f = moe_kw["dynamic"], moe_kw["tile_f"]
    bindings = stage["bindings"]
    net = Network(g, system)
    op_chip: dict[int, int] = {}
    idle: set = set()
    tile_rows: dict = {}
    expert_chips: list = []
    build = dict(dynamic=dynamic, tile_n=tile_n, tile_f=tile_f, compute_bw=bw["compute_bw"],
                 packing_compute_bw=PACKING_COMPUTE_BW)
    layer_of = build_sharded if micro_batches == 1 else (
        lambda *a, **kw: build_sharded_micro(*a, micro_batches=micro_batches, **kw))

    rows_in = {}  # shard c's input rows of the current layer, (1, shard)
    for c in range(ep):
        before = len(g.ops)
        rows_in[c] = Flatten(g, LinearOffChipLoad(g, Tensor(f"x.{c}", (shard, d), BF16), (1, d), (shard, 1), (1, 1),
                                                  stream_dtype=FP32), 0, 1)
        op_chip.update({op.id: c for op in g.ops[before:]})
    for i, routing in enumerate(routings):
        base, prefix = (i // per_stage) * ep, f"layer{i}."
        if i and i % per_stage == 0:  # a stage boundary: shard c crosses to its new home chip once, and fans out
            for c in range(ep):  # there (a fan-out's FIFO depth is its producer's: the link's would be too shallow)
                before = len(g.ops)
                rows_in[c] = Promote(g, Flatten(g, rows_in[c], 0, 1), 1)
                op_chip.update({op.id: base + c for op in g.ops[before:]})
        start = len(g.ops)
        for c in range(ep):  # the rows wait for the attention (all shards) before the residual reads them
            rows_in[c].fanout_depth = shard
        order = np.eye(ep, dtype=np.int8)[np.arange(batch) // shard]

        def attention_partial(a, prefix=prefix, i=i, order=order, rows=dict(rows_in)):
            gathered = Reassemble(g, [Flatten(g, rows[c], 0, 1) for c in range(ep)], SelectorSource(g, order, ep), 0)
            bindings[gathered.ragged_symbol] = 1  # one row per selector element
            flat = Flatten(g, gathered, 0, 2)
            flat.assume_shape(0, (batch,))
            all_rows = Promote(g, flat, 1)
            tiles = input_tiles(g, all_rows)

            def qkv_of(h):
                q, k, v, ragged = qkv_streams(g, tiles, prefix, h)
                bindings[ragged] = 1  # one query head's row per selector element
                return q, k, v

            products = heads(range(a * per_head, (a + 1) * per_head), prefix, qkv_of,
                             i * n_heads * stage["attention_regions"])
            return Promote(g, RetileStreamify(g, products, split_row=True), 1)

        chips = [base + a * gap for a in range(attn_chips)]
        chunks = reduce_scatter_partials(g, _GroupNetwork(net, chips), attn_chips, attention_partial, batch,
                                         algorithm=algorithm, compute_bw=bw["compute_bw"],
                                         prefix=f"{prefix}attn_reducescatter.")
        op_chip.update({op.id: chips[op.chip] for op in g.ops[start:] if hasattr(op, "chip")})
        for tr in net.transfers:  # a chunk delivered to a chip is read there (the send's placeholder)
            op_chip[tr.delivered.id] = tr.dst
        reduced = {}
        for a in range(attn_chips):
            if attn_chips == ep:
                reduced[a] = chunks[a]
                continue
            before = len(g.ops)  # the attention chip cuts its chunk into the shards of the chips it feeds
            part = Partition(g, Promote(g, chunks[a], 1), SelectorSource(g, np.eye(gap, dtype=np.int8)[
                np.arange(batch // attn_chips) // shard], gap), 0, gap)
            part.channel_depth = shard  # a shard waits whole for its link, not blocking the next one
            for j in range(gap):
                part.assume_shape(j, (shard,))
                reduced[a * gap + j] = part[j]
            op_chip.update({op.id: chips[a] for op in g.ops[before:]})

        homes, rows_out = {}, {}

        def home_in(c, n, reduced=reduced, own=dict(rows_in)):
            h = Map(g, [Promote(g, reduced[c], 1), own[c]], Add(), **bw)  # h = x + attn @ W_o, shard c's rows
            h.fanout_depth = shard  # the rows wait for the MoE block's output
            homes[c] = h
            return h

        def home_out(c, combined, last=i == layers - 1):
            out = Map(g, [combined, homes[c]], Add(), **bw)
            if last:
                LinearOffChipStore(g, Reshape(g, out, 1, 0, write_back_mu=True), tensor_name=f"y.{c}")
            rows_out[c] = out

        def ffns(g, packed, prefix=prefix):
            return [_expert_ffn(g, packed[e], e, moe, tile_f, dynamic, bw, prefix=prefix)
                    for e in range(moe.experts)], {}, {}

        shared = None
        if moe.shared_intermediate:
            def shared(g, tokens, rows, prefix=prefix):
                return shared_ffn(g, tokens, moe, rows, tile_n or DEFAULT_TILE_N, tile_f, PACKING_COMPUTE_BW, bw,
                                  prefix=prefix)

        counts = expert_counts(routing, moe.experts)
        chip_of = place_experts(counts, ep, placement, None if dynamic else tile_n)
        expert_chips.append(chip_of)
        before = len(g.ops)
        layer_chip, layer_bindings, bounds, rows_of = layer_of(
            g, moe, routing, chip_of, ep, ffns=ffns, shared_ffn=shared, home_in=home_in, home_out=home_out,
            prefix=prefix, **build)
        for op in g.ops[before:]:
            op_chip[op.id] = base + layer_chip[op.id]
            if isinstance(op.group, tuple):  # expert e of layer i is not expert e of layer j (channel labels)
                op.group = (f"layer{i}.{op.group[0]}", op.group[1])
        bindings.update(layer_bindings)
        tile_rows.update(rows_of)
        idle |= {(f"layer{i}.expert", e) for e, n in enumerate(counts) if n == 0}
        rows_in = rows_out
    net = place_on_chips(g, system, lambda op: op_chip[op.id], network=net)
    values = {sym: sympy.sympify(v) for sym, v in bindings.items()}  # xreplace: subs is quadratic here
    link_bytes = {name: int(sympy.sympify(b).xreplace(values))
                  for name, b in net.link_bytes(fp32_timing_bytes(g)).items()}
    params = {"layers": layers, "micro_batches": micro_batches, **({"pp": pp} if pp else {}), "ep": ep,
              "placement": placement, "algorithm": algorithm, "system": system.name, "shard_bounds": bounds,
              "expert_chips": expert_chips, "links_used": len(net.links), "link_bytes": link_bytes}
    return params, idle, tile_rows
