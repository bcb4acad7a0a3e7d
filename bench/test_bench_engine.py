"""Engine throughput: unit firings per second of three engines on the same synthetic graphs.

Workloads (built with :class:`stepsim.kernels.program.ProgramBuilder`; the graph is the same for every engine, only the
number of elements streamed through it changes):

* ``chain``: a u64 MetadataGen through 1000 unary Maps into a sink (1000 elements: 1,002,000 firings);
* ``fanout``: the same source broadcast to 8 branches of 125 Maps each, joined by a tree of 7 binary Maps
  (1000 elements: 1,010,000 firings).

Each runs with channel depth 2 (the evaluation default) and 16, on

* ``numba``: the compiled engine, :func:`stepsim.kernels.run` (timed: ``EngineResult.wall_seconds``, the engine
  call alone, compilation excluded), with 1000 elements (~1M firings, so that per-call overhead is negligible);
* ``reference``: the pure-Python twin, :func:`stepsim.kernels.reference.run`, and
* ``simpy``: a SimPy model of the same graph (``bench/simpy_engine.py``; one process per unit, a Store plus a
  credit Container per channel), both with 100 elements (~100k firings) to keep their runs around a second.

The numba engine also runs the 100-element graph, which (a) checks that all three engines agree on cycles and
firings (hard asserts: these counts are deterministic) and (b) gives the same-size ratio next to the headline
ratio (numba at ~1M firings / slow engine at ~100k firings; rates, so the sizes may differ).

``ENGINES`` maps a name to ``run(program) -> (cycles, fires, seconds)`` and ``ELEMENTS`` gives its stream length;
add an engine there and every workload is measured on it. With ``--benchmark-disable`` (pyproject's default)
every engine runs once; with ``--benchmark-enable`` the best of several runs is kept. Nothing here asserts on
time: the numbers go to ``benchmark.extra_info`` and to the summary printed at the end of the run.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
import simpy_engine  # bench/simpy_engine.py: bench/ is on sys.path under pytest's default (prepend) import mode

from stepsim.base.hardware import Hardware
from stepsim.kernels import abi as A
from stepsim.kernels.program import ProgramBuilder

#: elements streamed through the graph for the numba engine (~1M firings) and for the slow engines (~100k)
LARGE, SMALL = 1000, 100


def _numba_engine(program):
    from stepsim.kernels import run

    result = run(program)
    return result.cycles, result.fires, result.wall_seconds


def _reference_engine(program):
    from stepsim.kernels import reference as reference_engine

    # the bound only guards against a runaway program; these graphs need about one step per firing
    t0 = time.perf_counter()
    result = reference_engine.run(program, max_steps=50 * program.n_units * LARGE)
    seconds = time.perf_counter() - t0
    return result.cycles, int(result.unit_counters[:, A.CNT_FIRES].sum()), seconds


def _simpy_engine(program):
    t0 = time.perf_counter()  # building the SimPy processes is part of its run, as the reference's set-up is
    result = simpy_engine.run(program)
    seconds = time.perf_counter() - t0
    return result.cycles, result.fires, seconds


#: name -> callable(program) -> (cycles, fires, engine seconds)
ENGINES = {"numba": _numba_engine, "reference": _reference_engine, "simpy": _simpy_engine}
#: elements per engine (slow engines get the smaller stream through the same graph)
ELEMENTS = {"numba": LARGE, "reference": SMALL, "simpy": SMALL}
#: the engine the others are compared against
FAST = "numba"


def chain_program(depth: int, n_maps: int = 1000, n_elements: int = LARGE):
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


def fanout_program(depth: int, branches: int = 8, maps_per_branch: int = 125, n_elements: int = LARGE):
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


def _best_of(run_engine, program, n: int):
    """Run ``n`` times; returns (cycles, fires, fastest seconds). Counts must not change between runs."""
    runs = [run_engine(program) for _ in range(n)]
    assert len({r[:2] for r in runs}) == 1, f"non-deterministic counts: {[r[:2] for r in runs]}"
    return runs[0][0], runs[0][1], min(r[2] for r in runs)


@pytest.mark.parametrize("depth", [2, 16])
@pytest.mark.parametrize("workload", sorted(WORKLOADS))
def test_engine_firings_per_second(benchmark, rounds, bench_summary, workload, depth):
    """Firings/s of every engine on one graph, and the fast engine's speed-up over each other engine."""
    build = WORKLOADS[workload]
    programs = {n: build(depth, n_elements=n) for n in sorted(set(ELEMENTS.values()))}

    # pytest-benchmark times the fast engine on its large stream; its rate uses the engine's own timer
    fast_runs = []
    benchmark.pedantic(lambda: fast_runs.append(ENGINES[FAST](programs[ELEMENTS[FAST]])),
                       rounds=rounds(5), iterations=1, warmup_rounds=0)
    assert len({r[:2] for r in fast_runs}) == 1
    measured = {FAST: (fast_runs[0][0], fast_runs[0][1], min(r[2] for r in fast_runs))}
    for name, run_engine in ENGINES.items():
        if name != FAST:
            measured[name] = _best_of(run_engine, programs[ELEMENTS[name]], rounds(3))
    # the fast engine on the slow engines' stream: checks agreement, and gives the same-size ratio
    fast_small = _best_of(ENGINES[FAST], programs[SMALL], rounds(5))

    rate = {name: fires / seconds for name, (_, fires, seconds) in measured.items()}
    info = {"workload": workload, "channel_depth": depth}
    for name, (cycles, fires, seconds) in measured.items():
        info[name] = {"elements": ELEMENTS[name], "firings": fires, "cycles": cycles, "engine_seconds": seconds,
                      "firings_per_second": rate[name]}
    info[f"{FAST}_small"] = {"elements": SMALL, "firings": fast_small[1], "cycles": fast_small[0],
                             "engine_seconds": fast_small[2], "firings_per_second": fast_small[1] / fast_small[2]}
    for name in ENGINES:
        if name != FAST:
            info[f"{FAST}_over_{name}"] = rate[FAST] / rate[name]
            info[f"{FAST}_over_{name}_same_size"] = (fast_small[1] / fast_small[2]) / rate[name]
    benchmark.extra_info.update(info)

    rates = "  ".join(f"{name} {rate[name] / 1e6:7.3f}" for name in ENGINES)
    ratios = "  ".join(f"{FAST}/{name} {info[f'{FAST}_over_{name}']:6.0f}x "
                       f"(same size {info[f'{FAST}_over_{name}_same_size']:.0f}x)" for name in ENGINES if name != FAST)
    line = (f"{workload:6s} depth {depth:2d}: M firings/s  {rates}  |  {ratios}  |  "
            f"{measured[FAST][1]:,} firings in {measured[FAST][2] * 1e3:.1f} ms")
    bench_summary("engine firings per second (numba on ~1M firings, reference and SimPy on ~100k)", line)
    print("\n" + line)

    assert measured[FAST][1] >= 1_000_000
    # deterministic: every engine simulates the same cycles and firings on the same graph
    for name in ENGINES:
        if ELEMENTS[name] == SMALL:
            assert measured[name][:2] == fast_small[:2], f"{name} disagrees with {FAST} on (cycles, fires)"
