"""Graph building and metric evaluation time (issue 13, part 2) versus the number of experts.

For the synthetic MoE layer of the HBM scaling bench (B=64, top-8, D=2048, F=768, Dirichlet(0.5) routing), each
tiling and 64 to 2048 experts, measures in one run:

* ``build``: ``build_moe`` (constructing every operator and its symbolic shapes);
* ``metrics``: ``Workload.metrics()`` (every operator's off-chip bytes, on-chip bytes and FLOPs, evaluated by the
  exact numeric evaluator :mod:`stepsim.graph.numeric`, FLOPs and off-chip bytes factor by factor; the first call,
  which also inserts the broadcasts, is the benchmark's round, the second one is timed apart);
* ``xreplace`` (up to :data:`XREPLACE_MAX_EXPERTS`): the same per-operator expressions substituted with sympy
  ``xreplace`` (the former path), and asserts that both give identical integers, so the bench also re-checks
  exactness.

It also counts the sympy sums and products (``AssocOp`` constructor calls) a third ``metrics()`` makes: a
deterministic number, 0 under static tiling and about 30 per expert under dynamic tiling (a dynamic tile's FLOPs
per firing and bytes, built anew for each operator because each holds another expert's token-count symbol): the
work grows linearly with the experts, and the time per call is what varies between runs.

The end-of-run summary prints the times and the growth exponents of build and metrics time between consecutive
expert counts (1.0 = linear in the number of operators, which grows linearly with the experts here). Nothing asserts
on time.
"""

from __future__ import annotations

import math
import time

import pytest
from test_bench_hbm_scaling import synthetic_routing

from stepsim.graph.graph import PUBLISHED
from stepsim.graph.numeric import sympy_expressions_built
from stepsim.models.presets import moe_model
from stepsim.workloads.base import as_int, substitute
from stepsim.workloads.moe.build import build_moe

#: (tiling, experts) -> (build seconds, metrics seconds), for the growth exponents
_TIMES: dict[tuple[str, int], tuple[float, float]] = {}
EXPERTS = [64, 128, 256, 512, 1024, 2048]
#: the sympy reference is the slow former path; above this it only adds minutes to the run
XREPLACE_MAX_EXPERTS = 512


def _xreplace_totals(workload) -> tuple[int, int, int]:
    """Off-chip bytes, on-chip bytes, graph FLOPs summed over operators through sympy substitution."""
    off = on = flops = 0
    for op in workload.graph.ops:
        off += as_int(substitute(op.off_chip_bytes(), workload.bindings))
        on += as_int(substitute(op.on_chip_bytes(PUBLISHED), workload.bindings))
        flops += as_int(substitute(op.flops(), workload.bindings))
    return off, on, flops


def _growth(tiling: str, experts: int, index: int, seconds: float) -> str:
    """``E^x``: the exponent of the time's growth from the previous expert count (``index`` into the times)."""
    previous = EXPERTS[EXPERTS.index(experts) - 1] if experts != EXPERTS[0] else None
    if previous is None or (tiling, previous) not in _TIMES:
        return "     -"
    return f"E^{math.log(seconds / _TIMES[(tiling, previous)][index]) / math.log(experts / previous):4.2f}"


@pytest.mark.parametrize("tiling", ["static", "dynamic"])
@pytest.mark.parametrize("experts", EXPERTS)
def test_build_and_metrics_vs_experts(benchmark, bench_summary, experts, tiling):
    model = moe_model("custom", hidden=2048, intermediate=768, experts=experts, top_k=8)
    routing = synthetic_routing(64, experts, 8, seed=experts)
    t0 = time.perf_counter()
    workload = build_moe(model, routing, tiling=tiling, tile_n=16 if tiling == "static" else None)
    build_s = time.perf_counter() - t0
    results = []
    benchmark.pedantic(lambda: results.append(workload.metrics()), rounds=1, iterations=1, warmup_rounds=0)
    t0 = time.perf_counter()
    metrics = workload.metrics()
    metrics_s = time.perf_counter() - t0
    assert results[0] == metrics
    # a third call: the count's wrapper stays out of the timed one
    sympy_built = sympy_expressions_built(workload.metrics)
    xreplace = "        -"
    xreplace_s = None
    if experts <= XREPLACE_MAX_EXPERTS:
        t0 = time.perf_counter()
        reference = _xreplace_totals(workload)
        xreplace_s = time.perf_counter() - t0
        assert (metrics["off_chip_bytes"], metrics["on_chip_bytes"], metrics["graph_flops"]) == reference
        xreplace = f"{xreplace_s:7.3f} s"
    growth = _growth(tiling, experts, 0, build_s), _growth(tiling, experts, 1, metrics_s)
    _TIMES[(tiling, experts)] = (build_s, metrics_s)
    benchmark.extra_info.update(build_s=build_s, metrics_s=metrics_s, xreplace_s=xreplace_s,
                                operators=len(workload.graph.ops), sympy_built=sympy_built)
    bench_summary("MoE graph build and metrics vs experts (B=64, top-8, D=2048, F=768)",
                  f"E={experts:<4d} {tiling:7s} {len(workload.graph.ops):6d} ops  build {build_s:6.3f} s ({growth[0]})"
                  f"  metrics {metrics_s:6.3f} s ({growth[1]})  sympy {sympy_built:5d}  xreplace {xreplace}")
