"""The SLO a plan searches against: the user's limits less the fidelity error of the prices (docs/plan.md §4,
"Margin").

A plan prices its candidates with fast mode's calibrations (:mod:`stepsim.plan.pricing`) and finds each one's
highest rate meeting the SLO to the grid's step, so the recommended deployment sits at the SLO's edge under those
prices. Re-served with a fresh calibration (its own run's, as ``stepsim serve --fidelity fast`` makes it) its
latencies move by the prices' error, and half the time that is over the limit (issue 42's disaggregated test: 14.5 %
over, 13.96 % above the plan's own TTFT). A latency is a sum of step prices; every held-out step of a
calibration was priced within its ``iteration_max`` of the engine's cycles (its ``error``), so a latency of the
same steps is within that relative error too. The plan therefore searches against every limit times
``1 - margin``, the margin the largest ``iteration_max`` of the calibrations that price its candidates, and checks
the recommended deployment's re-serve against the user's limits. (The schedule itself can move with the prices,
so this is the measured error of the prices, not a proof: the re-serve's ``meets_slo`` says whether it held.)
"""

from __future__ import annotations

#: the most a margin may take off a limit: a calibration whose held-out error is larger prices nothing a plan can
#: use, and the limit must stay > 0
MAX_MARGIN = 0.5


def fidelity_margin(calibrations: dict) -> float:
    """The margin (a fraction of each limit) for the calibrations a plan priced its candidates with
    (``{shape: {"calibration": key, "error": {..., "iteration_max": e}}}``): the largest ``iteration_max``, capped
    at :data:`MAX_MARGIN`; 0 when none says one."""
    errors = [c["error"].get("iteration_max") for c in calibrations.values() if isinstance(c.get("error"), dict)]
    errors = [float(e) for e in errors if isinstance(e, (int, float)) and e == e and e >= 0]
    return min(max(errors, default=0.0), MAX_MARGIN)


def search_slo(slo_seconds: dict, margin: float) -> dict:
    """The limits a plan's rate search holds its candidates to (s): each of ``slo_seconds`` times ``1 - margin``."""
    return {key: limit * (1.0 - margin) for key, limit in slo_seconds.items()}
