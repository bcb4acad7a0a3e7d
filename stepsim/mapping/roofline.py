"""Rooflines of a serving step: the bytes it must read from HBM and the FLOPs it must do (docs/mapping.md §1).

How believable a serving latency is gets measured against these, whatever schedule produced it:

* :func:`decode_token_bytes`: the bytes one decode token must read at batch 1: for every layer the attention
  projections (q, k, v, o) and the FFN (dense: gate, up, down; MoE: the top-k experts' three matrices, the router
  and the shared experts), plus the LM head; the embedding is one row. bf16 weights. Llama-3.1-8B: 15.0 GB, 9.38 ms at
  1.6 TB/s; Qwen3-30B-A3B: 6.08 GB, 3.80 ms.
* :func:`step_roofline`: a step's bytes (every weight matrix once, each *touched* expert once per layer, every
  sequence's KV cache read, the new tokens' K and V written) and FLOPs (two per weight per token it meets, plus the
  attention's ``4 x context x head_dim`` per query head and token), and its bound ``max(bytes / HBM peak, FLOPs /
  peak)`` in cycles.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from stepsim.base.hardware import Hardware

#: bf16 bytes per weight and per KV value
DTYPE_BYTES = 2


def _projection_params(model) -> int:
    d, hd = model.hidden, model.head_dim
    return 2 * d * model.heads * hd + 2 * d * model.kv_heads * hd


def _ffn_params_per_token(model) -> int:
    d = model.hidden
    if not model.is_moe:
        return 3 * d * model.dense_intermediate
    moe = model.moe
    return model.top_k * 3 * d * moe.intermediate + 3 * d * moe.shared_intermediate + d * model.experts


def decode_token_bytes(model, vocab: int) -> int:
    """Bytes one decode token must read at batch 1 (module docstring)."""
    per_layer = _projection_params(model) + _ffn_params_per_token(model)
    return (model.layers * per_layer + vocab * model.hidden + model.hidden) * DTYPE_BYTES


@dataclass(frozen=True)
class StepRoofline:
    """A step's must-read bytes, FLOPs and their bound (cycles on a hardware)."""

    hbm_bytes: int
    flops: int
    bound_cycles: int


def step_roofline(model, hardware: Hardware, vocab: int, context, new, routing=None) -> StepRoofline:
    """The roofline of a step (module docstring). ``context``, ``new``: per sequence, tokens cached before the step
    and computed in it; ``routing``: ``[tokens, layers, top_k]`` expert ids of the step's tokens (an MoE model)."""
    context = np.asarray(context, dtype=np.int64)
    new = np.asarray(new, dtype=np.int64)
    tokens = int(new.sum())
    d, hd, layers = model.hidden, model.head_dim, model.layers
    kv_per_token_layer = 2 * model.kv_heads * hd * DTYPE_BYTES
    weights = layers * _projection_params(model)
    ffn_flops_params = layers * _ffn_params_per_token(model)  # per token
    if model.is_moe:
        moe = model.moe
        expert = 3 * d * moe.intermediate
        touched = sum(len(np.unique(routing[:, layer, :])) for layer in range(layers))
        weights += touched * expert + layers * (3 * d * moe.shared_intermediate + d * model.experts)
    else:
        weights += layers * 3 * d * model.dense_intermediate
    weights += vocab * d
    kv_read = int(context.sum()) * layers * kv_per_token_layer
    kv_write = tokens * layers * kv_per_token_layer
    hbm_bytes = weights * DTYPE_BYTES + kv_read + kv_write + tokens * d * DTYPE_BYTES  # + the embedding rows
    # attention per query head and token: q K^T and P V over the context seen (cached + earlier new tokens + itself)
    seen = int((new * context).sum() + (new * (new + 1) // 2).sum())
    flops = 2 * tokens * (layers * _projection_params(model) + ffn_flops_params + vocab * d) \
        + layers * model.heads * 4 * hd * seen
    bound = max(math.ceil(hbm_bytes / hardware.hbm_peak_bytes_per_cycle),
                math.ceil(flops / hardware.peak_flops_per_cycle))
    return StepRoofline(hbm_bytes, flops, bound)
