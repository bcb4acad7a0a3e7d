"""Re-tiling by in-order packing (issue 33): a consumer tile made of ``k`` producer tiles along one of the last two
dims, which the producer emits consecutively, is packed by one Accum holding one consumer tile. On random such
pairs of 2-D and 3-D tensors: that is the minimum buffer found by brute force over the two access orders, the
graph holds nothing else but the load's and the store's tiles, values arrive in the consumer's order, no run
deadlocks, and the output carries the consumer's layout. Other unequal pairs spill (test_convert_spill.py)."""

import sys
from pathlib import Path

import numpy as np
import pytest

from stepsim.graph import Accum
from stepsim.graph.layout import Layout, Loop, converter_buffer
from stepsim.graph.ops_convert import packs_in_order

sys.path.insert(0, str(Path(__file__).parent))
from test_convert import converted, in_order  # noqa: E402
from test_layout import brute_force_elements, random_layout  # noqa: E402


def sample(n: int, seed: int = 5):
    """``n`` random (producer, consumer) pairs that pack in order, with the axis they pack along."""
    rng = np.random.default_rng(seed)
    while n:
        rank = int(rng.choice([2, 3]))
        shape = tuple(int(rng.choice([2, 4, 8])) for _ in range(rank))
        tp = (1,) * (rank - 2) + tuple(int(rng.choice([d for d in (1, 2, 4) if s % d == 0])) for s in shape[-2:])
        axis = rank - 1 - int(rng.integers(2))
        tc = list(tp)
        tc[axis] *= int(rng.choice([2, 4]))
        if shape[axis] % tc[axis]:
            continue
        p, c = random_layout(rng, shape, tp), random_layout(rng, shape, tuple(tc))
        if packs_in_order(p, c) is None:
            continue
        n -= 1
        yield p, c, axis


PAIRS = list(sample(120))


def test_the_sample_covers_both_axes_and_ranks():
    assert {(p.rank, axis - p.rank) for p, _, axis in PAIRS} == {(2, -2), (2, -1), (3, -2), (3, -1)}


@pytest.mark.parametrize("k", range(len(PAIRS)))
def test_packing_is_minimal_and_in_the_consumers_order(k):
    p, c, axis = PAIRS[k]
    assert packs_in_order(p, c) == axis
    size = converter_buffer(p, c)
    assert size.elements == brute_force_elements(p, c) == c.tile_elements  # one consumer tile
    x = np.random.default_rng(k).standard_normal(p.shape).astype(np.float32)
    g, out, r = converted(p, c, x)  # a deadlock would raise DeadlockError
    assert np.array_equal(r.outputs["y"].reshape(-1, c.tile[-1] * c.trips[-1]), in_order(c, x)), (str(p), str(c))
    (acc,) = [op for op in g if isinstance(op, Accum)]
    assert acc.on_chip_bytes() == size.bytes
    assert g.on_chip_bytes() == size.bytes + 4 * p.tile_elements + 4 * c.tile_elements  # + the load's, the store's
    assert out.stream.layout == c and out.stream.shape == (1,) + c.trips


def test_column_stripes_into_row_blocks():
    # a MatMul's 2 x 2 output stripes of each 2-row block, into whole 2 x 8 row blocks: one row block of buffer
    p = Layout.ordered((4, 8), (2, 2))
    c = Layout.ordered((4, 8), (2, 8))
    assert packs_in_order(p, c) == 1 and converter_buffer(p, c).bytes == 2 * 8 * 4
    x = np.arange(32, dtype=np.float32).reshape(4, 8)
    g, out, r = converted(p, c, x)
    assert np.array_equal(r.outputs["y"], x)
    assert g.on_chip_bytes() == 64 + 16 + 64


@pytest.mark.parametrize("p, c", [
    (Layout.ordered((8, 8), (2, 2)), Layout.ordered((8, 8), (4, 4))),  # two dims coarser
    (Layout.ordered((4, 8), (2, 2), order=(1, 0)), Layout.ordered((4, 8), (2, 8))),  # stripes not consecutive
    (Layout.ordered((4, 8), (2, 8)), Layout.ordered((4, 8), (2, 2))),  # finer: a split, not a packing
    (Layout((4, 8), (2, 2), (Loop(0, 2, 2), Loop(1, 2, 2), Loop(1, 2, 4))),
     Layout.ordered((4, 8), (2, 4))),  # each run out of order along its axis
])
def test_other_retilings_spill(p, c):
    from stepsim.graph import FP32, Graph, LinearOffChipLoad, Tensor
    from stepsim.graph.ops_convert import convert

    g = Graph("retile")
    load = LinearOffChipLoad(g, Tensor("x", p.shape, FP32), p.tile[-2:], *p.tile_view())
    assert packs_in_order(p, c) is None
    out = convert(g, load, p, c, producer_name=load.name, consumer_name="matmul_3")
    assert out.name == "spill_read[LinearOffChipLoad_0->matmul_3]"  # tests/graph/test_convert_spill.py: the values
    assert out.spill_reason.startswith(f"re-tiling {'x'.join(map(str, p.tile))} -> {'x'.join(map(str, c.tile))} "
                                       f"has no minimal on-chip converter")
