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
                                                      (kept only when some layer slides or is chunked)
``sliding_window``                                    tokens a sliding layer attends to; without ``layer_types``
                                                      every layer slides unless ``use_sliding_window`` is false
``attention_bias``                                    q, k, v and o projections carry biases (JSON boolean)
``interleave_moe_layer_step``                         Llama 4: layers ``step - 1, 2 step - 1, ...`` are MoE, the
                                                      others dense of ``intermediate_size_mlp`` (transformers'
                                                      Llama4TextConfig: ``moe_layers``, which must agree)
``intermediate_size_mlp``                             Llama 4: the dense layers' FFN dimension (elements)
``attention_chunk_size``                              Llama 4: a RoPE layer attends within chunks of this many
                                                      tokens (``chunked_attention`` in ``layer_types``); the
                                                      NoPE layers (``no_rope_layers`` entry 0) attend globally
``no_rope_layers``                                    Llama 4: per layer 1 (RoPE, chunked) or 0 (NoPE, full);
                                                      empty or absent: every ``no_rope_layer_interval``-th
                                                      layer (default 4) is NoPE, as transformers derives it
====================================================  ==========================================================

A Llama 4 MoE layer always has one shared expert of the experts' width (transformers' ``Llama4TextMoe.shared_expert``),
which its config.json does not name (:data:`FAMILY_SHARED_EXPERTS`).

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
#: Llama 4's RoPE layers (from ``attention_chunk_size`` and ``no_rope_layers``; not a ``layer_types`` spelling)
CHUNKED = "chunked_attention"
SCORING_FUNCS = ("softmax", "sigmoid")
#: parameters a family's modelling code always has, which its config.json does not name:
#: gpt-oss (transformers' GptOssAttention.sinks, GptOssTopKRouter.bias, GptOssExperts.*_bias); DeepSeek-V3's gate
#: keeps a per-expert score-correction bias (e_score_correction_bias)
FAMILY_PARAMETERS = {
    "gpt_oss": frozenset({"attention_sinks", "router_bias", "expert_bias"}),
    "deepseek_v3": frozenset({"router_bias"}),
}
#: shared experts (of the routed experts' width) a family's MoE layer always has: Llama 4's
#: ``Llama4TextMoe.shared_expert`` (transformers, modeling_llama4.py)
FAMILY_SHARED_EXPERTS = {"llama4_text": 1}


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
    step = read_interleave(cfg, where, layers, experts, dense_f)
    chunk = _int(cfg, "attention_chunk_size", where)
    types = cfg.get("layer_types")
    window = _int(cfg, "sliding_window", where)
    if chunk is not None:
        if types is not None:
            raise ConfigError(f"{where}: fields 'attention_chunk_size' and 'layer_types' are both set; expected one "
                              "way of giving the layers' attention")
        types = tuple(CHUNKED if rope else "full_attention" for rope in read_no_rope(cfg, where, layers))
    elif types is not None:
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
    if "sliding_attention" not in types:
        window = None
    if "chunked_attention" not in types:
        chunk = None
    if set(types) <= {"full_attention"}:  # every layer full: told by an empty tuple, as for the other models
        types = ()
    return {"first_k_dense_replace": first_dense, "moe_layer_freq": freq, "layer_types": types,
            "sliding_window": window, "interleave_moe_layer_step": step, "attention_chunk_size": chunk}


def _int_list(cfg: dict, key: str, where: str, layers: int, allowed) -> list[int] | None:
    """A JSON list of integers from ``allowed`` (null or absent: None)."""
    value = cfg.get(key)
    if value is None:
        return None
    if not isinstance(value, list) or any(isinstance(v, bool) or not isinstance(v, int) or v not in allowed
                                          for v in value):
        raise ConfigError(f"{where}: field {key!r} must be a list of integers in {allowed.start}..{allowed.stop - 1}"
                          f", got {value!r}")
    return value


def read_no_rope(cfg: dict, where: str, layers: int) -> list[int]:
    """Llama 4's ``no_rope_layers``: per layer 1 when it uses RoPE (chunked attention), 0 for NoPE (global); empty
    or absent: derived from ``no_rope_layer_interval`` (default 4) as transformers' Llama4TextConfig does."""
    listed = _int_list(cfg, "no_rope_layers", where, layers, range(2))
    if listed:
        if len(listed) != layers:
            raise ConfigError(f"{where}: field 'no_rope_layers' lists {len(listed)} layers, expected {layers} "
                              "(num_hidden_layers)")
        return listed
    interval = _int(cfg, "no_rope_layer_interval", where, default=4)
    return [int((i + 1) % interval != 0) for i in range(layers)]


def read_interleave(cfg: dict, where: str, layers: int, experts: int, dense_f: int | None) -> int:
    """Llama 4's ``interleave_moe_layer_step`` (0 when absent): layers ``step - 1, 2 step - 1, ...`` are MoE;
    ``moe_layers``, when listed, must name exactly those; a step above 1 needs the dense layers' FFN
    (``intermediate_size_mlp``)."""
    step = _int(cfg, "interleave_moe_layer_step", where, default=0)
    listed = _int_list(cfg, "moe_layers", where, layers, range(layers))
    if not step:
        if listed is not None:
            raise ConfigError(f"{where}: field 'moe_layers' needs 'interleave_moe_layer_step'")
        return 0
    if step > layers:
        raise ConfigError(f"{where}: field 'interleave_moe_layer_step' = {step} exceeds the {layers} layers")
    expected = list(range(step - 1, layers, step))
    if listed is not None and listed != expected:
        raise ConfigError(f"{where}: field 'moe_layers' lists {listed!r}; interleave_moe_layer_step = {step} "
                          f"makes layers {expected!r} MoE")
    if experts and step > 1 and dense_f is None:
        raise ConfigError(f"{where}: field 'interleave_moe_layer_step' = {step} needs 'intermediate_size_mlp' "
                          "(the dense layers' FFN dimension)")
    return step


def read_parameters(cfg: dict, where: str, model_type: str) -> dict:
    """Biases and sinks: ``attention_bias`` from the config, the rest by family (:data:`FAMILY_PARAMETERS`)."""
    family = FAMILY_PARAMETERS.get(model_type, frozenset())
    return {"attention_bias": json_bool(cfg, "attention_bias", where), "attention_sinks": "attention_sinks" in family,
            "router_bias": "router_bias" in family, "expert_bias": "expert_bias" in family}
