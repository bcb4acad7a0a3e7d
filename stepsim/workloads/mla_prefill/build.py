"""Multi-head latent attention (MLA, DeepSeek-V2/V3/R1) for prefill, in the expanded form: the latent cache expanded
into per-head keys and values once per request, then causal attention over them (DeepSeek-V3's ``attn_impl=
"naive"``, the form serving engines run MLA prefill in; decode runs absorbed, :mod:`stepsim.workloads.mla_attention`).

Request ``b`` has ``cached[b]`` tokens in its latent cache and a chunk of ``chunk[b]`` new tokens after them, whose
latents are already in the cache (written by the projections, not modelled, as in the other attention kinds):
``n = cached + chunk`` rows of ``c_KV`` (``kv_lora_rank`` = r) in ``kv_cache`` and of ``k_pe`` (``qk_rope_head_dim``
= dr) in ``pe_cache``. With H heads, ``dn`` = ``qk_nope_head_dim``, ``dv`` = ``v_head_dim`` and ``W_UK[h]`` /
``W_UV[h]`` the key and value rows of head ``h`` in DeepSeek's ``wkv_b`` (tensors ``w_uk`` ``[H dn, r]`` and ``w_uv``
``[H dv, r]``)::

    k_nope[h] = c_KV @ W_UK[h]^T      v[h] = c_KV @ W_UV[h]^T              (every cached row, once)
    s[h] = (q_nope[h] . k_nope[h] + q_pe[h] . k_pe) / sqrt(dn + dr)      (causal: key position <= query's)
    out[h] = softmax(s[h]) @ v[h]

The graph has two phases joined by a barrier, as the kernel's two launches are:

1. **Expansion.** Every KV tile of every request (``tile_n`` = t latent rows, ``ceil(n / t)`` tiles a request) is
   read once, repeated on chip for the H heads, multiplied by the head's ``W_UK`` and ``W_UV`` (read from HBM once,
   kept on chip) and stored to the expanded caches ``k_exp`` ``[B H max_n, dn]`` and ``v_exp`` ``[B H max_n, dv]``
   (bf16). Each store acknowledges its tile once written (``RandomOffChipStore``'s ack stream).
2. **Barrier.** The last acknowledgement of each request in each store (a static selector picks it) releases that
   request's attention: its first (query tile, head) address waits for both (an ``Expand`` on them), and the
   others follow it in order (a ``Reassemble`` by a static selector), so no expanded tile is read before it is
   written.
3. **Attention.** Per query tile (t positions of a chunk, aligned to multiples of t, as
   :mod:`stepsim.workloads.prefill_attention` tiles them) and head, in that order: KV tiles ``0 .. g`` of
   ``k_exp``, ``v_exp`` (head ``h``) and ``pe_cache``; the two score products and their sum; the causal mask added to
   the diagonal tile; ``MapAccum(OnlineSoftmax(dn + dr))`` over the values and ``SoftmaxNormalize``; the
   ``(t, dv)`` tile stored to ``out`` ``[Q H t, dv]`` (row ``(j H + h) t + i``: query tile j, head h, position i).
   ``q_nope`` / ``q_pe`` (``[Q H t, dn]`` / ``[Q H t, dr]``, the same row order) are the chunk's queries after the
   projection and rotary embedding. The rope keys are read per head, as DeepSeek's naive form stores ``k_pe``
   with every head's key.

Rows of a query tile outside its chunk are computed and stored (an aligned kernel's padding), by the same rule in
the reference. Storage is bf16, streams fp32. Symbols: the attention's KV tiles per (query tile, head) are bound to
their mean (a Rational): off-chip bytes and FLOPs are exact.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from stepsim.base.errors import ArgumentError, ConfigError
from stepsim.graph import (
    BF16,
    FP32,
    Add,
    CacheReadAddrGen,
    Expand,
    Flatten,
    Graph,
    LinearOffChipLoad,
    Map,
    MapAccum,
    Matmul,
    MetadataSource,
    OnlineSoftmax,
    Partition,
    Promote,
    RandomOffChipLoad,
    RandomOffChipStore,
    Reassemble,
    RepeatStatic,
    SelectorSource,
    Sink,
    SoftmaxNormalize,
    Tensor,
    Zero,
)
from stepsim.graph.dims import sp
from stepsim.graph.gcpause import gc_paused
from stepsim.workloads.base import Workload
from stepsim.workloads.decode_tiles import cache_slots, mask_last_tile, positive_int
from stepsim.workloads.kinds import WORKLOAD_CHANNEL_DEPTH, WORKLOAD_HARDWARE
from stepsim.workloads.mla_attention.build import weights_on_chip

# the prefill kind's own validation of per-request token counts (private there: that module is hashed into the
# mapper's and the calibrations' keys, so it is imported rather than renamed)
from stepsim.workloads.prefill_attention.build import _tokens as token_counts
from stepsim.workloads.prefill_attention.build import prefill_batch, query_tiles

#: FLOPs/cycle of every compute node (the decode attention's, docs/semantics.md §5.5)
COMPUTE_BW = 2048
CHANNEL_DEPTH = WORKLOAD_CHANNEL_DEPTH["mla_prefill"]


def mla_prefill_flops(kv_tiles: int, attended: int, units: int, *, heads: int, kv_lora_rank: int,
                      qk_nope_head_dim: int, qk_rope_head_dim: int, v_head_dim: int, tile_n: int) -> int:
    """FLOPs of the graph: the expansion ``2 t r (dn + dv)`` per KV tile and head (``kv_tiles`` tiles); per KV tile
    a (query tile, head) attends to (``attended`` in all) the two score products ``2 t t (dn + dr)``, their sum
    ``t t`` and ``OnlineSoftmax``'s ``2 t t dv + 8 t t + 2 t dv + 6 t``; per (query tile, head) (``units``) the
    diagonal mask ``t t`` and the normalization ``t dv``."""
    h, r, dn, dr, dv, t = heads, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim, tile_n
    expansion = kv_tiles * h * 2 * t * r * (dn + dv)
    per_tile = 2 * t * t * (dn + dr) + t * t + 2 * t * t * dv + 8 * t * t + 2 * t * dv + 6 * t
    return expansion + attended * per_tile + units * (t * t + t * dv)


def _selector(g: Graph, pick: np.ndarray):
    """A static selector stream of ``pick`` (a bool an element): output 0 where True, 1 elsewhere."""
    return Flatten(g, SelectorSource(g, np.eye(2, dtype=np.int8)[np.where(pick, 0, 1)], 2), 0, 1)


def _split(g: Graph, stream, pick: np.ndarray):
    """``(picked, the others)`` of ``stream`` (a flat stream) by the static ``pick``, each flat."""
    split = Partition(g, stream, _selector(g, pick), 0, 2)
    split.assume_shape(0, (int(pick.sum()),))
    split.assume_shape(1, (len(pick) - int(pick.sum()),))
    return split[0], split[1]


def _last_of_each(g: Graph, acks, last: np.ndarray):
    """The acknowledgements of ``acks`` (a flat stream) where ``last`` is True, as ``[requests, 1]``; the others
    are dropped."""
    picked, others = _split(g, acks, last)
    Sink(g, others)
    return Promote(g, picked, 0)


def _released(g: Graph, stream, first: np.ndarray, barrier):
    """``stream`` (a flat stream, one element per (query tile, head)) with each request's first element held until
    that request's ``barrier`` element (``[requests, 1]``) arrives; the others follow in order."""
    firsts, others = _split(g, stream, first)
    held = Flatten(g, Expand(g, Promote(g, firsts, 0), barrier, 1), 0, 1)
    merged = Reassemble(g, [held, others], _selector(g, first), 0)
    merged.assume_shape(0, (len(first), 1))  # one element per selector
    return Flatten(g, merged, 0, 1)


@gc_paused  # see stepsim.graph.gcpause
def build_mla_prefill(cached, chunk, *, heads: int = 128, kv_lora_rank: int = 512, qk_nope_head_dim: int = 128,
                      qk_rope_head_dim: int = 64, v_head_dim: int = 128, tile_n: int = 32, max_n: int | None = None,
                      compute_bw: int = COMPUTE_BW) -> Workload:
    """MLA prefill attention in the expanded form (see the module docstring; defaults: DeepSeek-V3's dims).

    Parameters
    ----------
    cached, chunk : sequence of int
        Per request: latent rows already cached before the chunk (>= 0) and the chunk's new tokens (>= 1).
    heads, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim : int
        H, r, dn, dr, dv (elements).
    tile_n : int
        Positions per query tile and rows per KV tile.
    max_n : int, optional
        Cache rows per request (a multiple of ``tile_n``); default the longest request's tiles.
    compute_bw : int
        FLOPs/cycle of every compute node.

    Returns
    -------
    Workload
        name ``"mla_prefill"``, params (``kv_tiles``, ``query_tiles``, ``attended_tiles``, ...), trace
        ``{"cached", "chunk"}``.
    """
    h = positive_int("heads", heads)
    r = positive_int("kv_lora_rank", kv_lora_rank)
    dn = positive_int("qk_nope_head_dim", qk_nope_head_dim)
    dr = positive_int("qk_rope_head_dim", qk_rope_head_dim)
    dv = positive_int("v_head_dim", v_head_dim)
    t = positive_int("tile_n", tile_n)
    bw = positive_int("compute_bw", compute_bw)
    cached, chunk = token_counts("cached", cached, 0), token_counts("chunk", chunk, 1)
    if len(cached) != len(chunk):
        raise ArgumentError(f"cached and chunk must give one value per request, got {len(cached)} and {len(chunk)}")
    total = cached + chunk
    tiles = -(-total // t)  # KV tiles of each request
    max_n = cache_slots(int(tiles.max()) * t, max_n, t)
    slots = max_n // t  # tile slots a request (and a request's head) has in a cache
    batch = len(cached)
    request, group = query_tiles(cached, chunk, t)
    q_tiles = len(request)

    g = Graph(f"mla-prefill-r{batch}-q{q_tiles}")
    kv_cache = Tensor("kv_cache", (batch * max_n, r), BF16)
    pe_cache = Tensor("pe_cache", (batch * max_n, dr), BF16)
    k_exp = Tensor("k_exp", (batch * h * max_n, dn), BF16)
    v_exp = Tensor("v_exp", (batch * h * max_n, dv), BF16)

    # 1. expansion: every KV tile once, each head's key and value tiles stored
    owner = np.repeat(np.arange(batch), tiles)  # the request of each KV tile
    index = np.concatenate([np.arange(n) for n in tiles])  # its tile index within the request
    n_kv = len(owner)
    latent = RandomOffChipLoad(g, Flatten(g, MetadataSource(g, owner * slots + index), 0, 1), kv_cache, (t, r),
                               stream_dtype=FP32)
    per_head = RepeatStatic(g, latent, h)  # [tiles, H]
    heads_idx = np.arange(h)
    w_addr = Flatten(g, MetadataSource(g, ((owner[:, None] * h + heads_idx[None, :]) * slots + index[:, None])), 0, 1)
    acks = []
    for name, width, tensor in (("w_uk", dn, k_exp), ("w_uv", dv, v_exp)):
        weights = weights_on_chip(g, Tensor(name, (h * width, r), BF16), (width, r), h, n_kv)
        rows = Map(g, [per_head, weights], Matmul(weight_transposed=True), compute_bw=bw)
        acks.append(Flatten(g, RandomOffChipStore(g, rows, w_addr, tensor, (t, width)), 0, 1))

    # 2. barrier: each request's last acknowledgement of both stores
    last = np.zeros(n_kv * h, dtype=bool)
    last[np.cumsum(tiles) * h - 1] = True
    k_done, v_done = (_last_of_each(g, a, last) for a in acks)
    barrier = Expand(g, k_done, v_done, 1)  # [requests, 1]: both stores of the request done

    # 3. attention per (query tile, head), request by request
    unit_request = np.repeat(request, h)
    unit_group = np.repeat(group, h)
    unit_head = np.tile(heads_idx, q_tiles)
    first = np.r_[True, unit_request[1:] != unit_request[:-1]]
    units = len(unit_request)
    q_nope, q_pe = (Flatten(g, LinearOffChipLoad(g, Tensor(name, (units * t, width), BF16), (t, width), (units, 1),
                                                 (1, 1), stream_dtype=FP32), 1, 2)
                    for name, width in (("q_nope", dn), ("q_pe", dr)))
    seq_len = Flatten(g, MetadataSource(g, unit_group + 1), 0, 1)
    expanded = _released(g, Flatten(g, MetadataSource(g, unit_request * h + unit_head), 0, 1), first, barrier)
    k_addr = CacheReadAddrGen(g, expanded, seq_len, slots)
    keys = RandomOffChipLoad(g, k_addr, k_exp, (t, dn), stream_dtype=FP32)
    shape = keys.stream.shape
    v_addr = CacheReadAddrGen(g, expanded, seq_len, slots)
    v_addr.assume_shape(0, shape)  # the same tiles of the value cache
    values = RandomOffChipLoad(g, v_addr, v_exp, (t, dv), stream_dtype=FP32)
    pe_addr = CacheReadAddrGen(g, Flatten(g, MetadataSource(g, unit_request), 0, 1), seq_len, slots)
    pe_addr.assume_shape(0, shape)
    rope = RandomOffChipLoad(g, pe_addr, pe_cache, (t, dr), stream_dtype=FP32)
    s_nope = Map(g, [Expand(g, q_nope, keys, 1), keys], Matmul(weight_transposed=True), compute_bw=bw)
    s_pe = Map(g, [Expand(g, q_pe, rope, 1), rope], Matmul(weight_transposed=True), compute_bw=bw)
    mask = Flatten(g, RepeatStatic(g, LinearOffChipLoad(g, Tensor("mask", (t, t), BF16), (t, t), (1,), (0,),
                                                        stream_dtype=FP32), units), 0, 2)
    scores = mask_last_tile(g, Map(g, [s_nope, s_pe], Add(), compute_bw=bw), seq_len, mask, bw)
    state = MapAccum(g, scores, values, OnlineSoftmax(dn + dr), Zero(t, dv + 2), 1, compute_bw=bw)
    result = Map(g, state, SoftmaxNormalize(), compute_bw=bw, write_back_mu=True)
    out = Tensor("out", (units * t, dv), BF16)
    Sink(g, RandomOffChipStore(g, result, Flatten(g, MetadataSource(g, np.arange(units)), 0, 1), out, (t, dv)))
    g.finalize()

    attended = int(np.sum(unit_group + 1))
    dims = dict(heads=h, kv_lora_rank=r, qk_nope_head_dim=dn, qk_rope_head_dim=dr, v_head_dim=dv, tile_n=t)
    workload = Workload(
        name="mla_prefill", graph=g, channel_depth=CHANNEL_DEPTH, hardware=WORKLOAD_HARDWARE["mla_prefill"],
        algorithmic_flops=mla_prefill_flops(n_kv, attended, units, **dims),
        params=dict(requests=batch, **dims, max_n=max_n, compute_bw=bw, channel_depth=CHANNEL_DEPTH,
                    kv_tiles=n_kv, query_tiles=q_tiles, attended_tiles=attended,
                    chunk_tokens=int(chunk.sum()), cached_tokens=int(cached.sum())),
        trace={"cached": cached, "chunk": chunk},
    )
    cached.flags.writeable = False
    chunk.flags.writeable = False
    workload.bindings = {k_addr.tiles_symbol: sp.Rational(attended, units)}
    return workload


def from_config(cfg: Mapping) -> Workload:
    """The MLA prefill of a normalized run config: the KV-length batch (``trace``, ``batch_id``; default the
    bundled synthetic decode batch) gives each request's context after the chunk, ``tile_m`` the chunk's tokens
    (each request's last ``min(tile_m, length)`` tokens, the rest cached), ``model`` the MLA dimensions (default
    ``deepseek-v3``; one line for a model without MLA), ``tile_n`` the tile."""
    from stepsim.models.presets import resolve_model
    from stepsim.workloads.config import apply_channel_depth, compute_bw_kwargs

    model = resolve_model(cfg["model"])
    if not model.is_mla:
        raise ConfigError(f"model {model.name!r} has no multi-head latent attention (no 'kv_lora_rank' in "
                          f"{model.source}); the mla_prefill workload needs an MLA model such as deepseek-v3")
    cached, chunk = prefill_batch(cfg)
    workload = build_mla_prefill(cached, chunk, heads=model.heads, kv_lora_rank=model.kv_lora_rank,
                                 qk_nope_head_dim=model.qk_nope_head_dim, qk_rope_head_dim=model.qk_rope_head_dim,
                                 v_head_dim=model.v_head_dim, tile_n=cfg["tile_n"], **compute_bw_kwargs(cfg))
    return apply_channel_depth(workload, cfg)
