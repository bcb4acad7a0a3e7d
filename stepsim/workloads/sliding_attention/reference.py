"""Sliding-window / full decode attention with sinks: NumPy reference and seeded functional inputs (kind
``sliding_attention``).

:func:`sink_attention` is gpt-oss's formula (transformers' ``GptOssAttention`` eager path) for one request and
KV head: ``logits = q K^T * head_dim**-0.5``, the sinks concatenated as one more column, softmax, the sink column
dropped, times ``V``. :func:`ring_rows` says which cache rows hold which positions.
"""

from __future__ import annotations

import numpy as np

from stepsim.workloads.base import Workload
from stepsim.workloads.decode_tiles import MASKED, tail_mask
from stepsim.workloads.numerics import as_f32, seeded_normal, take_input, workload_trace
from stepsim.workloads.sliding_attention.build import window_tiles


def sink_attention(q, keys, values, sinks=None, *, fp32_scores: bool = False) -> np.ndarray:
    """``q`` ``[G, d]`` over the ``keys`` / ``values`` ``[n, d]`` it attends to (any row order), with per-head
    sink logits ``sinks`` ``[G]`` (None: none); float64 ``[G, d]``. ``fp32_scores`` rounds ``q @ keys.T`` to
    float32 first, as the graph materialises its score tiles::

        logits = q @ keys.T * d**-0.5
        combined = concat([logits, sinks[:, None]], axis=1)
        probs = softmax(combined - combined.max(axis=1))[:, :-1]
        out = probs @ values
    """
    q, keys, values = (np.asarray(a, np.float64) for a in (q, keys, values))
    scores = q @ keys.T
    logits = (as_f32(scores).astype(np.float64) if fp32_scores else scores) * q.shape[1] ** -0.5
    if sinks is not None:
        logits = np.concatenate([logits, np.asarray(sinks, np.float64)[:, None]], axis=1)
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    return p[:, :keys.shape[0]] @ values


def ring_rows(length: int, slots: int, window: int | None) -> tuple[np.ndarray, np.ndarray]:
    """``(positions, rows)``: the positions a query at position ``length`` attends to (the last ``window`` of
    ``0 .. length``; all without a window) and the cache row of each (``p mod window`` in a sliding layer's ring,
    ``p`` in a full layer's ``slots`` rows)."""
    first = 0 if window is None else max(0, length + 1 - window)
    positions = np.arange(first, length + 1, dtype=np.int64)
    return positions, (positions if window is None else positions % window)


def inputs(w: Workload, seed: int) -> dict:
    """``q`` and keys of std ``d**-0.25`` (scores of std ~1), values std 1, all bf16. Keys and values are drawn
    per request and position (``0 .. L``) and written to their rows in position order, so a sliding layer's
    ring holds the last ``window`` of them; rows never written are zero. ``sinks`` holds head ``h``'s logit
    (std 1) times ``sqrt(d)`` in column 0 and the mask elsewhere; ``sink_values`` is zero; ``mask`` masks the
    last tiles' unattended rows."""
    p = w.params
    b, g, d, t, slots = p["batch"], p["query_per_kv_head"], p["head_dim"], p["tile_n"], p["cache_slots"]
    lengths = workload_trace(w, "kv_lengths")
    qk_std = d ** -0.25
    arrays = {"q": seeded_normal(seed, "q", (b * g, d), qk_std, bf16=True)}
    for name, std in (("k_cache", qk_std), ("v_cache", 1.0)):
        cache = np.zeros((b, slots, d), np.float32)
        for req, n in enumerate(lengths + 1):
            by_position = seeded_normal(seed, name, (int(n), d), std, req, bf16=True)
            _, rows = ring_rows(int(n) - 1, slots, p["window"])
            cache[req, rows] = by_position[-len(rows):]  # the attended positions; older ones were overwritten
        arrays[name] = cache.reshape(-1, d)
    _, valid = window_tiles(lengths, t, p["window"])
    arrays["mask"] = tail_mask(valid, t)
    if p["sinks"]:
        sinks = np.full((g, t), MASKED, np.float32)
        sinks[:, 0] = seeded_normal(seed, "sinks", (g,), 1.0, bf16=True) * np.float32(np.sqrt(d))
        arrays["sinks"] = sinks
        arrays["sink_values"] = np.zeros((t, d), np.float32)
    return arrays


def outputs(workload: Workload, inputs: dict) -> dict:
    """``out`` by :func:`sink_attention` over each request's attended rows (score tiles rounded to fp32 as the
    graph materialises them), the sink logits read back from ``sinks`` (column 0 over ``sqrt(d)``)."""
    who, p = "workload_reference", workload.params
    g, d, slots = p["query_per_kv_head"], p["head_dim"], p["cache_slots"]
    q, k_cache, v_cache = (np.asarray(take_input(inputs, n, who), np.float64) for n in ("q", "k_cache", "v_cache"))
    sinks = np.asarray(take_input(inputs, "sinks", who), np.float64)[:, 0] / np.sqrt(d) if p["sinks"] else None
    out = []
    for b, length in enumerate(workload_trace(workload, "kv_lengths")):
        _, rows = ring_rows(int(length), slots, p["window"])
        keys, values = k_cache[b * slots + rows], v_cache[b * slots + rows]
        out.append(sink_attention(q[b * g:(b + 1) * g], keys, values, sinks, fp32_scores=True))
    return {"out": np.concatenate(out).astype(np.float32)}


def reduction_length(workload: Workload, name: str) -> int:
    p = workload.params
    tiles, _ = window_tiles(workload_trace(workload, "kv_lengths"), p["tile_n"], p["window"])
    return p["head_dim"] + (int(tiles.max()) + int(p["sinks"])) * p["tile_n"]  # scores over d, sums over rows
