"""MLA prefill's NumPy reference and seeded functional inputs (kind ``mla_prefill``).

:func:`mla_prefill_expanded` is DeepSeek-V3's naive (expanded) attention of a prompt chunk over a request's latent
cache, causal; :func:`outputs` is the graph's data path (the expanded caches stored in bf16, score tiles in fp32),
computing every row of every aligned query tile as the graph does (the rows outside the chunk by the same rule).
"""

from __future__ import annotations

import numpy as np

from stepsim.workloads.base import Workload
from stepsim.workloads.mla_attention.reference import softmax
from stepsim.workloads.numerics import as_f32, round_to_bf16, seeded_normal, take_input, workload_trace
from stepsim.workloads.prefill_attention.build import causal_mask, query_tiles


def mla_prefill_expanded(q_nope, q_pe, kv_cache, pe_cache, w_uk, w_uv, positions,
                         softmax_scale: float | None = None) -> np.ndarray:
    """Causal expanded MLA for the query rows at ``positions`` of one request: ``q_nope`` ``[H, P, dn]``, ``q_pe``
    ``[H, P, dr]``, the latent cache ``kv_cache`` ``[n, r]`` and ``pe_cache`` ``[n, dr]``, ``w_uk`` ``[H, dn, r]``,
    ``w_uv`` ``[H, dv, r]``; query row ``p`` attends to cache rows ``0 .. positions[p]``. Returns ``[H, P, dv]``
    (float64)::

        k = [kv_cache @ w_uk[h].T | pe_cache]    v = kv_cache @ w_uv[h].T
        out[h] = softmax(mask(q[h] @ k.T) * scale) @ v          scale = (dn + dr) ** -0.5
    """
    q_nope, q_pe, kv, pe, w_uk, w_uv = (np.asarray(a, np.float64) for a in (q_nope, q_pe, kv_cache, pe_cache,
                                                                           w_uk, w_uv))
    dn, dr = q_nope.shape[-1], q_pe.shape[-1]
    scale = (dn + dr) ** -0.5 if softmax_scale is None else softmax_scale
    k_nope = np.einsum("nc,hdc->hnd", kv, w_uk)
    v = np.einsum("nc,hdc->hnd", kv, w_uv)
    scores = (np.einsum("hpd,hnd->hpn", q_nope, k_nope) + np.einsum("hpd,nd->hpn", q_pe, pe)) * scale
    scores = np.where(np.arange(kv.shape[0])[None, None, :] <= np.asarray(positions)[None, :, None], scores, -np.inf)
    return np.einsum("hpn,hnd->hpd", softmax(scores), v)


def inputs(w: Workload, seed: int) -> dict:
    """Queries and caches of std 1, ``w_uk`` of std ``r**-0.5`` and ``w_uv`` of std ``r**-0.5`` (the expanded keys
    and values stay O(1)), all bf16; request ``b``'s cache rows ``0 .. cached + chunk - 1`` drawn per request, the
    rest zero; ``k_exp`` / ``v_exp`` noise; ``mask`` the causal tile."""
    p = w.params
    h, r, dn, dr, dv, t, max_n = (p[k] for k in ("heads", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
                                                "v_head_dim", "tile_n", "max_n"))
    cached, chunk = workload_trace(w, "cached"), workload_trace(w, "chunk")
    caches = {}
    for name, width in (("kv_cache", r), ("pe_cache", dr)):
        cache = np.zeros((len(cached), max_n, width), np.float32)
        for b, n in enumerate(cached + chunk):  # per request, so a request's cache does not depend on the batch
            cache[b, :n] = seeded_normal(seed, name, (int(n), width), 1.0, b, bf16=True)
        caches[name] = cache.reshape(-1, width)
    rows = p["query_tiles"] * h * t
    # the expanded caches hold noise (what an earlier step left there): the graph writes every tile it reads
    # first, so the attention reading any noise (its barrier not holding) fails the check
    for name, width in (("k_exp", dn), ("v_exp", dv)):
        caches[name] = seeded_normal(seed, name, (len(cached) * h * max_n, width), 1.0, bf16=True)
    return {"q_nope": seeded_normal(seed, "q_nope", (rows, dn), 1.0, bf16=True),
            "q_pe": seeded_normal(seed, "q_pe", (rows, dr), 1.0, bf16=True),
            "w_uk": seeded_normal(seed, "w_uk", (h * dn, r), r ** -0.5, bf16=True),
            "w_uv": seeded_normal(seed, "w_uv", (h * dv, r), r ** -0.5, bf16=True),
            **caches, "mask": round_to_bf16(causal_mask(1, t))}


def outputs(workload: Workload, inputs: dict) -> dict:
    """``out`` (every aligned query tile's rows, head by head) and the expanded caches ``k_exp`` / ``v_exp`` as the
    graph computes them: the expansion rounded to bf16 where it is stored (each request's whole tiles; the other
    rows keep their input), the score tiles to fp32."""
    who, p = "workload_reference", workload.params
    h, r, dn, dr, dv, t, max_n = (p[k] for k in ("heads", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
                                                "v_head_dim", "tile_n", "max_n"))
    q_nope, q_pe, kv, pe, w_uk, w_uv = (np.asarray(take_input(inputs, n, who), np.float64) for n in
                                        ("q_nope", "q_pe", "kv_cache", "pe_cache", "w_uk", "w_uv"))
    w_uk, w_uv = w_uk.reshape(h, dn, r), w_uv.reshape(h, dv, r)
    cached, chunk = workload_trace(workload, "cached"), workload_trace(workload, "chunk")
    batch = len(cached)
    # the tiles the expansion writes replace what the caches held; the rest stays
    k_exp = np.array(take_input(inputs, "k_exp", who), np.float32).reshape(batch, h, max_n, dn)
    v_exp = np.array(take_input(inputs, "v_exp", who), np.float32).reshape(batch, h, max_n, dv)
    for b, n in enumerate(cached + chunk):
        rows = slice(b * max_n, b * max_n + -(-int(n) // t) * t)  # the request's whole tiles, as the graph reads
        k_exp[b, :, :rows.stop - rows.start] = round_to_bf16(as_f32(np.einsum("nc,hdc->hnd", kv[rows], w_uk)))
        v_exp[b, :, :rows.stop - rows.start] = round_to_bf16(as_f32(np.einsum("nc,hdc->hnd", kv[rows], w_uv)))
    scale = (dn + dr) ** -0.5
    request, group = query_tiles(cached, chunk, t)
    out = np.zeros((len(request), h, t, dv), np.float64)
    i = np.arange(t)
    for j, (b, grp) in enumerate(zip(request, group)):
        keys = slice(0, (int(grp) + 1) * t)
        qn = q_nope[j * h * t:(j + 1) * h * t].reshape(h, t, dn)
        qp = q_pe[j * h * t:(j + 1) * h * t].reshape(h, t, dr)
        k = k_exp[b, :, keys].astype(np.float64)
        s = as_f32(as_f32(np.einsum("hpd,hnd->hpn", qn, k))
                   + as_f32(np.einsum("hpd,nd->hpn", qp, pe[b * max_n + keys.start:b * max_n + keys.stop])))
        s = s.astype(np.float64) * scale
        cols = np.arange(keys.stop)[None, None, :]
        s = np.where(cols <= (int(grp) * t + i)[None, :, None], s, -np.inf)  # the diagonal tile's causal mask
        out[j] = softmax(s) @ v_exp[b, :, keys].astype(np.float64)
    return {"out": out.reshape(-1, dv).astype(np.float32), "k_exp": k_exp.reshape(-1, dn),
            "v_exp": v_exp.reshape(-1, dv)}


def reduction_length(workload: Workload, name: str) -> int:
    p = workload.params
    if name in ("k_exp", "v_exp"):
        return p["kv_lora_rank"]  # the expansion over r
    _, group = query_tiles(workload_trace(workload, "cached"), workload_trace(workload, "chunk"), p["tile_n"])
    # the expansion, the scores over dn + dr, the softmax sums over the rows read
    return p["kv_lora_rank"] + p["qk_nope_head_dim"] + p["qk_rope_head_dim"] + int(group.max() + 1) * p["tile_n"]
