"""The expert-parallel MoE layer as a sharded all-to-all (``--ep N``): the graph, chip by chip.

The batch is sharded over the N chips (data-parallel attention before the layer): chip c holds tokens
``shard[c] .. shard[c+1] - 1`` (``numpy.array_split`` bounds: the first ``B mod N`` chips one token more), in its
own tensors ``x.<c>`` (rows of ``x``) and ``routing_weights.<c>``, and stores its rows of the output in ``y.<c>``.
Every chip runs the non-expert part of the layer on its own tokens: the token load, the routing selectors, the
Partition of its rows by expert, the routing weights, the weighting, the Reassemble and sum, the shared experts.

* **Dispatch (all-to-all).** Chip c's rows routed to expert e cross to e's chip (no transfer when it is c);
  expert e takes the rows of all N chips through an ``EagerMerge`` (arrival order) and runs its FFN on its chip,
  with its weights from that chip's HBM.
* **Combine (all-to-all).** The expert's output rows are partitioned back by the merge's selector (the chip each
  row came from) and cross back to their home chip, which scales them by their routing weights and sums them.

So a chip sends exactly its tokens' rows routed to remote experts: link ``chip c -> chip p`` carries one D-wide
row per (token of c, expert on p) pair (dispatch) plus one per (token of p, expert on c) pair (combine), as the
routing trace says. Transfers are routed over the system by :func:`stepsim.graph.network.place_on_chips`. The
experts' FFNs come from the caller: one region per expert, or each chip's experts time-multiplexed on its
regions (``--regions``, :func:`stepsim.workloads.moe.parallel.region_members`).

Buffers an all-to-all needs, as FIFO depths from the token counts (depth-2 FIFOs there deadlock across chips,
because the merge is time-sensitive and every chip's Reassemble consumes in its own token order). Each is as deep
as the most elements its channel can carry under *any* routing of the batch, since a token's top-k experts are
distinct (a token sends at most one row to an expert):

* the merge's selector waits, one entry per row, until the row comes out of the expert's FFN (after its whole
  token tile and F loop): it holds all the expert's rows, at most the batch's B tokens;
* a chip's dispatch Partition and its routing weights (which wait for their rows' round trip) hold up to its
  count for one expert, at most its shard's tokens;
* an expert's combine Partition holds up to its count from one chip, at most the largest shard's tokens.

Why from the token counts and not from the routing: a channel whose sends never exceed its capacity never makes
its producer wait for a credit (kernels/channels.py: send i waits for the credit of send i - capacity), so any
depth at least the channel's element count gives the same cycles; the routing's counts (the largest
per-expert count, the rule before) and these bounds both are, so the cycles are the same for every routing,
and the lowered program of a batch size no longer depends on its routing beyond the selector targets: serving
rebinds one template per token count (:mod:`stepsim.serve.layers`). Deeper FIFOs only reserve more slot rows
(``np.zeros``, pages touched only by elements sent).

A chip whose shard is empty (a batch of fewer tokens than chips: ``shard_bounds`` gives the last chips none)
has no home part at all: no ``x.<c>``, ``routing_weights.<c>`` or ``y.<c>`` tensor, no dispatch from it and no
combine back to it. It still holds and runs its experts for the other chips' tokens. The merges and combine
Partitions then span only the chips with tokens (``active`` below), so a batch of at least N tokens builds
exactly the graph it built before.
"""

from __future__ import annotations

import numpy as np

from stepsim.graph import (
    BF16,
    FP32,
    Accum,
    AccumAdd,
    Add,
    DynTile,
    EagerMerge,
    Empty,
    Flatten,
    Graph,
    LinearOffChipLoad,
    LinearOffChipStore,
    Map,
    Mul,
    Partition,
    Reassemble,
    Reshape,
    RetileRow,
    RetileStreamify,
    SelectorSource,
    Tensor,
    Tile,
    Zero,
)
from stepsim.graph.dims import make_symbol
from stepsim.workloads.routing import multihot, onehot_per_slot


def shard_bounds(batch: int, chips: int) -> list[int]:
    """Token bounds of the chips' shards: chip c holds tokens ``bounds[c] .. bounds[c+1] - 1``.

    >>> shard_bounds(10, 4)
    [0, 3, 6, 8, 10]
    """
    base, extra = divmod(batch, chips)
    return [c * base + min(c, extra) for c in range(chips + 1)]


def build_sharded(g: Graph, model, routing, chip_of: list[int], chips: int, *, dynamic: bool, tile_n, tile_f: int,
                  compute_bw: int, packing_compute_bw: int, ffns, shared_ffn,
                  region_chip: list[int] | None = None, home_in=None, home_out=None,
                  prefix: str = "") -> tuple[dict, dict, list, dict]:
    """Add the sharded layer to ``g`` (module docstring); ``chip_of[e]`` is expert e's chip.

    ``ffns(g, packed)`` builds the experts' FFNs on their packed token tiles (``packed[e]``: expert e's) and
    returns ``(output tiles by expert, bindings, tile_rows)``; its operators carry the group ``("expert", e)``
    (on chip ``chip_of[e]``) or ``("region", r)`` (time-multiplexed regions, on chip ``region_chip[r]``).
    ``shared_ffn(g, tokens, batch)`` builds the shared experts on a chip's token rows (None without them).
    ``home_in(c, rows)``, when given, builds chip c's ``rows`` token rows of the layer's input (its shard, in token
    order; a stream as the load of ``x.<c>`` gives) instead of loading them from ``x.<c>`` (the decoder layer
    computes them: :mod:`stepsim.workloads.decoder.many_chips`); its operators are placed on chip c.
    ``home_out(c, rows)``, when given, takes chip c's output rows (its tokens' rows of y, in token order) instead
    of storing them in ``y.<c>`` (tensor parallelism sums them over chips first). ``prefix`` starts the names of
    the routing weights' shards (a stack's layer: ``layer<i>.routing_weights.<c>``, sharding.ep_layer).
    Returns ``(op_chip, bindings, shard bounds, tile_rows)``: the chip of every operator it added (by ``op.id``),
    the symbols' values from the trace, the shard bounds, and ``ffns``' tile rows.
    """
    experts, k, d = model.experts, model.top_k, model.hidden
    bw = dict(compute_bw=compute_bw)
    bounds = shard_bounds(routing.shape[0], chips)
    first = len(g.ops)  # a graph may hold several sharded layers (one per tensor-parallel rank)
    op_chip: dict[int, int] = {}
    bindings: dict = {}

    def on(chip, before):
        for op in g.ops[before:]:
            op_chip[op.id] = chip

    # home chips (those with tokens: module docstring): token loads, selectors, routing weights, rows
    # partitioned by expert; per_expert, slot_weights and shards are indexed by position in ``active``
    active = [c for c in range(chips) if bounds[c + 1] > bounds[c]]
    per_expert, slot_weights, shards = [], [], []
    for c in active:
        before = len(g.ops)
        rc = routing[bounds[c]:bounds[c + 1]]
        bc = rc.shape[0]
        if home_in is None:
            x = Tensor(f"x.{c}", (bc, d), BF16)
            tokens = Flatten(g, LinearOffChipLoad(g, x, (1, d), (bc, 1), (1, 1), stream_dtype=FP32), 0, 1)
        else:
            tokens = home_in(c, bc)
        select = SelectorSource(g, multihot(rc, experts), experts)
        route_w = Tensor(f"{prefix}routing_weights.{c}", (bc, k), BF16)
        weights = LinearOffChipLoad(g, route_w, (1, 1), (bc, k), (k, 1), stream_dtype=FP32)
        part = Partition(g, tokens, select, 0, experts)
        counts = np.zeros(experts, dtype=np.int64)
        np.add.at(counts, rc.ravel(), 1)
        bindings.update({part.count_symbols[e]: int(counts[e]) for e in range(experts)})
        part.channel_depth = bc  # the dispatch buffer: any routing's count for one expert (module docstring)
        wpart = Partition(g, weights, SelectorSource(g, onehot_per_slot(rc, experts), experts), 0, experts)
        wpart.channel_depth = part.channel_depth  # weights wait for their rows' round trip (module docstring)
        for e in range(experts):
            wpart.assume_shape(e, (part.count_symbols[e],))
        per_expert.append(part)
        slot_weights.append(wpart)
        shards.append((rc, bc, tokens, counts))
        on(c, before)

    # experts: dispatch (merge of every chip's rows), packing into tiles, FFNs, combine (rows back by the
    # merge's selector)
    merges, packed = [], []
    for e in range(experts):
        before = len(g.ops)
        total = int(sum(int(s[3][e]) for s in shards))
        merge = EagerMerge(g, [part[e] for part in per_expert], 0)
        merge.channel_depth = bounds[-1]  # the selector waits for the FFN: all B tokens at most (module docstring)
        # one symbol for the expert's rows (bound to the trace's count) instead of the sum of the chips' counts,
        # which sympy's ceilings downstream make slow to build
        rows_symbol = make_symbol(f"{merge.name}_rows")
        bindings[rows_symbol] = total
        merge.assume_shape(0, (rows_symbol,))
        merge.assume_shape(1, (rows_symbol,))
        merged = merge[0]
        if dynamic:
            padded = Reshape(g, merged, 1, 0, pad=Zero(1, d), add_outer_dim=True)
            rows = Flatten(g, padded, 0, 1)
            out_dtype = DynTile(FP32, rows_symbol, d)
        else:
            padded = Reshape(g, merged, tile_n, 0, pad=Zero(1, d), add_outer_dim=True)
            rows = Flatten(g, padded, 1, 2)
            out_dtype = Tile(FP32, tile_n, d)
        packed.append(Accum(g, rows, RetileRow(), Empty(0, d), 1, out_dtype=out_dtype,
                            compute_bw=packing_compute_bw))
        merges.append(merge)
        set_group(g.ops[before:], ("expert", e))
    outs, ffn_bindings, tile_rows = ffns(g, packed)
    bindings.update(ffn_bindings)
    back = []
    for e in range(experts):
        out_rows = RetileStreamify(g, outs[e], split_row=True, filter_mask=True)
        out_rows.assume_shape(0, merges[e][0].stream.shape)
        ret = Partition(g, out_rows, merges[e][1], 0, len(active))  # the merge's selector: index in active
        ret.channel_depth = bounds[1] - bounds[0]  # the combine buffer: the largest shard (module docstring)
        for i, part in enumerate(per_expert):
            ret.assume_shape(i, (part.count_symbols[e],))
        back.append(ret)
        set_group(g.ops[-2:], ("expert", e))
    for op in g.ops[first:]:
        if op.id not in op_chip and op.group is not None:
            kind, index = op.group
            op_chip[op.id] = chip_of[index] if kind == "expert" else region_chip[index]

    # home chips: weight the returned rows, reassemble each token's top-k rows, sum, shared experts, store
    for i, c in enumerate(active):
        before = len(g.ops)
        rc, bc, tokens, _ = shards[i]
        scaled = [Map(g, [slot_weights[i][e], back[e][i]], Mul(), **bw) for e in range(experts)]
        combine_home(g, c, scaled, multihot(rc, experts), k=k, d=d, bw=bw, bindings=bindings, tokens=tokens,
                     rows=bc, shared_ffn=shared_ffn, home_out=home_out)
        on(c, before)
    return op_chip, bindings, bounds, tile_rows


def combine_home(g: Graph, c: int, scaled: list, slots, *, k: int, d: int, bw: dict, bindings: dict, tokens, rows: int,
                 shared_ffn, home_out) -> None:
    """Home chip ``c``'s combine: each of its ``rows`` tokens gathers its ``k`` weighted expert rows from the
    ``scaled`` streams (``slots``: the multi-hot selector rows over them), sums them, adds the shared experts'
    rows of ``tokens`` when there are shared experts, and stores ``y.<c>`` (or hands the sum to ``home_out``)."""
    gathered = Reassemble(g, scaled, SelectorSource(g, slots, len(scaled)), 0)
    bindings[gathered.ragged_symbol] = k
    summed = Accum(g, gathered, AccumAdd(), Zero(1, d), 1, **bw)
    if shared_ffn is not None:
        shared_before = len(g.ops)
        shared = shared_ffn(g, tokens, rows)
        summed = Map(g, [summed, shared], Add(), **bw)
        set_group(g.ops[shared_before:], ("shared_expert", c))
    if home_out is None:
        LinearOffChipStore(g, Reshape(g, summed, 1, 0, write_back_mu=True), tensor_name=f"y.{c}")
    else:
        home_out(c, summed)


def set_group(ops, group) -> None:
    for op in ops:
        op.group = group
