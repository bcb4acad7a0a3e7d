"""Machine code for ``stepsim serve --fidelity fast`` (docs/serving.md §10): routing draws, routing windows'
features and a step's attention features.

**Routing draws.**
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

About 13 ns of CPU per slot on the reference machine (AMD EPYC): a whole trace's 26 M tokens x 48 layers x 8
slots would take minutes, so the fast path draws a pool once and takes every step's layers from windows of it
(:mod:`stepsim.serve.routing`).

**Window features.** :func:`window_features` gives, per layer, the quantities of the FFN's metrics over a window
of ``tokens`` consecutive pool tokens from the per-expert prefix counts: the expert tiles
``sum(ceil(c_e / tile))``, the active experts and the busiest expert's tiles (``c_e``: the window's tokens routed
to expert ``e``), O(experts) per layer whatever the window's length.

**Attention features.** :func:`attention_features`: a step's decode and prefill attention features in one pass
over its requests, the decode attention's region loads dealt greedily (each request to the least-loaded of the
graph's regions, the first of equals), as its dynamic dispatcher deals them.
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


@kernel
def window_stop(pool, start, turns, rest):
    """The window of ``turns`` whole turns of the pool and ``rest`` (< ``pool``) more tokens from ``start``
    (0 <= start < pool), wrapping around the pool's end, as rows of its prefix counts: ``(stop, turns)``, a wrap
    past the end counted as a turn, so that :func:`window_count` is each expert's tokens in it."""
    end = start + rest
    if end > pool:
        return end - pool, turns + 1
    return end, turns


@kernel
def window_rows(pool, start, tokens):
    """:func:`window_stop` of the window of ``tokens`` consecutive pool tokens from ``start``."""
    return window_stop(pool, start, tokens // pool, tokens % pool)


@kernel
def window_count(prefix, row, start, stop, turns, e):
    """Expert ``e``'s tokens in the window of pool ``row`` that :func:`window_stop` made ``(stop, turns)`` of:
    ``prefix[row, stop, e] - prefix[row, start, e] + turns * prefix[row, pool, e]``. The pool's row is read only for
    a window that turns (``turns`` is the same for every expert of a loop, so the compiler moves the test out of it
    and vectorises both loops: a window inside the pool, the usual one, reads two rows)."""
    c = np.int64(prefix[row, stop, e]) - np.int64(prefix[row, start, e])
    if turns:
        c += turns * np.int64(prefix[row, prefix.shape[1] - 1, e])
    return c


@kernel
def window_features(prefix, starts, tokens, tile_shift, out):
    """Per layer ``l``: ``out[l] = (expert tiles, active experts, busiest expert's tiles)`` of the window of
    ``tokens`` tokens starting at ``starts[l]`` (wrapping around: a window longer than the pool counts every
    pool token once per whole turn); tiles of ``2 ** tile_shift`` tokens.

    Parameters
    ----------
    prefix : uint16 or int32 ``[rows, pool + 1, experts]``
        Prefix counts: ``prefix[r, i, e]`` tokens among the first ``i`` of pool ``r`` route to ``e``; layer
        ``l`` reads pool ``l`` when ``rows`` > 1, else pool 0.
    starts : int64 ``[layers]``
    tokens, tile_shift : int
    out : float64 ``[layers, 3]``
        Written.
    """
    rows, size, experts = prefix.shape
    round_up = (1 << tile_shift) - 1
    for layer in range(len(starts)):
        r = layer if rows > 1 else 0
        s = starts[layer]
        stop, turns = window_rows(size - 1, s, tokens)
        total = 0
        active = 0
        busiest = 0
        for e in range(experts):
            c = window_count(prefix, r, s, stop, turns, e)
            t = (c + round_up) >> tile_shift
            total += t
            active += c > 0
            busiest = max(busiest, t)
        out[layer, 0] = total
        out[layer, 1] = active
        out[layer, 2] = busiest


@kernel
def attention_features(context, new, tile_shift, loads, decode, prefill):
    """A step's attention features in one pass over its requests (``context``: tokens cached before the step,
    ``new``: tokens computed in it, int64; tiles of ``2 ** tile_shift``). Requests computing one token form the
    decode piece: ``decode`` = (requests, KV tiles ``sum(ceil((x + 1) / tile))``, the longest's tiles, the
    largest of ``len(loads)`` region loads when they are dealt greedily, requests per region rounded up). The
    others form the prefill piece: ``prefill`` = (requests, query tiles, KV tiles read: ``sum(g + 1)`` over the
    position tiles ``g`` each chunk covers). ``loads`` (int64) is scratch; the caller zeroes the outputs."""
    round_up = (1 << tile_shift) - 1
    regions = len(loads)
    for j in range(regions):
        loads[j] = 0
    for i in range(len(new)):
        x = context[i]
        if new[i] == 1:
            t = (x + 1 + round_up) >> tile_shift
            decode[0] += 1
            decode[1] += t
            decode[2] = max(decode[2], t)
            best = 0
            for j in range(1, regions):
                if loads[j] < loads[best]:
                    best = j
            loads[best] += t
        else:
            first = x >> tile_shift
            last = (x + new[i] - 1) >> tile_shift
            prefill[0] += 1
            prefill[1] += last - first + 1
            prefill[2] += ((last + 1) * (last + 2) - first * (first + 1)) // 2
    most = 0
    for j in range(regions):
        most = max(most, loads[j])
    decode[3] = most
    decode[4] = (decode[0] + regions - 1) // regions
