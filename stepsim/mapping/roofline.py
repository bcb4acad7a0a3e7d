"""Rooflines of a serving step: the bytes it must read from HBM and the FLOPs it must do (docs/mapping.md §1).

How believable a serving latency is gets measured against these, whatever schedule produced it:

* :func:`decode_token_bytes`: the bytes one decode token must read at batch 1: for every layer the attention
  projections (q, k, v, o) and the FFN (dense: gate, up, down; MoE: the top-k experts' three matrices, the router
  and the shared experts), plus the LM head; the embedding is one row. bf16 weights. Llama-3.1-8B: 15.0 GB, 9.38 ms at
  1.6 TB/s; Qwen3-30B-A3B: 6.08 GB, 3.80 ms. A heterogeneous model counts each layer as it is (MLA's low-rank
  projections, dense first layers, interleaved MoE layers): DeepSeek-V3 / R1 73.2 GB.
* :func:`step_roofline`: a step's bytes (every weight matrix once, each *touched* expert once per layer, every
  sequence's KV cache read, the new tokens' K and V written) and FLOPs (two per weight per token it meets, plus the
  attention's ``4 x context x head_dim`` per query head and token), and its bound ``max(bytes / HBM peak, FLOPs /
  peak)`` in cycles. A heterogeneous model's layer groups: :meth:`StepWork.of_layers` (MLA's latent cache and
  its own weights, each layer's FFN kind).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from stepsim.base.hardware import Hardware
from stepsim.models.layers import attention_parameters, ffn_token_parameters

#: bf16 bytes per weight and per KV value
DTYPE_BYTES = 2


def projection_params(model) -> int:
    """Weights of one layer's q, k, v and o projections (elements)."""
    d, hd = model.hidden, model.head_dim
    return 2 * d * model.heads * hd + 2 * d * model.kv_heads * hd


def _ffn_params_per_token(model) -> int:
    d = model.hidden
    if not model.is_moe:
        return 3 * d * model.dense_intermediate
    moe = model.moe
    return model.top_k * 3 * d * moe.intermediate + 3 * d * moe.shared_intermediate + d * model.experts


def decode_token_bytes(model, vocab: int) -> int:
    """Bytes one decode token must read at batch 1 (module docstring).

    A model of one layer kind repeated counts ``layers`` identical layers (an MoE model's every layer as MoE, as its
    executors run it). A heterogeneous model (``model.unmodelled()``: DeepSeek-V3's MLA and dense first layers,
    Llama 4's interleave, gpt-oss's sinks and biases; :mod:`stepsim.models.layers`) counts each layer as it is: its
    attention's weights (MLA's low-rank q_a / q_b, kv_a, kv_b and o), and its dense FFN or its top-k experts, shared
    experts and router. DeepSeek-V3 / R1: 73,249,487,872 bytes (36.6 B weights, the published "37 B activated"),
    not the 1.34 TB of every expert.
    """
    if not model.unmodelled():
        per_layer = projection_params(model) + _ffn_params_per_token(model)
        return (model.layers * per_layer + vocab * model.hidden + model.hidden) * DTYPE_BYTES
    attention = attention_parameters(model)
    layers = sum(attention + ffn_token_parameters(model, model.layer_is_moe(i)) for i in range(model.layers))
    return (layers + vocab * model.hidden + model.hidden) * DTYPE_BYTES


@dataclass(frozen=True)
class StepRoofline:
    """A step's must-read bytes, FLOPs and their bound (cycles on a hardware)."""

    hbm_bytes: int
    flops: int
    bound_cycles: int


def touched_experts(routing) -> int:
    """Experts a step touches, summed over layers: ``routing`` ``[tokens, layers, top_k]`` expert ids."""
    routing = np.asarray(routing)
    return sum(len(np.unique(routing[:, layer, :])) for layer in range(routing.shape[1]))


class StepWork:
    """The roofline of a model's steps, its per-step constants made once (a serving run prices ~10^5 steps).

    :meth:`work` gives a step's must-read HBM bytes and FLOPs (module docstring) from four integers, and
    :meth:`utilisation` what fraction of the chips' HBM bandwidth and peak FLOPs a step of some cycles achieved
    with them: the roofline's "useful" utilisation, the same whatever schedule produced the cycles (bytes a
    schedule re-reads count once).
    """

    def __init__(self, model, hardware: Hardware, vocab: int, chips: int = 1):
        d, hd, layers = model.hidden, model.head_dim, model.layers
        self.is_moe = model.is_moe
        self.kv_bytes_per_token = layers * 2 * model.kv_heads * hd * DTYPE_BYTES  # K and V of every layer
        weights = layers * projection_params(model) + vocab * d
        if model.is_moe:
            moe = model.moe
            self.expert_bytes = 3 * d * moe.intermediate * DTYPE_BYTES
            weights += layers * (3 * d * moe.shared_intermediate + d * model.experts)
        else:
            self.expert_bytes = 0
            weights += layers * 3 * d * model.dense_intermediate
        self.fixed_bytes = weights * DTYPE_BYTES
        self.embedding_bytes = d * DTYPE_BYTES
        self.flops_per_token = 2 * layers * (projection_params(model) + _ffn_params_per_token(model))
        # the LM head computes one row per sequence (the logits of its last token), not one per new token: counted
        # per token, a prefill step's FLOPs were overstated (its compute utilisation above 1 on small models)
        self.head_flops = 2 * vocab * d
        self.attention_flops = layers * model.heads * 4 * hd  # per query head, token and context token seen
        self.peak_bytes = hardware.hbm_peak_bytes_per_cycle * chips
        self.peak_flops = hardware.peak_flops_per_cycle * chips

    @classmethod
    def of_layers(cls, model, attention: str, moe: bool, layers: int, hardware: Hardware, vocab: int,
                  chips: int = 1, embedding: bool = True) -> StepWork:
        """The roofline of ``layers`` layers of a heterogeneous model (``model.unmodelled()``), each counted as it
        is, as :func:`decode_token_bytes` counts it: a layer group of :mod:`stepsim.serve.layer_list`.

        ``attention`` (a :class:`~stepsim.models.layers.LayerKind`'s): ``mla`` is priced in its absorbed form, as
        DeepSeek's inference code runs decode (the group's engine model, serve/layer_list.py): the weights are
        MLA's own (:func:`~stepsim.models.layers.attention_parameters`: q_a / q_b, kv_a, kv_b and o, read once and
        met twice a FLOP per token), the cache is the compressed latent, ``kv_lora_rank + qk_rope_head_dim``
        values a token and layer (no separate K and V), and a query head spends ``2 (kv_lora_rank +
        qk_rope_head_dim)`` FLOPs on its score and ``2 kv_lora_rank`` on its output per context token it sees.
        Any other kind is GQA (with its biases and sinks): K and V of ``kv_heads x head_dim`` a token and layer
        and ``4 head_dim`` FLOPs a head and seen token; a ``sliding`` or ``chunked`` layer's cap is the step's
        (the group's provider sees the capped context: :func:`stepsim.serve.layer_list.seen_batch`). ``moe``: the
        router and shared experts read once, each touched expert's matrices (and biases) once; else the dense
        SwiGLU. ``vocab``: the LM head's rows (0: not this group's), ``embedding``: whether the new tokens'
        embedding rows are this group's (the first group counts both)."""
        d = model.hidden
        work = cls.__new__(cls)
        work.is_moe = moe
        attn = attention_parameters(model)
        if attention == "mla":
            work.kv_bytes_per_token = layers * (model.kv_lora_rank + model.qk_rope_head_dim) * DTYPE_BYTES
            work.attention_flops = layers * model.heads * 2 * (2 * model.kv_lora_rank + model.qk_rope_head_dim)
        else:
            work.kv_bytes_per_token = layers * 2 * model.kv_heads * model.head_dim * DTYPE_BYTES
            work.attention_flops = layers * model.heads * 4 * model.head_dim
        ffn = ffn_token_parameters(model, moe)  # a token's: top-k experts, router and shared experts, or dense
        if moe:
            f = model.expert_intermediate
            expert = 3 * d * f + ((2 * f + d) if model.expert_bias else 0)
            work.expert_bytes = expert * DTYPE_BYTES
            once = ffn - model.top_k * expert  # the router and the shared experts
        else:
            work.expert_bytes, once = 0, ffn
        work.fixed_bytes = (layers * (attn + once) + vocab * d) * DTYPE_BYTES
        work.embedding_bytes = d * DTYPE_BYTES if embedding else 0
        work.flops_per_token = 2 * layers * (attn + ffn)
        work.head_flops = 2 * vocab * d
        work.peak_bytes = hardware.hbm_peak_bytes_per_cycle * chips
        work.peak_flops = hardware.peak_flops_per_cycle * chips
        return work

    def work(self, tokens: int, context_tokens: int, seen: int, touched: int, sequences: int) -> tuple[int, int]:
        """``(HBM bytes, FLOPs)`` of a step of ``tokens`` new tokens of ``sequences`` sequences over
        ``context_tokens`` cached ones; ``seen``: context tokens the new tokens attend to (:func:`seen_tokens`);
        ``touched``: experts touched, summed over layers (0 for a dense model)."""
        hbm = (self.fixed_bytes + touched * self.expert_bytes + (context_tokens + tokens) * self.kv_bytes_per_token
               + tokens * self.embedding_bytes)
        return hbm, tokens * self.flops_per_token + sequences * self.head_flops + self.attention_flops * seen

    def bound_cycles(self, hbm_bytes: int, flops: int) -> int:
        """``max(bytes / HBM peak, FLOPs / peak)`` (cycles)."""
        return max(math.ceil(hbm_bytes / self.peak_bytes), math.ceil(flops / self.peak_flops))

    def utilisation(self, hbm_bytes: int, flops: int, cycles: int) -> tuple[float, float]:
        """``(HBM, compute)`` utilisation of a step of ``cycles`` (0..1)."""
        return hbm_bytes / (cycles * self.peak_bytes), flops / (cycles * self.peak_flops)


def seen_tokens(context, new) -> int:
    """Context tokens a step's new tokens attend to: each sequence's ``new`` tokens see its cached ``context``,
    the new tokens before them and themselves (causal)."""
    return sum(n * c + n * (n + 1) // 2 for c, n in zip(context, new))


def step_roofline(model, hardware: Hardware, vocab: int, context, new, routing=None) -> StepRoofline:
    """The roofline of a step (module docstring). ``context``, ``new``: per sequence, tokens cached before the step
    and computed in it; ``routing``: ``[tokens, layers, top_k]`` expert ids of the step's tokens (an MoE model)."""
    context = [int(c) for c in context]
    new = [int(n) for n in new]
    step = StepWork(model, hardware, vocab)
    touched = touched_experts(routing) if model.is_moe else 0
    hbm, flops = step.work(sum(new), sum(context), seen_tokens(context, new), touched, len(new))
    return StepRoofline(hbm, flops, step.bound_cycles(hbm, flops))
