"""The LP of stepsim.passes.fifo_lp on graphs whose answer is computed by hand from the module's model.

Model values used below (fifo_lp docstring): a Map of FLOP-based function costs ceil(FLOPs / compute_bw) per
firing and has latency cost + 1; a load of a 16x64 fp32 tile costs 4096 B / 1024 B/cycle = 4 cycles; the
bottleneck T is the largest busy time (firings x cost) and a stream of n tokens has period T / n.
"""

import math

import numpy as np
import pytest

from stepsim.graph import (
    FP32,
    Add,
    Flatten,
    Graph,
    LinearOffChipLoad,
    LinearOffChipStore,
    Map,
    Partition,
    Reassemble,
    SelectorSource,
    Silu,
    Tensor,
)
from stepsim.graph.functions import RowSum
from stepsim.passes import lp_depths
from stepsim.simulation.simulate import simulate

TILES = 128
SLOW_BW = 64  # Silu of a 16x64 tile: 8 * 1024 FLOPs / 64 = 128 cycles per tile
SLOW_COST = 8 * 16 * 64 // SLOW_BW
SLOW_MAPS = 4


def _tiles(g):
    x = LinearOffChipLoad(g, Tensor("x", (TILES * 16, 64), FP32), tile=(16, 64), out_shape_tiled=(TILES, 1),
                          stride=(1, 0))
    return Flatten(g, x, 0, 1)


def _slow_branch(g, src):
    for _ in range(SLOW_MAPS):
        src = Map(g, src, Silu(), compute_bw=SLOW_BW)
    return Map(g, src, RowSum(), compute_bw=1024)  # 16x64 -> 16x1: 1 cycle, latency 2


def test_fork_join_fast_branch_gets_the_latency_difference_over_the_initiation_interval():
    g = Graph("fork-join")
    x = _tiles(g)
    slow = _slow_branch(g, x)
    fast = Map(g, x, RowSum(), compute_bw=1024)
    join = Map(g, [slow, fast], Add(), compute_bw=1024)
    LinearOffChipStore(g, join)
    lp = lp_depths(g)
    # latency difference: 4 Silu maps (128 + 1 each) and a RowSum (1 + 1) vs one RowSum (1 + 1)
    delta = SLOW_MAPS * (SLOW_COST + 1) + 2 - 2
    interval = SLOW_COST  # every stream carries 128 tokens over the bottleneck's 128 x 128 cycles
    assert lp.bottleneck_cycles == TILES * SLOW_COST
    assert lp.period[fast.name + "[0]"] == interval
    assert lp.slack[fast.name + "[0]"] == delta
    assert lp.depths[fast.name + "[0]"] == math.ceil(delta / interval) == 5
    # the slack sits on the cheap 64-byte edge after the RowSum, every other channel keeps the base depth 2
    assert {name: d for name, d in lp.depths.items() if d != 2} == {fast.name + "[0]": 5}
    # the LP's depths are enough: the run is as fast as with 1024-deep FIFOs, and depth 2 everywhere is not
    unbounded = simulate(g, channel_depth=1024).cycles
    assert simulate(g, channel_depth=1024, channel_depths=lp.depths).cycles == unbounded
    assert simulate(g, channel_depth=2).cycles > unbounded


def test_a_chain_needs_the_base_depth_everywhere():
    g = Graph("chain")
    y = _tiles(g)
    for bw in (64, 1024, 256):
        y = Map(g, y, Silu(), compute_bw=bw)
    LinearOffChipStore(g, y)
    lp = lp_depths(g)
    assert set(lp.depths.values()) == {2} and set(lp.slack.values()) == {0.0}
    assert len(lp.depths) == 5
    assert simulate(g, channel_depth=1024, channel_depths=lp.depths).cycles == simulate(g, channel_depth=1024).cycles


def test_partition_reassemble_with_a_known_routing():
    """Tiles 0, 4, 8, ... go to the slow branch (32 of them), the others to the fast one (96)."""
    g = Graph("partition-reassemble")
    x = _tiles(g)
    route = np.zeros((TILES, 2), np.int8)
    route[np.arange(TILES) % 4 == 0, 0] = 1
    route[np.arange(TILES) % 4 != 0, 1] = 1
    part = Partition(g, x, SelectorSource(g, route, 2), 0, 2)
    slow = _slow_branch(g, part[0])
    fast = Map(g, part[1], RowSum(), compute_bw=1024)
    joined = Reassemble(g, [slow, fast], SelectorSource(g, route, 2), 0)
    LinearOffChipStore(g, Flatten(g, joined, 0, 1))
    n_slow, n_fast = 32, 96
    bindings = {part.count_symbols[0]: n_slow, part.count_symbols[1]: n_fast, joined.ragged_symbol: 1}
    lp = lp_depths(g, bindings)
    bottleneck = n_slow * SLOW_COST  # the slow Silu maps see 32 tiles: 4096 cycles each
    delta = SLOW_MAPS * (SLOW_COST + 1) + 2 - 2
    assert lp.bottleneck_cycles == bottleneck == 4096
    assert lp.period[fast.name + "[0]"] == pytest.approx(bottleneck / n_fast)
    assert lp.slack[fast.name + "[0]"] == delta
    assert lp.depths[fast.name + "[0]"] == math.ceil(delta * n_fast / bottleneck) == 13
    assert {name: d for name, d in lp.depths.items() if d != 2} == {fast.name + "[0]": 13}
