"""Synthetic routing limited to a few expert groups, for DeepSeek-V3 / R1 served by ``stepsim serve`` (issue 43).

:class:`GroupSyntheticRouting` is :class:`stepsim.serve.routing.SyntheticRouting`'s law passed through
DeepSeek-V3's gate (:func:`stepsim.workloads.group_routing.route`): a token's router logits in a layer are the
synthetic popularity logits (``-alpha log(rank + 1) - beta rank``, a seeded rank per expert) plus one Gumbel draw
per expert; the gate scores them by a sigmoid, adds the selection bias (zero: the synthetic law's skew stands in for
the imbalance DeepSeek's ``e_score_correction_bias`` corrects; with a bias a group scores the sum of its two best
experts, as DeepSeek-V3's ``noaux_tc`` does), keeps the ``topk_group`` best of ``n_group`` groups and picks the
``top_k`` best experts among them. Without the group limit this is the Gumbel-top-k law of ``SyntheticRouting``
(the sigmoid keeps the order); with it a token's experts lie in at most ``topk_group`` groups, which is what
decides how many chips an expert-parallel step's tokens are sent to.

Layers differ by a seeded permutation that keeps the groups: the groups' order and the experts' order within each
group are permuted per layer (a free permutation would break the group limit). Every layer's routing is drawn in
a base expert space (groups of contiguous ids) and mapped by its layer's permutation, so the fast path
(:meth:`window`) keeps ``SyntheticRouting``'s pool of :data:`~stepsim.serve.routing.POOL_TOKENS` tokens (here
drawn through the gate, in base space) with each layer's ids given by its permutation. ``locality`` is not
modelled (0).
"""

from __future__ import annotations

import numpy as np

from stepsim.serve.routing import POOL_TOKENS, SyntheticRouting
from stepsim.workloads.group_routing import GateConfig, route

#: the last pool drawn, by (seed, gate, alpha, beta); never written after
_POOLS: dict = {}
#: tokens routed through the gate at once (bounds the [tokens, experts] key arrays: 8 MiB at 256 experts)
ROUTE_CHUNK = 4096


class GroupSyntheticRouting(SyntheticRouting):
    """The synthetic routing of a model whose gate keeps ``gate.topk_group`` of ``gate.n_group`` expert groups
    (module docstring). Same interface as :class:`SyntheticRouting`: :meth:`route` for the exact path,
    :meth:`window` for the fast path."""

    def __init__(self, gate: GateConfig, layers: int, *, seed: int = 0, skew: tuple[float, float] | None = None):
        super().__init__(gate.experts, gate.top_k, layers, seed=seed, skew=skew)
        self.gate = gate
        rng = np.random.default_rng(np.random.SeedSequence([seed, 0x5E4E, 0x6A7E]))
        size = gate.experts // gate.n_group
        rank = rng.permutation(gate.experts).astype(np.float64)  # base expert b's popularity rank
        self._base_logits = -self.alpha * np.log(rank + 1.0) - self.beta * rank
        self._bias = np.zeros(gate.experts)
        out = np.empty((layers, gate.experts), dtype=np.int64)
        for layer in range(layers):  # group g of the base space is group order[g] of the layer, permuted within
            order = rng.permutation(gate.n_group)
            for g in range(gate.n_group):
                out[layer, g * size:(g + 1) * size] = order[g] * size + rng.permutation(size)
        self._expert_of_base = out
        self._gate_rng = np.random.default_rng(np.random.SeedSequence([seed, 0x5E4E, 0x6A7F]))

    def _base_route(self, tokens: int, rng: np.random.Generator) -> np.ndarray:
        """``tokens`` tokens' experts ``[tokens, top_k]`` in base space (module docstring), best first."""
        out = np.empty((tokens, self.top_k), dtype=np.int64)
        for start in range(0, tokens, ROUTE_CHUNK):
            n = min(ROUTE_CHUNK, tokens - start)
            logits = self._base_logits[None, :] + rng.gumbel(size=(n, self.experts))
            out[start:start + n] = route(logits, self.gate, self._bias)[0]
        return out

    def route(self, tokens: int) -> np.ndarray:
        """Expert ids ``[tokens, layers, top_k]`` of the next ``tokens`` tokens of the run."""
        base = self._base_route(tokens * self.layers, self._gate_rng).reshape(tokens, self.layers, self.top_k)
        return np.take_along_axis(self._expert_of_base[None, :, :], base, axis=2)

    def _draw_pool(self) -> None:
        """The fast path's pool through the gate, in base space (module docstring), with its prefix counts."""
        key = (self._seed, self.gate, self.alpha, self.beta)
        if key not in _POOLS:  # a fast calibration builds several providers of one routing: drawn once (seconds)
            rng = np.random.default_rng(np.random.SeedSequence([self._seed, 0x5E4E, 0xFA57]))
            pool = self._base_route(POOL_TOKENS, rng)
            onehot = np.zeros((POOL_TOKENS, self.experts), dtype=np.uint16)
            onehot[np.repeat(np.arange(POOL_TOKENS), self.top_k), pool.ravel()] = 1  # a token's experts differ
            prefix = np.zeros((1, POOL_TOKENS + 1, self.experts), dtype=np.uint16)
            np.cumsum(onehot, axis=0, out=prefix[0, 1:])
            _POOLS.clear()  # one routing's pool at a time (16 MiB at 256 experts)
            _POOLS[key] = (pool, prefix)
        pool, prefix = _POOLS[key]
        self._pool = (pool, prefix, self._expert_of_base)
        self._windows = np.random.default_rng(np.random.SeedSequence([self._seed, 0x5E4E, 0x0FF5]))
        self._starts = np.empty((0, self.layers), dtype=np.int64)
        self._used = 0

    def describe(self) -> dict:
        return {**super().describe(), "n_group": self.gate.n_group, "topk_group": self.gate.topk_group,
                "scoring": self.gate.scoring_func}


def synthetic_routing(model, seed: int) -> SyntheticRouting:
    """The synthetic routing of ``model`` (a ModelConfig): :class:`GroupSyntheticRouting` when its gate keeps a
    few of several expert groups (``n_group > 1``), else :class:`SyntheticRouting`."""
    if model.n_group > 1:
        return GroupSyntheticRouting(GateConfig.of_model(model), model.layers, seed=seed)
    return SyntheticRouting(model.experts, model.top_k, model.layers, seed=seed)


__all__ = ["GroupSyntheticRouting", "synthetic_routing", "ROUTE_CHUNK"]
