"""Causal prefill attention: each request's prompt chunk attends to its KV cache (the cached tokens and the
chunk itself, causally), tiled, for one KV head and the ``query_per_kv_head`` query heads sharing it.

Request ``b`` has ``cached[b]`` tokens in its KV cache and a chunk of ``chunk[b]`` new tokens at positions
``cached[b] .. cached[b] + chunk[b] - 1``, whose keys and values are already in the cache (written by the
projections, which are not modelled, as in the decoder workload). Query position ``p`` attends to the keys at
positions ``0 .. p``.

Tiling (``tile_n`` = t rows for queries and keys alike): positions are grouped into tiles aligned to multiples
of t. The chunk of a request covers the position tiles ``g = cached // t .. (cached + chunk - 1) // t``; each
is one **query tile**: the ``query_per_kv_head x t`` query rows of positions ``g t .. g t + t - 1`` (head-major:
row ``h t + i`` is head ``h`` at position ``g t + i``). Rows of positions outside the chunk (before it in the
first tile, after it in the last) are computed as well and stored (an aligned kernel's padding); the
reference computes them by the same rule. Query tile ``g`` reads KV tiles ``0 .. g`` of its request
(``CacheReadAddrGen``, ``g + 1`` tiles), so only its last KV tile, the diagonal one, holds keys after some of
its query positions: that tile's scores get the causal mask added (``0`` where key column ``c <= i``, the
query row's position in the tile, ``-1e30`` elsewhere), split off with ``FilterLastTile`` and put back with a
Reassemble as the decode graph appends its new key. The mask is one ``(query_per_kv_head x t, t)`` tile read
from HBM once and repeated on chip (``RepeatStatic``). Softmax:

* ``softmax="stable"`` (default for functional runs): ``MapAccum(OnlineSoftmax)`` over the KV tiles and
  ``Map(SoftmaxNormalize)``, FlashAttention's running max with the 1/sqrt(head_dim) scale;
* ``softmax="plain"``: the decode graph's exp / row-sum form (no scale, no running max).

Storage is bf16 (q, caches, mask, output) with fp32 streams, as the decode graph. Every query tile streams its
KV tiles in one pipeline; with ``regions`` > 1 (a mapped layer, :mod:`stepsim.mapping.kinds.prefill`) query tile
``j`` goes to pipeline ``j % regions``, any ``regions`` up to the query tiles: the first ``query tiles % regions``
pipelines get ``ceil(query tiles / regions)`` tiles, the others the floor (a dataflow compiler deals uneven
shares; dealing only a divisor of the query tiles ran a 1,028-token prompt, 132 query tiles, on 4 of its bucket's
128 regions). Each pipeline has metadata sources of its own tiles (their request, KV-tile count and output
tile), not one source dealt by a ``Parallelize``, whose static outer dimension must divide. Symbols: the KV-tile
count of each pipeline's ``CacheReadAddrGen`` stands for "KV tiles of one query tile"; the builder binds it to the
pipeline's own mean (a Rational), which makes off-chip bytes and FLOPs exact.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from stepsim.base.errors import ArgumentError
from stepsim.graph import (
    BF16,
    FP32,
    Accum,
    AccumAdd,
    Add,
    CacheReadAddrGen,
    Div,
    Exp,
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
    Partition,
    RandomOffChipLoad,
    RandomOffChipStore,
    Reassemble,
    RepeatStatic,
    RowSum,
    Sink,
    SoftmaxNormalize,
    Tensor,
    Zero,
)
from stepsim.graph.dims import sp
from stepsim.graph.gcpause import gc_paused
from stepsim.workloads.attention.build import SHARED_KV_FIFO_DEPTH
from stepsim.workloads.base import Workload
from stepsim.workloads.kinds import WORKLOAD_CHANNEL_DEPTH, WORKLOAD_HARDWARE

SOFTMAX_FORMS = ("plain", "stable")
#: FLOPs/cycle of every compute node (the decode attention's, docs/semantics.md §5.5)
COMPUTE_BW = 2048
#: the causal mask's value for a key after the query (added to the score; exp of it is 0 in fp32)
MASKED = -1e30
CHANNEL_DEPTH = WORKLOAD_CHANNEL_DEPTH["prefill_attention"]
#: what each region's metadata sources hold (regions > 1): its tiles' requests, KV-tile counts and output tiles
REGION_SOURCES = ("request", "kv_tiles", "out_tile")


def region_source_name(region: int, value: str) -> str:
    """The name of region ``region``'s metadata source of ``value`` (one of :data:`REGION_SOURCES`)."""
    return f"region{region}.{value}"


def _positive_int(name: str, value) -> int:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
        raise ArgumentError(f"{name} must be a positive int, got {value!r}")
    return int(value)


def _tokens(name: str, values, minimum: int) -> np.ndarray:
    arr = np.asarray(values)
    if arr.ndim != 1 or arr.size == 0 or not np.issubdtype(arr.dtype, np.integer):
        raise ArgumentError(f"{name} must be a non-empty 1-D sequence of ints (one per request), got {values!r}")
    bad = np.flatnonzero(arr < minimum)
    if bad.size:
        raise ArgumentError(f"{name}[{bad[0]}] = {arr[bad[0]]} must be at least {minimum}")
    return arr.astype(np.int64)


def query_tiles(cached, chunk, tile_n: int) -> tuple[np.ndarray, np.ndarray]:
    """``(request, group)`` of every query tile, int64: the position tiles ``g`` each chunk covers, in request
    order. Query tile ``(b, g)`` reads KV tiles ``0 .. g`` of request ``b``."""
    first = cached // tile_n
    last = (cached + chunk - 1) // tile_n
    counts = last - first + 1
    request = np.repeat(np.arange(len(cached), dtype=np.int64), counts)
    group = np.concatenate([np.arange(lo, hi + 1, dtype=np.int64) for lo, hi in zip(first, last)])
    return request, group


def causal_mask(query_per_kv_head: int, tile_n: int) -> np.ndarray:
    """The diagonal tile's mask ``(query_per_kv_head * tile_n, tile_n)`` float32: row ``h t + i``, column ``c``
    is 0 when ``c <= i`` and :data:`MASKED` otherwise."""
    i = np.arange(tile_n)
    one = np.where(i[None, :] <= i[:, None], 0.0, MASKED).astype(np.float32)
    return np.tile(one, (query_per_kv_head, 1))


def prefill_flops(groups, *, head_dim: int, query_per_kv_head: int, tile_n: int, softmax: str) -> int:
    """FLOPs of the tiles computed, with ``q = query_per_kv_head * tile_n`` query rows, ``t`` KV rows and
    ``d = head_dim``: per KV tile ``q K^T`` (``2 q t d``) and the softmax-weighted sum (stable:
    ``OnlineSoftmax``'s ``2 q t d + 8 q t + 2 q d + 6 q``; plain: exp ``4 q t``, ``P V`` ``2 q t d``, row-sum
    accumulation ``q t``); per query tile the mask add (``q t``) and the normalization (stable: ``q d``; plain:
    the row sum ``q t`` and the division ``q d``). Padding rows count: they are computed."""
    q, t, d = query_per_kv_head * tile_n, tile_n, head_dim
    kv_tiles = int(np.sum(np.asarray(groups) + 1))
    if softmax == "stable":
        return kv_tiles * (4 * q * t * d + 8 * q * t + 2 * q * d + 6 * q) + len(groups) * (q * t + q * d)
    return kv_tiles * (4 * q * t * d + 5 * q * t) + len(groups) * (2 * q * t + q * d)


@gc_paused  # see stepsim.graph.gcpause
def build_prefill_attention(cached, chunk, *, head_dim: int = 128, query_per_kv_head: int = 8, tile_n: int = 32,
                            max_n: int | None = None, compute_bw: int = COMPUTE_BW,
                            softmax: str = "stable", regions: int = 1, shared_kv: bool = False) -> Workload:
    """Causal prefill attention of prompt chunks (see the module docstring).

    Parameters
    ----------
    cached : sequence of int
        Per request: tokens already in its KV cache before the chunk (>= 0).
    chunk : sequence of int
        Per request: the chunk's new tokens (>= 1).
    head_dim, query_per_kv_head : int
        Head dimension and query heads sharing the simulated KV head.
    tile_n : int
        Rows per query and KV tile (positions).
    max_n : int, optional
        KV-cache rows per request (a multiple of ``tile_n``); default: the longest request rounded up to tiles.
    compute_bw : int
        FLOPs/cycle of every compute node.
    softmax : {"stable", "plain"}
    regions : int
        Parallel copies of the pipeline (1: the paper's graph), at most the query tiles; query tile ``j`` goes to
        region ``j % regions`` (a mapped prefill attention, :mod:`stepsim.mapping.kinds.prefill`): shares of
        ``ceil`` and ``floor(query tiles / regions)`` tiles.
    shared_kv : bool
        One cache whose rows are both the keys and the values (MLA's latent and rope key, as the decode graph's
        ``shared_kv``, :mod:`stepsim.workloads.attention.build`): its tiles are read once and feed ``P V`` too.

    Returns
    -------
    Workload
        name ``"prefill_attention"``, params (``requests``, ``query_tiles``, ``kv_tiles``, ...), trace
        ``{"cached": ..., "chunk": ...}`` and the symbol binding that makes its metrics exact.
    """
    if softmax not in SOFTMAX_FORMS:
        raise ArgumentError(f"softmax must be one of {', '.join(map(repr, SOFTMAX_FORMS))}; got {softmax!r}")
    d = _positive_int("head_dim", head_dim)
    heads = _positive_int("query_per_kv_head", query_per_kv_head)
    t = _positive_int("tile_n", tile_n)
    bw = _positive_int("compute_bw", compute_bw)
    cached = _tokens("cached", cached, 0)
    chunk = _tokens("chunk", chunk, 1)
    if len(cached) != len(chunk):
        raise ArgumentError(f"cached and chunk must give one value per request, got {len(cached)} and {len(chunk)}")
    total = cached + chunk
    need = int(-(-int(total.max()) // t) * t)
    if max_n is None:
        max_n = need
    max_n = _positive_int("max_n", max_n)
    if max_n % t or max_n < need:
        raise ArgumentError(f"max_n must be a multiple of tile_n={t} holding the longest request ({int(total.max())} "
                            f"tokens, {need} rows), got {max_n}")
    request, group = query_tiles(cached, chunk, t)
    n_tiles = len(group)
    regions = _positive_int("regions", regions)
    if regions > n_tiles:
        raise ArgumentError(f"regions={regions} must be at most the {n_tiles} query tiles (each region gets one)")
    rows = heads * t
    row_offset = max_n // t

    g = Graph(f"prefill-attention-r{len(cached)}-q{n_tiles}")
    q_t = Tensor("q", (n_tiles * rows, d), BF16)  # regions > 1: one tensor a region (below)
    k_cache = Tensor("k_cache", (len(cached) * max_n, d), BF16)
    v_cache = None if shared_kv else Tensor("v_cache", (len(cached) * max_n, d), BF16)
    mask_t = Tensor("mask", (rows, t), BF16)
    out = Tensor("out", (n_tiles * rows, d), BF16)

    def q_load(tensor, tiles):
        return Flatten(g, LinearOffChipLoad(g, tensor, (rows, d), (tiles, 1), (1, 1), stream_dtype=FP32), 1, 2)

    def metadata(tiles, region=None):  # the request, KV-tile count and output tile of each of ``tiles``, as streams
        values = (request[tiles], group[tiles] + 1, tiles)
        # a region's sources are named (region_source_name): a serving template finds them by name, since the
        # regions' slices of the data can be alike (one request: every region's requests are zeros)
        names = [None] * 3 if region is None else [region_source_name(region, v) for v in REGION_SOURCES]
        return [Flatten(g, MetadataSource(g, v, name=name), 0, 1) for v, name in zip(values, names)]

    cfg = dict(rows=rows, t=t, d=d, bw=bw, softmax=softmax, row_offset=row_offset, caches=(k_cache, v_cache, out),
               mask=mask_t)
    every = np.arange(n_tiles, dtype=np.int64)
    if regions == 1:  # the paper's graph, operator for operator
        q = q_load(q_t, n_tiles)
        k_addrs = [_region(g, q, *metadata(every), n_tiles, cfg)]
    else:  # query tile j to region j % regions: the first n_tiles % regions regions one tile more
        k_addrs = []
        for r in range(regions):
            before = len(g.ops)
            tiles = every[r::regions]
            # each region reads its own query tiles (tiles r, r + regions, ...: the projection writes them region by
            # region), so no one load issues every tile's requests; and has its own metadata (uneven shares)
            q = q_load(Tensor(f"q_region{r}", (len(tiles) * rows, d), BF16), len(tiles))
            k_addrs.append(_region(g, q, *metadata(tiles, r), len(tiles), cfg))
            for op in g.ops[before:]:
                op.group = ("region", r)
    g.finalize()

    kv_tiles = int(np.sum(group + 1))
    workload = Workload(
        name="prefill_attention", graph=g, channel_depth=CHANNEL_DEPTH,
        hardware=WORKLOAD_HARDWARE["prefill_attention"],
        algorithmic_flops=prefill_flops(group, head_dim=d, query_per_kv_head=heads, tile_n=t, softmax=softmax),
        params=dict(requests=len(cached), head_dim=d, query_per_kv_head=heads, tile_n=t, max_n=max_n,
                    compute_bw=bw, softmax=softmax, channel_depth=CHANNEL_DEPTH, query_tiles=n_tiles,
                    kv_tiles=kv_tiles, chunk_tokens=int(chunk.sum()), cached_tokens=int(cached.sum())),
        trace={"cached": cached, "chunk": chunk},
    )
    if regions > 1:  # said only when mapped: a paper run's params stay as they were
        workload.params["regions"] = regions
    if shared_kv:  # said only when set, likewise
        workload.params["shared_kv"] = True
    cached.flags.writeable = False
    chunk.flags.writeable = False
    # the K cache's tiles-per-query-tile symbol of each region: its own mean (exact traffic and FLOPs)
    workload.bindings = {addr.tiles_symbol: sp.Rational(int(np.sum(group[r::regions] + 1)),
                                                        len(group[r::regions]))
                         for r, addr in enumerate(k_addrs)}
    if regions > 1:
        workload.balanced_units = [tuple(tuple(op.name for op in g.ops if op.group == ("region", r))
                                         for r in range(regions))]
    return workload


def _region(g: Graph, q, idx, seq_len, out_idx, n_tiles: int, cfg: dict):
    """One pipeline over ``n_tiles`` query tiles: their KV loads, scores, the diagonal tile's mask, the softmax and
    the store (the module docstring). Returns its K-cache ``CacheReadAddrGen``."""
    rows, t, d, bw = cfg["rows"], cfg["t"], cfg["d"], cfg["bw"]
    k_cache, v_cache, out = cfg["caches"]
    k_addr = CacheReadAddrGen(g, idx, seq_len, cfg["row_offset"])
    keys = RandomOffChipLoad(g, k_addr, k_cache, (t, d), stream_dtype=FP32)
    shape = keys.stream.shape
    if v_cache is None:  # shared_kv: the key tiles are the values too
        values = keys
        keys.fanout_depth = SHARED_KV_FIFO_DEPTH
    else:
        v_addr = CacheReadAddrGen(g, idx, seq_len, cfg["row_offset"])
        v_addr.assume_shape(0, shape)  # V reads the same tiles as K
        values = RandomOffChipLoad(g, v_addr, v_cache, (t, d), stream_dtype=FP32)
    scores = Map(g, [Expand(g, q, keys, 1), keys], Matmul(weight_transposed=True), compute_bw=bw)
    last = FilterLastTile(g, seq_len)
    last.assume_shape(0, shape)
    split = Partition(g, scores, last, 0, 2)
    split.assume_shape(0, (shape[0],))  # the diagonal tile of every query tile
    split.assume_shape(1, (shape[0] * (shape[1] - 1),))
    mask = Flatten(g, RepeatStatic(g, LinearOffChipLoad(g, cfg["mask"], (rows, t), (1,), (0,), stream_dtype=FP32),
                                   n_tiles), 0, 2)
    masked = Map(g, [split[0], mask], Add(), compute_bw=bw)
    merged = Reassemble(g, [masked, split[1]], last, 0)
    merged.assume_shape(0, shape + (1,))
    full = Flatten(g, merged, 0, 1)
    if cfg["softmax"] == "stable":
        state = MapAccum(g, full, values, OnlineSoftmax(d), Zero(rows, d + 2), 1, compute_bw=bw)
        result = Map(g, state, SoftmaxNormalize(), compute_bw=bw, write_back_mu=True)
    else:
        probs = Map(g, full, Exp(), compute_bw=bw)
        pv = MapAccum(g, probs, values, Matmul(), Zero(rows, d), 1, compute_bw=bw)
        row_tiles = Accum(g, probs, AccumAdd(), Zero(rows, t), 1, compute_bw=bw)
        denom = Map(g, row_tiles, RowSum(), compute_bw=bw)
        result = Map(g, [pv, denom], Div(), compute_bw=bw, write_back_mu=True)
    Sink(g, RandomOffChipStore(g, result, out_idx, out, (rows, d)))
    return k_addr


def from_config(cfg: Mapping) -> Workload:
    """The prefill attention of a normalized run config: the KV-length batch (``trace``, ``batch_id``; default
    the bundled synthetic decode batch) gives each request's context after the chunk, ``tile_m`` the chunk's
    tokens (each request's last ``min(tile_m, length)`` tokens are its chunk, the rest are cached), ``model``
    the head dimension and query heads per KV head, ``tile_n`` the tile."""
    from stepsim.models.presets import resolve_model
    from stepsim.workloads.config import apply_channel_depth, compute_bw_kwargs

    cached, chunk = prefill_batch(cfg)
    model = resolve_model(cfg["model"])
    model.refuse_unmodelled("the prefill_attention workload")
    attention = model.attention
    workload = build_prefill_attention(cached, chunk, head_dim=attention.head_dim,
                                       query_per_kv_head=attention.query_per_kv_head, tile_n=cfg["tile_n"],
                                       softmax=cfg["softmax"] or "stable", **compute_bw_kwargs(cfg))
    return apply_channel_depth(workload, cfg)


def prefill_batch(cfg: Mapping) -> tuple[np.ndarray, np.ndarray]:
    """A prefill workload's requests from a normalized run config: ``(cached, chunk)`` tokens of each, from the
    KV-length batch (``trace``, ``batch_id``: each request's context after the chunk) and ``tile_m`` (the chunk is
    its last ``min(tile_m, length)`` tokens); a request of no token is a one-line error."""
    from stepsim.trace_io.load import load_kv_lengths
    from stepsim.workloads.config import resolved_trace

    lengths = load_kv_lengths(resolved_trace(cfg), cfg["batch_id"])
    if (lengths < 1).any():
        j = int(np.argmax(lengths < 1))
        raise ArgumentError(f"request {j} has KV length {int(lengths[j])}: a prefill needs at least one token")
    chunk = np.minimum(lengths, cfg["tile_m"])
    return lengths - chunk, chunk
