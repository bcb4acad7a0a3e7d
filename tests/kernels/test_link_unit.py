"""The Link unit (kernels.units_link) in both engines: serialization by bandwidth, latency, first-come-first-served
sharing, the output FIFO as the window of elements in flight, and bytes carried; exact arrival stamps."""

from __future__ import annotations

import numpy as np
import pytest
from kernel_helpers import builder

from stepsim.base.errors import LoweringError
from stepsim.kernels import abi
from stepsim.kernels import reference as reference_engine
from stepsim.kernels.api import run as fast_run
from stepsim.kernels.reference import run as ref_run


def _both(program):
    """Run both engines, require identical counters and link bytes; return the reference result (it has arrivals)."""
    ref = ref_run(program)
    fast = fast_run(program)
    assert ref.cycles == fast.cycles
    np.testing.assert_array_equal(ref.unit_counters, fast.unit_counters)
    np.testing.assert_array_equal(ref.channel_counters, fast.channel_counters)
    np.testing.assert_array_equal(ref.link_bytes, fast.link_bytes)
    return ref


def test_two_transfers_share_a_link_first_come_first_served():
    b = builder()
    x, y, a, z = (b.add_channel(name=n) for n in ("x", "y", "a", "z"))
    b.offchip_load(out=x, tile_rows=16, tile_cols=64, elem_bytes=2, view_shape=(3,), name="load_x")  # 2048 B tiles
    b.offchip_load(out=y, tile_rows=16, tile_cols=32, elem_bytes=2, view_shape=(2,), name="load_y")  # 1024 B tiles
    link = b.link(ins=[x, y], outs=[a, z], bandwidth=64, latency=10, name="chip0->chip1")
    b.sink(inp=a, name="sink_a")
    b.sink(inp=z, name="sink_z")
    r = _both(b.build())
    assert r.arrivals[0] == [51, 101, 151] and r.arrivals[1] == [35, 69]  # the loads' tiles reach the link
    # y0 at 35: 16 cycles on the wire (35..51), +10 -> 61. x0 at 51: 32 cycles (51..83) -> 93. y1 (69) waited
    # for x0: 83..99 -> 109. x1 at 101: 101..133 -> 143. x2 at 151: 151..183 -> 193.
    assert r.arrivals[2] == [93, 143, 193]
    assert r.arrivals[3] == [61, 109]
    fires, busy, blocked_in, blocked_out, clock = r.unit_counters[link]
    assert (fires, busy, blocked_out, clock) == (5, 3 * 32 + 2 * 16, 0, 183)
    assert r.link_bytes.tolist() == [0, 0, 3 * 2048 + 2 * 1024, 0, 0]
    assert r.cycles == 194  # sink_a takes x2 at 193, +1


def test_a_byte_that_does_not_fill_a_cycle_still_takes_one():
    b = builder()
    x, a = b.add_channel(name="x"), b.add_channel(name="a")
    b.metadata_gen(out=x, values=[7, 8, 9], shape=(3,), name="meta")  # 8-byte scalars arriving at 1, 1, 2
    link = b.link(ins=[x], outs=[a], bandwidth=3, latency=1, name="l")
    b.sink(inp=a, name="sink")
    r = _both(b.build())
    # 8 B at 3 B/cycle: 3 cycles each, back to back from 1: 1..4, 4..7, 7..10; +1 latency
    assert r.arrivals[1] == [5, 8, 11]
    assert r.unit_counters[link, abi.CNT_BUSY] == 9
    assert r.link_bytes[link] == 24


def test_a_full_receiver_holds_its_transfer_back_before_it_is_sent():
    """Depth 1 at the far end and a latency of 20: the second element waits for the first one's credit (the sink
    dequeues it at its arrival 1+1+20 = 22, credit at 23) before it goes on the wire: 23..24, arrives at 44."""
    b = builder()
    x = b.add_channel(name="x")
    a = b.add_channel(capacity=1, name="a")
    b.metadata_gen(out=x, values=[1, 2], shape=(2,), name="meta")  # arrivals 1, 1
    link = b.link(ins=[x], outs=[a], bandwidth=8, latency=20, name="l")
    b.sink(inp=a, name="sink")
    r = _both(b.build())
    assert r.arrivals[1] == [22, 44]
    fires, busy, blocked_in, blocked_out, clock = r.unit_counters[link]
    assert (fires, busy, blocked_in, blocked_out, clock) == (2, 2, 22, 0, 24)  # idle 0..1 and 2..23
    assert r.dequeues[1] == [22, 44]


def test_a_full_receiver_does_not_block_the_other_transfers_on_the_link():
    """Transfer 0's receiver (depth 1) is slow; transfer 1 shares the link and goes on while transfer 0 waits for
    its credit (virtual channels: no head-of-line blocking)."""
    b = builder()
    x, y, z, a2 = (b.add_channel(name=n) for n in ("x", "y", "z", "a2"))
    b.metadata_gen(out=x, values=[1, 2], shape=(2,), name="meta_x")  # arrivals 1, 1
    b.metadata_gen(out=y, values=[3, 4, 5], shape=(3,), name="meta_y")  # arrivals 1, 1, 2
    a = b.add_channel(capacity=1, name="a_slow")
    link = b.link(ins=[x, y], outs=[a, z], bandwidth=8, latency=3, name="l")
    b.repeat_static(inp=a, out=a2, count=30, name="slow")  # holds each element 30 cycles before dequeuing it
    b.sink(inp=a2, name="sink_a")
    b.sink(inp=z, name="sink_z")
    r = _both(b.build())
    names = list(b.build().channel_names)
    # x0 at 1 (1..2, +3 -> 5); y0 2..3 -> 6, y1 3..4 -> 7; y2 (arrived at 4) waits for its own receiver's credit
    # (sink_z dequeued y0 at 6, credit 7): 7..8 -> 11. x1 waits for x0's credit: 'slow' dequeues x0 at 181 (after
    # its 30 copies), credit 182: 182..183 -> 186, long after transfer 1 finished.
    assert r.arrivals[names.index("a_slow")] == [5, 186]
    assert r.dequeues[names.index("a_slow")] == [181, 362]
    assert r.arrivals[names.index("z")] == [6, 7, 11]
    assert r.unit_counters[link, abi.CNT_BLOCKED_OUT] == 0


def test_a_selector_crosses_a_link_with_one_byte_per_target():
    b = builder()
    s, a = b.add_channel(name="s"), b.add_channel(name="a")
    b.select_gen(out=s, targets_ptr=[0, 1, 3], targets_idx=[2, 0, 5], n_targets=6, name="sel")
    link = b.link(ins=[s], outs=[a], bandwidth=4, latency=2, name="l")
    b.sink(inp=a, name="sink")
    r = _both(b.build())
    assert r.link_bytes[link] == 12  # two 6-target selectors
    assert r.arrivals[1] == [5, 7]  # sel at 1: 1..3 (+2) -> 5; at 2: 3..5 -> 7


@pytest.mark.parametrize("kw, message", [
    (dict(bandwidth=0, latency=1), "l: bandwidth must be an int in 1..2147483647, got 0"),
    (dict(bandwidth=4, latency=0), "l: latency must be an int in 1..2147483647, got 0"),
    (dict(bandwidth=True, latency=1), "l: bandwidth must be an int in 1..2147483647, got True"),
])
def test_bad_link_parameters_are_one_line(kw, message):
    b = builder()
    x, a = b.add_channel(), b.add_channel()
    with pytest.raises(LoweringError) as info:
        b.link(ins=[x], outs=[a], name="l", **kw)
    assert str(info.value) == message


def test_a_link_needs_one_output_per_input():
    b = builder()
    x, a, z = b.add_channel(), b.add_channel(), b.add_channel()
    with pytest.raises(LoweringError) as info:
        b.link(ins=[x], outs=[a, z], bandwidth=1, latency=1, name="l")
    assert str(info.value) == "l: needs one output per input (>= 1), got 1 inputs and 2 outputs"


def test_a_buffer_reference_cannot_cross_a_link():
    b = builder()
    x, buf, a = b.add_channel(name="x"), b.add_channel(name="buf"), b.add_channel(name="a")
    b.offchip_load(out=x, tile_rows=1, tile_cols=32, elem_bytes=2, view_shape=(2,), name="load")
    b.bufferize(inp=x, out=buf, rank=1, name="bufferize")
    b.link(ins=[buf], outs=[a], bandwidth=1, latency=1, name="l")
    b.sink(inp=a, name="sink")
    with pytest.raises(LoweringError) as info:
        b.build()
    assert str(info.value) == ("l (Link): input port 0 (channel 'buf', from 'bufferize') carries buffer elements; "
                               "expected scalar or selector or tile")


def test_every_kernel_module_invalidates_the_numba_cache():
    """numba keys its disk cache on a function's own file: a kernel module missing from jit.KERNEL_MODULES would
    keep stale machine code after an edit (units_link.py once was)."""
    from pathlib import Path

    from stepsim.kernels import jit

    here = Path(jit.__file__).parent
    with_kernels = {p.name for p in here.glob("*.py") if "@kernel" in p.read_text() or "@inline_kernel" in p.read_text()}
    assert with_kernels - {"jit.py"} <= set(jit.KERNEL_MODULES)


def test_every_opcode_has_a_reference_behaviour_and_a_name():
    assert set(abi.OPCODE_NAMES) == set(range(1, abi.N_OPCODES)) == set(reference_engine._BEHAVIOURS)
    assert set(abi.TIME_SENSITIVE_OPS) <= set(abi.OPCODE_NAMES)


def test_a_transfer_closes_when_its_own_input_closes_not_when_the_link_finishes():
    """Transfer 0 (one scalar) ends at cycle 2 although transfer 1 still runs: its sink finishes at 8, not after
    the load's tile (a ring all-reduce deadlocks if a link closes its outputs only when all transfers ended)."""
    b = builder()
    x, y, a, z = (b.add_channel(name=n) for n in ("x", "y", "a", "z"))
    b.metadata_gen(out=x, values=[5], shape=(1,), name="meta")  # arrives at 1, producer done at 0
    b.offchip_load(out=y, tile_rows=16, tile_cols=32, elem_bytes=2, view_shape=(1,), name="load")  # arrives 35
    link = b.link(ins=[x, y], outs=[a, z], bandwidth=8, latency=5, name="l")
    sink_a = b.sink(inp=a, name="sink_a")
    sink_z = b.sink(inp=z, name="sink_z")
    r = _both(b.build())
    assert r.arrivals[2] == [7]  # 1 + 1 cycle on the wire + 5
    assert r.unit_clock(sink_a) == 8  # takes it at 7, +1; the closure (at the link's clock 2) is already seen
    assert r.arrivals[3] == [35 + 128 + 5]  # 1024 B at 8 B/cycle
    assert r.unit_clock(sink_z) == 169 and r.unit_clock(link) == 163
