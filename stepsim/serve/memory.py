"""What a model occupies in HBM: its weights, and the KV cache each token adds (bytes, bf16).

Weights count every matrix of the decoder (per layer: the attention's projections, the routed experts' gate /
up / down matrices and the router, the shared experts or the dense FFN, two RMSNorm vectors), the token
embedding, the LM head (unless ``tie_word_embeddings``) and the final norm. Multi-head latent attention counts
q_a / q_b, kv_a, kv_b, o and the two latent norms; biases count where the config (``attention_bias``) or the
family (gpt-oss: sinks, router and expert biases; DeepSeek-V3: the router's score bias) has them. Other
families' biases and per-head q/k norms are left out (under 0.01 % of any model here). Every layer of an MoE
model that serving runs counts as an MoE layer, as serving's executors run it (DeepSeek-MoE's first layer is
dense, ``first_k_dense_replace``: 16.88 B counted against 16.4 B published); DeepSeek-V3's three dense first
layers count as dense (671,026,419,200 against 671 B published; gpt-oss-120b 116,829,156,672 against 116.8 B).

The KV cache per token and layer holds a key and a value vector per KV head (``2 * kv_heads * head_dim * 2``
bytes), or for MLA the latent and the rope key (``(kv_lora_rank + qk_rope_head_dim) * 2`` bytes: DeepSeek-V3
61 x 576 x 2 = 70,272 B per token). A sliding-window layer holds at most the window (:meth:`ModelMemory.kv_bytes`),
a chunked-attention layer (Llama 4's RoPE layers) at most one chunk (``attention_chunk_size`` tokens: a token attends
to the tokens of its own chunk, so the blocks of earlier chunks are free; vLLM's ChunkedLocalAttentionManager).

Llama 4's vision encoder (``vision_config`` of ``model_type`` ``llama4_vision_model``) is loaded beside the
language model and counts in the weights (:func:`vision_parameters`; Scout 108,641,793,536 parameters against
109 B published, Maverick 401,583,781,376 against 400 B).
The layers of one attention kind share a KV pool (:func:`kv_pools`: full, sliding or MLA's latent), as vLLM's
hybrid KV cache manager keeps one block pool per attention type (:func:`stepsim.serve.kv_cache.pooled_capacity`).

``vocab_size`` (required), ``max_position_embeddings`` and ``tie_word_embeddings`` come from the model's
``config.json`` (the preset's file for a preset), which :class:`~stepsim.models.presets.ModelConfig` does not
carry.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from stepsim.base.errors import ConfigError
from stepsim.models.frontier import json_bool
from stepsim.models.layers import attention_parameters
from stepsim.models.presets import ModelConfig

#: bytes per weight and per KV element (bf16)
DTYPE_BYTES = 2


@dataclass(frozen=True)
class ModelMemory:
    """HBM footprint of a model.

    Attributes
    ----------
    weight_bytes : int
        All weights (bytes).
    kv_bytes_per_token : int
        KV-cache bytes one token adds over all layers.
    max_position_embeddings : int or None
        The longest sequence the model takes (tokens), when its config says.
    vocab_size : int
        Vocabulary size (tokens).
    parameters : int
        Weights counted (elements); ``weight_bytes`` is twice this.
    sliding_kv_bytes_per_token : int
        The part of ``kv_bytes_per_token`` held by sliding-window layers, which keep only the last
        ``sliding_window`` tokens (0 without sliding layers).
    sliding_window : int or None
        Tokens a sliding layer keeps.
    chunked_kv_bytes_per_token : int
        The part of ``kv_bytes_per_token`` held by chunked-attention layers, which keep at most
        ``attention_chunk_size`` tokens (0 without chunked layers).
    attention_chunk_size : int or None
        Tokens a chunked layer keeps at most.
    """

    weight_bytes: int
    kv_bytes_per_token: int
    max_position_embeddings: int | None
    vocab_size: int
    parameters: int = 0
    sliding_kv_bytes_per_token: int = 0
    sliding_window: int | None = None
    chunked_kv_bytes_per_token: int = 0
    attention_chunk_size: int | None = None

    def kv_bytes(self, tokens: int) -> int:
        """KV-cache bytes of one sequence of ``tokens`` tokens: full layers hold every token, sliding layers at
        most the window, chunked layers at most a chunk."""
        window = tokens if self.sliding_window is None else min(tokens, self.sliding_window)
        chunk = tokens if self.attention_chunk_size is None else min(tokens, self.attention_chunk_size)
        full = self.kv_bytes_per_token - self.sliding_kv_bytes_per_token - self.chunked_kv_bytes_per_token
        return full * tokens + self.sliding_kv_bytes_per_token * window + self.chunked_kv_bytes_per_token * chunk


def _whole_config_json(model: ModelConfig) -> dict:
    """The whole ``config.json`` behind ``model`` (a shipped preset file or the user's file)."""
    source = model.source
    if source.startswith("stepsim/data/models/"):
        text = (resources.files("stepsim") / "data" / "models" / Path(source).name).read_text(encoding="utf-8")
    else:
        text = Path(source).read_text(encoding="utf-8")
    return json.loads(text)


def _config_json(model: ModelConfig) -> dict:
    """The ``config.json`` behind ``model``, its ``text_config`` for a multimodal one."""
    cfg = _whole_config_json(model)
    # multimodal configs keep the language model under text_config (as stepsim.models.presets reads them)
    return cfg["text_config"] if "vocab_size" not in cfg and isinstance(cfg.get("text_config"), dict) else cfg


def _positive(cfg: dict, key: str, source: str, required: bool) -> int | None:
    v = cfg.get(key)
    if v is None and not required:
        return None
    if v is None:
        raise ConfigError(f"model file {source}: missing field {key!r} (serving needs it for the weights' size)")
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ConfigError(f"model file {source}: {key} must be a positive integer for serving, got {v!r}")
    return v


def ffn_parameters(model: ModelConfig, moe: bool) -> int:
    """Weights of one layer's FFN (elements): the routed experts (gate, up, down; biases when the family has
    them), the router (and its bias) and the shared experts of an MoE layer, or the dense SwiGLU FFN."""
    d = model.hidden
    if not moe:
        return 3 * d * (model.dense_intermediate or 0)
    f = model.expert_intermediate
    n = model.experts * 3 * d * f + d * model.experts + 3 * d * model.shared_intermediate
    if model.expert_bias:
        n += model.experts * (2 * f + d)
    if model.router_bias:
        n += model.experts
    return n


@dataclass(frozen=True)
class KVPool:
    """The KV cache of the layers of one attention kind.

    Attributes
    ----------
    kind : str
        ``"full"`` (GQA over the whole context), ``"sliding"`` (GQA over the last ``window`` tokens) or ``"mla"``
        (the latent ``c_KV`` and rope key over the whole context).
    layers : int
        Layers of that kind.
    bytes_per_token : int
        KV bytes one token adds over those layers (bytes).
    window : int or None
        Tokens a sliding layer keeps (None: every token).
    """

    kind: str
    layers: int
    bytes_per_token: int
    window: int | None = None


def kv_pools(model: ModelConfig) -> tuple[KVPool, ...]:
    """The model's KV pools by attention kind, full (or MLA) first; a kind without layers has none."""
    per_layer = kv_bytes_per_layer(model)
    if model.is_mla:
        return (KVPool("mla", model.layers, model.layers * per_layer),)
    sliding, chunked = model.sliding_layers, model.chunked_layers
    full = model.layers - sliding - chunked
    pools = []
    if full:
        pools.append(KVPool("full", full, full * per_layer))
    if sliding:
        pools.append(KVPool("sliding", sliding, sliding * per_layer, model.sliding_window))
    if chunked:  # a chunk's tokens at most: the pooled capacity treats it as a window of the chunk's size
        pools.append(KVPool("chunked", chunked, chunked * per_layer, model.attention_chunk_size))
    return tuple(pools)


def kv_bytes_per_layer(model: ModelConfig) -> int:
    """KV-cache bytes one token adds in one layer: MLA's latent and rope key (``kv_lora_rank +
    qk_rope_head_dim`` values), else a key and a value per KV head."""
    if model.is_mla:
        return (model.kv_lora_rank + model.qk_rope_head_dim) * DTYPE_BYTES
    return 2 * model.kv_heads * model.head_dim * DTYPE_BYTES


def parameter_count(model: ModelConfig, vocab: int, tied: bool) -> int:
    """Every weight of the main model (elements): per layer attention, FFN and two RMSNorm vectors; the embedding, the LM head unless ``tied``, the final
    norm."""
    d = model.hidden
    attention = attention_parameters(model)
    # the one-kind executors run every layer of an MoE model as an MoE layer, so for the models they take the weights
    # count them so too (DeepSeek-MoE-16B: 16.88 B against 16.4 B published; kept, so its runs stay as they were); a
    # model served layer group by layer group (stepsim/serve/layer_list.py: DeepSeek-V3, Llama 4 Maverick) has its
    # dense layers counted as published
    if model.unmodelled():
        moe_layers = sum(model.layer_is_moe(i) for i in range(model.layers))
    else:
        moe_layers = model.layers if model.is_moe else 0
    layers = model.layers * (attention + 2 * d) + (model.layers - moe_layers) * ffn_parameters(model, False)
    if moe_layers:
        layers += moe_layers * ffn_parameters(model, True)
    return layers + vocab * d + (0 if tied else vocab * d) + d


#: the ``vision_config`` fields :func:`vision_parameters` reads (Llama 4's vision encoder)
VISION_FIELDS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_channels", "patch_size",
                 "image_size", "projector_input_dim", "projector_output_dim", "vision_output_dim")


def vision_parameters(cfg: dict, text_hidden: int, source: str) -> int:
    """Weights of Llama 4's vision encoder and projector (elements; 0 without a ``vision_config`` of
    ``model_type`` ``llama4_vision_model``), as transformers' Llama4VisionModel and Llama4MultiModalProjector
    hold them: the patch embedding (``channels x patch^2 -> hidden``, no bias), the class embedding, the position
    embedding of ``(image / patch)^2 + 1`` positions, two LayerNorms before and after (weight and bias); per
    encoder layer q, k, v, o with biases, fc1 / fc2 with biases (GELU MLP) and two LayerNorms; the pixel-shuffle
    adapter's fc1 (``intermediate -> projector_input``) and fc2 (``projector_output`` square), and the projector
    to the text model (``vision_output -> text hidden``), all without biases."""
    vision = cfg.get("vision_config")
    if vision is None or (isinstance(vision, dict) and vision.get("model_type") != "llama4_vision_model"):
        return 0
    if not isinstance(vision, dict):
        raise ConfigError(f"model file {source}: field 'vision_config' must be an object, got {vision!r}")
    v = {}
    for key in VISION_FIELDS:
        value = vision.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 2**31 - 1:
            raise ConfigError(f"model file {source}: field 'vision_config.{key}' must be an integer in "
                              f"1..2,147,483,647, got {value!r}")
        v[key] = value
    h, f = v["hidden_size"], v["intermediate_size"]
    positions = (v["image_size"] // v["patch_size"]) ** 2 + 1
    embed = v["num_channels"] * v["patch_size"] ** 2 * h + h + positions * h + 4 * h
    layer = 4 * (h * h + h) + 2 * h * f + f + h + 4 * h
    adapter = f * v["projector_input_dim"] + v["projector_output_dim"] ** 2
    return embed + v["num_hidden_layers"] * layer + adapter + v["vision_output_dim"] * text_hidden


def model_memory(model: ModelConfig) -> ModelMemory:
    """Weights and KV bytes per token of ``model`` in bf16.

    Raises
    ------
    ConfigError
        The config has no positive ``vocab_size`` (naming the file).
    """
    cfg = _config_json(model)
    vocab = _positive(cfg, "vocab_size", model.source, required=True)
    max_pos = _positive(cfg, "max_position_embeddings", model.source, required=False)
    # a JSON boolean: a string such as "false", read as Python truth, would mean true (one line naming the key)
    params = parameter_count(model, vocab, json_bool(cfg, "tie_word_embeddings", f"model file {model.source}"))
    params += vision_parameters(_whole_config_json(model), model.hidden, model.source)
    per_layer = kv_bytes_per_layer(model)
    sliding = model.sliding_layers * per_layer
    return ModelMemory(params * DTYPE_BYTES, model.layers * per_layer, max_pos, vocab, params, sliding,
                       model.sliding_window, model.chunked_layers * per_layer, model.attention_chunk_size)
