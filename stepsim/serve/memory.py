"""What a model occupies in HBM: its weights, and the KV cache each token adds (bytes, bf16).

Weights count every matrix of the decoder (per layer: the q, k, v and o projections, the routed experts' gate /
up / down matrices and the router, the shared experts or the dense FFN, two RMSNorm vectors), the token
embedding, the LM head (unless ``tie_word_embeddings``) and the final norm. Biases and the per-head q/k norms of
some families are left out (under 0.01 % of any model here); every layer of an MoE model counts as an MoE layer
(DeepSeek-MoE's first layer is dense, ``first_k_dense_replace``: 16.88 B counted against 16.4 B published). The KV cache holds a key and a value vector per KV
head per layer per token: ``layers * 2 * kv_heads * head_dim * 2`` bytes.

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
    """

    weight_bytes: int
    kv_bytes_per_token: int
    max_position_embeddings: int | None
    vocab_size: int


def _config_json(model: ModelConfig) -> dict:
    """The ``config.json`` behind ``model`` (a shipped preset file or the user's file)."""
    source = model.source
    if source.startswith("stepsim/data/models/"):
        text = (resources.files("stepsim") / "data" / "models" / Path(source).name).read_text(encoding="utf-8")
    else:
        text = Path(source).read_text(encoding="utf-8")
    cfg = json.loads(text)
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


def _flag(cfg: dict, key: str, source: str) -> bool:
    """A JSON boolean field (absent or null: false). A string such as ``"false"`` is refused, naming the key:
    read as Python truth it would mean true."""
    v = cfg.get(key)
    if v is None:
        return False
    if not isinstance(v, bool):
        raise ConfigError(f"model file {source}: field {key!r} must be true or false (a JSON boolean), got {v!r}")
    return v


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
    d, hd = model.hidden, model.head_dim
    attention = 2 * d * model.heads * hd + 2 * d * model.kv_heads * hd  # q and o, k and v
    ffn = 0
    if model.is_moe:
        ffn += model.experts * 3 * d * model.expert_intermediate + d * model.experts  # experts and router
        ffn += 3 * d * model.shared_intermediate
    else:
        ffn += 3 * d * (model.dense_intermediate or 0)
    per_layer = attention + ffn + 2 * d  # two RMSNorm weight vectors
    head = 0 if _flag(cfg, "tie_word_embeddings", model.source) else vocab * d
    params = model.layers * per_layer + vocab * d + head + d
    kv = model.layers * 2 * model.kv_heads * hd * DTYPE_BYTES
    return ModelMemory(params * DTYPE_BYTES, kv, max_pos, vocab)
