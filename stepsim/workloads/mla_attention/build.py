"""Multi-head latent attention (MLA, DeepSeek-V2/V3/R1) for decode, in the absorbed form, over the compressed
latent cache.

Per token and layer MLA caches the latent ``c_KV`` (``kv_lora_rank`` = r values, after ``kv_norm``) and the
rotary key ``k_pe`` (``qk_rope_head_dim`` = dr values) that every head shares: ``r + dr`` values (576 for
DeepSeek-V3) instead of a key and a value per head. For decode the key up-projection ``W_UK`` is absorbed into
the query and the value up-projection ``W_UV`` into the output, so attention runs over the latent cache
directly, as DeepSeek-V3's inference code computes it (``attn_impl="absorb"``, ``model.py``)::

    q_lat[h] = q_nope[h] @ W_UK[h]                              (dn -> r per head, h < H)
    s[h, j]  = (q_lat[h] . c_KV[j] + q_pe[h] . k_pe[j]) / sqrt(dn + dr)
    o_lat[h] = softmax_j(s[h]) @ c_KV                            (r)
    out[h]   = o_lat[h] @ W_UV[h]^T                              (r -> dv)

``W_UK[h]`` and ``W_UV[h]`` are the rows of head ``h`` of DeepSeek's ``wkv_b`` weight (``[H * (dn + dv), r]``):
its first ``dn`` rows and its last ``dv`` rows; the graph reads them as the tensors ``w_uk`` ``[H * dn, r]`` and
``w_uv`` ``[H * dv, r]``. ``q_nope`` / ``q_pe`` are the new token's query halves after the query projection and
rotary embedding (``[B * H, dn]`` / ``[B * H, dr]``), which are not modelled here, as in the other attention
kinds; the new token's ``c_KV`` and ``k_pe`` are already in the caches at row ``L`` (DeepSeek writes them before
attending), so request ``b`` with ``L = kv_lengths[b]`` attends to rows ``0 .. L``.

The graph (one pipeline, requests in order; every tensor bf16, streams fp32):

* ``w_uk`` / ``w_uv`` are read from HBM once and kept on chip (``Bufferize``), re-streamed per request
  (``Streamify``): weight-stationary, as a decode batch absorbs them;
* per request and head ``q_nope @ W_UK[h]`` (``Map(Matmul)``), the H rows packed into one ``(H, r)`` tile
  (``Accum(RetileRow)``);
* the latent cache ``kv_cache`` ``[B * max_n, r]`` and ``pe_cache`` ``[B * max_n, dr]`` in tiles of ``tile_n``
  rows (``CacheReadAddrGen``: ``ceil((L + 1) / tile_n)`` tiles per request): the decode reads exactly the
  latent cache, ``tiles * tile_n * (r + dr) * 2`` bytes;
* per KV tile the two score products and their sum; the last tile's rows after ``L`` masked
  (:mod:`stepsim.workloads.decode_tiles`); ``MapAccum(OnlineSoftmax(dn + dr))`` with the ``c_KV`` tile as the
  values (FlashAttention's running max and DeepSeek's ``softmax_scale = (dn + dr) ** -0.5``; the YaRN
  ``mscale ** 2`` DeepSeek multiplies it by past the original context is taken by scaling ``q_nope`` and ``q_pe``);
* ``o_lat`` split into its H rows (``FlatMap(RowStreamify)``), each times ``W_UV[h]^T``, stored to ``out``
  ``[B * H, dv]``.

Symbols: the ``CacheReadAddrGen``'s ragged tile count is bound to the mean tiles per request (a Rational), which
makes off-chip bytes and FLOPs exact.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from stepsim.base.errors import ConfigError
from stepsim.graph import (
    BF16,
    FP32,
    Accum,
    Add,
    Bufferize,
    CacheReadAddrGen,
    Empty,
    Expand,
    FlatMap,
    Flatten,
    Graph,
    LinearOffChipLoad,
    Map,
    MapAccum,
    Matmul,
    MetadataSource,
    OnlineSoftmax,
    Promote,
    RandomOffChipLoad,
    RandomOffChipStore,
    RetileRow,
    RowStreamify,
    Sink,
    SoftmaxNormalize,
    Streamify,
    Tensor,
    Tile,
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
CHANNEL_DEPTH = WORKLOAD_CHANNEL_DEPTH["mla_attention"]


def mla_flops(tiles: int, requests: int, *, heads: int, kv_lora_rank: int, qk_nope_head_dim: int,
              qk_rope_head_dim: int, v_head_dim: int, tile_n: int) -> int:
    """FLOPs of the graph: with ``H`` heads, ``r``, ``dn``, ``dr``, ``dv``, ``t`` = tile_n, ``T`` KV tiles in all
    and ``B`` requests: the absorption ``B H 2 dn r``; per KV tile the two score products ``2 H t (r + dr)``,
    their sum ``H t`` and ``OnlineSoftmax``'s ``2 H t r + 8 H t + 2 H r + 6 H``; per request the mask ``H t``,
    the normalization ``H r`` and the output projection ``H 2 r dv``."""
    h, r, dn, dr, dv, t = heads, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim, tile_n
    per_tile = 2 * h * t * (r + dr) + h * t + 2 * h * t * r + 8 * h * t + 2 * h * r + 6 * h
    per_request = 2 * h * dn * r + h * t + h * r + 2 * h * r * dv
    return tiles * per_tile + requests * per_request


def weights_on_chip(g, tensor: Tensor, tile, heads: int, requests: int):
    """``tensor``'s per-head tiles read once, kept on chip and streamed once per request: ``[requests, heads]``."""
    load = LinearOffChipLoad(g, tensor, tile, (heads,), (1,), stream_dtype=FP32)
    return Flatten(g, Streamify(g, Bufferize(g, load, 1), (requests,), 1), 1, 2)


@gc_paused  # see stepsim.graph.gcpause
def build_mla_attention(kv_lengths, *, heads: int = 128, kv_lora_rank: int = 512, qk_nope_head_dim: int = 128,
                        qk_rope_head_dim: int = 64, v_head_dim: int = 128, tile_n: int = 32,
                        max_n: int | None = None, compute_bw: int = COMPUTE_BW) -> Workload:
    """MLA decode attention in the absorbed form (see the module docstring; defaults: DeepSeek-V3's dims).

    Parameters
    ----------
    kv_lengths : sequence of int
        Per request the tokens cached before the new one (the new token's latent is row ``L``).
    heads, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim : int
        H, r, dn, dr, dv (elements).
    tile_n : int
        Cache rows per KV tile.
    max_n : int, optional
        Cache rows per request (a multiple of ``tile_n``); default the longest request's tiles.
    compute_bw : int
        FLOPs/cycle of every compute node.

    Returns
    -------
    Workload
        name ``"mla_attention"``, params (``kv_tiles``, ``latent_cache_bytes``, ...), trace ``{"kv_lengths"}``.
    """
    h = positive_int("heads", heads)
    r = positive_int("kv_lora_rank", kv_lora_rank)
    dn = positive_int("qk_nope_head_dim", qk_nope_head_dim)
    dr = positive_int("qk_rope_head_dim", qk_rope_head_dim)
    dv = positive_int("v_head_dim", v_head_dim)
    t = positive_int("tile_n", tile_n)
    bw = positive_int("compute_bw", compute_bw)
    seq_len_tiled, _ = kv_metadata(kv_lengths, t)  # validates the lengths (one line each)
    lengths = np.asarray(kv_lengths).astype(np.int64)
    batch = len(lengths)
    max_n = cache_slots(int(seq_len_tiled.max()) * t, max_n, t)

    g = Graph(f"mla-attention-b{batch}")
    q_nope_t = Tensor("q_nope", (batch * h, dn), BF16)
    q_pe_t = Tensor("q_pe", (batch * h, dr), BF16)
    kv_cache = Tensor("kv_cache", (batch * max_n, r), BF16)
    pe_cache = Tensor("pe_cache", (batch * max_n, dr), BF16)
    mask_t = Tensor("mask", (batch, t), BF16)
    out_t = Tensor("out", (batch * h, dv), BF16)

    # the absorption: per request and head q_nope[h] @ W_UK[h], the heads' rows packed into one (H, r) tile
    q_nope = Flatten(g, LinearOffChipLoad(g, q_nope_t, (1, dn), (batch, h), (h, 1), stream_dtype=FP32), 1, 2)
    w_uk = weights_on_chip(g, Tensor("w_uk", (h * dn, r), BF16), (dn, r), h, batch)
    q_rows = Map(g, [q_nope, w_uk], Matmul(), compute_bw=bw)
    q_lat = Promote(g, Accum(g, q_rows, RetileRow(), Empty(0, r), 1, compute_bw=0, out_dtype=Tile(FP32, h, r)), 0)
    q_pe = Flatten(g, LinearOffChipLoad(g, q_pe_t, (h, dr), (batch, 1), (1, 1), stream_dtype=FP32), 1, 2)

    # the latent cache, tile by tile: both score products over it, their sum, the last tile masked
    idx, seq_len = (Flatten(g, MetadataSource(g, v), 0, 1) for v in (np.arange(batch, dtype=np.int64), seq_len_tiled))
    c_addr = CacheReadAddrGen(g, idx, seq_len, max_n // t)
    latent = RandomOffChipLoad(g, c_addr, kv_cache, (t, r), stream_dtype=FP32)
    shape = latent.stream.shape
    pe_addr = CacheReadAddrGen(g, idx, seq_len, max_n // t)
    pe_addr.assume_shape(0, shape)  # the rope keys of the same rows
    rope = RandomOffChipLoad(g, pe_addr, pe_cache, (t, dr), stream_dtype=FP32)
    s_lat = Map(g, [Expand(g, q_lat, latent, 1), latent], Matmul(weight_transposed=True), compute_bw=bw)
    s_pe = Map(g, [Expand(g, q_pe, rope, 1), rope], Matmul(weight_transposed=True), compute_bw=bw)
    mask = Flatten(g, LinearOffChipLoad(g, mask_t, (1, t), (batch,), (1,), stream_dtype=FP32), 0, 1)
    scores = mask_last_tile(g, Map(g, [s_lat, s_pe], Add(), compute_bw=bw), seq_len, mask, bw)
    state = MapAccum(g, scores, latent, OnlineSoftmax(dn + dr), Zero(h, r + 2), 1, compute_bw=bw)
    o_lat = Map(g, state, SoftmaxNormalize(), compute_bw=bw)

    # the output: each head's latent row times W_UV[h]^T
    w_uv = weights_on_chip(g, Tensor("w_uv", (h * dv, r), BF16), (dv, r), h, batch)
    out = Map(g, [FlatMap(g, o_lat, RowStreamify()), w_uv], Matmul(weight_transposed=True), compute_bw=bw,
              write_back_mu=True)
    out_idx = Flatten(g, MetadataSource(g, np.arange(batch * h, dtype=np.int64)), 0, 1)
    Sink(g, RandomOffChipStore(g, Flatten(g, out, 0, 1), out_idx, out_t, (1, dv)))
    g.finalize()

    tiles = int(seq_len_tiled.sum())
    dims = dict(heads=h, kv_lora_rank=r, qk_nope_head_dim=dn, qk_rope_head_dim=dr, v_head_dim=dv, tile_n=t)
    workload = Workload(
        name="mla_attention", graph=g, channel_depth=CHANNEL_DEPTH, hardware=WORKLOAD_HARDWARE["mla_attention"],
        algorithmic_flops=mla_flops(tiles, batch, **dims),
        params=dict(batch=batch, **dims, max_n=max_n, compute_bw=bw, channel_depth=CHANNEL_DEPTH, kv_tiles=tiles,
                    latent_cache_bytes=tiles * t * (r + dr) * 2),
        trace={"kv_lengths": lengths},
    )
    lengths.flags.writeable = False
    workload.bindings = {c_addr.tiles_symbol: sp.Rational(tiles, batch)}
    return workload


def from_config(cfg: Mapping) -> Workload:
    """The MLA decode attention of a normalized run config: the KV-length batch (``trace``, ``batch_id``;
    default the bundled synthetic decode batch), the MLA dimensions of ``model`` (default ``deepseek-v3``;
    one line for a model without MLA), ``tile_n``."""
    from stepsim.models.presets import resolve_model
    from stepsim.trace_io.load import load_kv_lengths
    from stepsim.workloads.config import apply_channel_depth, compute_bw_kwargs, resolved_trace

    model = resolve_model(cfg["model"])
    if not model.is_mla:
        raise ConfigError(f"model {model.name!r} has no multi-head latent attention (no 'kv_lora_rank' in "
                          f"{model.source}); the mla_attention workload needs an MLA model such as deepseek-v3")
    lengths = load_kv_lengths(resolved_trace(cfg), cfg["batch_id"])
    kw = compute_bw_kwargs(cfg)
    workload = build_mla_attention(lengths, heads=model.heads, kv_lora_rank=model.kv_lora_rank,
                                   qk_nope_head_dim=model.qk_nope_head_dim, qk_rope_head_dim=model.qk_rope_head_dim,
                                   v_head_dim=model.v_head_dim, tile_n=cfg["tile_n"], **kw)
    return apply_channel_depth(workload, cfg)
