"""The streamed ring (the collectives' default ``ring``): a chunk crosses the link in tiles that are reduced as they
arrive, so transfer and reduction overlap. A 16 MiB all-reduce on an idle ring is within 1 % of the textbook
2 (n-1) (alpha + S / (n B)) where the whole-chunk ``ring-chunked`` form takes twice as long; the engine equals the
closed-form estimate (stepsim.workloads.collective.closed_form.streamed_ring_cycles) wherever each link sends the
steps in order and is never below it; both engines agree on random streamed collectives."""

from __future__ import annotations

import random

import pytest
from engines_agree import both_engines, link_unit_bytes

from stepsim.base.errors import ArgumentError
from stepsim.base.hardware import Hardware
from stepsim.base.system import System, from_dict
from stepsim.graph.lower import lower
from stepsim.kernels.api import run as fast_run
from stepsim.workloads.collective.build import build_collective, default_tile_bytes, tiles_per_chunk
from stepsim.workloads.collective.closed_form import collective_cycles, streamed_ring_cycles

MIB16 = 16 << 20


def _system(topology, n, alpha, bandwidth, hardware="step-eval"):
    return from_dict({"chips": n, "topology": topology, "link_bandwidth": bandwidth, "link_latency": alpha,
                      "hardware": hardware}, source="test")


def _cycles(system, op, nbytes, algorithm="ring", tile_bytes=None):
    c = build_collective(system, op, nbytes, algorithm, tile_bytes=tile_bytes)
    return fast_run(lower(c.graph, system.hardware)).cycles


def test_the_tile_is_a_quarter_of_a_memory_unit():
    """512 KiB PMUs (520 MiB over 1,040 units) on every preset: 128 KiB tiles; a hardware file's units set it."""
    assert {default_tile_bytes(Hardware.preset(name)) for name in ("step-eval", "step-hdl", "sn40l")} == {1 << 17}
    assert default_tile_bytes(Hardware.preset("step-eval", memory_units=4160)) == 1 << 15
    # the fewest equal tiles of at most the tile: 1 MiB chunks in 8, 1,200 B chunks of 300 fp32 values in 2 of
    # 600 B at most 1,024 B, 7 values in tiles of one value
    assert (tiles_per_chunk(1 << 18, 1 << 17), tiles_per_chunk(300, 1024), tiles_per_chunk(7, 4)) == (8, 2, 7)
    assert tiles_per_chunk(300, 1200) == 1 and tiles_per_chunk(301, 1200) == 7  # 301 = 7 x 43


# n, tiles a chunk, streamed cycles, the whole-chunk ring-chunked cycles (ring-n: alpha 500, B 64, PMU 64 B/cycle)
SIXTEEN_MIB = [(2, 64, 264_693, 525_289), (4, 32, 395_765, 789_433), (8, 16, 461_301, 924_505)]


@pytest.mark.parametrize("n, tiles, cycles, chunked", SIXTEEN_MIB)
def test_a_16_mib_all_reduce_is_within_one_percent_of_the_textbook(n, tiles, cycles, chunked):
    """Chunks of 16 MiB / n in 128 KiB tiles: tau = 2048 cycles on a link, rho = 2048 to read a tile from on-chip
    memory (send stage, add: PMU 64 B/cycle = B). The link is the bottleneck: 2 (n-1) chunks back to back on every
    link, one link latency and one tile's send stage, 2 (n-1) T tau + alpha + rho + 1. Ratios to the textbook
    2 (n-1) (alpha + S / (n B)): 1.0059 (n = 2: one tile of fill over two latencies), 0.9989, 0.9904 (n = 8: 13 of
    the 14 latencies hidden behind the wire). ring-chunked pays n - 1 whole-chunk adds of 2 S / (n pmu_bw) on top."""
    system = System.preset(f"ring-{n}")
    alpha, bandwidth, tau, rho = 500, 64, 2048, 2048
    c = build_collective(system, "all-reduce", MIB16)
    assert (c.tiles, c.algorithm) == (tiles, "ring")
    got = fast_run(lower(c.graph, system.hardware)).cycles
    assert got == cycles == 2 * (n - 1) * tiles * tau + alpha + rho + 1
    assert got == collective_cycles("all-reduce", "ring", "ring", n, MIB16, alpha, bandwidth, 64, tile_bytes=1 << 17)
    textbook = 2 * (n - 1) * (alpha + MIB16 / (n * bandwidth))
    assert abs(got / textbook - 1) < 0.01
    assert round(got / textbook, 4) == {2: 1.0059, 4: 0.9989, 8: 0.9904}[n]
    assert _cycles(system, "all-reduce", MIB16, "ring-chunked") == chunked == collective_cycles(
        "all-reduce", "ring-chunked", "ring", n, MIB16, alpha, bandwidth, 64)


def test_one_tile_a_chunk_by_hand():
    """ring-4, S = 4096 B: 1024 B chunks, one tile (tau = rho = 16). 6 hops of 500 + 16; the send stage and the 3 adds
    each read one tile from on-chip memory (16 each: the received tile comes from the link); one edge into the
    all-gather's fan-out and one into the store. ring-chunked: 6 x 516 + 3 adds of two chunks (32) + 1 = 3193."""
    system = System.preset("ring-4")
    assert _cycles(system, "all-reduce", 4096) == 6 * 516 + 4 * 16 + 2 == 3162
    assert _cycles(system, "all-reduce", 4096, "ring-chunked") == 6 * 516 + 3 * 32 + 1 == 3193


def test_tiles_overlap_transfer_and_reduction_by_hand():
    """ring-2 (alpha 500, B 64), S = 8192 B, tiles of 1024 B: 4 tiles a chunk, tau = rho = 16. Chip c's send stage
    emits tile 0 at 16, the link carries chunk 0's 4 tiles back to back (64 cycles), then the reduced tiles of the
    all-gather (the first reduced at 16 + 516 + 16 + 1 = 549, later than 16 + 64 = 80: latency-bound), whose last
    tile arrives 3 x 16 + 516 later and is stored one edge after: 549 + 48 + 516 + 1 = 1114."""
    system = System.preset("ring-2")
    assert _cycles(system, "all-reduce", 8192, tile_bytes=1024) == 16 + (516 + 16 + 1) + 48 + 516 + 1 == 1114
    assert streamed_ring_cycles("all-reduce", "ring", 2, 8192, 500, 64, 64, tile_bytes=1024) == 1114


GRID = [(topology, n, nbytes, alpha, bandwidth, tile_bytes, op)
        for topology, n in (("ring", 2), ("ring", 3), ("fully-connected", 4), ("switch", 3))
        for nbytes in (4 * 12 * 50, 4 * 12 * 2000)
        for alpha, bandwidth in ((3, 64), (100, 16))
        for tile_bytes in (256, 2048, 1 << 17)
        for op in ("all-reduce", "reduce-scatter", "all-gather")]
#: the grid's one case where a later step's tile was made before an earlier step's tile still waiting for the link:
#: the link interleaves them (first come, first served), its last step starts later and the engine takes longer
#: than the in-order estimate, by these cycles (25 of 9,130: 0.27 %)
INTERLEAVED = {("fully-connected", 4, 96000, 100, 16, 256, "all-reduce"): 25}


@pytest.mark.parametrize("topology, n, nbytes, alpha, bandwidth, tile_bytes, op", GRID)
def test_the_engine_is_the_estimate_when_the_links_send_in_order(topology, n, nbytes, alpha, bandwidth, tile_bytes,
                                                                 op):
    system = _system(topology, n, alpha, bandwidth)
    want = collective_cycles(op, "ring", topology, n, nbytes, alpha, bandwidth, 64, tile_bytes=tile_bytes)
    got = _cycles(system, op, nbytes, tile_bytes=tile_bytes)
    assert got - want == INTERLEAVED.get((topology, n, nbytes, alpha, bandwidth, tile_bytes, op), 0)


def test_a_faster_pmu_makes_the_link_the_only_bound():
    """PMU 256 B/cycle against links of 64: a 1024 B tile reads in 4 cycles and crosses in 16, so the tiles leave
    every 16 cycles; 8,192 B chunks on ring-4 are 8 tiles, 128 cycles a step."""
    system = _system("ring", 4, 20, 64, hardware="step-hdl")
    got = _cycles(system, "all-reduce", 4 * 8192, tile_bytes=1024)
    assert got == streamed_ring_cycles("all-reduce", "ring", 4, 4 * 8192, 20, 64, 256, tile_bytes=1024) == \
        4 + 6 * 128 + 20 + 1 == 793


def test_bytes_over_each_link_are_the_chunks():
    n, nbytes = 4, 4 * 4 * 300
    system = _system("ring", n, 10, 64)
    c = build_collective(system, "all-reduce", nbytes, tile_bytes=256)
    program = lower(c.graph, system.hardware)
    measured = link_unit_bytes(program, fast_run(program))
    assert c.tiles == 5
    assert measured == {f"chip{i}->chip{(i + 1) % n}": 2 * (n - 1) * nbytes // n for i in range(n)} == {
        name: int(b) for name, b in c.network.link_bytes().items()}


def test_both_engines_agree_on_random_streamed_collectives():
    rng = random.Random(41)
    for _ in range(8):
        topology = rng.choice(("ring", "fully-connected", "switch"))
        n = rng.randint(2, 5)
        system = _system(topology, n, rng.randint(2, 60), rng.choice((8, 32, 64, 100)))
        op = rng.choice(("all-reduce", "reduce-scatter", "all-gather"))
        nbytes = 4 * n * rng.randint(1, 90)
        c = build_collective(system, op, nbytes, tile_bytes=4 * rng.randint(1, 40))
        both_engines(lower(c.graph, system.hardware))


def test_ring_chunked_is_for_the_collective_only():
    from stepsim.graph.graph import Graph
    from stepsim.graph.network import Network
    from stepsim.workloads.collective.build import all_reduce_streams

    system = System.preset("ring-2")
    g = Graph("t")
    with pytest.raises(ArgumentError) as info:
        all_reduce_streams(g, Network(g, system), {}, "ring-chunked")
    assert str(info.value) == ("--algorithm ring-chunked applies to 'stepsim run collective' only: a tensor-parallel "
                               "layer's all-reduce streams its own tiles (use ring or direct)")
    with pytest.raises(ArgumentError) as info:
        build_collective(system, "all-reduce", 64, tile_bytes=2)
    assert str(info.value) == "collective tile_bytes must be an int >= 4 (one fp32 element), got 2"


def test_ring_chunked_with_tp_is_one_line(capsys):
    from stepsim.cli import main

    assert main(["run", "swiglu", "--tp", "2", "--algorithm", "ring-chunked"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "stepsim: error: --algorithm ring-chunked applies to 'stepsim run collective' only: a tensor-parallel layer's "
        "all-reduce streams its own tiles (use ring or direct)"]


@pytest.mark.parametrize("system_name", ["ring-2", "ring-8", "switch-8"])
@pytest.mark.parametrize("tokens", [1, 112, 2048])
def test_serve_prices_its_all_reduces_as_the_engine_runs_them(system_name, tokens):
    """stepsim serve --system's all-reduce of a step's activations (tokens x 4096 fp32: 16 KiB to 32 MiB, one to 32
    tiles a chunk) is the estimate, and the engine equals it on these idle systems (every link sends in order)."""
    from stepsim.serve.system import allreduce_cycles

    system = System.preset(system_name)
    nbytes = -(-tokens * 4096 // system.chips) * system.chips * 4
    assert _cycles(system, "all-reduce", nbytes) == allreduce_cycles(system, 4096, tokens)
