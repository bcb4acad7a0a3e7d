"""MLA decode attention's NumPy references and seeded functional inputs (kind ``mla_attention``).

Two forms of DeepSeek-V3's attention (``model.py``, ``MLA.forward``), both for one decode token per request:

* :func:`mla_absorbed` — ``attn_impl="absorb"``: ``q_nope`` through ``W_UK`` into the latent space, scores
  against the latent cache plus the rope scores, the softmax-weighted latent rows through ``W_UV``;
* :func:`mla_expanded` — ``attn_impl="naive"``: the latent cache expanded through ``wkv_b`` into per-head keys
  ``[k_nope | k_pe]`` and values, then ordinary multi-head attention.

Both work in float64 on the inputs as given; they agree to rounding (the absorption is associativity of
matrix products). :func:`outputs` is the graph's data path (fp32 rounding where the graph materialises a tile).
"""

from __future__ import annotations

import numpy as np

from stepsim.workloads.base import Workload
from stepsim.workloads.decode_tiles import tail_mask
from stepsim.workloads.numerics import as_f32, seeded_normal, take_input, workload_trace


def softmax(s: np.ndarray) -> np.ndarray:
    """Softmax over the last axis (max subtracted first)."""
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    return p / p.sum(axis=-1, keepdims=True)


def wkv_b(w_uk: np.ndarray, w_uv: np.ndarray) -> np.ndarray:
    """DeepSeek's ``wkv_b`` weight ``[H * (dn + dv), r]`` from its per-head halves ``w_uk`` ``[H, dn, r]`` and
    ``w_uv`` ``[H, dv, r]`` (head ``h``'s rows: its ``dn`` key rows, then its ``dv`` value rows)."""
    h, _, r = w_uk.shape
    return np.concatenate([w_uk, w_uv], axis=1).reshape(-1, r)


def mla_absorbed(q_nope, q_pe, kv_cache, pe_cache, w_kv_b, v_head_dim: int,
                 softmax_scale: float | None = None) -> np.ndarray:
    """One request's absorbed MLA decode: ``q_nope`` ``[H, dn]``, ``q_pe`` ``[H, dr]``, the latent cache
    ``kv_cache`` ``[n, r]`` and ``pe_cache`` ``[n, dr]`` of the ``n`` rows attended to (the new token's
    included), ``w_kv_b`` ``[H * (dn + dv), r]``; ``softmax_scale`` default ``(dn + dr) ** -0.5`` (DeepSeek
    multiplies it by YaRN's ``mscale ** 2`` past the original context: the same as scaling both query halves by
    it, which is how the graph, whose scale is ``(dn + dr) ** -0.5``, takes it). Returns ``[H, dv]`` (float64)::

        q_nope = einsum("hd,hdc->hc", q_nope, wkv_b[:, :dn])
        scores = (einsum("hc,tc->ht", q_nope, kv_cache) + einsum("hr,tr->ht", q_pe, pe_cache)) * scale
        x = einsum("ht,tc->hc", softmax(scores), kv_cache)
        x = einsum("hc,hdc->hd", x, wkv_b[:, -dv:])
    """
    q_nope, q_pe, kv, pe, w = (np.asarray(a, np.float64) for a in (q_nope, q_pe, kv_cache, pe_cache, w_kv_b))
    h, dn = q_nope.shape
    w = w.reshape(h, -1, w.shape[1])
    scale = (dn + q_pe.shape[1]) ** -0.5 if softmax_scale is None else softmax_scale
    q_lat = np.einsum("hd,hdc->hc", q_nope, w[:, :dn])
    scores = (q_lat @ kv.T + q_pe @ pe.T) * scale
    return np.einsum("hc,hdc->hd", softmax(scores) @ kv, w[:, -v_head_dim:])


def mla_expanded(q_nope, q_pe, kv_cache, pe_cache, w_kv_b, v_head_dim: int,
                 softmax_scale: float | None = None) -> np.ndarray:
    """The same attention in the expanded (naive) form: per-head keys ``[kv_cache @ W_UK[h]^T | k_pe]`` and
    values ``kv_cache @ W_UV[h]^T``, queries ``[q_nope | q_pe]``, softmax over ``q k * softmax_scale`` (default
    ``(dn + dr) ** -0.5``)."""
    q_nope, q_pe, kv, pe, w = (np.asarray(a, np.float64) for a in (q_nope, q_pe, kv_cache, pe_cache, w_kv_b))
    h, dn = q_nope.shape
    n = kv.shape[0]
    expanded = (kv @ w.T).reshape(n, h, dn + v_head_dim)  # wkv_b(kv): [n, H, dn + dv]
    k_nope, v = expanded[..., :dn], expanded[..., dn:]
    k = np.concatenate([k_nope, np.broadcast_to(pe[:, None, :], (n, h, pe.shape[1]))], axis=-1)
    q = np.concatenate([q_nope, q_pe], axis=-1)
    scores = np.einsum("hd,thd->ht", q, k) * (q.shape[1] ** -0.5 if softmax_scale is None else softmax_scale)
    return np.einsum("ht,thd->hd", softmax(scores), v)


def inputs(w: Workload, seed: int) -> dict:
    """Queries and caches of std 1, ``w_uk`` of std ``dn**-0.5`` and ``w_uv`` of std ``r**-0.5`` (so the
    absorbed query and the output stay O(1)), all bf16; request ``b``'s cache rows ``0 .. L`` drawn per request,
    the rest zero; ``mask`` the last tiles' masks."""
    p = w.params
    b, h, r, dn, dr, dv, t, max_n = (p[k] for k in ("batch", "heads", "kv_lora_rank", "qk_nope_head_dim",
                                                    "qk_rope_head_dim", "v_head_dim", "tile_n", "max_n"))
    lengths = workload_trace(w, "kv_lengths")
    caches = {}
    for name, width in (("kv_cache", r), ("pe_cache", dr)):
        cache = np.zeros((b, max_n, width), np.float32)
        for req, n in enumerate(lengths + 1):  # per request, so a request's cache does not depend on the batch
            cache[req, :n] = seeded_normal(seed, name, (int(n), width), 1.0, req, bf16=True)
        caches[name] = cache.reshape(-1, width)
    return {"q_nope": seeded_normal(seed, "q_nope", (b * h, dn), 1.0, bf16=True),
            "q_pe": seeded_normal(seed, "q_pe", (b * h, dr), 1.0, bf16=True),
            "w_uk": seeded_normal(seed, "w_uk", (h * dn, r), dn ** -0.5, bf16=True),
            "w_uv": seeded_normal(seed, "w_uv", (h * dv, r), r ** -0.5, bf16=True),
            **caches, "mask": tail_mask(lengths % t + 1, t)}


def outputs(workload: Workload, inputs: dict) -> dict:
    """``out`` as the graph computes it: :func:`mla_absorbed`'s steps with the absorbed query, the score tiles
    and the latent output rounded to fp32 where the graph materialises them."""
    who, p = "workload_reference", workload.params
    h, r, dn, dv, max_n = (p[k] for k in ("heads", "kv_lora_rank", "qk_nope_head_dim", "v_head_dim", "max_n"))
    q_nope, q_pe, kv, pe, w_uk, w_uv = (np.asarray(take_input(inputs, n, who), np.float64) for n in
                                        ("q_nope", "q_pe", "kv_cache", "pe_cache", "w_uk", "w_uv"))
    w_uk, w_uv = w_uk.reshape(h, dn, r), w_uv.reshape(h, dv, r)
    scale = (dn + q_pe.shape[1]) ** -0.5
    out = []
    for b, n in enumerate(workload_trace(workload, "kv_lengths") + 1):
        rows = slice(b * h, (b + 1) * h)
        cache = slice(b * max_n, b * max_n + int(n))
        q_lat = as_f32(np.einsum("hd,hdc->hc", q_nope[rows], w_uk)).astype(np.float64)
        s = as_f32(as_f32(q_lat @ kv[cache].T) + as_f32(q_pe[rows] @ pe[cache].T)).astype(np.float64) * scale
        o_lat = as_f32(softmax(s) @ kv[cache]).astype(np.float64)
        out.append(np.einsum("hc,hdc->hd", o_lat, w_uv))
    return {"out": np.concatenate(out).astype(np.float32)}


def reduction_length(workload: Workload, name: str) -> int:
    p = workload.params
    rows = int((workload_trace(workload, "kv_lengths") // p["tile_n"]).max() + 1) * p["tile_n"]
    # the absorption over dn, the scores over r + dr, the softmax sums over the rows read, the output over r
    return p["qk_nope_head_dim"] + p["kv_lora_rank"] + p["qk_rope_head_dim"] + rows + p["kv_lora_rank"]
