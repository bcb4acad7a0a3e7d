"""The compiled mapped pricing's per-layer routing counts (:func:`stepsim.kernels.serve_mapped._layer_loads`)
against the rank-order loop it replaced (bench/README.md "Session 44"), side by side in one run on Qwen3-30B-A3B's
synthetic routing pool (128 experts, top 8, 48 layers), at random window starts: ns a layer, and the same integers
(tiles, active experts, busiest expert, busiest region) asserted for every window.

    python bench/mapped_layer_loads.py [TOKENS,...]   # default 1,8,16,64,256,2048
"""

from __future__ import annotations

import sys
import time

import numba
import numpy as np

from stepsim.kernels.serve_mapped import _counts, _layer_loads, _log2_exact, _quotient
from stepsim.serve.routing import SyntheticRouting

LAYERS, EXPERTS, TOP_K = 48, 128, 8
#: window starts drawn (steps x layers)
STEPS = 20_000
#: the FFN bucket's regions (16 of 8 contiguous experts)
REGIONS = 16


@numba.njit(cache=False)
def rank_order_loads(prefix, pool_rows, expert_of_rank, start, tokens, tile_n, tile_shift, per_region, n_regions,
                     counts, regions):
    """The baseline: every rank's tiles added into its expert's region (one chip), row by row under ``experts``
    rows, as stepsim did before session 44."""
    region_shift = _log2_exact(per_region)
    for j in range(n_regions):
        regions[j] = 0
    pool, top_k = pool_rows.shape[0], pool_rows.shape[1]
    experts = expert_of_rank.shape[0]
    total = active = busiest = 0
    if tokens * top_k >= experts:
        _counts(prefix, start, tokens, experts, counts)
        for rank in range(experts):
            c = counts[rank]
            t = _quotient(c + tile_n - 1, tile_n, tile_shift)
            total += t
            active += 1 if c > 0 else 0
            busiest = max(busiest, t)
            regions[_quotient(expert_of_rank[rank], per_region, region_shift)] += t
        return total, active, busiest
    for step in range(3):
        row = start
        for _ in range(tokens):
            for slot in range(top_k):
                rank = pool_rows[row, slot]
                if step == 0:
                    counts[rank] = 0
                elif step == 1:
                    counts[rank] += 1
                elif counts[rank] > 0:
                    c = counts[rank]
                    counts[rank] = -c
                    t = _quotient(c + tile_n - 1, tile_n, tile_shift)
                    total += t
                    active += 1
                    busiest = max(busiest, t)
                    regions[_quotient(expert_of_rank[rank], per_region, region_shift)] += t
            row = row + 1 if row + 1 < pool else 0
    return total, active, busiest


@numba.njit(cache=False)
def drive(new, prefix, pool_rows, expert_of_rank, rank_of_expert, starts, tokens, tile_n, out):
    """Every (step, layer) window's four counts into ``out``."""
    counts = np.zeros(2 * EXPERTS, np.int64)
    regions = np.zeros(REGIONS, np.int64)
    loads = np.zeros(3, np.int64)
    xf = np.zeros(3)
    shift = _log2_exact(tile_n)
    for s in range(starts.shape[0]):
        for layer in range(LAYERS):
            if new:
                a, b, c = _layer_loads(prefix, pool_rows, expert_of_rank[layer], rank_of_expert[layer],
                                       starts[s, layer], tokens, tile_n, shift, EXPERTS // REGIONS, REGIONS, False, 1,
                                       EXPERTS, _log2_exact(EXPERTS), counts, regions, loads, xf, 0)
            else:
                a, b, c = rank_order_loads(prefix, pool_rows, expert_of_rank[layer], starts[s, layer], tokens, tile_n,
                                           shift, EXPERTS // REGIONS, REGIONS, counts, regions)
            out[s, layer, 0], out[s, layer, 1], out[s, layer, 2] = a, b, c
            out[s, layer, 3] = regions.max()


def main(sizes: list[int]) -> None:
    routing = SyntheticRouting(EXPERTS, TOP_K, LAYERS, seed=0)
    routing._draw_pool()
    ranks, prefix, expert_of_rank = routing._pool
    pool_rows, expert_of_rank = np.ascontiguousarray(ranks), np.ascontiguousarray(expert_of_rank)
    rank_of_expert = np.argsort(expert_of_rank, axis=1)
    starts = np.random.default_rng(1).integers(0, prefix.shape[1] - 1, size=(STEPS, LAYERS))
    for tokens in sizes:
        tile_n = 32 if tokens >= 256 else 16
        best, outs = {}, {}
        for new in (False, True):
            out = np.zeros((STEPS, LAYERS, 4), np.int64)
            drive(new, prefix, pool_rows, expert_of_rank, rank_of_expert, starts[:1], tokens, tile_n, out)  # compile
            best[new] = min(_timed(drive, new, prefix, pool_rows, expert_of_rank, rank_of_expert, starts, tokens,
                                   tile_n, out) for _ in range(3))
            outs[new] = out
        assert (outs[False] == outs[True]).all(), f"{tokens} tokens: the counts differ"
        per = 1e9 / (STEPS * LAYERS)
        print(f"{tokens:5d} tokens: rank order {best[False] * per:6.1f} ns a layer, now {best[True] * per:6.1f} ns "
              f"({best[False] / best[True]:.2f}x); the same integers")


def _timed(fn, *args) -> float:
    t0 = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t0


if __name__ == "__main__":
    main([int(t) for t in sys.argv[1].split(",")] if len(sys.argv) > 1 else [1, 8, 16, 64, 256, 2048])
