"""Grouped-query decode attention of one layer of a model whose layers attend over a sliding window or over the
whole context, with or without attention sinks (gpt-oss: ``layer_types``, ``sliding_window``, ``sinks``).

One KV head is simulated with the ``query_per_kv_head`` = G query heads that share it. Request ``b`` has
``L = kv_lengths[b]`` tokens cached before the new one, whose key and value are already in the cache (written
by the projections, which are not modelled, as in the prefill kind), so its query at position ``L`` attends to
positions ``max(0, L + 1 - W) .. L`` with a window of ``W`` tokens, ``0 .. L`` without one.

KV cache layout:

* a **sliding** layer keeps a ring of ``W`` rows per request (position ``p`` in row ``p mod W``), as
  transformers' sliding-window cache layer does: it holds the window and nothing more. ``W`` must be a
  multiple of ``tile_n``. Before the ring is full the request reads tiles ``0 .. L // tile_n``; after, all
  ``W / tile_n`` tiles, which hold exactly the window (softmax does not depend on the rows' order, and the
  keys carry their rotary position already). So a decode step reads at most the window: its bytes stop
  growing once the context passes it.
* a **full** layer keeps ``max_n`` rows per request (position ``p`` in row ``p``) and reads
  ``ceil((L + 1) / tile_n)`` tiles.

Either way the rows of the last tile read that hold no attended token are masked
(:mod:`stepsim.workloads.decode_tiles`). Scores are ``q K^T / sqrt(head_dim)`` with FlashAttention's running
max (``MapAccum(OnlineSoftmax)``).

**Sinks** (gpt-oss): each query head ``h`` has a learned logit ``s_h`` that joins the softmax's denominator and
nothing else (transformers' ``GptOssAttention``: the logits concatenated with the sinks, softmax, the sink
column dropped). The graph gives each request one more KV tile, last: a score tile whose first column holds
``s_h * sqrt(head_dim)`` (the softmax scales it back to ``s_h``) and whose other columns are masked, with a
zero value tile, so it adds ``exp(s_h - m)`` to the running sum and nothing to the output. The two tiles
(``sinks`` ``(G, tile_n)``, ``sink_values`` ``(tile_n, head_dim)``) are read once and repeated on chip.

Storage is bf16 (q, caches, mask, sinks, output) with fp32 streams. Symbols: the K-cache ``CacheReadAddrGen``'s
ragged tile count and, with sinks, the tile count with the sink tile are bound to their means per request.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from stepsim.base.errors import ArgumentError, ConfigError
from stepsim.graph import (
    BF16,
    FP32,
    CacheReadAddrGen,
    Expand,
    FilterLastTile,
    Flatten,
    Graph,
    LinearOffChipLoad,
    Map,
    MapAccum,
    Matmul,
    MetadataSource,
    OnlineSoftmax,
    RandomOffChipLoad,
    RandomOffChipStore,
    Reassemble,
    RepeatStatic,
    Sink,
    SoftmaxNormalize,
    Tensor,
    Zero,
)
from stepsim.graph.dims import sp
from stepsim.graph.gcpause import gc_paused
from stepsim.workloads.attention.build import kv_metadata
from stepsim.workloads.base import Workload
from stepsim.workloads.decode_tiles import cache_slots, mask_last_tile, positive_int
from stepsim.workloads.kinds import WORKLOAD_CHANNEL_DEPTH, WORKLOAD_HARDWARE

#: FLOPs/cycle of every compute node (the decode attention's, docs/semantics.md §5.5)
COMPUTE_BW = 2048
CHANNEL_DEPTH = WORKLOAD_CHANNEL_DEPTH["sliding_attention"]


def window_tiles(kv_lengths, tile_n: int, window: int | None) -> tuple[np.ndarray, np.ndarray]:
    """``(tiles, valid_in_last)`` per request, int64: the KV tiles a decode reads and how many rows of its last
    tile hold attended tokens (1 .. tile_n). ``window`` None: a full layer."""
    seq_len_tiled, _ = kv_metadata(kv_lengths, tile_n)  # validates the lengths (one line each)
    lengths = np.asarray(kv_lengths).astype(np.int64)
    valid = lengths % tile_n + 1
    if window is None:
        return seq_len_tiled, valid
    full = lengths + 1 >= window  # the ring holds the window: every row of every tile
    return np.where(full, window // tile_n, seq_len_tiled), np.where(full, tile_n, valid)


def sliding_flops(tiles: int, requests: int, *, head_dim: int, query_per_kv_head: int, tile_n: int,
                  sinks: bool) -> int:
    """FLOPs of the graph, with ``q`` = G query rows, ``t`` = tile_n, ``d`` = head_dim: per KV tile ``q K^T``
    ``2 q t d``; per KV tile and sink tile ``OnlineSoftmax``'s ``2 q t d + 8 q t + 2 q d + 6 q``; per request the
    mask ``q t`` and the normalization ``q d``."""
    q, t, d = query_per_kv_head, tile_n, head_dim
    softmax_tiles = tiles + (requests if sinks else 0)
    return tiles * 2 * q * t * d + softmax_tiles * (2 * q * t * d + 8 * q * t + 2 * q * d + 6 * q) \
        + requests * (q * t + q * d)


@gc_paused  # see stepsim.graph.gcpause
def build_sliding_attention(kv_lengths, *, window: int | None = 128, sinks: bool = True, head_dim: int = 64,
                            query_per_kv_head: int = 8, tile_n: int = 32, max_n: int | None = None,
                            compute_bw: int = COMPUTE_BW) -> Workload:
    """Decode attention of a sliding (``window``) or full (``window=None``) layer, with or without sinks (see the
    module docstring; defaults: a gpt-oss sliding layer).

    Returns
    -------
    Workload
        name ``"sliding_attention"``, params (``window``, ``sinks``, ``kv_tiles``, ``cache_slots``, ...), trace
        ``{"kv_lengths"}``.
    """
    d = positive_int("head_dim", head_dim)
    g_rows = positive_int("query_per_kv_head", query_per_kv_head)
    t = positive_int("tile_n", tile_n)
    bw = positive_int("compute_bw", compute_bw)
    if not isinstance(sinks, bool):
        raise ArgumentError(f"sinks must be True or False, got {sinks!r}")
    if window is not None:
        window = positive_int("window", window)
        if window % t:
            raise ArgumentError(f"window {window} is not a multiple of tile_n={t}: a sliding layer's ring of "
                                f"{window} cache rows is read in whole tiles")
    tiles_per_request, _ = window_tiles(kv_lengths, t, window)
    lengths = np.asarray(kv_lengths).astype(np.int64)
    batch = len(lengths)
    if window is not None:
        slots = window
        if max_n is not None:
            raise ArgumentError("max_n applies to a full layer only (a sliding layer keeps a ring of window rows)")
    else:
        slots = cache_slots(int(tiles_per_request.max()) * t, max_n, t)

    g = Graph(f"{'sliding' if window else 'full'}-attention-b{batch}")
    q_t = Tensor("q", (batch * g_rows, d), BF16)
    k_cache = Tensor("k_cache", (batch * slots, d), BF16)
    v_cache = Tensor("v_cache", (batch * slots, d), BF16)
    mask_t = Tensor("mask", (batch, t), BF16)
    out_t = Tensor("out", (batch * g_rows, d), BF16)

    q = Flatten(g, LinearOffChipLoad(g, q_t, (g_rows, d), (batch, 1), (1, 1), stream_dtype=FP32), 1, 2)
    idx, seq_len = (Flatten(g, MetadataSource(g, v), 0, 1)
                    for v in (np.arange(batch, dtype=np.int64), tiles_per_request))
    k_addr = CacheReadAddrGen(g, idx, seq_len, slots // t)
    keys = RandomOffChipLoad(g, k_addr, k_cache, (t, d), stream_dtype=FP32)
    shape = keys.stream.shape
    v_addr = CacheReadAddrGen(g, idx, seq_len, slots // t)
    v_addr.assume_shape(0, shape)  # V reads the same tiles as K
    values = RandomOffChipLoad(g, v_addr, v_cache, (t, d), stream_dtype=FP32)
    mask = Flatten(g, LinearOffChipLoad(g, mask_t, (1, t), (batch,), (1,), stream_dtype=FP32), 0, 1)
    scores = mask_last_tile(g, Map(g, [Expand(g, q, keys, 1), keys], Matmul(weight_transposed=True),
                                   compute_bw=bw), seq_len, mask, bw)
    bindings = {k_addr.tiles_symbol: sp.Rational(int(tiles_per_request.sum()), batch)}
    if sinks:  # one more tile per request, last: the sink scores and zero values
        with_sink = Flatten(g, MetadataSource(g, tiles_per_request + 1), 0, 1)
        last = FilterLastTile(g, with_sink)
        bindings[last.tiles_symbol] = sp.Rational(int(tiles_per_request.sum()) + batch, batch)
        merged = []
        for name, tile, real in (("sinks", (g_rows, t), scores), ("sink_values", (t, d), values)):
            extra = Flatten(g, RepeatStatic(g, LinearOffChipLoad(g, Tensor(name, tile, BF16), tile, (1,), (0,),
                                                                 stream_dtype=FP32), batch), 0, 2)
            both = Reassemble(g, [extra, Flatten(g, real, 0, 1)], last, 0)
            both.assume_shape(0, last.stream.shape + (1,))
            merged.append(Flatten(g, both, 0, 1))
        scores, values = merged
    state = MapAccum(g, scores, values, OnlineSoftmax(d), Zero(g_rows, d + 2), 1, compute_bw=bw)
    result = Map(g, state, SoftmaxNormalize(), compute_bw=bw, write_back_mu=True)
    Sink(g, RandomOffChipStore(g, result, idx, out_t, (g_rows, d)))
    g.finalize()

    tiles = int(tiles_per_request.sum())
    workload = Workload(
        name="sliding_attention", graph=g, channel_depth=CHANNEL_DEPTH,
        hardware=WORKLOAD_HARDWARE["sliding_attention"],
        algorithmic_flops=sliding_flops(tiles, batch, head_dim=d, query_per_kv_head=g_rows, tile_n=t, sinks=sinks),
        params=dict(batch=batch, window=window, sinks=sinks, head_dim=d, query_per_kv_head=g_rows, tile_n=t,
                    cache_slots=slots, compute_bw=bw, channel_depth=CHANNEL_DEPTH, kv_tiles=tiles,
                    kv_cache_bytes=2 * tiles * t * d * 2),
        trace={"kv_lengths": lengths},
    )
    lengths.flags.writeable = False
    workload.bindings = bindings
    return workload


def from_config(cfg: Mapping) -> Workload:
    """The decode attention of layer ``layer`` (default 0) of ``model`` (default ``gpt-oss-20b``): sliding with the
    model's window when ``layer_types`` says so, else full; sinks when the family has them; the KV-length batch
    of ``trace`` / ``batch_id`` (default the bundled synthetic decode batch)."""
    from stepsim.models.presets import resolve_model
    from stepsim.trace_io.load import load_kv_lengths
    from stepsim.workloads.config import apply_channel_depth, compute_bw_kwargs, resolved_trace

    model = resolve_model(cfg["model"])
    if model.is_mla:
        raise ConfigError(f"model {model.name!r} uses multi-head latent attention; run it with the mla_attention "
                          "workload")
    layer = cfg["layer"] or 0
    if layer >= model.layers:
        raise ConfigError(f"--layer {layer}: model {model.name!r} has {model.layers} layers (0 .. {model.layers - 1})")
    sliding = bool(model.layer_types) and model.layer_types[layer] == "sliding_attention"
    lengths = load_kv_lengths(resolved_trace(cfg), cfg["batch_id"])
    kw = compute_bw_kwargs(cfg)
    attention = model.attention
    try:
        workload = build_sliding_attention(lengths, window=model.sliding_window if sliding else None,
                                           sinks=model.attention_sinks, head_dim=attention.head_dim,
                                           query_per_kv_head=attention.query_per_kv_head, tile_n=cfg["tile_n"], **kw)
    except ArgumentError as exc:
        raise ConfigError(f"model {model.name!r} layer {layer}: {exc}") from None
    return apply_channel_depth(workload, cfg)
