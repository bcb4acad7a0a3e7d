"""``stepsim optimize`` prunes at least 5x on a B=1024 Mixtral-8x7B trace with the real trace's skew, and finds the
front an exhaustive search finds.

The trace: the seeded Plackett-Luce routing model of ``stepsim.serve.routing`` (Zipf law with an exponential
cut-off over a seeded popularity order), its skew fitted (``fit_skew``) to the real Mixtral B=64 trace
(``expert_routing/mixtral_b64/008_010.npz``), 1,024 tokens drawn with seed 1. Unlike the trace of
test_optimize_b1024.py (``stepsim trace synth routing``'s Dirichlet popularity, not fitted to anything), this one
keeps the real trace's imbalance: the busiest expert gets 2.2 times the idlest's tokens (372 against 170; the real
batch 2.4 times, 24 against 10), which the bounds of stepsim.analysis.bounds must see through to prune.

The exhaustive search (every candidate simulated, 4 minutes on a quiet core) is stored in
``data/mixtral_b1024_skewed_exhaustive.json`` by ``data/refresh_skewed_exhaustive.py``, as the serving tests store
their exact runs. The test proves the table is today's before it trusts it: the same candidates, the search's own
63 fresh simulations equal to the table's cycles, and the pruned candidates nearest the front (those a wrong bound
would most likely have lost) simulated again.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from stepsim.optimize import optimize
from stepsim.optimize.pareto import pareto_front
from stepsim.results.records import run_config
from stepsim.serve.routing import FITTED_SKEW, SyntheticRouting, fit_skew

pytestmark = [pytest.mark.slow, pytest.mark.traces]

EXHAUSTIVE = Path(__file__).parent / "data" / "mixtral_b1024_skewed_exhaustive.json"
STALE = "stale exhaustive table: run python tests/optimize/data/refresh_skewed_exhaustive.py"
#: pruned candidates simulated again in every run: the ones with the fewest stored cycles
RECHECKED = 4


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


def stored_front(result, cycles: dict) -> list:
    """The exhaustive front (conftest.exhaustive's form) from the stored ``{run_id: cycles or None}``."""
    ok = [c for c in result.candidate_list if cycles.get(c.run_id) is not None]
    points = [(cycles[c.run_id], c.on_chip_bytes, c.allocated_flops_per_cycle, c.chips) for c in ok]
    return sorted((ok[i].run_id, *points[i]) for i in pareto_front(points))


def test_skewed_b1024_prunes_5x_with_the_exhaustive_front(shared_traces, tmp_path, serial):
    trace = tmp_path / "mixtral_b1024_skewed.npz"
    routing = skewed_mixtral_b1024(shared_traces, trace)
    assert np.bincount(routing.ravel(), minlength=8).tolist() == [186, 231, 279, 255, 170, 219, 336, 372]
    result = optimize("moe", out=tmp_path / "opt", model="mixtral-8x7b", trace=str(trace), executor=serial)
    doc = result.to_json()
    assert (result.candidates, result.simulations, doc["failed_simulations"], doc["proven_deadlocks"]) == (
        336, 63, 10, 0)
    assert result.candidates >= 5 * result.simulations  # 5.33x

    table = json.loads(EXHAUSTIVE.read_text())
    assert sorted(c.run_id for c in result.candidate_list) == table["candidates"], STALE
    cycles = table["cycles"]
    simulated = [c for c in result.candidate_list if c.status == "simulated"]
    assert {c.run_id: c.cycles for c in simulated} == {c.run_id: cycles[c.run_id] for c in simulated}, STALE
    pruned = sorted((cycles[c.run_id], c.run_id, c) for c in result.candidate_list
                    if c.status == "pruned" and cycles.get(c.run_id) is not None)
    for stored, _, c in pruned[:RECHECKED]:
        assert run_config({**c.config, "mode": "simulate"}).row["cycles"] == stored, STALE

    front = stored_front(result, cycles)
    assert _front(result) == front and len(front) == 27
    # the fastest point: dynamic tiling, one region per expert
    assert min(cycles[c.run_id] for c in result.front) == 7147054
