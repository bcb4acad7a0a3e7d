"""Seeded expert-routing draws for ``stepsim serve --fidelity fast``: every token of every layer, in machine code.

The synthetic routing model (:mod:`stepsim.serve.routing`) gives each token ``top_k`` distinct experts per layer,
slot by slot, each slot a categorical draw over the layer's expert probabilities, a draw that repeats an expert
of the token being drawn again (Plackett-Luce). :func:`draw_routing` makes the same draws with

* a Walker/Vose alias table per layer (``prob``, ``alias``: one random number gives an expert, O(1), where the
  NumPy path searches a CDF);
* SplitMix64 (Steele, Lea and Flood, OOPSLA 2014) as the random source, its 64-bit state in a one-element array
  the caller keeps (so a run's draws are a pure function of its seed and the tokens asked for): the high 32 bits
  of an output pick the column (multiply-shift, ``(hi * E) >> 32``), the low 32 bits are the alias test's uniform;
* counting: ``counts[l, e]`` gets one for every draw of expert ``e`` in layer ``l`` (the fast model's features
  need the per-layer counts, not the rows).

A full Qwen3-30B-A3B step of 2,048 tokens is 2,048 x 48 x 8 = 786,432 slots; this costs a few nanoseconds each.
"""

from __future__ import annotations

import numpy as np

from stepsim.kernels.jit import kernel

#: SplitMix64's increment (the golden ratio in 64 bits) and output mixers
_GAMMA = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_LOW32 = np.uint64(0xFFFFFFFF)
_S30, _S27, _S31, _S32, _S11 = np.uint64(30), np.uint64(27), np.uint64(31), np.uint64(32), np.uint64(11)


@kernel
def _next(state):
    """The next SplitMix64 output (advances ``state[0]``)."""
    z = state[0] + _GAMMA
    state[0] = z
    z = (z ^ (z >> _S30)) * _MIX1
    z = (z ^ (z >> _S27)) * _MIX2
    return z ^ (z >> _S31)


@kernel
def draw_routing(prob, alias, state, locality, previous, has_previous, out, counts):
    """Fill ``out`` (int64 ``[tokens, layers, top_k]``) with the next tokens' experts and add them to ``counts``.

    Parameters
    ----------
    prob : float64 ``[layers, experts]``
        Alias-table acceptance probability of each column.
    alias : int64 ``[layers, experts]``
        The expert a rejected column gives.
    state : uint64 ``[1]``
        SplitMix64 state, advanced in place.
    locality : float
        Probability that a token repeats the previous token's experts in every layer (one draw per token,
        the first of its draws).
    previous : int64 ``[layers, top_k]``
        The previous token's experts (the last token of the caller's previous call).
    has_previous : bool
        Whether ``previous`` holds a token (False at the start of a run).
    out : int64 ``[tokens, layers, top_k]``
        Written.
    counts : int64 ``[layers, experts]``
        Added to (the caller zeroes it).
    """
    tokens, layers, top_k = out.shape
    experts = np.uint64(prob.shape[1])
    for t in range(tokens):
        repeat = False
        if locality > 0.0:
            u = np.float64(_next(state) >> _S11) * (1.0 / 9007199254740992.0)  # 53 bits in [0, 1)
            repeat = u < locality and (t > 0 or has_previous)
        for layer in range(layers):
            for slot in range(top_k):
                if repeat:
                    e = out[t - 1, layer, slot] if t > 0 else previous[layer, slot]
                else:
                    while True:
                        z = _next(state)
                        column = np.int64(((z >> _S32) * experts) >> _S32)
                        u = np.float64(z & _LOW32) * (1.0 / 4294967296.0)
                        e = column if u < prob[layer, column] else alias[layer, column]
                        seen = False
                        for j in range(slot):
                            if out[t, layer, j] == e:
                                seen = True
                                break
                        if not seen:
                            break
                out[t, layer, slot] = e
                counts[layer, e] += 1


def alias_tables(weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Vose's alias tables of each row of ``weights`` (``[rows, n]``, positive): ``(prob, alias)`` such that
    column ``i`` drawn uniformly, kept with probability ``prob[r, i]``, else replaced by ``alias[r, i]``, gives
    ``i`` with probability ``weights[r, i] / weights[r].sum()``. Deterministic (stacks in index order)."""
    rows, n = weights.shape
    prob = np.ones((rows, n), dtype=np.float64)
    alias = np.tile(np.arange(n, dtype=np.int64), (rows, 1))
    for r in range(rows):
        scaled = (weights[r] / weights[r].sum() * n).tolist()
        small = [i for i in range(n) if scaled[i] < 1.0]
        large = [i for i in range(n) if scaled[i] >= 1.0]
        while small and large:
            s, g = small.pop(), large.pop()
            prob[r, s] = scaled[s]
            alias[r, s] = g
            scaled[g] = scaled[g] + scaled[s] - 1.0
            (small if scaled[g] < 1.0 else large).append(g)
        # the rest are 1 up to rounding: always kept (prob 1, alias itself)
    return prob, alias
