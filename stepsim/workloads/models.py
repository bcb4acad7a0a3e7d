"""Model presets used by the paper's experiments (STEP_SEMANTICS §5.1)."""

from __future__ import annotations

from dataclasses import dataclass

from stepsim.errors import ConfigError


@dataclass(frozen=True)
class MoEModel:
    """Dimensions of one Mixture-of-Experts layer.

    ``hidden`` is D (the model dimension), ``intermediate`` is F (the expert FFN dimension).
    """

    name: str
    hidden: int
    intermediate: int
    experts: int
    top_k: int

    def __post_init__(self):
        for key in ("hidden", "intermediate", "experts", "top_k"):
            v = getattr(self, key)
            if not isinstance(v, int) or v < 1:
                raise ConfigError(f"model {self.name!r}: {key} must be a positive int, got {v!r}")
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


MOE_MODELS = {
    "mixtral-8x7b": MoEModel("mixtral-8x7b", hidden=4096, intermediate=14336, experts=8, top_k=2),
    "qwen3-30b-a3b": MoEModel("qwen3-30b-a3b", hidden=2048, intermediate=768, experts=128, top_k=8),
}

ATTENTION_MODELS = {
    "qwen3-30b-a3b": AttentionModel("qwen3-30b-a3b", hidden=2048, head_dim=64, heads=32, kv_heads=4),
    "mixtral-8x7b": AttentionModel("mixtral-8x7b", hidden=4096, head_dim=128, heads=32, kv_heads=8),
}


def moe_model(name: str, **custom) -> MoEModel:
    """A preset by name, or ``custom`` with ``hidden, intermediate, experts, top_k`` given."""
    if name == "custom":
        missing = [k for k in ("hidden", "intermediate", "experts", "top_k") if custom.get(k) is None]
        if missing:
            raise ConfigError(f"model 'custom' needs {', '.join('--' + m.replace('_', '-') for m in missing)}")
        return MoEModel("custom", **{k: int(custom[k]) for k in ("hidden", "intermediate", "experts", "top_k")})
    try:
        return MOE_MODELS[name]
    except KeyError:
        raise ConfigError(f"unknown model {name!r}; expected one of {sorted(MOE_MODELS) + ['custom']}") from None
