"""A stack of decoder layers, and its pipeline parallelism (``stepsim run decoder --layers L --pp N
--micro-batches M``).

Layer ``i`` is the decoder layer of :mod:`stepsim.workloads.decoder.build` with its tensors named ``layer<i>.*``
and one change: its attention's new q, k and v are **computed from the layer's input rows** (:func:`qkv_streams`)
instead of read from HBM, so a later layer waits for the earlier one's rows. Layer 0 loads ``x`` ([B, D]) as rows,
every later layer consumes the previous layer's output rows, the last stores ``y``. ``--pp N`` places layers
``s L/N ..`` on chip s; the stage boundary is an ordinary cross-chip edge (:func:`stepsim.graph.network.place_on_chips`).

Micro-batches of ``B / M`` requests: the input rows are packed into tiles of ``o_tile`` requests that never span a
micro-batch (``o_tile`` divides ``B / M``), and the MoE FFN packs its expert tiles per micro-batch
(``moe_stage(micro_batches=M)``); the attention streams request by request anyway.
"""

from __future__ import annotations

import numpy as np

from stepsim.base.errors import ArgumentError
from stepsim.graph import (
    BF16,
    FP32,
    Accum,
    Empty,
    Flatten,
    LinearOffChipLoad,
    Map,
    Matmul,
    Reassemble,
    Reshape,
    RetileRow,
    RetileStreamify,
    SelectorSource,
    Tensor,
    Tile,
)
from stepsim.workloads.chips import check_stack
from stepsim.workloads.moe.pipeline import MICRO_BATCH_TILINGS

#: requests per projection tile (at most; a micro-batch's size when smaller)
O_TILE = 32


def check_pipeline(layers: int, pp: int | None, batch: int, micro_batches: int | None, *, strategy: str,
                   tiling: str, tp, regions) -> tuple[int, int]:
    """One-line ArgumentError unless the stack fits; returns ``(M, o_tile)``. ``tp`` (the sharding pass) takes
    one micro-batch."""
    if regions is not None:
        raise ArgumentError("--regions does not combine with --layers / --pp / --micro-batches (a stack's MoE "
                            "layers have one region per expert)")
    if strategy == "coarse":
        raise ArgumentError("--strategy coarse does not combine with --layers / --pp / --micro-batches (its regions "
                            "load their own q / k / v tensors; a stack computes them from its input: dynamic or "
                            "interleave)")
    m = check_stack(layers, pp, batch, micro_batches, "requests") or 1
    if tp is not None and m > 1:
        raise ArgumentError(f"--micro-batches {m} does not combine with --tp yet (a tensor-parallel stack's layer "
                            f"all-reduces the whole batch)")
    rows = batch // m
    o_tile = min(O_TILE, rows)
    if rows % o_tile:
        raise ArgumentError(f"--micro-batches {m}: a micro-batch of {rows} requests must be a multiple of the "
                            f"projection tile of {O_TILE} requests (or at most {O_TILE})")
    if m > 1 and tiling not in MICRO_BATCH_TILINGS:  # every tiling today; kept for a tiling added later
        raise ArgumentError(f"--micro-batches {m} needs --tiling {' or '.join(MICRO_BATCH_TILINGS)}")
    return m, o_tile


def input_tiles(g, rows, *, batch: int, hidden: int, o_tile: int, packing_compute_bw: int):
    """A layer's input rows ``(1, B)`` of ``(1, D)`` packed into ``(o_tile, D)`` tiles, stream ``(1, B / o_tile)``;
    deep enough to hold the batch, since the residual add waits for the attention while the projections read
    them."""
    tiles = Accum(g, Reshape(g, rows, o_tile, 0), RetileRow(), Empty(0, hidden), 1,
                  out_dtype=Tile(FP32, o_tile, hidden), compute_bw=packing_compute_bw)
    tiles.fanout_depth = batch // o_tile
    return tiles


def _project(g, tiles, name: str, *, hidden: int, head_dim: int, bw: dict):
    """``tiles @ <name>`` ([D, head_dim], one weight tile per input tile), split back into ``(1, head_dim)`` rows:
    stream ``(1, B)``."""
    w = LinearOffChipLoad(g, Tensor(name, (hidden, head_dim), BF16), (hidden, head_dim), (1, 1), (1, 1), ref=tiles,
                          stream_dtype=FP32)
    product = Map(g, [tiles, Flatten(g, Flatten(g, w, 0, 1), 0, 1)], Matmul(), **bw)
    return RetileStreamify(g, product, split_row=True)


def qkv_streams(g, tiles, prefix: str, h: int, *, batch: int, hidden: int, head_dim: int, q_rows: int, bw: dict,
                packing_compute_bw: int) -> tuple:
    """KV head ``h``'s new q, k, v from a layer's input tiles, in the shapes ``attention_stage`` loads them
    (``(1, B, 1)``: one ``(q_rows, head_dim)`` tile, one ``(1, head_dim)`` row, one row per request).

    Weights ``<prefix>wq_h<h>_q<j>`` (query head j of KV head h), ``<prefix>wk_h<h>``, ``<prefix>wv_h<h>``, each
    ``[D, head_dim]``. A request's q tile gathers its row of every query head in order j = 0 .. q_rows - 1: a
    Reassemble whose static selector names one query head per element (never two, so arrival order cannot
    reorder them), then rows packed by q_rows.
    """
    def rows_to_requests(rows):  # (1, B) -> (1, B, 1), the loads' shape: each request its own group (a Promote
        return Reshape(g, rows, 1, 0)  # would make the batch one group, routed whole to one attention region)

    k, v = (rows_to_requests(_project(g, tiles, f"{prefix}w{part}_h{h}", hidden=hidden, head_dim=head_dim, bw=bw))
            for part in ("k", "v"))
    # (B,) rows, no stop before the end: a Reassemble passes its inputs' stops on, and a query head's last row
    # would otherwise end the gathered stream's dimension in the middle
    per_head = [Flatten(g, _project(g, tiles, f"{prefix}wq_h{h}_q{j}", hidden=hidden, head_dim=head_dim, bw=bw), 0, 1)
                for j in range(q_rows)]
    order = np.eye(q_rows, dtype=np.int8)[np.tile(np.arange(q_rows), batch)]  # request r: heads 0 .. q_rows - 1
    gathered = Reassemble(g, per_head, SelectorSource(g, order, q_rows), 0)
    rows = Flatten(g, gathered, 0, 1)
    rows.assume_shape(0, (1, batch * q_rows))
    q = Accum(g, Reshape(g, rows, q_rows, 0), RetileRow(), Empty(0, head_dim), 1,
              out_dtype=Tile(FP32, q_rows, head_dim), compute_bw=packing_compute_bw)
    return rows_to_requests(q), k, v, gathered.ragged_symbol
