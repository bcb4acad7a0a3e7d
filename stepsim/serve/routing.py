"""Expert routing for every token of every MoE layer of a serve run (docs/serving.md §9.3).

* :class:`ReplayRouting` (``--routing FILE``): a routed-experts dump ``[tokens, layers, top_k]`` (SGLang's /
  vLLM's "return routed experts", read and checked by :func:`stepsim.trace_io.serving.load_routed_experts`).
  The run's tokens take the dump's rows in order, the first token of the run row 0, wrapping around at the end;
  layer ``l`` of the model uses the dump's layer ``l`` (a dump with fewer layers than the model is refused).
* :class:`SyntheticRouting` (``--routing synthetic``, the default): a seeded model. Expert ``e`` of layer ``l``
  has popularity rank ``rank_l(e)`` (a seeded permutation per layer: layers differ in *which* experts are
  popular, not in how skewed they are) and logit ``-alpha * log(rank + 1) - beta * rank`` (a Zipf law with an
  exponential cut-off); each token draws its ``top_k`` experts without replacement, slot by slot, each with
  probability proportional to ``exp(logit)`` among the experts not yet drawn (Plackett-Luce: a categorical
  draw that repeats an expert is drawn again; the same law as Gumbel-top-k, for a few random numbers per slot
  instead of one per expert). With probability ``locality`` a token repeats the previous token's experts in
  that layer (token-to-token locality; default 0: tokens are independent).

``(alpha, beta)`` is fitted to a real routing trace by :func:`fit_skew`: the pair whose simulated batches (of
the trace's token count, common random numbers, :data:`FIT_BATCHES` of them) have mean sorted per-expert token
counts closest (least squares) to the trace's, on the grid alpha = 0, 0.1, .., 2 by beta = 0, 0.01, .., 0.2.
The fit reproduces the Qwen3 trace's shape: 64 tokens x top-8 leave 68 experts idle and give the busiest 42
tokens; the model's batches leave 60.0 idle and give the busiest 39.3 on average. The shared traces
are one decoding batch of one layer each, so per-layer differences and locality cannot be fitted; they are the
documented parameters above. Fitted values (``tests/serve/test_routing.py`` re-fits them from the traces):

* Qwen3-30B-A3B (128 experts, top-8; ``expert_routing/qwen_b64/032_012.npz``): alpha 0.3, beta 0.05
* Mixtral-8x7B (8 experts, top-2; ``expert_routing/mixtral_b64/008_010.npz``): alpha 0.1, beta 0.09

Models with another expert count use the Qwen3 value.

**The fast path's routing** (:meth:`SyntheticRouting.window`, ``--fidelity fast``). Drawing every slot of every
token of every layer costs about 13 ns of CPU even in machine code: the whole Azure conversation trace
(26.4 M tokens x 48 layers x 8 slots of Qwen3-30B-A3B) would spend over two minutes on it. The fast path draws
a pool of :data:`POOL_TOKENS` tokens once, token by token by the law above (in rank space: expert ids of rank
order, one layer; :func:`stepsim.kernels.serve_fast.draw_routing`, its own seeded stream), and gives layer ``l``
of a step of ``T`` tokens the ``T`` consecutive pool tokens from a seeded uniform start (wrapping around), its
ranks mapped to layer ``l``'s experts. Each layer's routing in each step is therefore a sequence of tokens
drawn by the model's law, exactly; what is given up is independence *between* windows (they share pool tokens:
two windows of a 2,048-token step overlap with probability about 2 x 2048 / 32768) and, with ``locality`` > 0,
the repeat of a token's experts across all layers at once (within a layer, locality holds inside the pool). The
FFN features need only each layer's per-expert counts, which prefix counts of the pool give in O(experts) per
layer (:func:`stepsim.kernels.serve_fast.window_features`); the rows themselves are made only for the steps the
calibration simulates and for two-token steps (:func:`stepsim.serve.fast.pair_parity`). The exact provider keeps :meth:`SyntheticRouting.route`, untouched.
:meth:`ReplayRouting.window` takes the dump's rows in order, as :meth:`ReplayRouting.route` does.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np

from stepsim.base.errors import ConfigError
from stepsim.kernels.serve_fast import alias_tables, draw_routing, window_features

#: batches simulated per candidate (alpha, beta) when fitting
FIT_BATCHES = 100
#: (alpha, beta) fitted per expert count (from the real traces named in the module docstring)
FITTED_SKEW = {128: (0.3, 0.05), 8: (0.1, 0.09)}
#: the fit's seed (common random numbers for every candidate)
FIT_SEED = 2024
#: tokens of the fast path's routing pool (module docstring)
POOL_TOKENS = 1 << 15
#: steps whose window starts are drawn at once
WINDOW_BATCH = 1024
#: pools kept by :func:`_pool_in_ranks` (each 8 MiB of prefix counts for 128 experts)
POOLS_KEPT = 4


def gumbel_top_k(logits: np.ndarray, top_k: int, rng: np.random.Generator, tokens: int) -> np.ndarray:
    """``tokens`` draws of ``top_k`` distinct indices of ``logits`` (Gumbel-top-k), largest perturbed logit
    first. Returns int64 ``[tokens, top_k]``."""
    keys = logits[None, :] + rng.gumbel(size=(tokens, len(logits)))
    return _top_k(keys, top_k)


def _top_k(keys: np.ndarray, top_k: int) -> np.ndarray:
    part = np.argpartition(-keys, top_k - 1, axis=1)[:, :top_k]
    order = np.argsort(-np.take_along_axis(keys, part, axis=1), axis=1, kind="stable")
    return np.take_along_axis(part, order, axis=1).astype(np.int64)


def sorted_counts(routing: np.ndarray, experts: int) -> np.ndarray:
    """Per-expert token counts of a ``[tokens, top_k]`` routing, largest first."""
    return np.sort(np.bincount(routing.ravel(), minlength=experts))[::-1]


def fit_skew(routing: np.ndarray, experts: int) -> tuple[float, float]:
    """The skew ``(alpha, beta)`` whose simulated batches best match the sorted counts of ``routing`` (module
    docstring)."""
    tokens, top_k = routing.shape
    target = sorted_counts(routing, experts).astype(np.float64)
    gumbel = np.random.default_rng(FIT_SEED).gumbel(size=(FIT_BATCHES, tokens, experts))
    rank = np.arange(experts, dtype=np.float64)
    slots = np.repeat(np.arange(FIT_BATCHES), tokens * top_k)

    def error(alpha: float, beta: float) -> float:
        keys = (gumbel - alpha * np.log(rank + 1) - beta * rank).reshape(-1, experts)
        picks = _top_k(keys, top_k).reshape(FIT_BATCHES, tokens * top_k)
        counts = np.zeros((FIT_BATCHES, experts))
        np.add.at(counts, (slots, picks.ravel()), 1)
        mean = np.sort(counts, axis=1)[:, ::-1].mean(axis=0)
        return float(np.sum((mean - target) ** 2))

    _, a, b = min((error(a / 10, b / 100), a, b) for a in range(21) for b in range(21))
    return a / 10, b / 100


@functools.lru_cache(maxsize=POOLS_KEPT)
def _pool_in_ranks(seed: int, experts: int, top_k: int, alpha: float, beta: float,
                   locality: float) -> tuple[np.ndarray, np.ndarray]:
    """The fast path's pool in rank space, ``(ranks [POOL_TOKENS, top_k], prefix counts [1, POOL_TOKENS + 1,
    experts])``, drawn once a process for each law and seed and shared, never written, by every routing drawing it:
    a plan makes a fresh provider, hence a fresh routing, for each of its hundreds of replays, and drawing the pool
    again was most of a small replay's set-up (6.6 s of a 155 s profiled test of 1,172 replays,
    tests/plan/test_plan.py)."""
    rank = np.arange(experts, dtype=np.float64)
    logit = -alpha * np.log(rank + 1.0) - beta * rank
    prob, alias = alias_tables(np.exp(logit - logit.max())[None, :])
    state = np.random.SeedSequence([seed, 0x5E4E, 0xFA57]).generate_state(1, np.uint64)
    pool = np.empty((POOL_TOKENS, 1, top_k), dtype=np.int64)
    counts = np.zeros((1, experts), dtype=np.int64)
    draw_routing(prob, alias, state, locality, np.zeros((1, top_k), dtype=np.int64), False, pool, counts)
    onehot = np.zeros((POOL_TOKENS, experts), dtype=np.uint16)
    onehot[np.repeat(np.arange(POOL_TOKENS), top_k), pool.ravel()] = 1  # a token's experts are distinct
    # uint16 holds every prefix count (at most POOL_TOKENS = 2^15): 8 MiB for 128 experts, mostly in cache
    prefix = np.zeros((1, POOL_TOKENS + 1, experts), dtype=np.uint16)
    np.cumsum(onehot, axis=0, out=prefix[0, 1:])
    return pool[:, 0, :], prefix


class SyntheticRouting:
    """The seeded synthetic routing model (module docstring)."""

    mode = "synthetic"

    def __init__(self, experts: int, top_k: int, layers: int, *, seed: int = 0,
                 skew: tuple[float, float] | None = None, locality: float = 0.0):
        if not 0.0 <= locality <= 1.0:
            raise ConfigError(f"routing locality must be between 0 and 1, got {locality!r}")
        self.experts, self.top_k, self.layers = experts, top_k, layers
        self.alpha, self.beta = FITTED_SKEW.get(experts, FITTED_SKEW[128]) if skew is None else skew
        self.locality = float(locality)
        self._rng = np.random.default_rng(np.random.SeedSequence([seed, 0x5E4E]))
        ranks = np.arange(experts)
        perms = [self._rng.permutation(ranks).astype(np.float64) for _ in range(layers)]
        self._logits = np.stack([-self.alpha * np.log(p + 1.0) - self.beta * p for p in perms])
        weights = np.exp(self._logits - self._logits.max(axis=1, keepdims=True))
        cdf = np.cumsum(weights / weights.sum(axis=1, keepdims=True), axis=1)
        cdf[:, -1] = 1.0
        # layer l's CDF shifted to (l, l + 1]: one searchsorted draws every (token, layer) row at once
        self._cdf = (cdf + np.arange(layers)[:, None]).ravel()
        self._previous = None
        self._perms = np.stack(perms).astype(np.int64)  # rank of expert e in layer l
        self._seed = seed
        self._pool = None  # the fast path's (window()), drawn on first use

    def route(self, tokens: int) -> np.ndarray:
        """Expert ids ``[tokens, layers, top_k]`` of the next ``tokens`` tokens of the run."""
        layers, k = self.layers, self.top_k
        layer = np.tile(np.arange(layers, dtype=np.int64), tokens)  # row t * layers + l: token t, layer l
        picks = np.empty((tokens * layers, k), dtype=np.int64)
        for slot in range(k):  # sequential draws without replacement: a repeat is drawn again
            pending = np.arange(tokens * layers)
            while len(pending):
                rows = layer[pending]
                u = rows + self._rng.random(len(pending))
                expert = np.searchsorted(self._cdf, u, side="right") - rows * self.experts
                repeat = (picks[pending, :slot] == expert[:, None]).any(axis=1)
                picks[pending[~repeat], slot] = expert[~repeat]
                pending = pending[repeat]
        out = picks.reshape(tokens, layers, k)
        if self.locality > 0.0:
            repeat = self._rng.random(tokens) < self.locality
            for t in range(tokens):
                previous = out[t - 1] if t else self._previous
                if repeat[t] and previous is not None:
                    out[t] = previous
        self._previous = out[-1].copy()
        return out

    def _draw_pool(self) -> None:
        """The fast path's pool (module docstring): :data:`POOL_TOKENS` tokens of one layer in rank space, drawn
        token by token by the model's law, their prefix counts (:func:`_pool_in_ranks`, shared), and each layer's
        expert of every rank."""
        ranks, prefix = _pool_in_ranks(self._seed, self.experts, self.top_k, self.alpha, self.beta, self.locality)
        expert_of_rank = np.empty_like(self._perms)
        np.put_along_axis(expert_of_rank, self._perms, np.arange(self.experts, dtype=np.int64)[None, :], axis=1)
        self._pool = (ranks, prefix, expert_of_rank)
        self._windows = np.random.default_rng(np.random.SeedSequence([self._seed, 0x5E4E, 0x0FF5]))
        self._starts = np.empty((0, self.layers), dtype=np.int64)  # drawn WINDOW_BATCH steps at a time
        self._used = 0

    def window(self, tokens: int, tile: int) -> tuple[np.ndarray, Callable[[], np.ndarray]]:
        """The fast path's routing of the next step of ``tokens`` tokens (module docstring): per layer a window of
        the pool at a seeded uniform start. Returns ``(features, rows)``: ``features[l]`` = (expert tiles
        ``sum(ceil(c_e / tile))``, ``tile`` a power of two, active experts, the busiest expert's tiles) of layer ``l`` (float64
        ``[layers, 3]``), and ``rows()`` the expert ids ``[tokens, layers, top_k]`` they count."""
        if self._pool is None:
            self._draw_pool()
        ranks, prefix, expert_of_rank = self._pool
        if self._used == len(self._starts):  # one call per WINDOW_BATCH steps (a few us each)
            self._starts = self._windows.integers(0, POOL_TOKENS, size=(WINDOW_BATCH, self.layers))
            self._used = 0
        starts = self._starts[self._used]
        self._used += 1
        out = np.empty((self.layers, 3), dtype=np.float64)
        window_features(prefix, starts, tokens, tile.bit_length() - 1, out)

        def rows() -> np.ndarray:
            index = (starts[None, :] + np.arange(tokens)[:, None]) % POOL_TOKENS
            return np.take_along_axis(expert_of_rank[None, :, :], ranks[index], axis=2)

        return out, rows

    def describe(self) -> dict:
        return {"mode": self.mode, "alpha": self.alpha, "beta": self.beta, "locality": self.locality}


class ReplayRouting:
    """A routed-experts dump replayed token by token (module docstring)."""

    mode = "replay"

    def __init__(self, path, model, layers: int, columns: tuple[int, ...] | None = None):
        """``layers``: the model's layers (the dump must have as many); ``columns``: the dump's layers replayed, in
        order (a layer group of a heterogeneous model, :mod:`stepsim.serve.layer_list`; default: the first
        ``layers``)."""
        from stepsim.trace_io.serving import DEFAULT_KEY, load_routed_experts

        experts, _, _ = load_routed_experts(path, model=model, several=f"--routing reads the one named "
                                                                           f"{DEFAULT_KEY!r}; name it so")
        if experts.shape[1] < layers:
            raise ConfigError(f"--routing {path}: the dump has {experts.shape[1]} layers; the model has {layers}")
        self.path = str(path)
        taken = experts[:, :layers, :] if columns is None else experts[:, list(columns), :]
        self.experts = np.ascontiguousarray(taken).astype(np.int64)
        self._next = 0
        self._columns = int(self.experts.max()) + 1  # counts' width (experts never routed to add only zeros)
        self._prefix = None  # window()'s prefix counts, made on first use

    def route(self, tokens: int) -> np.ndarray:
        rows = (self._next + np.arange(tokens)) % len(self.experts)
        self._next = int((self._next + tokens) % len(self.experts))
        return self.experts[rows]

    def window(self, tokens: int, tile: int) -> tuple[np.ndarray, Callable[[], np.ndarray]]:
        """:meth:`route`'s next ``tokens`` rows as the fast path takes them (``SyntheticRouting.window``): their
        per-layer features from prefix counts, and ``rows()`` the rows themselves."""
        if self._prefix is None:
            layers = self.experts.shape[1]
            onehot = np.zeros((layers, len(self.experts), self._columns), dtype=np.int32)
            for layer in range(layers):  # a dump's token may repeat an expert: add, do not assign
                np.add.at(onehot[layer], (np.repeat(np.arange(len(self.experts)), self.experts.shape[2]),
                                          self.experts[:, layer, :].ravel()), 1)
            self._prefix = np.zeros((layers, len(self.experts) + 1, self._columns), dtype=np.int32)
            np.cumsum(onehot, axis=1, out=self._prefix[:, 1:])
        start = self._next
        out = np.empty((self.experts.shape[1], 3), dtype=np.float64)
        window_features(self._prefix, np.full(self.experts.shape[1], start, dtype=np.int64), tokens,
                        tile.bit_length() - 1, out)
        self._next = int((self._next + tokens) % len(self.experts))
        return out, lambda: self.experts[(start + np.arange(tokens)) % len(self.experts)]

    def describe(self) -> dict:
        return {"mode": self.mode, "file": self.path, "tokens": int(len(self.experts))}
