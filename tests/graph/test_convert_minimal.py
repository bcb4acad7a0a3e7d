"""The converter's buffer is minimal on the engine (issue 33): with one slot fewer than the minimum, a converter
that keeps each slot's tiles in the consumer's order (so it can only deliver right values or stop) deadlocks, and
the engine reports it; with the minimum it runs and delivers the consumer's order.

The smaller converter: producer tiles dealt to ``B_min - 1`` depth-1 slot FIFOs by patience sorting (each tile to
the slot whose last tile the consumer takes latest before it), so within every slot the consumer's order is the
producer's. Such an assignment exists when the tiles' consumer positions, in producer order, have no decreasing
run longer than the slots; the sample keeps the random pairs where it does (for the others no FIFO slot
assignment of that size exists at all) and whose minimum is at least two tiles (one slot less is then at least one)."""

import sys
from pathlib import Path

import numpy as np
import pytest

from stepsim.base.errors import DeadlockError
from stepsim.graph import FP32, Graph, LinearOffChipLoad, LinearOffChipStore, Tensor
from stepsim.graph.layout import Layout, converter_buffer, tile_numbers
from stepsim.graph.ops_convert import from_slots, slot_schedule
from stepsim.simulation.simulate import simulate

sys.path.insert(0, str(Path(__file__).parent))
from test_convert import in_order  # noqa: E402
from test_layout import random_layout  # noqa: E402


def fifo_slots(p: Layout, c: Layout, slots: int):
    """``(slot of each producer tile, slot of each consumer tile)`` dealing the tiles to ``slots`` FIFOs with each
    FIFO's tiles in both orders (patience sorting), or None when that needs more slots."""
    pn, cn = tile_numbers(p, p.tile).ravel(), tile_numbers(c, p.tile).ravel()
    leaves = np.empty(p.num_tiles, np.int64)
    leaves[pn] = cn  # producer tile -> its consumer position
    last: list[int] = []  # per slot: the consumer position of its last tile
    slot_p = np.empty(p.num_tiles, np.int64)
    for t in range(p.num_tiles):
        fits = [k for k in range(len(last)) if last[k] < leaves[t]]
        if fits:
            k = max(fits, key=lambda k: last[k])
        elif len(last) < slots:
            k = len(last)
            last.append(-1)
        else:
            return None
        slot_p[t], last[k] = k, int(leaves[t])
    slot_c = np.empty(c.num_tiles, np.int64)
    slot_c[leaves] = slot_p
    return slot_p.reshape(p.trips), slot_c.reshape(c.trips)


def run(p: Layout, c: Layout, slot_p, slot_c, slots: int, x: np.ndarray):
    g = Graph("convert")
    trips, stride = p.tile_view()
    load = LinearOffChipLoad(g, Tensor("x", p.shape, FP32), p.tile[-2:], trips, stride)
    out = from_slots(g, load, c, slot_p, slot_c, slots, slots * p.tile_elements * 4)
    LinearOffChipStore(g, out, tensor_name="y")
    return simulate(g, functional=True, inputs={"x": x})


def sample(n: int, seed: int = 11):
    """``n`` random equal-tile pairs with a minimum of at least 2 tiles and a FIFO assignment one slot short."""
    rng = np.random.default_rng(seed)
    while n:
        rank = int(rng.choice([2, 3]))
        shape = tuple(int(rng.choice([2, 4, 8])) for _ in range(rank))
        tile = (1,) * (rank - 2) + tuple(int(rng.choice([d for d in (1, 2, 4) if s % d == 0])) for s in shape[-2:])
        p, c = random_layout(rng, shape, tile), random_layout(rng, shape, tile)
        size = converter_buffer(p, c)
        least = size.elements // p.tile_elements
        if size.method == "compatible" or least < 2 or fifo_slots(p, c, least - 1) is None:
            continue
        n -= 1
        yield p, c, least


PAIRS = list(sample(40))


def test_the_sample():
    # the sample is not trivial: minima from 3 to 400 tiles, 2-D and 3-D tensors
    least = sorted(m for _, _, m in PAIRS)
    assert least == [3, 3] + [4] * 12 + [7] + [8] * 5 + [10] * 2 + [16] * 3 + [19] + [22] * 6 + [32] + [46] * 3 + [
        100, 190, 382, 400]
    assert {p.rank for p, _, _ in PAIRS} == {2, 3}


@pytest.mark.parametrize("k", range(len(PAIRS)))
def test_one_slot_less_deadlocks_and_the_minimum_does_not(k):
    p, c, least = PAIRS[k]
    x = np.random.default_rng(k).standard_normal(p.shape).astype(np.float32)
    slot_p, slot_c, slots = slot_schedule(p, c)
    assert slots == least
    r = run(p, c, slot_p, slot_c, slots, x)
    assert np.array_equal(r.outputs["y"].reshape(-1, c.tile[-1] * c.trips[-1]), in_order(c, x)), (str(p), str(c))
    fewer = fifo_slots(p, c, least - 1)
    with pytest.raises(DeadlockError):
        run(p, c, *fewer, least - 1, x)
