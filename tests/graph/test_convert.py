"""The layout converter (issue 33): values arrive in the consumer's order, no run deadlocks, and its on-chip
bytes are the minimum buffer of the layout module."""

import math
import sys
from pathlib import Path

import numpy as np

from stepsim.graph import FP32, Graph, LinearOffChipLoad, LinearOffChipStore, Tensor
from stepsim.graph.layout import Layout, Loop, converter_buffer
from stepsim.graph.ops_convert import ConverterPartition, convert, slot_schedule
from stepsim.simulation.simulate import simulate

sys.path.insert(0, str(Path(__file__).parent))
from test_layout import random_layout  # noqa: E402


def converted(p: Layout, c: Layout, x: np.ndarray):
    """Load ``x`` in layout ``p``, convert to ``c``, store: returns the graph, the converter output and the run."""
    g = Graph("convert")
    trips, stride = p.tile_view()
    load = LinearOffChipLoad(g, Tensor("x", p.shape, FP32), p.tile[-2:], trips, stride)
    out = convert(g, load, p, c, producer_name=load.name, consumer_name="store")
    LinearOffChipStore(g, out, tensor_name="y")
    return g, out, simulate(g, functional=True, inputs={"x": x})


def in_order(c: Layout, x: np.ndarray) -> np.ndarray:
    """The tiles of ``x`` in ``c``'s order, as the store lays a stream of ``(1,) + trips`` tiles out."""
    tr, tc = c.tile[-2:]
    tiles = [x[tuple(slice(o, o + t) for o, t in zip(origin, c.tile))].reshape(tr, tc) for origin in c.origins()]
    grid = np.array(tiles).reshape(c.trips + (tr, tc))
    rows = math.prod(c.trips[:-1]) if len(c.trips) > 1 else 1
    cols = c.trips[-1]
    return grid.reshape(rows, cols, tr, tc).transpose(0, 2, 1, 3).reshape(rows * tr, cols * tc)


def test_row_major_to_column_major_in_ten_tiles():
    p = Layout.ordered((8, 8), (2, 2))
    c = Layout.ordered((8, 8), (2, 2), order=(1, 0))
    x = np.arange(64, dtype=np.float32).reshape(8, 8)
    g, out, r = converted(p, c, x)
    assert np.array_equal(r.outputs["y"], in_order(c, x))
    part = next(op for op in g if isinstance(op, ConverterPartition))
    assert part.num_consumers == 10 and part.on_chip_bytes() == 10 * 16 == converter_buffer(p, c).bytes
    assert g.on_chip_bytes() == 10 * 16 + 16 + 16  # the converter, the load's tile, the store's tile


def test_compatible_layouts_pass_through():
    g = Graph("same")
    p = Layout.ordered((8, 8), (2, 2))
    load = LinearOffChipLoad(g, Tensor("x", (8, 8), FP32), (2, 2), *p.tile_view())
    assert convert(g, load, p, Layout((8, 8), (2, 2), (Loop(0, 4, 2), Loop(1, 2, 4), Loop(1, 2, 2)))) is load


def test_random_pairs_arrive_in_the_consumers_order():
    rng = np.random.default_rng(7)
    done = 0
    while done < 100:
        rank = int(rng.choice([2, 3]))
        shape = tuple(int(rng.choice([2, 4, 8])) for _ in range(rank))
        tile = (1,) * (rank - 2) + tuple(int(rng.choice([d for d in (1, 2, 4) if n % d == 0])) for n in shape[-2:])
        p, c = random_layout(rng, shape, tile), random_layout(rng, shape, tile)
        size = converter_buffer(p, c)
        if size.method == "compatible":
            continue
        x = rng.standard_normal(shape).astype(np.float32)
        g, out, r = converted(p, c, x)  # a deadlock would raise DeadlockError
        assert np.array_equal(r.outputs["y"].reshape(-1, c.tile[-1] * c.trips[-1]), in_order(c, x)), (str(p), str(c))
        assert slot_schedule(p, c)[2] * p.tile_elements == size.elements
        part = next(op for op in g if isinstance(op, ConverterPartition))
        assert part.on_chip_bytes() == size.bytes
        done += 1
