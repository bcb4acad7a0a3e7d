"""Collectives over link units with whole chunks (``ring-chunked``, ``direct``) are exact: the engine equals the closed
forms (stepsim.workloads.collective.closed_form) to the cycle for several chip counts, sizes, link figures and
topologies; the ring-chunked all-reduce is the textbook 2 (n-1) (alpha + ceil(S / (n B))) plus its reductions and one
cycle; both engines agree; bytes over every link equal the symbolic per-link metric. (The streamed ``ring``:
test_collective_streamed.py.)"""

from __future__ import annotations

import pytest
from engines_agree import both_engines, link_unit_bytes

from stepsim.base.errors import ArgumentError
from stepsim.base.system import from_dict
from stepsim.graph.lower import lower
from stepsim.kernels.api import run as fast_run
from stepsim.workloads.collective.build import build_collective
from stepsim.workloads.collective.closed_form import add_cycles, collective_cycles


def _system(topology, n, alpha, bandwidth):
    return from_dict({"chips": n, "topology": topology, "link_bandwidth": bandwidth, "link_latency": alpha},
                     source="test")


def _cycles(system, op, nbytes, algorithm):
    c = build_collective(system, op, nbytes, algorithm)
    return fast_run(lower(c.graph, system.hardware)).cycles


def _ceil(a, b):
    return -(-a // b)


@pytest.mark.parametrize("n, nbytes, alpha, bandwidth", [
    (2, 8192, 100, 64), (3, 12_000, 500, 64), (4, 4096, 7, 1000), (5, 20 * 999, 2, 3), (8, 1 << 20, 1000, 128)])
def test_ring_all_reduce_is_the_textbook_formula_plus_its_reductions(n, nbytes, alpha, bandwidth):
    system = _system("ring", n, alpha, bandwidth)
    mu = add_cycles(nbytes, n, system.hardware.pmu_bw, 1024)
    network = 2 * (n - 1) * (alpha + _ceil(nbytes // n, bandwidth))  # 2 (n-1) (alpha + S/(nB)), S/(nB) rounded up
    assert _cycles(system, "all-reduce", nbytes, "ring-chunked") == network + (n - 1) * mu + 1
    assert _cycles(system, "all-gather", nbytes, "ring-chunked") == network // 2 + 1
    assert _cycles(system, "reduce-scatter", nbytes, "ring-chunked") == network // 2 + (n - 1) * mu + 1


def test_one_ring_all_reduce_by_hand():
    """4 chips, S = 4096 B, alpha = 20, B = 64 B/cycle, PMU 64 B/cycle: a chunk is 1024 B, 16 cycles on a link;
    an add reads two 1024 B chunks from on-chip memory, 2 * 16 = 32 cycles. 6 hops of 20 + 16, 3 adds, 1 edge."""
    assert _cycles(_system("ring", 4, 20, 64), "all-reduce", 4096, "ring-chunked") == 6 * 36 + 3 * 32 + 1 == 313


CASES = [(topology, n, alpha, bandwidth, nbytes, op, algorithm)
         for topology, n in (("ring", 2), ("ring", 3), ("ring", 6), ("fully-connected", 3), ("fully-connected", 5),
                             ("switch", 2), ("switch", 4), ("switch", 7))
         for alpha, bandwidth in ((100, 64), (3, 1000))
         for nbytes in (4 * n, 4 * n * 700)
         for op, algorithm in (("all-reduce", "ring-chunked"), ("reduce-scatter", "ring-chunked"),
                               ("all-gather", "ring-chunked"),
                               ("all-reduce", "direct"), ("reduce-scatter", "direct"), ("all-gather", "direct"),
                               ("all-to-all", "direct"))
         if not (topology == "ring" and n > 2 and algorithm == "direct")]


@pytest.mark.parametrize("topology, n, alpha, bandwidth, nbytes, op, algorithm", CASES)
def test_engine_equals_the_closed_form(topology, n, alpha, bandwidth, nbytes, op, algorithm):
    system = _system(topology, n, alpha, bandwidth)
    want = collective_cycles(op, algorithm, topology, n, nbytes, alpha, bandwidth, system.hardware.pmu_bw)
    assert _cycles(system, op, nbytes, algorithm) == want


@pytest.mark.parametrize("topology, n, op, algorithm", [
    ("ring", 3, "all-reduce", "ring-chunked"), ("ring", 4, "all-reduce", "direct"), ("ring", 4, "all-to-all", "direct"),
    ("switch", 3, "reduce-scatter", "direct"), ("fully-connected", 3, "all-gather", "ring-chunked"),
    ("torus", 4, "all-reduce", "ring-chunked"), ("torus", 4, "all-to-all", "direct")])
def test_both_engines_agree_on_collectives(topology, n, op, algorithm):
    """Including direct collectives on a ring and on a 2x2 torus, whose multi-hop routes share links."""
    if topology == "torus":
        system = from_dict({"dimension": [
            {"size": 2, "topology": "ring", "link_bandwidth": 32, "link_latency": 9},
            {"size": 2, "topology": "ring", "link_bandwidth": 16, "link_latency": 4}]}, source="torus")
    else:
        system = _system(topology, n, 9, 32)
    c = build_collective(system, op, 4 * n * 50, algorithm)
    program = lower(c.graph, system.hardware)
    both_engines(program)


@pytest.mark.parametrize("topology, op, algorithm", [("ring", "all-reduce", "ring-chunked"), ("ring", "all-reduce", "ring"),
                                                    ("ring", "all-to-all", "direct"),
                                                    ("switch", "all-gather", "direct")])
def test_bytes_over_each_link_equal_the_symbolic_metric(topology, op, algorithm):
    n, nbytes = 4, 4 * 4 * 300
    system = _system(topology, n, 10, 64)
    c = build_collective(system, op, nbytes, algorithm)
    program = lower(c.graph, system.hardware)
    result = fast_run(program)
    measured = link_unit_bytes(program, result)
    assert measured == {name: int(b) for name, b in c.network.link_bytes().items()}
    chunk = nbytes // n
    if op == "all-reduce":  # every ring link carries 2 (n-1) chunks (one direction of the ring only)
        assert measured == {f"chip{i}->chip{(i + 1) % n}": 2 * (n - 1) * chunk for i in range(n)}
    elif op == "all-to-all":  # 4 chips on a ring: neighbours one hop, the opposite chip two hops (over c+1)
        assert sum(measured.values()) == chunk * n * (1 + 1 + 2)
    else:  # through the switch: each up-link carries n-1 chunks, each down-link n-1
        assert set(measured.values()) == {(n - 1) * chunk} and len(measured) == 2 * n


@pytest.mark.parametrize("op, nbytes, algorithm, chips, message", [
    ("all-sum", 64, "ring", 4, "collective op must be one of all-reduce, reduce-scatter, all-gather, all-to-all, "
                               "got 'all-sum'"),
    ("all-reduce", 64, "tree", 4, "collective algorithm must be one of ring, ring-chunked, direct, got 'tree'"),
    ("all-to-all", 64, "ring", 4, "all-to-all is direct only (each chunk routed straight to its chip): use "
                                  "--algorithm direct"),
    ("all-reduce", 100, "ring", 4, "--bytes 100 must be a multiple of 16 (4 chunks of fp32 elements); e.g. 96"),
    ("all-reduce", 0, "ring", 4, "--bytes must be a positive int, got 0"),
    ("all-reduce", 64, "ring", 1, "a collective needs at least 2 chips, the system has 1"),
])
def test_bad_collective_requests_are_one_line(op, nbytes, algorithm, chips, message):
    system = from_dict({"chips": chips, "topology": "ring", "link_bandwidth": 1, "link_latency": 2}, source="t")
    with pytest.raises(ArgumentError) as info:
        build_collective(system, op, nbytes, algorithm)
    assert str(info.value) == message


def test_no_closed_form_for_direct_collectives_on_a_ring():
    with pytest.raises(ArgumentError) as info:
        collective_cycles("all-to-all", "direct", "ring", 4, 64, 2, 1, 64)
    assert str(info.value) == "direct collectives on a ring share links (multi-hop routes): no closed form"


def test_a_chunk_that_does_not_fill_its_last_cycle_takes_it_whole():
    """S/(nB) = 16000/(4*3) = 1333.3 cycles rounds up to 1334 on every hop: 3 hops of 2 + 1334, one edge."""
    n, nbytes = 4, 4000 * 4
    system = _system("ring", n, 2, 3)
    assert _ceil(nbytes // n, 3) == 1334
    assert _cycles(system, "all-gather", nbytes, "ring-chunked") == 3 * (2 + 1334) + 1
