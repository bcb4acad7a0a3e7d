"""``stepsim optimize`` prunes at least 5x on a B=1024 Mixtral-8x7B trace with the real trace's skew, and finds the
front an exhaustive search finds.

The trace: the seeded Plackett-Luce routing model of ``stepsim.serve.routing`` (Zipf law with an exponential
cut-off over a seeded popularity order), its skew fitted (``fit_skew``) to the real Mixtral B=64 trace
(``expert_routing/mixtral_b64/008_010.npz``), 1,024 tokens drawn with seed 1. Unlike the trace of
test_optimize_b1024.py (``stepsim trace synth routing``'s Dirichlet popularity, not fitted to anything), this one
keeps the real trace's imbalance: the busiest expert gets 2.2 times the idlest's tokens (372 against 170; the real
batch 2.4 times, 24 against 10), which the bounds of stepsim.analysis.bounds must see through to prune.
"""

from __future__ import annotations

import numpy as np
import pytest

from stepsim.optimize import optimize
from stepsim.serve.routing import FITTED_SKEW, SyntheticRouting, fit_skew

pytestmark = [pytest.mark.slow, pytest.mark.traces]


def _front(result) -> list:
    return sorted((c.run_id, *c.objectives) for c in result.front)  # (cycles, on-chip, compute, chips)


def skewed_mixtral_b1024(shared_traces, path):
    """Write the B=1024 trace (module docstring) to ``path`` (``.npz``) and return its routing."""
    real = np.load(shared_traces / "expert_routing" / "mixtral_b64" / "008_010.npz")["data"]
    skew = fit_skew(real, 8)
    assert skew == FITTED_SKEW[8] == (0.1, 0.09)
    routing = SyntheticRouting(8, 2, 1, seed=1, skew=skew).route(1024)[:, 0, :]
    np.savez(path, data=routing)
    return routing


def test_skewed_b1024_prunes_5x_with_the_exhaustive_front(shared_traces, tmp_path, serial, exhaustive_front):
    trace = tmp_path / "mixtral_b1024_skewed.npz"
    routing = skewed_mixtral_b1024(shared_traces, trace)
    assert np.bincount(routing.ravel(), minlength=8).tolist() == [186, 231, 279, 255, 170, 219, 336, 372]
    result = optimize("moe", out=tmp_path / "opt", model="mixtral-8x7b", trace=str(trace), executor=serial)
    doc = result.to_json()
    assert (result.candidates, result.simulations, doc["failed_simulations"], doc["proven_deadlocks"]) == (
        336, 63, 10, 0)
    assert result.candidates >= 5 * result.simulations  # 5.33x
    front, cycles = exhaustive_front(result)
    assert _front(result) == front and len(front) == 27
    # the fastest point: dynamic tiling, one region per expert
    assert min(cycles[c.run_id] for c in result.front) == 7147054
