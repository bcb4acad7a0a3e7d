"""The SLO a plan searches against (stepsim/plan/margin.py): the user's limits less the largest held-out step error
of the calibrations that price the candidates, capped at 50 %."""

from __future__ import annotations

from stepsim.plan.margin import MAX_MARGIN, fidelity_margin, search_slo


def _calibration(error):
    return {"calibration": "k", "error": error}


def test_the_margin_is_the_largest_held_out_step_error():
    calibrations = {"sn40l x1": _calibration({"iteration_p50": 0.001, "iteration_p95": 0.02, "iteration_max": 0.0337}),
                    "sn40l x2": _calibration({"iteration_p50": 0.0, "iteration_p95": 0.01, "iteration_max": 0.0125})}
    assert fidelity_margin(calibrations) == 0.0337
    assert search_slo({"ttft": 2.0, "tpot": 0.1}, 0.0337) == {"ttft": 2.0 * (1 - 0.0337), "tpot": 0.1 * (1 - 0.0337)}


def test_no_error_no_margin_and_a_large_one_is_capped():
    assert fidelity_margin({}) == 0.0
    assert fidelity_margin({"a": _calibration(None), "b": _calibration({"iteration_max": float("nan")}),
                            "c": {"calibration": "k"}}) == 0.0
    assert fidelity_margin({"a": _calibration({"iteration_max": 0.9})}) == MAX_MARGIN == 0.5
    assert search_slo({"e2e": 4.0}, 0.0) == {"e2e": 4.0}
