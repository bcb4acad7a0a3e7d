"""Engine throughput: unit firings per second on synthetic graphs of ~1M firings.

Workloads (built with :class:`stepsim.program.ProgramBuilder`):

* ``chain``: a u64 source of 1000 elements through 1000 unary Maps into a sink (1,002,000 firings).
* ``fanout``: the same source broadcast to 8 branches of 125 Maps each, joined by a tree of 7 binary Maps
  (about 1M firings).

Each is run with channel depth 2 (the evaluation default) and 16. Engines are pluggable: ``ENGINES`` maps a
name to ``run(program) -> (cycles, fires, engine_seconds)``; add the reference engine or a SimPy model there
and every workload is measured on it too (``--benchmark-disable`` still runs each case once).
``benchmark.extra_info`` records firings/s measured on the engine call alone (no compilation, no building).
"""

from __future__ import annotations

import numpy as np
import pytest

from stepsim.hardware import Hardware
from stepsim.program import ProgramBuilder

N_ELEMENTS = 1000


def _numba_engine(program):
    from stepsim.kernels import run

    result = run(program)
    return result.cycles, result.fires, result.wall_seconds


#: name -> callable(program) -> (cycles, fires, engine seconds)
ENGINES = {"numba": _numba_engine}


def chain_program(depth: int, n_maps: int = 1000, n_elements: int = N_ELEMENTS):
    """Source -> n_maps unary Maps -> sink."""
    b = ProgramBuilder(Hardware.preset("step-eval", channel_depth=depth))
    c = b.add_channel()
    b.metadata_gen(out=c, values=np.arange(n_elements))
    for _ in range(n_maps):
        d = b.add_channel()
        b.map(ins=[c], out=d, fn="exp", compute_bw=1024)
        c = d
    b.sink(inp=c)
    return b.build()


def fanout_program(depth: int, branches: int = 8, maps_per_branch: int = 125, n_elements: int = N_ELEMENTS):
    """Source -> Broadcast(branches) -> branches x Maps -> binary-Map tree -> sink."""
    b = ProgramBuilder(Hardware.preset("step-eval", channel_depth=depth))
    src = b.add_channel()
    b.metadata_gen(out=src, values=np.arange(n_elements))
    heads = [b.add_channel() for _ in range(branches)]
    b.broadcast(inp=src, outs=heads)
    tails = []
    for c in heads:
        for _ in range(maps_per_branch):
            d = b.add_channel()
            b.map(ins=[c], out=d, fn="exp", compute_bw=1024)
            c = d
        tails.append(c)
    while len(tails) > 1:
        nxt = []
        for x, y in zip(tails[::2], tails[1::2]):
            d = b.add_channel()
            b.map(ins=[x, y], out=d, fn="add", compute_bw=1024)
            nxt.append(d)
        tails = nxt
    b.sink(inp=tails[0])
    return b.build()


WORKLOADS = {"chain": chain_program, "fanout": fanout_program}


@pytest.fixture(scope="module", autouse=True)
def compiled():
    """Compile / load the kernels before anything is timed."""
    from stepsim.kernels import run
    from stepsim.kernels.warm import warm_program

    run(warm_program())


@pytest.mark.parametrize("engine", sorted(ENGINES))
@pytest.mark.parametrize("depth", [2, 16])
@pytest.mark.parametrize("workload", sorted(WORKLOADS))
def test_engine_firings_per_second(benchmark, engine, workload, depth):
    program = WORKLOADS[workload](depth)
    run_engine = ENGINES[engine]
    outcome = {}

    def once():
        outcome["result"] = run_engine(program)

    benchmark.pedantic(once, rounds=3, iterations=1, warmup_rounds=0)
    cycles, fires, seconds = outcome["result"]
    rate = fires / seconds
    benchmark.extra_info.update({"engine": engine, "workload": workload, "channel_depth": depth,
                                 "firings": fires, "cycles": cycles, "engine_seconds": seconds,
                                 "firings_per_second": rate})
    print(f"\n{engine:8s} {workload:7s} depth {depth:3d}: {fires:,} firings, {cycles:,} cycles, "
          f"{seconds * 1e3:.1f} ms, {rate / 1e6:.1f} M firings/s")
    assert fires >= 1_000_000
