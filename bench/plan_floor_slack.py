"""How loose a plan's duration floor is where its searches ended (docs/plan.md §6, bench/README.md "Session 39"):
for every deployment a plan searched to a rate, the floor of its duration at that rate
(:class:`stepsim.plan.search.DurationFloor`) over the duration its run took, and its goodput bound there and one
grid step above (what a failure there would have had to beat). A deployment whose goodput is a fraction f of its
wave's best is cut only where this ratio is below about f: the slack is what the plan cannot prune.

    python bench/plan_floor_slack.py DIR   # a plan's --out folder (plan.json and deployments.parquet)

Prints one JSON line a searched deployment.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def slack(folder: Path):
    """``{"deployment", "multiplier", "goodput", "floor_over_duration", "bound", "bound_one_step_up"}`` of each
    deployment searched to a rate in the plan written to ``folder``."""
    import pyarrow.parquet as pq

    from stepsim.models.presets import resolve_model
    from stepsim.plan.api import base_trace
    from stepsim.plan.pricing import least_touched
    from stepsim.plan.search import STEPS_PER_DOUBLING, goodput_bound, rate_bound
    from stepsim.plan.space import Deployment, SchedulerChoice
    from stepsim.serve.api import resolve_serving_hardware
    from stepsim.serve.metrics import parse_slo

    summary = json.loads((folder / "plan.json").read_text())
    base, _ = base_trace(summary["requests"], summary["limit_requests"], summary["arrival_scale"], None)
    model = resolve_model(summary["model"])
    slo = parse_slo(summary["slo"])
    rows = pq.read_table(folder / "deployments.parquet").to_pylist()
    touched = None
    if model.is_moe and not model.unmodelled():  # the plan's providers' routing (seed 0): pricing.ShapePricer
        from stepsim.serve.routing import SyntheticRouting

        routing = SyntheticRouting(model.experts, model.top_k, model.layers, seed=0)
        touched = least_touched(routing, model.layers, max(r["max_seqs"] for r in rows))
    for row in rows:
        if row["goodput_requests_per_s"] is None:
            continue
        dep = Deployment(row["chips_per_replica"], row["replicas"], row["router"],
                         SchedulerChoice(row["scheduler"], row["max_seqs"], row["max_batch_tokens"],
                                         row["chunk_tokens"]), row["hardware"],
                         () if row["prefill_chips"] is None else (row["prefill_chips"], row["decode_chips"]))
        _, floor, _ = rate_bound(dep, model, resolve_serving_hardware(dep.hardware), base, slo, summary["percentile"],
                                 touched)
        m = row["multiplier"]
        duration = base.n * row["slo_attainment"] / row["goodput_requests_per_s"]  # good requests / goodput
        yield {"deployment": row["deployment"], "multiplier": m, "goodput": row["goodput_requests_per_s"],
               "floor_over_duration": floor.at(m) / duration, "bound": goodput_bound(base.n, m, floor),
               "bound_one_step_up": goodput_bound(base.n, m * 2 ** (1 / STEPS_PER_DOUBLING), floor)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="a plan's --out folder")
    args = parser.parse_args(argv)
    for line in slack(args.folder):
        print(json.dumps(line))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
