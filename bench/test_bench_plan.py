"""Issue 42's must-show case for ``stepsim plan`` (docs/plan.md), run by hand: the 4-layer Qwen3-30B-A3B shape
(``examples/qwen3-30b-a3b-4layers.json``), the first 300 requests of the Azure conversation trace, SLO p99 TTFT 2 s
and TPOT 100 ms, up to 4 ``sn40l`` sockets, the default space (105 deployments): the plan's front equals the front of
searching every deployment fully, with at least 5x fewer full replays (a replay the plan stops early, its SLO
provably missed, is not full: docs/plan.md §4).

Not in the default benchmark run (``STEPSIM_BENCH_PLAN=1`` runs it): three fast calibrations (1, 2 and 4 chips a
replica; about 10 minutes each for the 1-chip shape on the 2-core machine at load 11-14, 2026-11-25) and a replay
of 300 requests of about 40 s in the Python replay loop (37,782 steps at the offered rate), hundreds of times.
Numbers: bench/README.md, "Capacity planning".
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import stepsim

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "examples" / "qwen3-30b-a3b-4layers.json"


@pytest.mark.skipif(os.environ.get("STEPSIM_BENCH_PLAN") != "1",
                    reason="hours on the 2-core machine today: set STEPSIM_BENCH_PLAN=1")
def test_plan_front_equals_brute_force_qwen3_4layers(shared_traces, tmp_path, bench_summary):
    trace = shared_traces / "azure" / "AzureLLMInferenceTrace_conv.csv"
    kw = dict(slo="ttft=2s,tpot=100ms", limit_requests=300, max_chips=4, verify=False,
              calibration_cache=tmp_path / "cache")
    plan = stepsim.plan(str(MODEL), trace, out=tmp_path / "out", **kw)
    brute = stepsim.plan(str(MODEL), trace, prune=False, **kw)
    front = [(f["deployment"], f["multiplier"], f["goodput_requests_per_s"]) for f in plan.summary["front"]]
    assert front == [(f["deployment"], f["multiplier"], f["goodput_requests_per_s"]) for f in brute.summary["front"]]
    assert brute.summary["replays_stopped"] == 0  # the brute force serves every probe to the end
    ratio = brute.summary["replays"] / plan.summary["replays"]
    bench_summary("plan", f"qwen3-4layers, 300 requests, 105 deployments: plan {plan.summary['replays']} full "
                          f"replays and {plan.summary['replays_stopped']} stopped ({plan.summary['wall_s']:.0f} s), "
                          f"brute force {brute.summary['replays']} ({brute.summary['wall_s']:.0f} s), {ratio:.1f}x")
    assert ratio >= 5
