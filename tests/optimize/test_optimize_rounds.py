"""The pruning loop (stepsim.optimize.search.search_rounds) on synthetic candidates, without simulating.

A round takes only candidates that no earlier candidate could prune (``next_round``), so the candidates
simulated are those of simulating one at a time in promise order, whatever the round size; the front is the
exhaustive one. Checked on random spaces with ties, failures and cycles at or above each bound.
"""

from __future__ import annotations

import random

import pytest

from stepsim.optimize.pareto import pareto_front
from stepsim.optimize.search import Candidate, SearchState, next_round, search_rounds


def _space(seed: int, n: int) -> tuple[list, dict]:
    """``n`` candidates with small-integer bounds (many ties) and hidden outcomes: cycles >= bound or None."""
    rng = random.Random(seed)
    candidates, outcome = [], {}
    for i in range(n):
        c = Candidate(index=i, config={"i": i}, run_id=f"r{i}", lower_bound=rng.randint(10, 30),
                      on_chip_bytes=rng.randint(1, 6), allocated_flops_per_cycle=rng.randint(1, 4))
        candidates.append(c)
        outcome[i] = None if rng.random() < 0.15 else c.lower_bound + rng.choice([0, 0, 1, 3, 8, 20])
    return candidates, outcome


def _search(seed: int, n: int, round_size: int) -> tuple[SearchState, list]:
    candidates, outcome = _space(seed, n)
    state = SearchState(candidates=candidates)
    batches = []

    def simulate(batch):
        batches.append([c.index for c in batch])
        for c in batch:
            if outcome[c.index] is None:
                c.status, c.error = "failed", "deadlock"
            else:
                c.status, c.cycles = "simulated", outcome[c.index]

    search_rounds(state, round_size, simulate)
    return state, batches


@pytest.mark.parametrize("seed", range(12))
def test_simulated_set_does_not_depend_on_the_round_size(seed):
    one, one_batches = _search(seed, 60, 1)
    simulated = {c.index: c.status for c in one.candidates if c.status in ("simulated", "failed")}
    # the exhaustive front, from every candidate's outcome
    _, outcome = _space(seed, 60)
    finished = [(i, (outcome[i], c.on_chip_bytes, c.allocated_flops_per_cycle))
                for i, c in enumerate(one.candidates) if outcome[i] is not None]
    exhaustive = sorted(finished[k][0] for k in pareto_front([p for _, p in finished]))
    for round_size in (2, 3, 4, 8, 60):
        state, batches = _search(seed, 60, round_size)
        assert {c.index: c.status for c in state.candidates if c.status in ("simulated", "failed")} == simulated
        assert all(len(b) <= round_size for b in batches)
        assert sum(len(b) for b in batches) == len(simulated)
        front = [c for c in state.candidates if c.status == "simulated"]
        front = sorted(front[k].index for k in pareto_front([c.objectives for c in front]))
        assert front == exhaustive
    assert len(one_batches) == len(simulated)
    assert all(c.status in ("simulated", "failed", "pruned") for c in one.candidates)


def test_next_round_waits_for_a_possible_pruner():
    """B (bound 12, 4 bytes, 2 FLOP/cycle) could be pruned by A (bound 10, 3 bytes, 2) if A runs in at most 12
    cycles, so it waits; C (bound 12, 2 bytes) cannot be pruned by A (more bytes) and runs now. D ties A's
    whole optimistic vector: equal vectors never dominate, so D runs too."""
    a, b, c, d = (Candidate(index=i, config={}, lower_bound=lb, on_chip_bytes=on, allocated_flops_per_cycle=2)
                  for i, (lb, on) in enumerate(((10, 3), (12, 4), (12, 2), (10, 3))))
    assert [x.index for x in next_round([a, d, c, b], 4)] == [0, 3, 2]
    assert [x.index for x in next_round([a, d, c, b], 2)] == [0, 3]
