"""The expert-parallel MoE layer as a sharded all-to-all (``--ep N``): the graph, chip by chip (docs/system.md,
"Expert parallelism" and, for micro-batches, "MoE stacks"; placed on chips by the sharding pass,
:func:`stepsim.workloads.sharding.expert_parallel`).

Chip c holds tokens ``shard[c] .. shard[c+1] - 1`` (:func:`shard_bounds`) in its own ``x.<c>`` and
``routing_weights.<c>`` and runs the layer's non-expert part on them. **Dispatch**: its rows routed to expert e
cross to e's chip, where an ``EagerMerge`` takes every chip's rows in arrival order into the expert's FFN.
**Combine**: the FFN's rows are partitioned back by the merge's selector, cross home, are weighted and summed into
``y.<c>``. So link ``c -> p`` carries one row per (token of c, expert on p) pair and one per (token of p, expert
on c). A chip with an empty shard (a batch of fewer tokens than chips) has no home part; the merges and combines
span the chips with tokens only (``active``).

FIFO depths: each all-to-all buffer is as deep as the most elements its channel can carry under *any* routing (a
token's experts are distinct): a merge's selector the batch, a chip's dispatch and routing weights its shard, a
combine the largest shard. Depth 2 deadlocks across chips (the merge is time-sensitive and every chip's
Reassemble consumes in its own token order); no send so waits for a credit, the cycles are the routing's own, and
a batch size's program depends on its routing only through the selectors (serving rebinds one template per token
count, :mod:`stepsim.serve.layers`).

**Micro-batches** (M >= 2): micro-batch m is the m-th piece of every chip's shard
(:func:`stepsim.workloads.moe.sharded_micro.micro_batch_tokens`); a chip's rows are split by micro-batch before
dispatch, each expert has one merge per micro-batch (its tiles put back in micro-batch order by a Reassemble), the
FFN's rows are split back by micro-batch for the combine, and a home chip reassembles a token's top-k rows from
the (m, e) streams in (m, e) order, so the sums are bit-equal to the one-chip layer's.
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
    Promote,
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
from stepsim.workloads.routing import expert_counts, multihot, onehot_per_slot


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
                  prefix: str = "", micro_batches: int = 1) -> tuple[dict, dict, list, dict]:
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
    the routing weights' shards (a stack's layer: ``layer<i>.routing_weights.<c>``, sharding.expert_parallel).
    ``micro_batches`` M >= 2 (the module docstring's micro-batches) must split every chip's shard evenly (B a
    multiple of ``chips * M``; ``moe/build.py`` checks it with a one-line error).
    Returns ``(op_chip, bindings, shard bounds, tile_rows)``: the chip of every operator it added (by ``op.id``),
    the symbols' values from the trace, the shard bounds, and the tiles' rows.
    """
    experts, k, d, m_count = model.experts, model.top_k, model.hidden, micro_batches
    bw = dict(compute_bw=compute_bw)
    bounds = shard_bounds(routing.shape[0], chips)
    first = len(g.ops)  # a graph may hold several sharded layers (one per tensor-parallel rank)
    op_chip: dict[int, int] = {}
    bindings: dict = {}

    def on(chip, before):
        for op in g.ops[before:]:
            op_chip[op.id] = chip

    # home chips (those with tokens: module docstring): token loads, selectors, routing weights, rows (of each
    # micro-batch) partitioned by expert; pieces, slot_weights and shards are indexed by position in ``active``
    active = [c for c in range(chips) if bounds[c + 1] > bounds[c]]
    pieces, slot_weights, shards = [], [], []
    tokens_of = np.zeros((m_count, experts), np.int64)  # tokens of expert e in micro-batch m, over chips
    for c in active:
        before = len(g.ops)
        rc = routing[bounds[c]:bounds[c + 1]]
        bc = rc.shape[0]
        rows = bc // m_count
        if home_in is None:
            x = Tensor(f"x.{c}", (bc, d), BF16)
            tokens = Flatten(g, LinearOffChipLoad(g, x, (1, d), (bc, 1), (1, 1), stream_dtype=FP32), 0, 1)
        else:
            tokens = home_in(c, bc)
        if m_count > 1:  # the rows split by micro-batch (rank 1, a static selector)
            split = Partition(g, Reshape(g, tokens, rows, 0),
                              SelectorSource(g, np.eye(m_count, dtype=np.int8), m_count), 1, m_count)
        else:
            select = SelectorSource(g, multihot(rc, experts), experts)
        route_w = Tensor(f"{prefix}routing_weights.{c}", (bc, k), BF16)
        weights = LinearOffChipLoad(g, route_w, (1, 1), (bc, k), (k, 1), stream_dtype=FP32)
        parts = []
        for m in range(m_count):
            rcm = rc[m * rows:(m + 1) * rows]
            if m_count > 1:
                split.assume_shape(m, (1, rows))
                bindings[split.count_symbols[m]] = 1
                select = SelectorSource(g, multihot(rcm, experts), experts)
            part = Partition(g, split[m] if m_count > 1 else tokens, select, 0, experts)
            counts = expert_counts(rcm, experts)
            tokens_of[m] += counts
            bindings.update({part.count_symbols[e]: int(counts[e]) for e in range(experts)})
            part.channel_depth = rows  # the dispatch buffer: any routing's count for one expert (module docstring)
            parts.append(part)
        if m_count == 1:  # weights wait for their rows' round trip (module docstring)
            wpart = Partition(g, weights, SelectorSource(g, onehot_per_slot(rc, experts), experts), 0, experts)
            wpart.channel_depth = bc
            for e in range(experts):
                wpart.assume_shape(e, (part.count_symbols[e],))
            slot_weights.append(wpart)
        pieces.append(parts)
        shards.append((rc, bc, rows, tokens, weights))
        on(c, before)

    # experts: dispatch (one merge of every chip's rows per micro-batch), packing into tiles (back in micro-batch
    # order), FFNs, combine (each micro-batch's rows back by its merge's selector)
    used_of, merges, packed, tile_rows = [], {}, [], {}
    for e in range(experts):
        before = len(g.ops)
        used = [m for m in range(m_count) if tokens_of[m, e]]
        used_of.append(used)
        tiles = {}
        for m in used or [0]:  # no token at all: micro-batch 0's empty merge (module docstring)
            merge = EagerMerge(g, [parts[m][e] for parts in pieces], 0)
            merge.channel_depth = int(sum(s[2] for s in shards))  # the selector waits for the FFN: B / M tokens
            # one symbol for the expert's rows (bound to the trace's count) instead of the sum of the chips'
            # counts, which sympy's ceilings downstream make slow to build
            rows_symbol = make_symbol(f"{merge.name}_rows")
            bindings[rows_symbol] = int(tokens_of[m, e])
            merge.assume_shape(0, (rows_symbol,))
            merge.assume_shape(1, (rows_symbol,))
            if dynamic:
                rows_in = Flatten(g, Reshape(g, merge[0], 1, 0, pad=Zero(1, d), add_outer_dim=True), 0, 1)
                out_dtype = DynTile(FP32, rows_symbol, d)
            else:
                rows_in = Flatten(g, Reshape(g, merge[0], tile_n, 0, pad=Zero(1, d), add_outer_dim=True), 1, 2)
                out_dtype = Tile(FP32, tile_n, d)
            tiles[m] = Accum(g, rows_in, RetileRow(), Empty(0, d), 1, out_dtype=out_dtype,
                             compute_bw=packing_compute_bw)
            merges[m, e] = (merge, rows_symbol)
        if len(used) <= 1:
            packed.append(tiles[(used or [0])[0]])
        else:
            counts = [1 if dynamic else -(-int(tokens_of[m, e]) // tile_n) for m in used]
            select = np.zeros((sum(counts), len(used)), np.int8)
            select[np.arange(len(select)), np.repeat(np.arange(len(used)), counts)] = 1
            order = Reassemble(g, [tiles[m] for m in used], SelectorSource(g, select, len(used)), 0)
            bindings[order.ragged_symbol] = 1  # one tile per selector element
            if dynamic:  # the tiles' ragged rows: the largest bounds buffers, each its own for FLOPs
                bindings[order.stream.dtype.rows] = int(tokens_of[used, e].max())
                tile_rows[order.stream.dtype.rows] = tuple(int(tokens_of[m, e]) for m in used)
            flat = Flatten(g, order, 0, 2)
            flat.assume_shape(0, (len(select),))
            packed.append(flat)
        set_group(g.ops[before:], ("expert", e))
    outs, ffn_bindings, ffn_rows = ffns(g, packed)
    bindings.update(ffn_bindings)
    tile_rows.update(ffn_rows)
    back = {}  # (m, e) -> combine Partition (output i: chip active[i]'s rows)
    for e in range(experts):
        before = len(g.ops)
        used = used_of[e] or [0]
        out_rows = RetileStreamify(g, outs[e], split_row=True, filter_mask=True)
        if len(used) == 1:
            out_rows.assume_shape(0, (merges[used[0], e][1],))
            by_micro_batch = {used[0]: out_rows}
        else:  # the FFN's rows split back by micro-batch (a static selector: the merges' row counts)
            select = np.zeros((int(tokens_of[used, e].sum()), len(used)), np.int8)
            select[np.arange(len(select)), np.repeat(np.arange(len(used)), tokens_of[used, e])] = 1
            out_rows.assume_shape(0, (len(select),))  # the expert's rows over the batch (the trace's count)
            split = Partition(g, Promote(g, out_rows, 1), SelectorSource(g, select, len(used)), 0, len(used))
            by_micro_batch = {}
            for j, m in enumerate(used):
                split.assume_shape(j, (merges[m, e][1],))
                bindings[split.count_symbols[j]] = int(tokens_of[m, e])
                by_micro_batch[m] = split[j]
        for m in used:
            ret = Partition(g, by_micro_batch[m], merges[m, e][0][1], 0, len(active))  # the merge's selector
            ret.channel_depth = max(s[2] for s in shards)  # the combine buffer: the largest piece (docstring)
            for i, parts in enumerate(pieces):
                ret.assume_shape(i, (parts[m].count_symbols[e],))
            back[m, e] = ret
        set_group(g.ops[before:], ("expert", e))
    for op in g.ops[first:]:
        if op.id not in op_chip and op.group is not None:
            kind, index = op.group
            op_chip[op.id] = chip_of[index] if kind == "expert" else region_chip[index]

    # home chips: weight the returned rows, reassemble each token's top-k rows, sum, shared experts, store
    if m_count == 1:
        for i, c in enumerate(active):
            before = len(g.ops)
            rc, bc, _, tokens, _ = shards[i]
            scaled = [Map(g, [slot_weights[i][e], back[0, e][i]], Mul(), **bw) for e in range(experts)]
            combine_home(g, c, scaled, multihot(rc, experts), k=k, d=d, bw=bw, bindings=bindings, tokens=tokens,
                         rows=bc, shared_ffn=shared_ffn, home_out=home_out)
            on(c, before)
        return op_chip, bindings, bounds, tile_rows
    # micro-batches: the Reassemble's inputs are the (m, e) pairs with tokens, in (m, e) order, so a token gathers
    # its top-k rows in expert order, as the one-chip layer does
    pairs = [(m, e) for m in range(m_count) for e in range(experts) if tokens_of[m, e]]
    index = np.full((m_count, experts), -1, np.int64)  # (m, e) -> its input of the Reassemble
    for i, (m, e) in enumerate(pairs):
        index[m, e] = i
    for c in range(chips):
        before = len(g.ops)
        rc, bc, rows, tokens, weights = shards[c]
        slots = index[np.arange(bc)[:, None] // rows, rc]  # [tokens, top_k]: each slot's (m, e) input
        wpart = Partition(g, weights, SelectorSource(g, onehot_per_slot(slots, len(pairs)), len(pairs)), 0,
                          len(pairs))
        wpart.channel_depth = rows  # weights wait for their rows' round trip
        for i, (m, e) in enumerate(pairs):
            wpart.assume_shape(i, (pieces[c][m].count_symbols[e],))
        scaled = [Map(g, [wpart[i], back[m, e][c]], Mul(), **bw) for i, (m, e) in enumerate(pairs)]
        combine_home(g, c, scaled, multihot(slots, len(pairs)), k=k, d=d, bw=bw, bindings=bindings, tokens=tokens,
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
