"""The compiled replay's link columns of a system step (:func:`stepsim.kernels.serve_mapped.chip_columns`, counted
from the routing pool's prefix counts or row by row) equal the provider's own (:func:`stepsim.serve.fast.chip_features`, row by
row in NumPy) on every kind of window: inside the pool, wrapping its end, whole turns of it, fewer tokens than
chips, one chip's shard empty, and experts placed on the chips by a map instead of contiguously; with the window's
counts given (:func:`~stepsim.kernels.serve_mapped._counts`, the mapped pricing) or counted there (the paper
schedule's), on a pool of a power of two tokens (the synthetic routing's: shifts) and of another size (divisions).
Windows of fewer (token, expert) rows than the 16 experts (up to 5 tokens) are counted row by row, larger ones from
the prefix counts: :data:`WINDOWS` has both."""

import numpy as np
import pytest

from stepsim.kernels.serve_mapped import _counts, chip_columns
from stepsim.serve.fast import chip_features
from stepsim.workloads.moe.sharded import shard_bounds

EXPERTS, TOP_K = 16, 3
#: pool sizes: a power of two and not
POOLS = (97, 128)


def pool(seed: int, size: int, experts: int = EXPERTS, top_k: int = TOP_K):
    """A pool of ``size`` tokens' distinct ranks ``[size, top_k]`` and its prefix counts ``[1, size + 1, experts]``
    (uint16, as :meth:`stepsim.serve.routing.SyntheticRouting._draw_pool` lays them out)."""
    rng = np.random.default_rng(seed)
    ranks = np.stack([rng.choice(experts, top_k, replace=False) for _ in range(size)])
    onehot = np.zeros((size, experts), dtype=np.uint16)
    onehot[np.repeat(np.arange(size), top_k), ranks.ravel()] = 1
    prefix = np.zeros((1, size + 1, experts), dtype=np.uint16)
    np.cumsum(onehot, axis=0, out=prefix[0, 1:])
    return ranks, prefix


def kernel_columns(ranks, prefix, expert_of_rank, chip_of, per_chip, start, tokens, chips, counted):
    xl = np.full(5, -1.0)
    chip_rows = np.full(chips, -7, dtype=np.int64)
    counts = np.full(EXPERTS, -7, dtype=np.int64)
    if counted:
        _counts(prefix, start, tokens, EXPERTS, counts)
    chip_columns(prefix, ranks, counts, counted, expert_of_rank, chip_of, per_chip, start, tokens, chips, chip_rows,
                 xl, 1)
    assert xl[0] == -1.0 and xl[4] == -1.0  # only its three columns written
    return xl[1:4], chip_rows


#: (start, tokens) (:func:`window`): inside the pool, to its end, wrapping, whole turns, fewer tokens than chips
WINDOWS = [(0, 1), (0, 5), (10, 40), (60, -60), (80, 30), (96, 2), (5, 1.0), (33, 2.17), (90, 3.0), (0, 7), (50, 3)]


def window(start, tokens, size):
    """A :data:`WINDOWS` entry on a pool of ``size`` tokens: a float is that many turns of the pool, a negative
    integer the pool less that many."""
    if isinstance(tokens, float):
        return start, round(tokens * size)
    return start, tokens if tokens > 0 else size + tokens


@pytest.mark.parametrize("size", POOLS)
@pytest.mark.parametrize("counted", [True, False])
@pytest.mark.parametrize("chips", [2, 4, 8])
@pytest.mark.parametrize("entry", WINDOWS)
def test_contiguous_experts_equal_the_providers_columns(size, counted, chips, entry):
    start, tokens = window(*entry, size)
    ranks, prefix = pool(chips, size)
    expert_of_rank = np.random.default_rng(100 + chips).permutation(EXPERTS).astype(np.int64)
    routing = expert_of_rank[ranks[(start + np.arange(tokens)) % size]][:, None, :]  # [tokens, 1 layer, top_k]
    got, chip_rows = kernel_columns(ranks, prefix, expert_of_rank, expert_of_rank, EXPERTS // chips, start, tokens,
                                    chips, counted)
    np.testing.assert_array_equal(got, chip_features(routing, chips, EXPERTS)[0])
    received = np.bincount((routing // (EXPERTS // chips)).ravel(), minlength=chips)
    np.testing.assert_array_equal(chip_rows, received)  # left for the block's traffic (ep_block_traffic)


@pytest.mark.parametrize("size", POOLS)
@pytest.mark.parametrize("entry", WINDOWS)
def test_experts_placed_by_a_map(size, entry):
    """The paper schedule's system (:mod:`stepsim.kernels.serve_replay`): experts on chips by a map, counted here."""
    chips = 3
    start, tokens = window(*entry, size)
    ranks, prefix = pool(7, size)
    expert_of_rank = np.arange(EXPERTS, dtype=np.int64)[::-1].copy()
    chip_of = np.random.default_rng(3).integers(0, chips, EXPERTS).astype(np.int64)
    routing = expert_of_rank[ranks[(start + np.arange(tokens)) % size]]
    home = np.repeat(np.arange(chips), np.diff(shard_bounds(tokens, chips)))
    dest = chip_of[routing]
    remote = int((dest != home[:, None]).sum())
    busiest = int(np.bincount(dest.ravel(), minlength=chips).max())
    got, _ = kernel_columns(ranks, prefix, expert_of_rank, chip_of, 0, start, tokens, chips, False)
    assert got.tolist() == [float(remote > 0), float(remote), float(busiest)]


def test_every_row_at_home_has_no_link_rows():
    """One token a chip, each routed only to experts on its own chip: no row crosses a link (column 0 is 0)."""
    chips, per_chip = 4, EXPERTS // 4
    ranks = np.array([[c * per_chip, c * per_chip + 1, c * per_chip + 2] for c in range(chips)])
    onehot = np.zeros((chips, EXPERTS), dtype=np.uint16)
    onehot[np.repeat(np.arange(chips), TOP_K), ranks.ravel()] = 1
    prefix = np.zeros((1, chips + 1, EXPERTS), dtype=np.uint16)
    np.cumsum(onehot, axis=0, out=prefix[0, 1:])
    identity = np.arange(EXPERTS, dtype=np.int64)
    got, chip_rows = kernel_columns(ranks, prefix, identity, identity, per_chip, 0, chips, chips, True)
    assert got.tolist() == [0.0, 0.0, 3.0] and chip_rows.tolist() == [3, 3, 3, 3]
    got, _ = kernel_columns(ranks, prefix, identity, identity, per_chip, 1, chips, chips, False)  # every row remote
    assert got.tolist() == [1.0, 12.0, 3.0]
