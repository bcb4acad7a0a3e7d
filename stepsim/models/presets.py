"""Model dimensions: built-in presets and Hugging Face ``config.json`` files (no weights, no network).

A model is named in three ways wherever a command takes ``--model`` (or a config takes ``model``):

* a built-in preset: ``mixtral-8x7b``, ``qwen3-30b-a3b``, ``deepseek-moe-16b``, ``llama-3.1-8b``,
  ``deepseek-v3``, ``gpt-oss-120b``, ``gpt-oss-20b``, ``qwen3-235b-a22b``, ``llama-4-scout``,
  ``llama-4-maverick``; or one of its aliases (``mixtral``, ``qwen``, ``deepseek``, ``llama``, ...). Records store the preset's canonical
  name (:func:`canonical_model_name`);
* a Hugging Face ``config.json`` path (any name ending in ``.json``), read by :func:`load_hf_config`;
* ``custom`` with the four MoE dimensions given (``--hidden --intermediate --experts --top-k``).

The presets are themselves config files shipped in the package (``stepsim/data/models/<name>.json``): the
published ``config.json`` fields stepsim reads, plus a ``"stepsim"`` object holding the canonical name, the
aliases, the source and, where the paper's runs used other dimensions than the published model, those
dimensions (``paper_attention``). Fields read (everything else in a config is ignored):

====================================================  ==========================================================
field                                                 meaning (unit)
====================================================  ==========================================================
``model_type``                                        architecture family (string), shown only
``hidden_size``                                       D, the model dimension (elements)
``intermediate_size``                                 dense FFN dimension; the expert FFN dimension when
                                                      ``moe_intermediate_size`` is absent (Mixtral)
``moe_intermediate_size``                             F, each routed expert's FFN dimension (elements)
``num_local_experts`` / ``num_experts`` /             routed experts per MoE layer (absent, null or 0: dense)
``n_routed_experts``
``num_experts_per_tok``                               top-k, experts per token (MoE models; refused without
                                                      an expert count)
``n_shared_experts``                                  shared experts of ``moe_intermediate_size`` each (DeepSeek)
``shared_expert_intermediate_size``                   one shared expert of that FFN dimension (Qwen2-MoE)
``num_attention_heads``, ``num_key_value_heads``      query heads, KV heads (default: the query heads)
``head_dim``                                          per-head dimension (default ``hidden_size / heads``)
``num_hidden_layers``                                 decoder layers
====================================================  ==========================================================

The frontier models' fields (multi-head latent attention, group-limited routing, dense first layers,
``layer_types`` and ``sliding_window``, sinks and biases, Llama 4's interleaved MoE layers and chunked attention)
are read by :mod:`stepsim.models.frontier`. Workloads that do not model them yet refuse such a model in one line
(:meth:`ModelConfig.refuse_unmodelled`); serving prices it layer group by layer group
(:mod:`stepsim.models.layers`, :mod:`stepsim.serve.layer_list`); ``stepsim models show`` and the weights / KV
accounting take it.

Refused with a :class:`~stepsim.base.errors.ConfigError` naming the file and the field: unreadable or non-object
JSON, a missing required field, a field of the wrong type (a non-positive or non-integer count), two expert
counts that disagree. A multimodal config whose text model sits under ``text_config`` is read from there.

The MoE workload (:func:`moe_model`) simulates routed experts and, where the model has them, its shared experts;
it refuses dense models, naming why.
"""

from __future__ import annotations

import json
import numbers
import os
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path

from stepsim.base.errors import ConfigError
from stepsim.models import frontier


@dataclass(frozen=True)
class MoEModel:
    """Dimensions of one Mixture-of-Experts layer.

    ``hidden`` is D (the model dimension), ``intermediate`` is F (the expert FFN dimension),
    ``shared_intermediate`` the FFN dimension of the shared expert(s) every token visits besides its routed ones
    (DeepSeek: ``n_shared_experts * moe_intermediate_size``, Qwen2-MoE: ``shared_expert_intermediate_size``;
    0: none). Shared experts of one layer act as one SwiGLU FFN of that width, so they are modelled as one.
    """

    name: str
    hidden: int
    intermediate: int
    experts: int
    top_k: int
    shared_intermediate: int = 0

    def __post_init__(self):
        for key in ("hidden", "intermediate", "experts", "top_k"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"model {self.name!r}: {key} must be a positive int, got {v!r}")
        v = self.shared_intermediate
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ConfigError(f"model {self.name!r}: shared_intermediate must be an int >= 0, got {v!r}")
        if self.top_k > self.experts:
            raise ConfigError(f"model {self.name!r}: top_k {self.top_k} exceeds experts {self.experts}")

    @property
    def expert_weight_bytes_bf16(self) -> int:
        """Bytes of one expert's gate + up + down weights stored in bf16."""
        return 3 * self.hidden * self.intermediate * 2


@dataclass(frozen=True)
class AttentionModel:
    """Attention dimensions (one KV head is simulated; ``query_per_kv_head`` queries share it)."""

    name: str
    hidden: int
    head_dim: int
    heads: int
    kv_heads: int

    @property
    def query_per_kv_head(self) -> int:
        return self.heads // self.kv_heads


@dataclass(frozen=True)
class ModelConfig:
    """The dimensions stepsim resolves from one ``config.json`` (a preset's or a user's).

    Attributes
    ----------
    name : str
        Canonical preset name, or the file path as given for a user's file.
    source : str
        File read.
    model_type : str
        The config's ``model_type``.
    hidden, layers, heads, kv_heads, head_dim : int
        D (elements), decoder layers, query heads, KV heads, per-head dimension (elements).
    experts, top_k : int
        Routed experts per MoE layer and experts per token; both 0 for a dense model.
    expert_intermediate : int or None
        F of each routed expert (elements); None for a dense model.
    dense_intermediate : int or None
        ``intermediate_size``: the dense FFN dimension (elements); None when the config has none or uses it as
        the experts' FFN dimension (no ``moe_intermediate_size``, as Mixtral).
    shared_experts : int
        Shared experts every token visits (0: none).
    shared_intermediate : int
        FFN dimension of all shared experts together (elements; DeepSeek: ``n_shared_experts *
        moe_intermediate_size``; Qwen2-MoE: ``shared_expert_intermediate_size``), 0 when there are none.
    aliases : tuple of str
        Other names of a preset.
    paper_attention : dict
        Attention dimensions the paper's runs used where they differ from the published ones (presets only).
    q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim : int or None
        Multi-head latent attention (elements; :mod:`stepsim.models.frontier`); all None for GQA. An MLA model's
        ``head_dim`` is ``qk_nope_head_dim + qk_rope_head_dim`` (a query's and a key's width per head).
    n_group, topk_group, scoring_func, routed_scaling_factor
        Group-limited routing (defaults 1, 1, ``softmax``, 1.0).
    first_k_dense_replace, moe_layer_freq : int
        Dense first layers and the MoE layer spacing (defaults 0, 1).
    layer_types : tuple of str
        Each layer's ``full_attention``, ``sliding_attention`` or ``chunked_attention`` (empty: all full).
    sliding_window : int or None
        Tokens a sliding layer attends to (None: no sliding layer).
    attention_bias, attention_sinks, router_bias, expert_bias : bool
        Biases on q/k/v/o, one sink logit per head, biases on the router and on each expert's matrices.
    shared_kv : bool
        One KV cache whose rows are both the keys and the values, read once: never read from a ``config.json``;
        set on an MLA layer group's engine model (:func:`stepsim.serve.layer_list.group_model`: multi-query
        attention over the ``kv_lora_rank + qk_rope_head_dim``-wide latent row, which is also the value).
    interleave_moe_layer_step : int
        Llama 4: layers ``step - 1, 2 step - 1, ...`` are MoE, the others dense (0: not given).
    attention_chunk_size : int or None
        Llama 4: tokens of one attention chunk of a ``chunked_attention`` layer (None: no chunked layer).
    """

    name: str
    source: str
    model_type: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    experts: int = 0
    top_k: int = 0
    expert_intermediate: int | None = None
    dense_intermediate: int | None = None
    shared_experts: int = 0
    shared_intermediate: int = 0
    aliases: tuple[str, ...] = ()
    paper_attention: dict = field(default_factory=dict)
    q_lora_rank: int | None = None
    kv_lora_rank: int | None = None
    qk_nope_head_dim: int | None = None
    qk_rope_head_dim: int | None = None
    v_head_dim: int | None = None
    n_group: int = 1
    topk_group: int = 1
    scoring_func: str = "softmax"
    routed_scaling_factor: float = 1.0
    first_k_dense_replace: int = 0
    moe_layer_freq: int = 1
    layer_types: tuple[str, ...] = ()
    sliding_window: int | None = None
    attention_bias: bool = False
    attention_sinks: bool = False
    router_bias: bool = False
    expert_bias: bool = False
    shared_kv: bool = False
    # out of the repr, which keys the fast calibrations of every model (repr(model)): the caches made before these
    # fields keep their keys; a layer-list model's calibration key names each group's layers and chunk besides
    interleave_moe_layer_step: int = field(default=0, repr=False)
    attention_chunk_size: int | None = field(default=None, repr=False)

    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    @property
    def is_mla(self) -> bool:
        """Multi-head latent attention (DeepSeek-V2/V3/R1)."""
        return self.kv_lora_rank is not None

    @property
    def sliding_layers(self) -> int:
        """Layers of sliding-window attention."""
        return sum(t == "sliding_attention" for t in self.layer_types)

    @property
    def chunked_layers(self) -> int:
        """Layers of chunked attention (Llama 4's RoPE layers)."""
        return sum(t == "chunked_attention" for t in self.layer_types)

    def layer_is_moe(self, index: int) -> bool:
        """Whether layer ``index`` (from 0) has routed experts (DeepSeek: past the dense first layers, every
        ``moe_layer_freq``-th; Llama 4: every ``interleave_moe_layer_step``-th, from layer ``step - 1``)."""
        if self.interleave_moe_layer_step:
            return self.is_moe and (index + 1) % self.interleave_moe_layer_step == 0
        return (self.is_moe and index >= self.first_k_dense_replace
                and index % self.moe_layer_freq == 0)

    def unmodelled(self) -> list[str]:
        """The features that make this model heterogeneous (issue 43): MLA, sliding or chunked attention, dense and
        MoE layers interleaved, sinks, group-limited routing. ``serve`` and ``plan`` price such a model layer group
        by layer group (:mod:`stepsim.serve.layer_list`); the one-kind workloads (``run``, ``map``) do not model
        them and refuse it (:meth:`refuse_unmodelled`). Empty: every layer is the same kind."""
        out = []
        if self.is_mla:
            out.append("multi-head latent attention (MLA)")
        if self.sliding_layers:
            out.append(f"sliding-window attention ({self.sliding_layers} of {self.layers} layers)")
        if self.chunked_layers:
            out.append(f"chunked attention ({self.chunked_layers} of {self.layers} layers)")
        if self.interleave_moe_layer_step > 1:
            out.append(f"dense and MoE layers interleaved (MoE every {self.interleave_moe_layer_step} layers)")
        if self.attention_sinks:
            out.append("attention sinks")
        if self.n_group > 1 or self.scoring_func != "softmax":
            out.append(f"{self.scoring_func} routing limited to {self.topk_group} of {self.n_group} expert groups")
        return out

    def refuse_unmodelled(self, what: str) -> None:
        """Refuse, in one line naming ``what`` (a workload, ``serve``), a model with features it does not model.

        Raises
        ------
        ConfigError
            The model uses MLA, sliding windows, chunked attention, interleaved dense and MoE layers, sinks or
            group-limited routing.
        """
        missing = self.unmodelled()
        if missing:
            named = missing[0] if len(missing) == 1 else f"{', '.join(missing[:-1])} and {missing[-1]}"
            raise ConfigError(f"model {self.name!r} uses {named}, which {what} does not model yet (issue 43)")

    @property
    def moe(self) -> MoEModel:
        """The routed-expert layer as an :class:`MoEModel` (what the ``moe`` workload simulates).

        Raises
        ------
        ConfigError
            A dense model.
        """
        if not self.is_moe:
            raise ConfigError(f"model {self.name!r} is dense (no routed experts in {self.source}); "
                              "the moe workload needs an MoE model")
        return MoEModel(self.name, hidden=self.hidden, intermediate=self.expert_intermediate,
                        experts=self.experts, top_k=self.top_k, shared_intermediate=self.shared_intermediate)

    @property
    def attention(self) -> AttentionModel:
        """The model's published attention dimensions."""
        return AttentionModel(self.name, hidden=self.hidden, head_dim=self.head_dim, heads=self.heads,
                              kv_heads=self.kv_heads)

    @property
    def paper_attention_model(self) -> AttentionModel:
        """The attention dimensions of the paper's runs: :attr:`attention` with ``paper_attention`` applied."""
        a = self.attention
        return AttentionModel(self.name, **{k: self.paper_attention.get(k, getattr(a, k))
                                            for k in ("hidden", "head_dim", "heads", "kv_heads")})

    def as_dict(self) -> dict:
        """Every resolved dimension as plain JSON values (``models show --json``)."""
        d = asdict(self)
        del d["shared_kv"]  # an engine model's (serve.layer_list.group_model), never a config's dimension
        d["aliases"] = list(self.aliases)
        d["kind"] = "moe" if self.is_moe else "dense"
        d["layer_types"] = list(self.layer_types)
        d["query_per_kv_head"] = self.heads // self.kv_heads
        d["attention_kind"] = "mla" if self.is_mla else "gqa"
        return d


# --- reading config.json ------------------------------------------------------------------------------
#: fields naming the routed-expert count, in the families that use them (Mixtral, Qwen-MoE, DeepSeek)
EXPERT_FIELDS = ("num_local_experts", "num_experts", "n_routed_experts")


def _read_json(path: Path) -> dict:
    from stepsim.base.files import refuse_special_file

    refuse_special_file(path, ConfigError, "a model config.json")
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"model file {path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"model file {path}: cannot read: {exc}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"model file {path}: not valid JSON: {exc.msg} (line {exc.lineno}, column "
                          f"{exc.colno})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"model file {path}: expected a JSON object of config fields, got "
                          f"{type(data).__name__}")
    return data


def _int_field(cfg: dict, key: str, where: str, *, required: bool, minimum: int = 1) -> int | None:
    """A positive-int field (JSON null counts as absent)."""
    value = cfg.get(key)
    if value is None:
        if required:
            raise ConfigError(f"{where}: missing field {key!r}")
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{where}: field {key!r} must be an integer >= {minimum}, got {value!r}")
    if value > 2**31 - 1:  # a dimension of 1e30 gave parameter counts of 1e34 and overflowing sizes downstream
        raise ConfigError(f"{where}: field {key!r} must be at most 2,147,483,647 (2**31 - 1), got {value!r}")
    return value


def _preset_meta(cfg: dict, where: str) -> dict:
    """The checked ``"stepsim"`` object of a shipped preset file: name, aliases, optional paper_attention."""
    meta = cfg.get("stepsim")
    if not isinstance(meta, dict) or not isinstance(meta.get("name"), str):
        raise ConfigError(f"{where}: a preset needs a 'stepsim' object with a 'name', got {meta!r}")
    aliases = meta.get("aliases", [])
    if not isinstance(aliases, list) or not all(isinstance(a, str) and a for a in aliases):
        raise ConfigError(f"{where}: field 'stepsim.aliases' must be a list of names, got {aliases!r}")
    paper = meta.get("paper_attention", {})
    if not isinstance(paper, dict) or any(k not in ("hidden", "head_dim", "heads", "kv_heads") or
                                          isinstance(v, bool) or not isinstance(v, int) or v < 1
                                          for k, v in paper.items()):
        raise ConfigError(f"{where}: field 'stepsim.paper_attention' must map hidden / head_dim / heads / kv_heads "
                          f"to positive integers, got {paper!r}")
    return meta


def parse_hf_config(cfg: dict, source: str, *, name: str | None = None, preset: bool = False) -> ModelConfig:
    """Resolve the dimensions of a parsed ``config.json`` mapping (see the module docstring).

    Parameters
    ----------
    cfg : dict
        The JSON object.
    source : str
        File name for messages (``model file <source>: ...``) and :attr:`ModelConfig.source`.
    name : str, optional
        Model name (default: ``source``; a preset's ``stepsim.name``).
    preset : bool
        Read the ``"stepsim"`` object (name, aliases, paper_attention) of a shipped preset. A user's file is
        named by its path and its ``"stepsim"`` object is ignored like any other field, so a copy of a preset
        file never poses as the preset.

    Raises
    ------
    ConfigError
        Missing or invalid field, naming the file and the field.
    """
    where = f"model file {source}"
    meta = _preset_meta(cfg, where) if preset else {}
    if cfg.get("hidden_size") is None and isinstance(cfg.get("text_config"), dict):
        cfg, where = cfg["text_config"], f"{where}: text_config"
    model_type = cfg.get("model_type")
    if model_type is None:
        raise ConfigError(f"{where}: missing field 'model_type'")
    if not isinstance(model_type, str) or not model_type:
        raise ConfigError(f"{where}: field 'model_type' must be a non-empty string, got {model_type!r}")
    hidden = _int_field(cfg, "hidden_size", where, required=True)
    layers = _int_field(cfg, "num_hidden_layers", where, required=True)
    heads = _int_field(cfg, "num_attention_heads", where, required=True)
    kv_heads = _int_field(cfg, "num_key_value_heads", where, required=False) or heads
    if heads % kv_heads:
        raise ConfigError(f"{where}: field 'num_key_value_heads' = {kv_heads} does not divide "
                          f"num_attention_heads = {heads}")
    mla = frontier.read_mla(cfg, where)
    head_dim = _int_field(cfg, "head_dim", where, required=False)
    if mla["kv_lora_rank"] is not None:  # MLA: a query's / key's width per head (nope + rope)
        head_dim = mla["qk_nope_head_dim"] + mla["qk_rope_head_dim"]
    if head_dim is None:
        if hidden % heads:
            raise ConfigError(f"{where}: missing field 'head_dim', and hidden_size {hidden} is not a multiple of "
                              f"num_attention_heads {heads}")
        head_dim = hidden // heads
    dense_f = _int_field(cfg, "intermediate_size", where, required=False)

    counts = {key: _int_field(cfg, key, where, required=False, minimum=0) for key in EXPERT_FIELDS}
    given = {key: v for key, v in counts.items() if v}
    if len(set(given.values())) > 1:
        shown = ", ".join(f"{k} = {v}" for k, v in given.items())
        raise ConfigError(f"{where}: expert counts disagree ({shown})")
    experts = next(iter(given.values()), 0)
    top_k, expert_f, shared, shared_f = 0, None, 0, 0
    if experts:
        top_k = _int_field(cfg, "num_experts_per_tok", where, required=True)
        if top_k > experts:
            raise ConfigError(f"{where}: field 'num_experts_per_tok' = {top_k} exceeds the {experts} experts")
        expert_f = _int_field(cfg, "moe_intermediate_size", where, required=False)
        if expert_f is None:  # Mixtral: intermediate_size is the experts' FFN, and there is no dense FFN
            expert_f, dense_f = dense_f, None
        if expert_f is None:
            raise ConfigError(f"{where}: missing field 'moe_intermediate_size' (or 'intermediate_size'): "
                              f"the expert FFN dimension of an MoE model")
        n_shared = _int_field(cfg, "n_shared_experts", where, required=False, minimum=0) or 0
        shared_size = _int_field(cfg, "shared_expert_intermediate_size", where, required=False, minimum=0) or 0
        if n_shared and shared_size:
            raise ConfigError(f"{where}: fields 'n_shared_experts' and 'shared_expert_intermediate_size' are both "
                              "set; expected one way of sizing the shared experts")
        shared, shared_f = (n_shared, n_shared * expert_f) if n_shared else ((1, shared_size) if shared_size
                                                                                else (0, 0))
        family_shared = frontier.FAMILY_SHARED_EXPERTS.get(model_type, 0)
        if family_shared and not shared:  # Llama 4: one shared expert of the experts' width, not a config field
            shared, shared_f = family_shared, family_shared * expert_f
        mlp = _int_field(cfg, "intermediate_size_mlp", where, required=False)
        if mlp is not None:  # Llama 4: the dense layers' FFN (intermediate_size is the experts')
            dense_f = mlp
    elif _int_field(cfg, "num_experts_per_tok", where, required=False, minimum=0):
        # routes each token to experts it does not count: read as dense, its weights and FFN would be another model's
        raise ConfigError(f"{where}: field 'num_experts_per_tok' = {cfg['num_experts_per_tok']} but no expert count "
                          f"({' / '.join(EXPERT_FIELDS)}); give the experts, or leave top-k out for a dense model")
    elif dense_f is None:
        raise ConfigError(f"{where}: missing field 'intermediate_size' (a dense model: no "
                          f"{' / '.join(EXPERT_FIELDS)})")
    aliases = meta.get("aliases", [])
    paper_attention = meta.get("paper_attention", {})
    extra = {**mla, **frontier.read_routing(cfg, where, experts, top_k),
             **frontier.read_layers(cfg, where, layers, experts, dense_f),
             **frontier.read_parameters(cfg, where, model_type)}
    return ModelConfig(
        name=name or meta.get("name") or source, source=source, model_type=model_type, hidden=hidden,
        layers=layers, heads=heads, kv_heads=kv_heads, head_dim=head_dim, experts=experts, top_k=top_k,
        expert_intermediate=expert_f, dense_intermediate=dense_f, shared_experts=shared,
        shared_intermediate=shared_f, aliases=tuple(aliases), paper_attention=dict(paper_attention), **extra,
    )


def load_hf_config(path: str | os.PathLike, *, name: str | None = None) -> ModelConfig:
    """Read a Hugging Face ``config.json`` (see the module docstring for the fields).

    ``name`` defaults to the path as given.
    """
    source = os.fspath(path)
    return parse_hf_config(_read_json(Path(source)), source, name=name)


# --- presets ------------------------------------------------------------------------------------------
def _load_presets() -> dict[str, ModelConfig]:
    folder = resources.files("stepsim") / "data" / "models"
    presets = {}
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".json"):
            model = parse_hf_config(json.loads(entry.read_text(encoding="utf-8")), f"stepsim/data/models/{entry.name}",
                                    preset=True)
            if model.name in presets:  # two shipped files claiming one name would shadow each other silently
                raise ConfigError(f"model file {model.source}: preset name {model.name!r} is used twice")
            presets[model.name] = model
    return presets


#: built-in models by canonical name (the files in ``stepsim/data/models``)
PRESETS: dict[str, ModelConfig] = _load_presets()
#: lower-case name or alias -> canonical preset name
ALIASES: dict[str, str] = {key.lower(): m.name for m in PRESETS.values() for key in (m.name, *m.aliases)}

#: MoE layers of the presets the ``moe`` workload simulates (routed experts, and shared experts where the model has
#: them)
MOE_MODELS: dict[str, MoEModel] = {n: m.moe for n, m in PRESETS.items() if m.is_moe}

#: the attention configurations of the artifact's ``dynamic_par`` scripts (docs/semantics.md §5.1) for the paper's
#: two models: the published dimensions with the preset's ``paper_attention`` applied (Qwen3-30B-A3B: head_dim 64
#: instead of 128)
ATTENTION_MODELS: dict[str, AttentionModel] = {n: PRESETS[n].paper_attention_model
                                               for n in ("mixtral-8x7b", "qwen3-30b-a3b")}

CUSTOM_KEYS = ("hidden", "intermediate", "experts", "top_k")


def is_model_file(name: str) -> bool:
    """Whether a ``--model`` value names a config file (it ends in ``.json``) rather than a preset."""
    return name.strip().lower().endswith(".json")


def canonical_model_name(name: str) -> str:
    """The canonical preset name of a preset name or alias (case-insensitive); any other value unchanged.

    >>> canonical_model_name("qwen"), canonical_model_name("Mixtral"), canonical_model_name("custom")
    ('qwen3-30b-a3b', 'mixtral-8x7b', 'custom')
    """
    if not isinstance(name, str):
        return name
    return ALIASES.get(name.strip().lower(), name)


def _known_names() -> str:
    aliases = ", ".join(sorted(a for a in ALIASES if a not in PRESETS))
    return f"{', '.join(PRESETS)} (aliases {aliases}) or a Hugging Face config.json path"


def resolve_model(name: str | os.PathLike) -> ModelConfig:
    """A preset (by name or alias) or a ``config.json`` file, resolved.

    Raises
    ------
    ConfigError
        Unknown name, or a file that cannot be read or resolved (naming the file and field).
    """
    name = os.fspath(name)
    if is_model_file(name):
        return load_hf_config(name)
    canonical = canonical_model_name(name)
    if canonical not in PRESETS:
        raise ConfigError(f"unknown model {name!r}; expected one of {_known_names()}")
    return PRESETS[canonical]


def moe_model(name: str, **custom) -> MoEModel:
    """The MoE layer of a preset (name or alias), of a ``config.json`` file, or ``custom`` with ``hidden,
    intermediate, experts, top_k`` given.

    Raises
    ------
    ConfigError
        Unknown name, missing custom dimensions, an unreadable config file, or a model the ``moe`` workload does
        not simulate (dense, or with shared experts).
    """
    if name == "custom":
        missing = [k for k in CUSTOM_KEYS if custom.get(k) is None]
        if missing:
            raise ConfigError(f"model 'custom' needs {', '.join('--' + m.replace('_', '-') for m in missing)}")
        for k in CUSTOM_KEYS:  # never truncated: 2048.5 is refused, not read as 2048
            v = custom[k]
            if isinstance(v, bool) or not isinstance(v, numbers.Integral):
                raise ConfigError(f"model 'custom': {k} must be a positive int, got {v!r}")
        return MoEModel("custom", **{k: int(custom[k]) for k in CUSTOM_KEYS})
    if is_model_file(name):
        return load_hf_config(name).moe
    canonical = canonical_model_name(name)
    if canonical in MOE_MODELS:
        return MOE_MODELS[canonical]
    if canonical in PRESETS:
        return PRESETS[canonical].moe  # raises: dense or shared experts
    aliases = ", ".join(sorted(a for a, n in ALIASES.items() if n in MOE_MODELS and a not in MOE_MODELS))
    raise ConfigError(f"unknown model {name!r}; expected one of {sorted(MOE_MODELS) + ['custom']}, an alias "
                      f"({aliases}) or a Hugging Face config.json path")


def routing_shape(name: str) -> tuple[int, int] | None:
    """``(experts, top_k)`` of a preset, alias or MoE config file; None for a name that is neither.

    Raises
    ------
    ConfigError
        A config file that cannot be read, or that describes a dense model.
    """
    if is_model_file(name):
        m = load_hf_config(name)
    else:
        canonical = canonical_model_name(name)
        if canonical not in PRESETS:
            return None
        m = PRESETS[canonical]
    if not m.is_moe:
        raise ConfigError(f"model {m.name!r} is dense (no routed experts); routing traces need an MoE model")
    return m.experts, m.top_k
