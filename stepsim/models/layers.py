"""A model as a list of layers, each with its own attention kind and FFN kind (issue 43).

Frontier models are not one layer repeated: DeepSeek-V3 has 3 dense layers then 58 MoE layers, all with multi-head
latent attention; gpt-oss alternates sliding-window (128 tokens) and full attention, every head with a sink;
Llama 4 Maverick is MoE every other layer, its RoPE layers attending within chunks of 8,192 tokens and every fourth
layer (NoPE) over the whole context. :func:`layer_list` spells each layer out from the resolved
:class:`~stepsim.models.presets.ModelConfig`, and :func:`layer_groups` gathers the layers of one kind (identical
layers cost the same, so they are priced once and counted).

====================  ======================================================================================
attention kind        meaning
====================  ======================================================================================
``full``              GQA over the whole context
``sliding``           GQA over the last ``window`` tokens (gpt-oss ``sliding_attention``)
``chunked``           GQA within the token's chunk of ``window`` tokens (Llama 4's RoPE layers)
``mla``               multi-head latent attention over the whole context (DeepSeek-V2/V3/R1)
====================  ======================================================================================

An FFN is ``dense`` (a SwiGLU of ``dense_intermediate``) or ``moe`` (routed experts, with the model's shared
experts when it has them).
"""

from __future__ import annotations

from dataclasses import dataclass

from stepsim.models.presets import ModelConfig

#: the attention kinds of :class:`LayerKind`
ATTENTION_KINDS = ("full", "sliding", "chunked", "mla")
FFN_KINDS = ("dense", "moe")
_FROM_TYPE = {"full_attention": "full", "sliding_attention": "sliding", "chunked_attention": "chunked"}


@dataclass(frozen=True)
class LayerKind:
    """What one decoder layer computes.

    Attributes
    ----------
    attention : str
        One of :data:`ATTENTION_KINDS`.
    window : int or None
        Tokens a ``sliding`` layer attends to, or a ``chunked`` layer's chunk (tokens); None otherwise.
    sinks : bool
        One learned sink logit per head in the softmax's denominator (gpt-oss).
    ffn : str
        ``dense`` or ``moe``.
    shared : bool
        An MoE layer's shared experts (every token visits them).
    """

    attention: str
    window: int | None
    sinks: bool
    ffn: str
    shared: bool

    def describe(self) -> str:
        """``mla + moe (shared)``, ``sliding 128 + sinks + moe``: the kind in a few words."""
        attention = self.attention + (f" {self.window}" if self.window is not None else "")
        return (attention + (" + sinks" if self.sinks else "") + f" + {self.ffn}"
                + (" (shared)" if self.shared else ""))


def layer_list(model: ModelConfig) -> tuple[LayerKind, ...]:
    """Each layer of ``model``, in order."""
    out = []
    for i in range(model.layers):
        if model.is_mla:
            attention, window = "mla", None
        else:
            attention = _FROM_TYPE[model.layer_types[i]] if model.layer_types else "full"
            window = {"sliding": model.sliding_window, "chunked": model.attention_chunk_size}.get(attention)
        moe = model.layer_is_moe(i)
        out.append(LayerKind(attention, window, model.attention_sinks, "moe" if moe else "dense",
                             moe and model.shared_intermediate > 0))
    return tuple(out)


def layer_groups(model: ModelConfig) -> tuple[tuple[LayerKind, tuple[int, ...]], ...]:
    """The layers of each kind: ``((kind, layer indices), ...)`` in the order each kind first appears."""
    groups: dict[LayerKind, list[int]] = {}
    for i, kind in enumerate(layer_list(model)):
        groups.setdefault(kind, []).append(i)
    return tuple((kind, tuple(indices)) for kind, indices in groups.items())


def attention_parameters(model: ModelConfig) -> int:
    """Weights of one layer's attention (elements): GQA's q, k, v, o (with biases when ``attention_bias``, one
    sink logit per head when the family has sinks), or MLA's q_a / q_b (or a full q), kv_a (latent + rope key),
    kv_b (keys without rope and values, per head) and o, with the norms of the two latents."""
    d, h = model.hidden, model.heads
    if model.is_mla:
        nope, rope, v, kv_rank = model.qk_nope_head_dim, model.qk_rope_head_dim, model.v_head_dim, model.kv_lora_rank
        q_rank = model.q_lora_rank
        q = d * h * (nope + rope) if q_rank is None else d * q_rank + q_rank + q_rank * h * (nope + rope)
        return q + d * (kv_rank + rope) + kv_rank + kv_rank * h * (nope + v) + h * v * d
    hd, kv = model.head_dim, model.kv_heads
    n = 2 * d * h * hd + 2 * d * kv * hd  # q and o, k and v
    if model.attention_bias:
        n += h * hd + 2 * kv * hd + d
    if model.attention_sinks:
        n += h
    return n


def mla_matrices(model: ModelConfig, chips: int = 1) -> list[tuple[str, int, int]]:
    """An MLA layer's weight matrices ``(name, d_in, d_out)`` as one of ``chips`` chips multiplies a step's tokens
    by them (tensor parallelism over the heads, as vLLM splits MLA), in run order: ``qkv_a``, the down-projections
    of the hidden state fused (q_a and kv_a: ``d x (q_rank + kv_rank + rope)``; without a query rank the full q,
    ``d x (h (nope + rope) + kv_rank + rope)``), on every chip; ``q_b`` (``q_rank x h (nope + rope)``), ``kv_b``
    (``kv_rank x h (nope + v)``) and ``o`` (``h v x d``), each chip its ``h / chips`` heads.

    Over a step's tokens, ``kv_b`` has the absorbed form's weights and FLOPs: the absorbed decode multiplies each
    token's query by its key half ``W_UK`` (``2 h nope kv_rank`` FLOPs) and the attention's latent output by its
    value half ``W_UV`` (``2 h kv_rank v``), together ``kv_b``'s ``2 kv_rank h (nope + v)`` on one row; each
    matrix is read once. The two latents' norm weights (``q_rank + kv_rank`` elements) are not matrices."""
    d, h = model.hidden, model.heads // chips
    nope, rope, v, kv_rank, q_rank = (model.qk_nope_head_dim, model.qk_rope_head_dim, model.v_head_dim,
                                      model.kv_lora_rank, model.q_lora_rank)
    if q_rank is None:
        return [("qkv_a", d, h * (nope + rope) + kv_rank + rope), ("kv_b", kv_rank, h * (nope + v)), ("o", h * v, d)]
    return [("qkv_a", d, q_rank + kv_rank + rope), ("q_b", q_rank, h * (nope + rope)),
            ("kv_b", kv_rank, h * (nope + v)), ("o", h * v, d)]


def ffn_token_parameters(model: ModelConfig, moe: bool) -> int:
    """Weights one token's FFN reads in one layer (elements): a dense layer's SwiGLU (gate, up, down), or an MoE
    layer's ``top_k`` routed experts (with their biases when the family has them), its shared experts and the
    whole router (with its bias), not the experts the token skips."""
    d = model.hidden
    if not moe:
        return 3 * d * (model.dense_intermediate or 0)
    f = model.expert_intermediate
    expert = 3 * d * f + ((2 * f + d) if model.expert_bias else 0)
    router = d * model.experts + (model.experts if model.router_bias else 0)
    return model.top_k * expert + router + 3 * d * model.shared_intermediate
