"""GQA decode attention's NumPy reference and seeded functional inputs (kind ``attention``)."""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from stepsim.base.errors import ArgumentError, ShapeError
from stepsim.workloads.attention.build import kv_metadata, region_assignment
from stepsim.workloads.base import Workload
from stepsim.workloads.numerics import (
    as_f32,
    checked_array,
    expect_shape,
    seeded_normal,
    take_input,
    workload_trace,
)


# =========================================================================================================
# GQA decode attention
# =========================================================================================================
class AttentionReference(NamedTuple):
    """Result of :func:`gqa_decode_reference`, each array in the layout of the corresponding input."""

    out: np.ndarray  #: float32, q's layout: [B, G, D] or [B*G, D]
    k_cache: np.ndarray  #: float32 copy of k_cache with new_k appended at row kv_len of each request
    v_cache: np.ndarray  #: float32 copy of v_cache with new_v appended likewise


SOFTMAX_FORMS = ("stable", "plain")
ORDERS = ("tiled", "direct")


def gqa_decode_reference(q, k_cache, v_cache, kv_lengths, new_k, new_v, *, softmax: str = "stable",
                         order: str = "tiled", tile_n: int = 32,
                         include_tile_padding: bool = False) -> AttentionReference:
    """Grouped-query decode attention of one KV head with KV-cache append.

    For request ``b`` with ``L = kv_lengths[b]`` cached tokens: the new key/value is written at row ``L`` of
    the request's cache block, then its ``G`` query rows attend to rows ``0..L`` (the new token included)::

        stable:  out = softmax(q K^T / sqrt(D)) V          (max-subtracted; never overflows)
        plain:   out = exp(q K^T) V / rowsum(exp(q K^T))  (the artifact's form)

    The two differ in the scale: with exact arithmetic ``plain(q) == stable(q * sqrt(D))``. Subtracting the
    row max changes nothing mathematically; it keeps ``exp`` finite. The plain form's scores are
    exponentiated in fp32 as the graph does, so scores above ~88.7 give ``inf`` (and ``inf/inf = nan``), like
    the graph; those entries are returned as such (see :func:`max_rel_error` for comparing them).

    ``order="tiled"`` walks the cache in tiles of ``tile_n`` rows, as the graph streams them: plain keeps
    running sums of ``exp(S_t) V_t`` and ``rowsum(exp(S_t))`` (the graph's MapAccum and Accum); stable keeps a
    running row max ``m``, rescaling the running sums by ``exp(m_old - m_new)`` whenever it grows
    (FlashAttention). ``order="direct"`` forms all scores at once (a one-shot softmax), for cross-checking.
    Both accumulate in float64 and agree to float32 rounding. Both forms round the score tiles to fp32, as the
    graph materialises them; the plain form also rounds its ``exp`` tiles. The stable form's running state
    stays in float64 here (the graph's ``OnlineSoftmax`` keeps it in fp32), which the tolerance covers.

    ``include_tile_padding=True`` reproduces what :func:`~stepsim.workloads.attention.build.build_attention`
    computes: it reads ``ceil((L+1)/tile_n)`` whole tiles, and the rows ``L+1 ..`` of the last tile take part
    in the softmax with whatever the cache holds there (the graph has no mask). With a zeroed tail each such
    row adds ``exp(0) = 1`` to the plain denominator and nothing to the numerator. ``False`` (default) is the
    intended attention over rows ``0..L`` only.

    Mapping onto the graph's tensors: ``q`` is ``"q"`` ([B*G, D], request ``b`` in rows ``b*G..``; the coarse
    strategy splits it per region into ``"q_region{r}"``), ``new_k``/``new_v`` are ``"k"``/``"v"`` (or
    ``"k_region{r}"``/``"v_region{r}"``), ``k_cache``/``v_cache`` are ``"k_cache"``/``"v_cache"``
    ([B*max_n, D], request ``b`` in rows ``b*max_n..``; read and written back by the graph), ``out`` is the
    stored ``"out"`` (bf16 storage).

    Parameters
    ----------
    q : array [B, G, D] or [B*G, D]
        Query rows (``G`` query heads share the KV head).
    k_cache, v_cache : array [B, N, D] or [B*N, D]
        KV caches, ``N`` rows (tokens) reserved per request.
    kv_lengths : int array [B]
        Tokens already cached per request (before the append); needs ``L + 1 <= N``.
    new_k, new_v : array [B, D]
        Key and value of the token being generated.
    softmax : {"stable", "plain"}
        See above (``"stable"`` scales by ``1/sqrt(D)``; ``"plain"`` does not).
    order : {"tiled", "direct"}
        Tile-by-tile in the graph's order, or one-shot.
    tile_n : int
        Cache rows per tile (32 in the experiments).
    include_tile_padding : bool
        Let the rows after the new token in the last tile take part (the shipped graph's behaviour); needs
        ``ceil((L+1)/tile_n) * tile_n <= N``.

    Returns
    -------
    AttentionReference
        ``out`` (float32, q's layout) and the appended caches (float32 copies in the input layout).

    Raises
    ------
    ShapeError
        Naming the argument whose shape does not fit (``B`` from ``kv_lengths``, ``D`` from ``q``).
    ArgumentError
        For bad lengths, a cache without room for the new row (or the padded last tile), or unknown options.
    """
    who = "gqa_decode_reference"
    if softmax not in SOFTMAX_FORMS:
        raise ArgumentError(f"{who}: softmax must be one of {SOFTMAX_FORMS}, got {softmax!r}")
    if order not in ORDERS:
        raise ArgumentError(f"{who}: order must be one of {ORDERS}, got {order!r}")
    seq_len_tiled, _ = kv_metadata(kv_lengths, tile_n)  # validates lengths and tile_n (ArgumentError)
    lengths = np.asarray(kv_lengths).astype(np.int64)
    batch = len(lengths)

    q_arr = checked_array(q, who, "q", (2, 3))
    if q_arr.ndim == 2:
        if q_arr.shape[0] % batch:
            raise ShapeError(f"{who}: q has shape {list(q_arr.shape)}; a flat q needs B*G rows with B = {batch} "
                             f"(len(kv_lengths))")
        q3 = q_arr.reshape(batch, -1, q_arr.shape[1])
    else:
        q3 = q_arr
        if q3.shape[0] != batch:
            raise ShapeError(f"{who}: q has shape {list(q3.shape)}, expected [B, G, D] with B = {batch} "
                             f"(len(kv_lengths))")
    d = q3.shape[2]
    caches = []
    for name, cache in (("k_cache", k_cache), ("v_cache", v_cache)):
        c = checked_array(cache, who, name, (2, 3))
        if c.ndim == 2:
            if c.shape[0] % batch or c.shape[1] != d:
                raise ShapeError(f"{who}: {name} has shape {list(c.shape)}; a flat cache needs [B*N, D] with "
                                 f"B = {batch} and D = {d} (from q)")
            c3 = c.reshape(batch, -1, d)
        else:
            c3 = c
            if c3.shape[0] != batch or c3.shape[2] != d:
                raise ShapeError(f"{who}: {name} has shape {list(c3.shape)}, expected [B, N, D] with B = {batch}, "
                                 f"D = {d}")
        caches.append((c, c3.copy()))
    (k_in, keys), (v_in, values) = caches
    if keys.shape != values.shape:
        raise ShapeError(f"{who}: k_cache {list(k_in.shape)} and v_cache {list(v_in.shape)} differ in shape")
    max_n = keys.shape[1]
    rows_new = []
    for name, row in (("new_k", new_k), ("new_v", new_v)):
        r = checked_array(row, who, name, 2)
        expect_shape(who, name, r, (batch, d), "[B, D]")
        rows_new.append(r)

    # rows each request reads: up to the new token, or whole tiles as the graph does
    limits = seq_len_tiled * tile_n if include_tile_padding else lengths + 1
    too_long = np.flatnonzero(limits > max_n)
    if too_long.size:
        b = int(too_long[0])
        what = f"{int(limits[b])} rows (whole tiles of {tile_n})" if include_tile_padding else \
            f"row {int(lengths[b])} for the new token"
        raise ArgumentError(f"{who}: request {b} has kv_length {int(lengths[b])} and needs {what}, but the caches "
                            f"hold N = {max_n} rows per request")

    # the append: the graph's SetOffset/RowAppend writes row (L mod tile_n) of tile L // tile_n, i.e. row L
    keys[np.arange(batch), lengths] = rows_new[0]
    values[np.arange(batch), lengths] = rows_new[1]

    scale = 1.0 / math.sqrt(d) if softmax == "stable" else 1.0
    out = np.empty_like(q3)
    attend = _attend_tiled if order == "tiled" else _attend_direct
    with np.errstate(over="ignore", invalid="ignore"):  # plain form: fp32 overflow gives inf/nan, as the graph
        for b in range(batch):
            n = int(limits[b])
            out[b] = attend(q3[b], keys[b, :n], values[b, :n], softmax, scale, tile_n)

    out = out.reshape(q_arr.shape).astype(np.float32)
    return AttentionReference(out, keys.reshape(k_in.shape).astype(np.float32),
                              values.reshape(v_in.shape).astype(np.float32))


def _exp_plain(s: np.ndarray) -> np.ndarray:
    """The graph's ``UnaryMap(Exp)`` on an fp32 score tile: an fp32 result (inf past ~88.7)."""
    return as_f32(np.exp(s))


def _attend_direct(q, keys, values, softmax, scale, tile_n):
    """One-shot attention of ``q`` [G, D] over ``keys``/``values`` [n, D] (float64 arrays)."""
    s = as_f32(q @ keys.T) * scale  # the score tile is materialised in fp32 (the graph's qkt Map)
    if softmax == "plain":
        p = _exp_plain(s)
    else:
        p = np.exp(s - s.max(axis=1, keepdims=True))
    return (p @ values) / p.sum(axis=1, keepdims=True)


def _attend_tiled(q, keys, values, softmax, scale, tile_n):
    """Tile-by-tile attention in the graph's streaming order (running sums; running max when stable)."""
    g, d = q.shape
    acc = np.zeros((g, d))  # running sum of p @ V: the graph's MapAccum(Matmul) over tiles
    row_sum = np.zeros(g)  # running sum of p's rows: the graph's Accum(Add) of tiles, then RowSum
    row_max = np.full(g, -np.inf)  # stable only: the largest score seen so far per query row
    for start in range(0, len(keys), tile_n):
        k_t, v_t = keys[start:start + tile_n], values[start:start + tile_n]
        s = as_f32(q @ k_t.T) * scale
        if softmax == "plain":
            p = _exp_plain(s)
        else:
            new_max = np.maximum(row_max, s.max(axis=1))
            rescale = np.exp(row_max - new_max)  # exp(-inf) = 0 before the first tile
            acc *= rescale[:, None]
            row_sum *= rescale
            row_max = new_max
            p = np.exp(s - new_max[:, None])
        acc += p @ v_t
        row_sum += p.sum(axis=1)
    return acc / row_sum[:, None]


def inputs(w: Workload, seed: int) -> dict:
    p = w.params
    b, g, d, max_n = p["batch"], p["query_per_kv_head"], p["head_dim"], p["max_n"]
    lengths = workload_trace(w, "kv_lengths")
    qk_std = d ** -0.25  # q.k then has standard deviation ~1: exp stays far from fp32 overflow
    q = seeded_normal(seed, "q", (b * g, d), qk_std, bf16=True)
    new_k = seeded_normal(seed, "k", (b, d), qk_std, bf16=True)
    new_v = seeded_normal(seed, "v", (b, d), 1.0, bf16=True)
    shared = p.get("shared_kv", False)  # one cache of keys and values: no v, v_cache (build's shared_kv)
    caches = {}
    for name, std in (("k_cache", qk_std), ("v_cache", 1.0))[:1 if shared else 2]:
        cache = np.zeros((b, max_n, d), np.float32)
        for r in range(b):  # per request, so a request's cache does not depend on the batch around it
            cache[r, :lengths[r]] = seeded_normal(seed, name, (int(lengths[r]), d), std, r, bf16=True)
        caches[name] = cache.reshape(b * max_n, d)
    arrays = dict(caches)
    if p["strategy"] == "coarse":
        for r, reqs in enumerate(region_assignment(b, "coarse", p["regions"])):
            arrays[f"q_region{r}"] = q.reshape(b, g, d)[reqs].reshape(-1, d)
            arrays[f"k_region{r}"] = new_k[reqs]
            if not shared:
                arrays[f"v_region{r}"] = new_v[reqs]
    else:
        arrays.update(q=q, k=new_k, **({} if shared else {"v": new_v}))
    return arrays


def outputs(workload: Workload, inputs: dict) -> dict:
    who, p = "workload_reference", workload.params
    b, g, d = p["batch"], p["query_per_kv_head"], p["head_dim"]
    shared = p.get("shared_kv", False)
    v = "k" if shared else "v"  # shared_kv: the keys are the values
    if p["strategy"] == "coarse":
        q = np.zeros((b, g, d), np.float32)
        new_k = np.zeros((b, d), np.float32)
        new_v = np.zeros((b, d), np.float32)
        for r, reqs in enumerate(region_assignment(b, "coarse", p["regions"])):
            q[reqs] = np.asarray(take_input(inputs, f"q_region{r}", who)).reshape(len(reqs), g, d)
            new_k[reqs] = take_input(inputs, f"k_region{r}", who)
            new_v[reqs] = take_input(inputs, f"{v}_region{r}", who)
        q = q.reshape(b * g, d)
    else:
        q, new_k, new_v = (take_input(inputs, n, who) for n in ("q", "k", v))
    res = gqa_decode_reference(q, take_input(inputs, "k_cache", who), take_input(inputs, f"{v}_cache", who),
                               workload_trace(workload, "kv_lengths"), new_k, new_v, softmax=p["softmax"], order="tiled",
                               tile_n=p["tile_n"], include_tile_padding=True)
    if shared:
        return {"out": res.out, "k_cache": res.k_cache}
    return {"out": res.out, "k_cache": res.k_cache, "v_cache": res.v_cache}


def reduction_length(workload: Workload, name: str) -> int:
    if name in ("k_cache", "v_cache"):
        return 0  # a pure append: no arithmetic
    p = workload.params
    seq_len_tiled, _ = kv_metadata(workload_trace(workload, "kv_lengths"), p["tile_n"])
    return p["head_dim"] + int(seq_len_tiled.max()) * p["tile_n"]  # scores over D, then sums over rows read
