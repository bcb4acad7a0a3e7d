"""The mapped pricing's per-step counts (:mod:`stepsim.kernels.serve_mapped`) against NumPy written from their
definitions, on every kind of routing window and region layout:

* :func:`~stepsim.kernels.serve_mapped.deal_least_loaded` (a heap) and
  :func:`~stepsim.kernels.serve_mapped.deal_by_bits` (the regions of each load as bits, up to 64 regions) pick what a
  scan of every region picks: the least loaded, the lowest index on a tie, so the busiest region's load of a decode
  attention's requests dealt greedily is the scan's to the integer (ties are most of a step's picks: every region
  starts at 0).
* :func:`~stepsim.kernels.serve_mapped._layer_loads` gives :func:`stepsim.serve.fast_mapped._ffn_loads`' expert
  tiles, active experts, busiest expert, each region's tiles, and on expert-parallel chips each chip's tiles,
  received rows and active experts, whether the window is counted row by row (fewer rows than a quarter of the
  experts) or from the pool's prefix counts (inside the pool, wrapping its end, whole turns), at tiles of a power of
  two (shifts) and of another size (divisions).
"""

import numpy as np
import pytest
from test_chip_columns import POOLS, WINDOWS, pool, window

from stepsim.kernels.cpu import lowest_bit
from stepsim.kernels.serve_mapped import (
    BIT_REGIONS,
    PC_CYCLES,
    PC_FLOPS,
    PC_HBM,
    PC_ON_CHIP,
    PC_PREFETCHED,
    PC_ROWS,
    PC_STREAMS,
    PC_WEIGHT,
    _hidden,
    _layer_loads,
    _log2_exact,
    bits_start,
    deal_by_bits,
    deal_least_loaded,
    least_loaded_heap,
    log2_bucket,
)
from stepsim.serve.projections import Piece, stream_ahead

EXPERTS = 16  # test_chip_columns' pool: 16 experts, 3 a token


def scan_deal(loads, t):
    """The definition: the first of the least loaded."""
    best = int(np.argmin(loads))
    loads[best] += t


@pytest.mark.parametrize("regions", [1, 2, 3, 7, 64, 1000])
@pytest.mark.parametrize("seed", range(3))
def test_the_heap_deals_as_the_scan_does(regions, seed):
    rng = np.random.default_rng(seed)
    tiles = rng.integers(0, 5, size=3000)  # small tiles and zeros: many ties
    loads, heap = np.full(regions + 2, -9, dtype=np.int64), np.full(regions + 2, -9, dtype=np.int64)
    least_loaded_heap(loads, heap, regions)
    expected = np.zeros(regions, dtype=np.int64)
    for t in tiles:
        deal_least_loaded(loads, heap, regions, t)
        scan_deal(expected, t)
        np.testing.assert_array_equal(loads[:regions], expected)
    assert loads[regions] == -9 and heap[regions] == -9  # nothing written past the regions


@pytest.mark.parametrize("regions", [1, 2, 3, 63, BIT_REGIONS])
@pytest.mark.parametrize("seed", range(3))
def test_the_bits_deal_as_the_scan_does(regions, seed):
    """Every deal, with tiles up to the ring's length - 1 (the longest the ring holds apart) and many ties."""
    rng = np.random.default_rng(seed)
    tiles = rng.integers(1, 9, size=3000)
    tiles[rng.integers(0, 3000, size=50)] = 15  # the largest: a ring of 16
    size = 1 << log2_bucket(int(tiles.max()) + 1)
    assert size == 16
    loads = np.full(BIT_REGIONS + size + 2, -9, dtype=np.int64)
    ring = loads[BIT_REGIONS:BIT_REGIONS + size]
    bits_start(loads, ring, regions)
    expected = np.zeros(regions, dtype=np.int64)
    low = 0
    for t in tiles:
        least = expected.min()
        low = deal_by_bits(loads, ring, low, t)
        scan_deal(expected, t)
        np.testing.assert_array_equal(loads[:regions], expected)
        assert low == least  # the least load before the deal, where the next search starts
    assert loads[BIT_REGIONS + size] == -9 and (loads[regions:BIT_REGIONS] == -9).all()  # nothing else written


@pytest.mark.parametrize("x, bit", [(1, 0), (12, 2), (-1, 0), (-2**63, 63), (2**62, 62)])
def test_lowest_bit(x, bit):
    assert lowest_bit(np.int64(x)) == bit


def reference_loads(routing_experts, tile_n, n_regions, chips):
    """From the window's expert ids ``[tokens, top_k]``: (tiles, active, busiest), each region's tiles and per chip
    (tiles, received rows, active experts), experts contiguous on regions and chips."""
    counts = np.bincount(routing_experts.ravel(), minlength=EXPERTS)
    tiles = -(-counts // tile_n)
    regions = tiles.reshape(n_regions, -1).sum(axis=1)
    per_chip = EXPERTS // chips
    chip = np.concatenate([tiles.reshape(chips, per_chip).sum(axis=1), counts.reshape(chips, per_chip).sum(axis=1),
                           (counts > 0).reshape(chips, per_chip).sum(axis=1)])
    return (int(tiles.sum()), int((counts > 0).sum()), int(tiles.max())), regions, chip


@pytest.mark.parametrize("tile_n, n_regions", [(1, 16), (2, 4), (4, 1), (3, 8)])
@pytest.mark.parametrize("chips", [0, 2, 4])
def test_layer_loads_equal_their_definition(tile_n, n_regions, chips):
    """Every :data:`WINDOWS` entry on both pools (one test a layout: the windows are many and quick)."""
    for size in POOLS:
        for entry in WINDOWS:
            check_window(size, *window(*entry, size), tile_n, n_regions, chips)


def check_window(size, start, tokens, tile_n, n_regions, chips):
    ranks, prefix = pool(5, size)
    expert_of_rank = np.random.default_rng(size + tokens).permutation(EXPERTS).astype(np.int64)
    rank_of_expert = np.argsort(expert_of_rank)
    ep = chips > 0
    per_chip = EXPERTS // max(chips, 1)
    counts = np.full(2 * EXPERTS, -7, dtype=np.int64)
    regions = np.full(n_regions + 1, -7, dtype=np.int64)
    loads = np.full(3 * max(chips, 1) + 1, -7, dtype=np.int64)
    xf = np.zeros(3)
    got = _layer_loads(prefix, ranks, expert_of_rank, rank_of_expert, start, tokens, tile_n, _log2_exact(tile_n),
                       EXPERTS // n_regions, n_regions, ep, max(chips, 1), per_chip, _log2_exact(per_chip), counts,
                       regions, loads, xf, 0)
    experts = expert_of_rank[ranks[(start + np.arange(tokens)) % size]]
    features, want_regions, want_chips = reference_loads(experts, tile_n, n_regions, max(chips, 1))
    assert got == features, f"pool {size}, window of {tokens} tokens from {start}"
    np.testing.assert_array_equal(regions[:n_regions], want_regions)
    assert regions[n_regions] == -7
    if ep:
        np.testing.assert_array_equal(loads[:3 * chips], want_chips)
        assert loads[3 * chips] == -7


@pytest.mark.parametrize("seed", range(20))
def test_hidden_is_stream_ahead(seed):
    """:func:`~stepsim.kernels.serve_mapped._hidden` (its floors and read cycles taken from the piece a layer
    before when equal) hides what :func:`stepsim.serve.projections.stream_ahead` saves, on layers that repeat
    their pieces but for one (the FFN's, drawn afresh: sometimes equal), a head piece last, and a period that is
    right, wrong or 1."""
    rng = np.random.default_rng(seed)
    period, layers = int(rng.integers(3, 7)), int(rng.integers(1, 9))
    layer = [Piece(f"p{i}", *map(int, rng.integers(1, 400, size=5)), streams=bool(rng.integers(0, 4)))
             for i in range(period)]
    pieces = []
    for _ in range(layers):
        ffn = Piece("ffn", *map(int, rng.integers(1, 400, size=2)), *map(int, rng.integers(1, 3, size=3)))
        pieces += [*layer[:-1], ffn]
    pieces.append(Piece("head", *map(int, rng.integers(1, 400, size=5))))
    capacity, peak_bytes, peak_flops = int(rng.integers(50, 3000)), int(rng.integers(1, 9)), int(rng.integers(1, 9))
    want = sum(s.saved for s in stream_ahead(pieces, capacity, peak_bytes, peak_flops))
    for guess in (period, period + 1, 1):
        pc = np.full((PC_ROWS, len(pieces)), -5, dtype=np.int64)
        for k, q in enumerate(pieces):
            pc[[PC_CYCLES, PC_HBM, PC_WEIGHT, PC_ON_CHIP, PC_FLOPS, PC_STREAMS, PC_PREFETCHED], k] = (
                q.cycles, q.hbm_bytes, q.weight_bytes, q.on_chip_bytes, q.flops, q.streams, 0)
        assert _hidden(pc, len(pieces), guess, capacity, peak_bytes, peak_flops) == want


@pytest.mark.parametrize("n_regions", [4, 3, 2])
def test_regions_of_other_than_a_power_of_two_experts(n_regions):
    """12 experts, 2 a token: 3 experts a region (summed expert by expert through the permutation), 4 (a shift), 6
    (expert by expert); windows inside the pool and wrapping it, at tiles of 1 and 2."""
    experts, size = 12, 50
    ranks, prefix = pool(n_regions, size, experts, top_k=2)
    expert_of_rank = np.random.default_rng(n_regions).permutation(experts).astype(np.int64)
    per_region = experts // n_regions
    for start, tokens in ((0, 50), (3, 20), (40, 30), (7, 120)):
        for tile_n in (1, 2):
            counts = np.full(2 * experts, -7, dtype=np.int64)
            regions = np.full(n_regions + 1, -7, dtype=np.int64)
            got = _layer_loads(prefix, ranks, expert_of_rank, np.argsort(expert_of_rank), start, tokens, tile_n,
                               _log2_exact(tile_n), per_region, n_regions, False, 1, experts, _log2_exact(experts),
                               counts, regions, np.zeros(3, dtype=np.int64), np.zeros(3), 0)
            window = expert_of_rank[ranks[(start + np.arange(tokens)) % size]]
            tiles = -(-np.bincount(window.ravel(), minlength=experts) // tile_n)
            assert got == (int(tiles.sum()), int((tiles > 0).sum()), int(tiles.max()))
            np.testing.assert_array_equal(regions[:n_regions], tiles.reshape(n_regions, per_region).sum(axis=1))
            assert regions[n_regions] == -7
