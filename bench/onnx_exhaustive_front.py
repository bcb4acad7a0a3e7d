"""Record the exhaustive Pareto front of an ONNX model's schedule space (every ``tile_m``, every MatMul's
``tile_n``, every set of spilled values: the space of ``stepsim optimize model.onnx --hierarchical``), by building
every schedule and simulating every distinct lowering. Too slow for a unit test on the Llama block; its result is
pinned in tests/frontend/test_hierarchy.py (``LLAMA_EXHAUSTIVE``), which the search must equal.

``--check-bounds`` also checks the search's bounds against the engine on every schedule, as the unit tests do on
the small spaces: each schedule's cycle bound, and each subtree's vector against every schedule below it in the search's
tree (``bound_violations`` in the output: 0).

    PYTHONPATH=. python bench/onnx_exhaustive_front.py llama 1 4 16 32 [--check-bounds]
"""

from __future__ import annotations

import itertools
import json
import sys
import time
from pathlib import Path

from stepsim.frontend import from_onnx
from stepsim.frontend.fusion import edge_name
from stepsim.frontend.layouts import groups_rows_cols
from stepsim.optimize.onnx_hierarchy import bounded, matmul_options
from stepsim.optimize.onnx_search import tile_space
from stepsim.optimize.pareto import pareto_front
from stepsim.results.records import allocated_compute_flops
from stepsim.simulation.simulate import simulate

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from onnx_blocks import BLOCKS  # noqa: E402


def exhaustive(m, check_bounds: bool = False) -> dict:
    """``{"schedules", "lowerings", "front": [[cycles, on_chip_bytes, allocated_flops_per_cycle], ...]}`` (and
    ``bound_violations`` with ``check_bounds``)."""
    report = from_onnx(m).frontend
    values = list(dict.fromkeys(e.value for e in report.edges))
    options = matmul_options(report)
    rows = [groups_rows_cols(lay.shape)[1] for lay in report.layouts.values()]
    tms = sorted({t["tile_m"] for t in tile_space(rows, 1)})
    seen, schedules, violations = {}, 0, 0
    for tm in tms:
        for combo in itertools.product(*options.values()):
            per_node = {k: v for k, v in zip(options, combo) if v is not None}
            subtrees = {}  # spill set -> (subtree vector, the schedule's vector)
            for k in range(len(values) + 1):
                for spill in itertools.combinations(values, k):
                    schedules += 1
                    tiling = {"tile_m": tm, "per_node": per_node, "spill": list(spill)}
                    try:
                        w = from_onnx(m, tiling={"tile_m": tm, "per_node": per_node}, spill=spill)
                    except Exception:  # not buildable: left out, as the search leaves it out
                        continue
                    key = (tm, tuple(sorted(per_node.items())),
                           tuple(edge_name(e.value, e.consumer) for e in w.frontend.spilled()))
                    if key not in seen:
                        met = w.metrics()
                        seen[key] = (simulate(w).cycles, met["on_chip_bytes"], allocated_compute_flops(w))
                    if check_bounds:
                        n = bounded(tiling, w)
                        violations += n.point.cycle_bound > seen[key][0]
                        first = max((values.index(v) + 1 for v in spill), default=0)  # children: later values
                        subtrees[frozenset(spill)] = (n.subtree(frozenset(values[:first]) - set(spill)), first,
                                                      seen[key])
            for spill, (sub, first, _) in subtrees.items():  # every schedule below each one in the search's tree
                violations += sum(any(a > b for a, b in zip(sub, vector)) for more, (_, _, vector) in subtrees.items()
                                  if spill <= more and all(values.index(v) >= first for v in more - spill))
    vectors = list(seen.values())
    front = sorted({vectors[i] for i in pareto_front(vectors)})
    out = {"schedules": schedules, "lowerings": len(seen), "front": [list(v) for v in front]}
    return {**out, "bound_violations": violations} if check_bounds else out


if __name__ == "__main__":
    args = sys.argv[1:]
    check = "--check-bounds" in args
    name, *dims = [a for a in args if a != "--check-bounds"]
    t0 = time.perf_counter()
    out = exhaustive(BLOCKS[name](*map(int, dims)), check)
    out["seconds"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(out))
