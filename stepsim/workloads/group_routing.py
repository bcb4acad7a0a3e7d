"""Group-limited top-k routing, DeepSeek-V3's gate: which experts each token picks from its router logits, and
with what weights.

DeepSeek-V3 (``inference/model.py``, ``Gate.forward``; transformers' ``DeepseekV3TopkRouter``):

1. scores ``s = sigmoid(logits)`` (``scoring_func="sigmoid"``; ``"softmax"``: the softmax over the experts);
2. for the *selection* only, the per-expert bias (``e_score_correction_bias``) is added: ``b = s + bias``;
3. the ``E`` experts fall in ``n_group`` groups of ``E / n_group``; a group scores the sum of its two best
   ``b`` (its best one without a bias); the ``topk_group`` best groups are kept, the others' experts masked;
4. the ``top_k`` best ``b`` among the kept experts are the token's experts;
5. their weights are the *unbiased* scores ``s``, divided by their sum when scoring is sigmoid, times
   ``routed_scaling_factor``.

:func:`route` is the router, vectorised over tokens (what a serving or trace path calls);
:func:`deepseek_gate_reference` is DeepSeek's code transcribed token by token, the reference it is checked
against. Ties between equal keys go to the lower expert (group) index in both, as a stable sort does.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from stepsim.base.errors import ArgumentError

SCORING_FUNCS = ("sigmoid", "softmax")


@dataclass(frozen=True)
class GateConfig:
    """The router's shape: ``experts`` (E), ``top_k``, ``n_group`` groups of ``E / n_group`` experts of which
    ``topk_group`` are kept, ``scoring_func`` and ``routed_scaling_factor`` (the config.json fields)."""

    experts: int
    top_k: int
    n_group: int = 1
    topk_group: int = 1
    scoring_func: str = "sigmoid"
    routed_scaling_factor: float = 1.0

    def __post_init__(self):
        for key in ("experts", "top_k", "n_group", "topk_group"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise ArgumentError(f"gate: {key} must be a positive int, got {v!r}")
        if self.experts % self.n_group:
            raise ArgumentError(f"gate: n_group {self.n_group} does not divide the {self.experts} experts")
        if self.topk_group > self.n_group:
            raise ArgumentError(f"gate: topk_group {self.topk_group} exceeds n_group {self.n_group}")
        if self.top_k > self.topk_group * (self.experts // self.n_group):
            raise ArgumentError(f"gate: top_k {self.top_k} exceeds the {self.topk_group * (self.experts // self.n_group)}"
                                f" experts of the {self.topk_group} groups kept")
        if self.scoring_func not in SCORING_FUNCS:
            raise ArgumentError(f"gate: scoring_func must be one of {', '.join(SCORING_FUNCS)}, got "
                                f"{self.scoring_func!r}")

    @classmethod
    def of_model(cls, model) -> GateConfig:
        """The gate of a :class:`~stepsim.models.presets.ModelConfig` (an MoE model)."""
        return cls(model.experts, model.top_k, model.n_group, model.topk_group, model.scoring_func,
                   model.routed_scaling_factor)


def _scores(logits: np.ndarray, scoring_func: str) -> np.ndarray:
    if scoring_func == "sigmoid":
        return 1.0 / (1.0 + np.exp(-logits))
    e = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _checked(logits, bias, gate: GateConfig) -> tuple[np.ndarray, np.ndarray | None]:
    x = np.asarray(logits, np.float64)
    if x.ndim != 2 or x.shape[1] != gate.experts:
        raise ArgumentError(f"gate: logits must be [tokens, {gate.experts}] (one per expert), got shape {list(x.shape)}")
    if not np.isfinite(x).all():
        t = int(np.argwhere(~np.isfinite(x))[0][0])
        raise ArgumentError(f"gate: logits row {t} is not finite")
    if bias is None:
        return x, None
    b = np.asarray(bias, np.float64)
    if b.shape != (gate.experts,):
        raise ArgumentError(f"gate: bias must be [{gate.experts}] (one per expert), got shape {list(b.shape)}")
    return x, b


def _top(keys: np.ndarray, k: int) -> np.ndarray:
    """Indices of the ``k`` largest keys along the last axis, largest first, ties to the lower index."""
    return np.argsort(-keys, axis=-1, kind="stable")[..., :k]


def route(logits, gate: GateConfig, bias=None) -> tuple[np.ndarray, np.ndarray]:
    """The experts and weights of every token (see the module docstring).

    Parameters
    ----------
    logits : array [tokens, experts]
        The router's logits (``x @ W_gate^T``).
    gate : GateConfig
    bias : array [experts], optional
        The selection bias (DeepSeek-V3's ``e_score_correction_bias``).

    Returns
    -------
    (ids, weights)
        ``[tokens, top_k]`` int64 expert ids (best first) and float64 weights.
    """
    x, b = _checked(logits, bias, gate)
    scores = _scores(x, gate.scoring_func)
    keys = scores if b is None else scores + b
    tokens, size = len(x), gate.experts // gate.n_group
    if gate.n_group > 1:
        grouped = keys.reshape(tokens, gate.n_group, size)
        ranked = -np.sort(-grouped, axis=-1)
        group_keys = ranked[..., 0] if b is None else ranked[..., :2].sum(axis=-1)
        kept = np.zeros((tokens, gate.n_group), bool)
        np.put_along_axis(kept, _top(group_keys, gate.topk_group), True, axis=1)
        keys = np.where(np.repeat(kept, size, axis=1), keys, -np.inf)
    ids = _top(keys, gate.top_k)
    weights = np.take_along_axis(scores, ids, axis=1)
    if gate.scoring_func == "sigmoid":
        weights = weights / weights.sum(axis=1, keepdims=True)
    return ids.astype(np.int64), weights * gate.routed_scaling_factor


def deepseek_gate_reference(logits, gate: GateConfig, bias=None) -> tuple[np.ndarray, np.ndarray]:
    """DeepSeek-V3's ``Gate.forward`` line by line, one token at a time (plain loops and sorts), for checking
    :func:`route`: same return values."""
    x, b = _checked(logits, bias, gate)
    size = gate.experts // gate.n_group
    all_ids, all_weights = [], []
    for row in x:
        if gate.scoring_func == "softmax":
            e = np.exp(row - row.max())
            original = e / e.sum()
        else:
            original = np.array([1.0 / (1.0 + np.exp(-v)) for v in row])
        scores = original.copy() if b is None else original + b
        if gate.n_group > 1:
            groups = [scores[g * size:(g + 1) * size] for g in range(gate.n_group)]
            if b is None:
                group_scores = [max(grp) for grp in groups]
            else:
                group_scores = [sum(sorted(grp, reverse=True)[:2]) for grp in groups]
            order = sorted(range(gate.n_group), key=lambda g: (-group_scores[g], g))
            keep = set(order[:gate.topk_group])
            scores = np.array([scores[e] if e // size in keep else -np.inf for e in range(gate.experts)])
        ids = sorted(range(gate.experts), key=lambda e: (-scores[e], e))[:gate.top_k]
        weights = np.array([original[e] for e in ids])
        if gate.scoring_func == "sigmoid":
            weights = weights / weights.sum()
        all_ids.append(ids)
        all_weights.append(weights * gate.routed_scaling_factor)
    return np.array(all_ids, np.int64), np.array(all_weights)
