"""Wall time and simulations of the hierarchical ONNX schedule search (``stepsim optimize model.onnx
--hierarchical``, :mod:`stepsim.optimize.onnx_hierarchy`) against exhaustive enumeration in the same run.

* the two-MatMul MLP of tests/frontend/test_hierarchy.py: the search against building and
  simulating all 144 schedules (3 tile_m x 3 x 2 per-MatMul tiles x 2^3 fusion choices); both give the same front
  (the branch and bound builds 42 schedules and simulates 8);
* the Llama block of examples/onnx_blocks.py (B 2, S 8, D 64, F 128; RMSNorm, SwiGLU MLP, residual): the search's
  wall time, schedules built, simulations and subtrees' schedules dropped unbuilt (its 786,432 schedules are not
  enumerated; a small Llama block's exhaustive front is pinned in tests/frontend/test_hierarchy.py).

Asserted: the MLP's counts and its front equal to the exhaustive front (deterministic); the numbers go to
bench/README.md.
"""

from __future__ import annotations

import itertools
import sys
import time
from pathlib import Path

from stepsim.frontend import from_onnx
from stepsim.optimize.onnx_hierarchy import search
from stepsim.optimize.onnx_search import symbolic_point
from stepsim.optimize.pareto import pareto_front
from stepsim.simulation.simulate import simulate

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "frontend"))
sys.path.insert(0, str(ROOT / "examples"))
from onnx_blocks import BLOCKS  # noqa: E402
from test_hierarchy import FRONT, mlp  # noqa: E402


def exhaustive(m) -> list:
    points = []
    for tm, n1, n2 in itertools.product((1, 2, 4), (None, 16, 32), (None, 16)):
        per_node = {k: v for k, v in (("fc1", n1), ("fc2", n2)) if v is not None}
        for k in range(4):
            for spill in itertools.combinations(("h1", "h2", "h3"), k):
                w = from_onnx(m, tiling={"tile_m": tm, "per_node": per_node}, spill=spill)
                p = symbolic_point({"tile_m": tm, "per_node": per_node, "spill": list(spill)}, w)
                p.cycles = simulate(w).cycles
                points.append(p)
    return points


def test_hierarchical_against_exhaustive(benchmark, bench_summary):
    m = mlp()
    simulate(from_onnx(m))  # compile outside the timings
    results = []
    benchmark.pedantic(lambda: results.append(search(m)), rounds=3, iterations=1, warmup_rounds=0)
    t0 = time.perf_counter()
    result = search(m)
    t_search = time.perf_counter() - t0
    t0 = time.perf_counter()
    every = exhaustive(m)
    t_all = time.perf_counter() - t0
    front = sorted(every[i].vector(every[i].cycles) for i in pareto_front([p.vector(p.cycles) for p in every]))
    assert [p.vector(p.cycles) for p in result.front] == front == [v for _, v in FRONT]
    assert (len(result.candidates), result.simulations, len(every)) == (42, 8, 144)
    bench_summary("onnx hierarchy", f"mlp: search {t_search:.2f} s ({result.simulations} simulations), exhaustive "
                                    f"{t_all:.2f} s ({len(every)}), ratio {t_all / t_search:.1f}x, same front")


def test_hierarchical_llama_block(benchmark, bench_summary):
    m = BLOCKS["llama"](2, 8, 64, 128)
    simulate(from_onnx(m))
    results = []
    t0 = time.perf_counter()
    benchmark.pedantic(lambda: results.append(search(m)), rounds=1, iterations=1, warmup_rounds=0)
    wall = time.perf_counter() - t0
    r = results[0]
    assert all(p.cycle_bound <= p.cycles for p in r.candidates if p.cycles is not None)
    assert (len(r.candidates), r.simulations, r.pruned) == (1977, 286, 784169)
    assert r.front[0].vector(r.front[0].cycles) == (1552, 37376, 14336)  # gate and up at tile_n 32
    bench_summary("onnx hierarchy", f"llama block: {wall:.2f} s, {len(r.candidates)} built, {r.simulations} "
                                    f"simulations, {r.pruned} dropped unbuilt, front "
                                    f"{[(p.tiling, p.cycles) for p in r.front]}")
