"""Re-tilings with no minimal on-chip converter go through off-chip memory (issue 33,
:func:`stepsim.graph.ops_spill.retile_through_memory`): on random pairs of 2-D and 3-D layouts whose tiles differ
and do not pack in order, the values arrive in the consumer's tiles and order (functional), both engines agree on
every counter and no run deadlocks, the engine moves exactly the metric's bytes (the load, the spill written and
read back, the store: four times the tensor), on chip are the four tiles and the 8-byte token, and the read-back
says why it spilled. Pairs nothing can join stay one-line LayoutErrors."""

import sys
from pathlib import Path

import numpy as np
import pytest

from stepsim.base.defaults import UNSET, resolve_channel_depth
from stepsim.base.errors import LayoutError
from stepsim.base.hardware import Hardware
from stepsim.graph import FP32, Graph, LinearOffChipLoad, LinearOffChipStore, Tensor
from stepsim.graph.layout import Layout, Loop, converter_buffer
from stepsim.graph.lower import lower
from stepsim.graph.ops_convert import ConverterPartition, convert, packs_in_order
from stepsim.graph.ops_memory import RandomOffChipStore
from stepsim.kernels.api import run as fast_run
from stepsim.kernels.reference import run as ref_run
from stepsim.simulation.simulate import simulate

sys.path.insert(0, str(Path(__file__).parent))
from test_convert import converted, in_order  # noqa: E402
from test_layout import random_layout  # noqa: E402


def sample(n: int, seed: int = 11):
    """``n`` random (producer, consumer) pairs of one tensor with unequal 2-D tiles that do not pack in order."""
    rng = np.random.default_rng(seed)
    while n:
        rank = int(rng.choice([2, 3]))
        shape = tuple(int(rng.choice([2, 4, 8])) for _ in range(rank))

        def tile():
            return (1,) * (rank - 2) + tuple(int(rng.choice([d for d in (1, 2, 4, 8) if s % d == 0]))
                                             for s in shape[-2:])
        tp, tc = tile(), tile()
        if tp == tc:
            continue
        p, c = random_layout(rng, shape, tp), random_layout(rng, shape, tc)
        if packs_in_order(p, c) is not None:
            continue
        n -= 1
        yield p, c


PAIRS = list(sample(60))


def test_the_sample_covers_ranks_coarser_finer_and_mixed_tiles():
    ranks = {p.rank for p, _ in PAIRS}
    kinds = {("coarser" if all(a <= b for a, b in zip(p.tile, c.tile)) else
              "finer" if all(a >= b for a, b in zip(p.tile, c.tile)) else "mixed") for p, c in PAIRS}
    assert ranks == {2, 3} and kinds == {"coarser", "finer", "mixed"}


@pytest.mark.parametrize("k", range(len(PAIRS)))
def test_a_retiling_spills_and_reads_back_in_the_consumers_tiles_and_order(k):
    p, c = PAIRS[k]
    x = np.random.default_rng(k).standard_normal(p.shape).astype(np.float32)
    g, out, r = converted(p, c, x)  # a deadlock would raise DeadlockError
    assert np.array_equal(r.outputs["y"].reshape(-1, c.tile[-1] * c.trips[-1]), in_order(c, x)), (str(p), str(c))
    tr, tc = p.tile[-2:]
    assert out.spill_reason == (f"re-tiling {'x'.join(map(str, p.tile))} -> {'x'.join(map(str, c.tile))} has no "
                                f"minimal on-chip converter (the consumer's tiles are not runs of the producer's in "
                                f"its order): spilled, read back in the consumer's tiles and order")
    assert out.stream.layout == c and tuple(out.stream.shape) == (1,) + c.trips
    assert not [op for op in g if isinstance(op, ConverterPartition)]
    nbytes = int(np.prod(p.shape)) * 4
    # x loaded, written to the spill, read back, stored as y: the engine's counters equal the metric
    assert (r.off_chip_bytes_read, r.off_chip_bytes_written) == (2 * nbytes, 2 * nbytes)
    assert int(g.off_chip_bytes()) == r.off_chip_bytes
    # on chip: the load's and the spill store's producer tiles, the read-back's and the store's consumer tiles
    assert g.on_chip_bytes() == 2 * p.tile_elements * 4 + 2 * c.tile_elements * 4 + 8
    hw = Hardware.preset("step-eval")
    program = lower(g, hw, channel_depth=resolve_channel_depth(UNSET, hw))
    ref, fast = ref_run(program), fast_run(program)
    assert ref.cycles == fast.cycles == r.cycles
    np.testing.assert_array_equal(ref.unit_counters, fast.unit_counters)
    np.testing.assert_array_equal(ref.channel_counters, fast.channel_counters)
    assert (ref.off_chip_bytes_read, ref.off_chip_bytes_written) == (fast.bytes_read, fast.bytes_written)
    store = next(op for op in g if isinstance(op, RandomOffChipStore))
    assert (store.tile_rows, store.tile_cols) == (tr, tc)


def test_a_coarser_square_tile_spills_exactly():
    p, c = Layout.ordered((8, 8), (2, 2)), Layout.ordered((8, 8), (4, 4))  # two dims coarser: no in-order packing
    assert converter_buffer(p, c).bytes == 6 * 16  # the on-chip minimum no STeP construction reaches
    x = np.arange(64, dtype=np.float32).reshape(8, 8)
    g, out, r = converted(p, c, x)
    assert np.array_equal(r.outputs["y"], in_order(c, x))
    # 256 B of x: loaded and read back (512 B read), written to the spill and stored (512 B written); the store of
    # the spill must finish before the read-back starts: 456 cycles, against 342 for the load and store alone
    assert (r.off_chip_bytes_read, r.off_chip_bytes_written, r.cycles) == (512, 512, 456)
    assert g.on_chip_bytes() == 16 + 16 + 64 + 64 + 8
    assert [op.name for op in g if op.name.startswith("spill_")] == [
        "spill_addr[LinearOffChipLoad_0->store]", "spill_write[LinearOffChipLoad_0->store]",
        "spill_done[LinearOffChipLoad_0->store]", "spill_read[LinearOffChipLoad_0->store]"]


def test_pairs_nothing_can_join_stay_one_line_errors():
    g = Graph("bad")
    p = Layout.ordered((8, 8), (2, 2))
    load = LinearOffChipLoad(g, Tensor("x", (8, 8), FP32), (2, 2), *p.tile_view())
    other = Layout.ordered((8, 16), (4, 4))
    with pytest.raises(LayoutError) as err:
        convert(g, load, p, other, producer_name=load.name, consumer_name="matmul_3")
    assert str(err.value) == (f"no converter from LinearOffChipLoad_0 {p} to matmul_3 {other}: they describe tensors "
                              f"of different shapes")
    rereads = Layout((8, 8), (4, 4), (Loop(0, 2, 4), Loop(1, 2, 4), Loop(1, 2, 0)))
    with pytest.raises(LayoutError) as err:
        convert(g, load, p, rereads, producer_name=load.name, consumer_name="matmul_3")
    assert str(err.value).endswith("the consumer re-reads tiles (that needs a reuse buffer, not a converter)")


def test_two_spills_with_default_names_keep_their_own_scratch_tensors():
    p, c = Layout.ordered((8, 8), (2, 2)), Layout.ordered((8, 8), (4, 4))
    g = Graph("twice")
    x = np.arange(64, dtype=np.float32).reshape(8, 8)
    for name in ("x", "z"):
        load = LinearOffChipLoad(g, Tensor(name, (8, 8), FP32), (2, 2), *p.tile_view())
        LinearOffChipStore(g, convert(g, load, p, c), tensor_name=f"{name}_out")
    assert [op.name for op in g if op.name.startswith("spill_read")] == [
        "spill_read[producer->consumer]", "spill_read[producer->consumer#2]"]
    r = simulate(g, functional=True, inputs={"x": x, "z": -x})
    assert np.array_equal(r.outputs["x_out"], in_order(c, x)) and np.array_equal(r.outputs["z_out"], in_order(c, -x))
