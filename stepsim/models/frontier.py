"""The ``config.json`` fields of the frontier models (issue 43): MLA, group-limited routing, dense first layers,
per-layer attention types with sliding windows, attention sinks and biases.

Read by :func:`stepsim.models.presets.parse_hf_config`; every value is checked here, a missing or malformed one
refused in one line naming the file and the field.

====================================================  ==========================================================
field                                                 meaning (unit)
====================================================  ==========================================================
``kv_lora_rank``                                      MLA: the latent ``c_KV`` cached per token and layer
                                                      (elements); its presence (or ``q_lora_rank``'s) means MLA
``q_lora_rank``                                       MLA: rank of the query's down-projection (elements; null:
                                                      a full query projection, DeepSeek-V2-Lite)
``qk_nope_head_dim``, ``qk_rope_head_dim``,           MLA: per-head query/key dimensions without and with
``v_head_dim``                                        rotary embedding, per-head value dimension (elements)
``n_group``, ``topk_group``                           routed experts fall in ``n_group`` groups; a token's experts
                                                      come from its ``topk_group`` best groups (default 1, 1)
``scoring_func``                                      router scores: ``softmax`` (default) or ``sigmoid``
``routed_scaling_factor``                             factor on the routed experts' weights (default 1.0)
``first_k_dense_replace``                             the first k layers have a dense FFN (``intermediate_size``)
``moe_layer_freq``                                    every n-th layer after those is MoE (default 1)
``layer_types``                                       per layer ``full_attention`` or ``sliding_attention``
                                                      (kept only when some layer slides)
``sliding_window``                                    tokens a sliding layer attends to; without ``layer_types``
                                                      every layer slides unless ``use_sliding_window`` is false
``attention_bias``                                    q, k, v and o projections carry biases (JSON boolean)
====================================================  ==========================================================

Attention sinks (one learned logit per head added to the softmax's denominator) and biases on the router and the
experts are not config fields: the published modelling code of a family always has them
(:data:`FAMILY_PARAMETERS`).
"""

from __future__ import annotations

import numbers

from stepsim.base.errors import ConfigError

#: fields whose presence means multi-head latent attention (DeepSeek-V2/V3/R1)
MLA_FIELDS = ("kv_lora_rank", "q_lora_rank")
#: the per-layer attention types of ``layer_types``
LAYER_TYPES = ("full_attention", "sliding_attention")
SCORING_FUNCS = ("softmax", "sigmoid")
#: parameters a family's modelling code always has, which its config.json does not name:
#: gpt-oss (transformers' GptOssAttention.sinks, GptOssTopKRouter.bias, GptOssExperts.*_bias); DeepSeek-V3's gate
#: keeps a per-expert score-correction bias (e_score_correction_bias)
FAMILY_PARAMETERS = {
    "gpt_oss": frozenset({"attention_sinks", "router_bias", "expert_bias"}),
    "deepseek_v3": frozenset({"router_bias"}),
}


def _int(cfg: dict, key: str, where: str, *, required: bool = False, minimum: int = 1, default=None):
    value = cfg.get(key)
    if value is None:
        if required:
            raise ConfigError(f"{where}: missing field {key!r}")
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{where}: field {key!r} must be an integer >= {minimum}, got {value!r}")
    if value > 2**31 - 1:  # a dimension of 1e30 gave parameter counts of 1e34 and overflowing sizes downstream
        raise ConfigError(f"{where}: field {key!r} must be at most 2,147,483,647 (2**31 - 1), got {value!r}")
    return value


def json_bool(cfg: dict, key: str, where: str) -> bool:
    """A JSON boolean field (absent or null: false); anything else is one line naming ``where`` and the key."""
    value = cfg.get(key)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise ConfigError(f"{where}: field {key!r} must be true or false (a JSON boolean), got {value!r}")
    return value


def read_mla(cfg: dict, where: str) -> dict:
    """The MLA dimensions (all None for another attention)."""
    keys = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
    if all(cfg.get(k) is None for k in MLA_FIELDS):
        return dict.fromkeys(keys)
    out = {"q_lora_rank": _int(cfg, "q_lora_rank", where)}
    for key in keys[1:]:
        out[key] = _int(cfg, key, where, required=True)
    return out


def read_routing(cfg: dict, where: str, experts: int, top_k: int = 0) -> dict:
    """Group-limited routing, its scores and scaling (defaults: one group, softmax, 1.0); ``top_k`` experts must
    fit in the ``topk_group`` groups kept."""
    n_group = _int(cfg, "n_group", where, default=1)
    topk_group = _int(cfg, "topk_group", where, default=1 if n_group == 1 else n_group)
    if experts and experts % n_group:
        raise ConfigError(f"{where}: field 'n_group' = {n_group} does not divide the {experts} experts")
    if topk_group > n_group:
        raise ConfigError(f"{where}: field 'topk_group' = {topk_group} exceeds n_group = {n_group}")
    if experts and top_k > topk_group * (experts // n_group):
        raise ConfigError(f"{where}: field 'num_experts_per_tok' = {top_k} exceeds the {topk_group * (experts // n_group)} "
                          f"experts of the topk_group = {topk_group} groups kept")
    scoring = cfg.get("scoring_func")
    if scoring is None:
        scoring = "softmax"
    if scoring not in SCORING_FUNCS:
        raise ConfigError(f"{where}: field 'scoring_func' must be one of {', '.join(SCORING_FUNCS)}, got {scoring!r}")
    scale = cfg.get("routed_scaling_factor")
    if scale is None:
        scale = 1.0
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real) or not 0 < scale < float("inf"):
        raise ConfigError(f"{where}: field 'routed_scaling_factor' must be a positive number, got {scale!r}")
    return {"n_group": n_group, "topk_group": topk_group, "scoring_func": scoring,
            "routed_scaling_factor": float(scale)}


def read_layers(cfg: dict, where: str, layers: int, experts: int, dense_f: int | None) -> dict:
    """Which layers are dense, and each layer's attention type."""
    first_dense = _int(cfg, "first_k_dense_replace", where, minimum=0, default=0)
    freq = _int(cfg, "moe_layer_freq", where, default=1)
    if first_dense > layers:
        raise ConfigError(f"{where}: field 'first_k_dense_replace' = {first_dense} exceeds the {layers} layers")
    if experts and first_dense and dense_f is None:
        raise ConfigError(f"{where}: field 'first_k_dense_replace' = {first_dense} needs 'intermediate_size' "
                          "and 'moe_intermediate_size' (the dense layers' and the experts' FFN dimensions)")
    types = cfg.get("layer_types")
    window = _int(cfg, "sliding_window", where)
    if types is not None:
        if not isinstance(types, list):
            raise ConfigError(f"{where}: field 'layer_types' must be a list of {layers} layer types "
                              f"(num_hidden_layers), got {types!r}")
        if len(types) != layers:
            raise ConfigError(f"{where}: field 'layer_types' lists {len(types)} layers, expected {layers} "
                              "(num_hidden_layers)")
        bad = next((i for i, t in enumerate(types) if t not in LAYER_TYPES), None)
        if bad is not None:
            raise ConfigError(f"{where}: field 'layer_types' entry {bad} is {types[bad]!r}; expected "
                              f"{' or '.join(LAYER_TYPES)}")
        types = tuple(types)
    elif window is not None and cfg.get("use_sliding_window", True) is not False:
        types = ("sliding_attention",) * layers
    else:
        types = ("full_attention",) * layers
    if "sliding_attention" in types and window is None:
        raise ConfigError(f"{where}: missing field 'sliding_window' (layer_types has sliding_attention layers)")
    if "sliding_attention" not in types:  # every layer full: told by an empty tuple, as for the other models
        window, types = None, ()
    return {"first_k_dense_replace": first_dense, "moe_layer_freq": freq, "layer_types": types,
            "sliding_window": window}


def read_parameters(cfg: dict, where: str, model_type: str) -> dict:
    """Biases and sinks: ``attention_bias`` from the config, the rest by family (:data:`FAMILY_PARAMETERS`)."""
    family = FAMILY_PARAMETERS.get(model_type, frozenset())
    return {"attention_bias": json_bool(cfg, "attention_bias", where), "attention_sinks": "attention_sinks" in family,
            "router_bias": "router_bias" in family, "expert_bias": "expert_bias" in family}
