"""Graph building and metric evaluation time (issue 13, part 2) versus the number of experts.

For the synthetic MoE layer of the HBM scaling bench (B=64, top-8, D=2048, F=768, Dirichlet(0.5) routing) and each
tiling, measures in one run:

* ``build``: ``build_moe`` (constructing every operator and its symbolic shapes);
* ``metrics``: ``Workload.metrics()`` (every operator's off-chip bytes, on-chip bytes and FLOPs, evaluated by the
  exact numeric evaluator :mod:`stepsim.graph.numeric`);
* ``xreplace``: the same per-operator expressions substituted with sympy ``xreplace`` (the former path), and
  asserts that both give identical integers, so the bench also re-checks exactness at 512 experts.

The end-of-run summary prints the times and the growth exponent of build time between consecutive expert
counts (1.0 = linear in the number of operators, which grows linearly with the experts here).
"""

from __future__ import annotations

import math
import time

import pytest
from test_bench_hbm_scaling import synthetic_routing

from stepsim.graph.graph import PUBLISHED
from stepsim.workloads.base import as_int, substitute
from stepsim.workloads.models import moe_model
from stepsim.workloads.moe import build_moe

_BUILD_S: dict[tuple[str, int], float] = {}
EXPERTS = [64, 128, 256, 512]


def _xreplace_totals(workload) -> tuple[int, int, int]:
    """Off-chip bytes, on-chip bytes, graph FLOPs summed over operators through sympy substitution."""
    off = on = flops = 0
    for op in workload.graph.ops:
        off += as_int(substitute(op.off_chip_bytes(), workload.bindings))
        on += as_int(substitute(op.on_chip_bytes(PUBLISHED), workload.bindings))
        flops += as_int(substitute(op.flops(), workload.bindings))
    return off, on, flops


@pytest.mark.parametrize("tiling", ["static", "dynamic"])
@pytest.mark.parametrize("experts", EXPERTS)
def test_build_and_metrics_vs_experts(benchmark, bench_summary, experts, tiling):
    model = moe_model("custom", hidden=2048, intermediate=768, experts=experts, top_k=8)
    routing = synthetic_routing(64, experts, 8, seed=experts)
    t0 = time.perf_counter()
    workload = build_moe(model, routing, tiling=tiling, tile_n=16 if tiling == "static" else None)
    build_s = time.perf_counter() - t0
    _BUILD_S[(tiling, experts)] = build_s
    results = []
    benchmark.pedantic(lambda: results.append(workload.metrics()), rounds=1, iterations=1, warmup_rounds=0)
    t0 = time.perf_counter()
    metrics = workload.metrics()
    metrics_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    reference = _xreplace_totals(workload)
    xreplace_s = time.perf_counter() - t0
    assert (metrics["off_chip_bytes"], metrics["on_chip_bytes"], metrics["graph_flops"]) == reference
    assert results[0] == metrics
    previous = EXPERTS[EXPERTS.index(experts) - 1] if experts != EXPERTS[0] else None
    growth = "     -"
    if previous is not None and (tiling, previous) in _BUILD_S:
        growth = f"E^{math.log(build_s / _BUILD_S[(tiling, previous)]) / math.log(experts / previous):4.2f}"
    benchmark.extra_info.update(build_s=build_s, metrics_s=metrics_s, xreplace_s=xreplace_s,
                                operators=len(workload.graph.ops))
    bench_summary("MoE graph build and metrics vs experts (B=64, top-8, D=2048, F=768)",
                  f"E={experts:<4d} {tiling:7s} {len(workload.graph.ops):6d} ops  build {build_s:6.3f} s ({growth})"
                  f"  metrics {metrics_s:6.3f} s  xreplace {xreplace_s:6.3f} s")
