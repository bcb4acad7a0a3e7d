"""Causal prefill attention's NumPy reference and seeded functional inputs (kind ``prefill_attention``)."""

from __future__ import annotations

import math

import numpy as np

from stepsim.workloads.base import Workload
from stepsim.workloads.numerics import as_f32, round_to_bf16, seeded_normal, take_input, workload_trace
from stepsim.workloads.prefill_attention.build import causal_mask, query_tiles


def prefill_reference(q, k_cache, v_cache, mask, cached, chunk, *, head_dim: int, query_per_kv_head: int,
                      tile_n: int, max_n: int, softmax: str = "stable") -> np.ndarray:
    """What the graph stores in ``out``: every query tile's attention over its request's KV tiles ``0 .. g``,
    with ``mask`` added to the diagonal tile's scores, tile by tile in the graph's order (float64 running
    sums, score tiles rounded to fp32 as the graph materialises them; stable: running max and 1/sqrt(d)).

    ``q`` is ``[query tiles * query_per_kv_head * tile_n, head_dim]`` (head-major within a tile), the caches
    ``[requests * max_n, head_dim]``, ``mask`` ``[query_per_kv_head * tile_n, tile_n]``.
    """
    t, rows = tile_n, query_per_kv_head * tile_n
    scale = 1.0 / math.sqrt(head_dim) if softmax == "stable" else 1.0
    request, group = query_tiles(np.asarray(cached), np.asarray(chunk), t)
    q, k_cache, v_cache, mask = (np.asarray(a, dtype=np.float64) for a in (q, k_cache, v_cache, mask))
    out = np.zeros((len(group) * rows, head_dim))
    for r, (b, g) in enumerate(zip(request, group)):
        q_tile = q[r * rows:(r + 1) * rows]
        acc = np.zeros((rows, head_dim))
        row_sum = np.zeros(rows)
        row_max = np.full(rows, -np.inf)
        for j in range(g + 1):
            start = b * max_n + j * t
            k_t, v_t = k_cache[start:start + t], v_cache[start:start + t]
            s = as_f32(q_tile @ k_t.T).astype(np.float64)
            if j == g:
                s = as_f32(s + mask).astype(np.float64)
            s = s * scale
            if softmax == "plain":
                p = as_f32(np.exp(s)).astype(np.float64)
            else:
                new_max = np.maximum(row_max, s.max(axis=1))
                rescale = np.exp(row_max - new_max)
                acc *= rescale[:, None]
                row_sum *= rescale
                row_max = new_max
                p = np.exp(s - new_max[:, None])
            acc += p @ v_t
            row_sum += p.sum(axis=1)
        out[r * rows:(r + 1) * rows] = acc / row_sum[:, None]
    return out


def inputs(w: Workload, seed: int) -> dict:
    """``q`` and keys with std ``d**-0.25`` (scores of std ~1), values std 1 (none with ``shared_kv``), all bf16;
    request ``b``'s cache rows ``0 .. cached + chunk - 1`` drawn per request, the rest zero; ``mask`` the causal
    tile."""
    p = w.params
    d, t, heads, max_n = p["head_dim"], p["tile_n"], p["query_per_kv_head"], p["max_n"]
    cached, chunk = workload_trace(w, "cached"), workload_trace(w, "chunk")
    qk_std = d ** -0.25
    caches = {}
    for name, std in (("k_cache", qk_std), ("v_cache", 1.0))[:1 if p.get("shared_kv") else 2]:
        cache = np.zeros((len(cached), max_n, d), np.float32)
        for b, n in enumerate(cached + chunk):
            cache[b, :n] = seeded_normal(seed, name, (int(n), d), std, b, bf16=True)
        caches[name] = cache.reshape(-1, d)
    q = seeded_normal(seed, "q", (p["query_tiles"] * heads * t, d), qk_std, bf16=True)
    regions = p.get("regions", 1)
    if regions > 1:  # a mapped layer reads query tile j from region j % regions' own tensor
        tiles = q.reshape(p["query_tiles"], heads * t, d)
        return {**{f"q_region{r}": tiles[r::regions].reshape(-1, d) for r in range(regions)}, **caches,
                "mask": round_to_bf16(causal_mask(heads, t))}
    return {"q": q, **caches, "mask": round_to_bf16(causal_mask(heads, t))}


def outputs(workload: Workload, inputs: dict) -> dict:
    who, p = "workload_reference", workload.params
    regions = p.get("regions", 1)
    if regions > 1:  # the regions' query tiles back in tile order
        parts = [take_input(inputs, f"q_region{r}", who).reshape(-1, p["query_per_kv_head"] * p["tile_n"],
                                                                p["head_dim"]) for r in range(regions)]
        tiles = np.empty((p["query_tiles"],) + parts[0].shape[1:], dtype=parts[0].dtype)
        for r, part in enumerate(parts):
            tiles[r::regions] = part
        inputs = {**inputs, "q": tiles.reshape(-1, p["head_dim"])}
    values = "k_cache" if p.get("shared_kv") else "v_cache"  # shared_kv: the keys are the values
    arrays = (take_input(inputs, n, who) for n in ("q", "k_cache", values, "mask"))
    return {"out": prefill_reference(*arrays, workload_trace(workload, "cached"), workload_trace(workload, "chunk"),
                                     head_dim=p["head_dim"], query_per_kv_head=p["query_per_kv_head"],
                                     tile_n=p["tile_n"], max_n=p["max_n"], softmax=p["softmax"])}


def reduction_length(workload: Workload, name: str) -> int:
    p = workload.params
    request, group = query_tiles(workload_trace(workload, "cached"), workload_trace(workload, "chunk"), p["tile_n"])
    return p["head_dim"] + int(group.max() + 1) * p["tile_n"]  # scores over D, then sums over the rows read
