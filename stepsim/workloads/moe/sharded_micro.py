"""The expert-parallel MoE layer with micro-batches (``stepsim run moe --layers L --ep E --micro-batches M``).

The layer of :mod:`stepsim.workloads.moe.sharded` (chip c holds shard c's tokens, experts on their chips, dispatch
and combine all-to-alls), with each chip's shard split into M micro-batches of ``shard / M`` consecutive tokens:
micro-batch m of the layer is the m-th piece of every chip's shard (:func:`micro_batch_tokens`). So, as
``moe/build.py``'s ``_micro_batch_tiles`` does on one chip:

* **Before dispatch** a chip's token rows are split by micro-batch (a Partition at rank 1 by a static selector)
  and each piece is partitioned by expert with its own routing selector, which ends with the micro-batch: chip c's
  rows of (micro-batch m, expert e) are a stream of their own, ended when the piece is.
* **One merge per micro-batch**: expert e merges every chip's rows of micro-batch m (``EagerMerge``, arrival
  order) and packs them into tiles (static: ``tile_n`` rows, padded; dynamic: one tile of the merge's rows); a
  Reassemble whose static selector names the micro-batch of each tile puts the tiles back in micro-batch order,
  and the FFN sees one stream of tiles. Micro-batches with no token for e have no merge (an expert with no token
  at all keeps micro-batch 0's empty one, as one merge would give it).
* **Combine**: the FFN's output rows are split back by micro-batch (static selector: the merges' row counts), and
  each micro-batch's rows partitioned by that merge's selector (the chip each row came from) cross back home.
  The home chip weights each (micro-batch, expert) stream by its routing weights and reassembles its tokens
  from all of them at once: the Reassemble's inputs are the (m, e) pairs with tokens, in (m, e) order, so a
  token (of one micro-batch) gathers its top-k rows in expert order, as the one-chip layer does: the sums, and
  the values, are bit-equal to it.

A micro-batch's tiles are complete, and its output rows flow to the next layer, once every chip's piece of it
has been dispatched, without waiting for later micro-batches. FIFO depths follow ``moe/sharded.py``'s rule (as
deep as the most elements the channel can carry under any routing): a piece's dispatch Partition and routing
weights hold up to the piece's tokens, a merge's selector up to the micro-batch's B / M tokens, a combine
Partition up to the largest piece.
"""

from __future__ import annotations

import numpy as np

from stepsim.graph import (
    BF16,
    FP32,
    Accum,
    DynTile,
    EagerMerge,
    Empty,
    Flatten,
    Graph,
    LinearOffChipLoad,
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
from stepsim.workloads.moe.sharded import combine_home, set_group, shard_bounds
from stepsim.workloads.routing import expert_counts, multihot, onehot_per_slot


def micro_batch_tokens(batch: int, chips: int, micro_batches: int) -> list[np.ndarray]:
    """The token indices of each micro-batch: micro-batch m is the m-th of M equal pieces of every chip's shard
    (the caller checks the shards split evenly).

    >>> [list(t) for t in micro_batch_tokens(8, 2, 2)]
    [[0, 1, 4, 5], [2, 3, 6, 7]]
    """
    bounds = shard_bounds(batch, chips)
    out = []
    for m in range(micro_batches):
        parts = []
        for c in range(chips):
            rows = (bounds[c + 1] - bounds[c]) // micro_batches
            parts.append(np.arange(bounds[c] + m * rows, bounds[c] + (m + 1) * rows))
        out.append(np.concatenate(parts))
    return out


def build_sharded_micro(g: Graph, model, routing, chip_of: list[int], chips: int, *, micro_batches: int,
                        dynamic: bool, tile_n, tile_f: int, compute_bw: int, packing_compute_bw: int, ffns,
                        shared_ffn, home_in=None, home_out=None, prefix: str = "") -> tuple[dict, dict, list, dict]:
    """Add the layer of the module docstring to ``g``; arguments and result as
    :func:`stepsim.workloads.moe.sharded.build_sharded`'s (``tile_f`` is the FFNs', which ``ffns`` builds).
    ``micro_batches`` M >= 2 must split every chip's shard evenly (non-empty shards: ``B`` a multiple of ``chips
    * M``; ``moe/build.py`` checks it with a one-line error)."""
    del tile_f  # the FFNs' tiling is ffns' own
    experts, k, d = model.experts, model.top_k, model.hidden
    m_count = micro_batches
    bw = dict(compute_bw=compute_bw)
    bounds = shard_bounds(routing.shape[0], chips)
    first = len(g.ops)
    op_chip: dict[int, int] = {}
    bindings: dict = {}

    def on(chip, before):
        for op in g.ops[before:]:
            op_chip[op.id] = chip

    # home chips: token rows split by micro-batch, each piece partitioned by expert
    pieces, shards = [], []  # by chip (all have tokens: docstring)
    tokens_of = np.zeros((m_count, experts), np.int64)  # tokens of expert e in micro-batch m, over chips
    for c in range(chips):
        before = len(g.ops)
        rc = routing[bounds[c]:bounds[c + 1]]
        bc = rc.shape[0]
        rows = bc // m_count
        if home_in is None:
            x = Tensor(f"x.{c}", (bc, d), BF16)
            tokens = Flatten(g, LinearOffChipLoad(g, x, (1, d), (bc, 1), (1, 1), stream_dtype=FP32), 0, 1)
        else:
            tokens = home_in(c, bc)
        split = Partition(g, Reshape(g, tokens, rows, 0),
                          SelectorSource(g, np.eye(m_count, dtype=np.int8), m_count), 1, m_count)
        route_w = Tensor(f"{prefix}routing_weights.{c}", (bc, k), BF16)
        weights = LinearOffChipLoad(g, route_w, (1, 1), (bc, k), (k, 1), stream_dtype=FP32)
        parts = []
        for m in range(m_count):
            split.assume_shape(m, (1, rows))
            bindings[split.count_symbols[m]] = 1
            rcm = rc[m * rows:(m + 1) * rows]
            part = Partition(g, split[m], SelectorSource(g, multihot(rcm, experts), experts), 0, experts)
            counts = expert_counts(rcm, experts)
            tokens_of[m] += counts
            bindings.update({part.count_symbols[e]: int(counts[e]) for e in range(experts)})
            part.channel_depth = rows  # the dispatch buffer: any routing's count for one expert in the piece
            parts.append(part)
        pieces.append(parts)
        shards.append((rc, bc, rows, tokens, weights))
        on(c, before)

    # experts: one merge per micro-batch, tiles back in micro-batch order, FFNs
    used_of, merges, packed, tile_rows = [], {}, [], {}
    for e in range(experts):
        before = len(g.ops)
        used = [m for m in range(m_count) if tokens_of[m, e]]
        used_of.append(used)
        tiles = {}
        for m in used or [0]:  # no token at all: micro-batch 0's empty merge (docstring)
            merge = EagerMerge(g, [parts[m][e] for parts in pieces], 0)
            merge.channel_depth = int(sum(s[2] for s in shards))  # the selector waits for the FFN: B / M tokens
            rows_symbol = make_symbol(f"{merge.name}_rows")  # one symbol, as moe/sharded.py's merge
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

    # combine: the FFN's rows split back by micro-batch, each micro-batch's rows home by its merge's selector
    back = {}  # (m, e) -> combine Partition (output c: chip c's rows)
    for e in range(experts):
        before = len(g.ops)
        used = used_of[e] or [0]
        out_rows = RetileStreamify(g, outs[e], split_row=True, filter_mask=True)
        if len(used) == 1:
            out_rows.assume_shape(0, (merges[used[0], e][1],))
            by_micro_batch = {used[0]: out_rows}
        else:
            select = np.zeros((int(tokens_of[used, e].sum()), len(used)), np.int8)
            select[np.arange(len(select)), np.repeat(np.arange(len(used)), tokens_of[used, e])] = 1
            out_rows.assume_shape(0, (len(select),))  # the expert's rows over the batch (the trace's count)
            rows_in = Promote(g, out_rows, 1)  # (1, rows): the static selector's outer dims
            split = Partition(g, rows_in, SelectorSource(g, select, len(used)), 0, len(used))
            by_micro_batch = {}
            for j, m in enumerate(used):
                split.assume_shape(j, (merges[m, e][1],))
                bindings[split.count_symbols[j]] = int(tokens_of[m, e])
                by_micro_batch[m] = split[j]
        for m in used:
            ret = Partition(g, by_micro_batch[m], merges[m, e][0][1], 0, chips)  # the merge's selector: the chip
            ret.channel_depth = max(s[2] for s in shards)  # the combine buffer: the largest piece
            for c, parts in enumerate(pieces):
                ret.assume_shape(c, (parts[m].count_symbols[e],))
            back[m, e] = ret
        set_group(g.ops[before:], ("expert", e))
    for op in g.ops[first:]:
        if op.id not in op_chip and op.group is not None:
            op_chip[op.id] = chip_of[op.group[1]]

    # home chips: weight each (micro-batch, expert) stream, reassemble each token's top-k rows, sum, shared, store
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
        wpart.channel_depth = rows  # weights wait for their rows' round trip (moe/sharded.py)
        for i, (m, e) in enumerate(pairs):
            wpart.assume_shape(i, (pieces[c][m].count_symbols[e],))
        scaled = [Map(g, [wpart[i], back[m, e][c]], Mul(), **bw) for i, (m, e) in enumerate(pairs)]
        combine_home(g, c, scaled, multihot(slots, len(pairs)), k=k, d=d, bw=bw, bindings=bindings, tokens=tokens,
                     rows=bc, shared_ffn=shared_ffn, home_out=home_out)
        on(c, before)
    return op_chip, bindings, bounds, tile_rows
