"""Tensor parallelism of the decoder layer (``--tp N``), Megatron style: two all-reduces per layer.

* **Attention.** Chip c owns KV heads ``c H/N .. (c+1) H/N - 1`` of the H simulated (``kv_heads``) and their
  query heads: their caches ``h<h>_*`` and output projections ``wo_h<h>_q<j>`` are in its HBM. Its query heads'
  products summed are a partial sum of ``attn @ W_o``; as B rows ``(1, D)`` they are all-reduced in N chunks of
  B / N rows (:func:`stepsim.workloads.chips.all_reduce_partials`, the collectives' ring or direct graphs).
* **Residual.** Chip c puts its N reduced chunks back in row order (a Reassemble by a static selector) and adds
  ``x`` (replicated: every chip reads it, as rows, from its own HBM): every chip holds all of ``h``.
* **FFN.** Chip c runs the FFN on every token with columns ``c F/N ..`` of every expert's gate / up projections
  and those rows of its down projection (``expert<e>_<part>.<c>``, the shared experts' ``shared_<part>.<c>``; a
  dense model's FFN is ``shared_<part>.<c>``), as the MoE layer's ``--tp``. Its output rows, a partial sum, are
  all-reduced the same way; chip c adds chunk k of its ``h`` to the reduced chunk k and stores it as ``y<c>.<k>``
  (rows ``k B/N ..`` of y), so every chip ends with all of y.

Both all-reduces share the system's links (one network).
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
    RetileStreamify,
    SelectorSource,
    Tensor,
)
from stepsim.workloads.moe.build import PACKING_COMPUTE_BW, moe_stage, shared_ffn


def check_tp(tp, n_heads: int, batch: int, widths: dict, tile_f: int) -> None:
    """One-line ArgumentError unless the KV heads, the batch and every FFN width split over ``tp`` chips."""
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 2:
        raise ArgumentError(f"--tp must be an int >= 2 (chips), got {tp!r}")
    if n_heads % tp:
        raise ArgumentError(f"--tp {tp}: the {n_heads} KV heads (--kv-heads) must split evenly over {tp} chips")
    if batch % tp:
        raise ArgumentError(f"--tp {tp}: the all-reduces cut the {batch} rows into {tp} chunks; the batch must be "
                            f"a multiple of {tp}")
    for what, width in widths.items():
        if width % (tp * tile_f):
            raise ArgumentError(f"--tp {tp}: the {what} size {width} must split into {tp} column blocks of whole "
                                f"--tile-f {tile_f} tiles (a multiple of {tp * tile_f})")


def tensor_parallel_decoder(tp: int, system, algorithm: str, *, model, n_heads: int, batch: int, tile_f: int,
                            routing, counts, moe_kw: dict, heads, dense, stage: dict) -> dict:
    """Build the tensor-parallel layer (module docstring) into ``stage["g"]``. ``heads(hs)`` builds the
    attention and output projection of KV heads ``hs`` and returns their summed products (tiles of ``o_tile``
    requests); ``dense(width)`` is a dense model's FFN of ``width`` columns as shared experts. Returns the
    record's parallel params: ``tp``, ``system``, ``algorithm``, ``links_used``, ``link_bytes``."""
    from stepsim.graph.network import Network
    from stepsim.models.presets import MoEModel
    from stepsim.workloads.chips import all_reduce_partials, chips_system, link_bytes, on_chip

    g, bw, bindings = stage["g"], stage["bw"], stage["bindings"]
    d, moe = model.hidden, (model.moe if model.is_moe else None)
    widths = ({"intermediate": moe.intermediate, "shared intermediate": moe.shared_intermediate} if moe is not None
              else {"dense intermediate": model.dense_intermediate})
    check_tp(tp, n_heads, batch, {k: w for k, w in widths.items() if w}, tile_f)
    if moe is not None and moe_kw["regions"] != moe.experts:  # region tensors hold whole experts, not shards
        raise ArgumentError("--tp does not combine with --regions (time-multiplexed expert regions) yet")
    system = chips_system(tp, system, "--tp")
    net = Network(g, system)
    per_head, per_chunk = n_heads // tp, batch // tp
    chunk_of_row = np.eye(tp, dtype=np.int8)[np.arange(batch) // per_chunk]

    def attention_partial(c):  # [1, B] rows (1, D): this chip's heads' share of attn @ W_o
        return Promote(g, RetileStreamify(g, heads(range(c * per_head, (c + 1) * per_head)), split_row=True), 1)

    attn = all_reduce_partials(g, net, tp, attention_partial, batch, algorithm=algorithm,
                               compute_bw=bw["compute_bw"], prefix="attn_allreduce.")

    def hidden(c):  # h = x + attn @ W_o on chip c, [1, B] rows
        ordered = Reassemble(g, [attn[(c, k)] for k in range(tp)], SelectorSource(g, chunk_of_row, tp), 0)
        bindings[ordered.ragged_symbol] = 1  # one row per selector
        rows = Flatten(g, ordered, 1, 2)  # [1, B, 1] -> [1, B]
        rows.assume_shape(0, (1, batch))
        x = Flatten(g, LinearOffChipLoad(g, Tensor("x", (batch, d), BF16), (1, d), (batch, 1), (1, 1),
                                         stream_dtype=FP32), 0, 1)
        h = Map(g, [rows, x], Add(), **bw)
        h.fanout_depth = batch  # the rows wait for the FFN's all-reduce (the decoder's h_rows)
        return h

    h_rows = [on_chip(g, c, hidden, c) for c in range(tp)]
    if moe is not None:
        shard = MoEModel(moe.name, hidden=d, intermediate=moe.intermediate // tp, experts=moe.experts,
                         top_k=moe.top_k, shared_intermediate=moe.shared_intermediate // tp)

    def ffn_partial(c):
        if moe is not None:
            out, chip_bindings, _ = moe_stage(g, h_rows[c], shard, routing, counts, suffix=f".{c}", **moe_kw)
            bindings.update(chip_bindings)
            return out
        return shared_ffn(g, h_rows[c], dense(model.dense_intermediate // tp), batch, stage["o_tile"], tile_f,
                          PACKING_COMPUTE_BW, bw, suffix=f".{c}")

    ffn = all_reduce_partials(g, net, tp, ffn_partial, batch, algorithm=algorithm, compute_bw=bw["compute_bw"],
                              prefix="ffn_allreduce.")

    def store(c):  # y chunk k = reduced FFN chunk k + h chunk k
        part = Partition(g, h_rows[c], SelectorSource(g, chunk_of_row, tp), 0, tp)
        part.channel_depth = per_chunk
        for k in range(tp):
            part.assume_shape(k, (per_chunk,))
            LinearOffChipStore(g, Map(g, [ffn[(c, k)], part[k]], Add(), **bw), tensor_name=f"y{c}.{k}")

    for c in range(tp):
        on_chip(g, c, store, c)
    net.finish()
    return {"tp": tp, "system": system.name, "algorithm": algorithm, "links_used": len(net.links),
            "link_bytes": link_bytes(g, net)}
