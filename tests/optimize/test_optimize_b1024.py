"""``stepsim optimize`` on a batch of 1,024 tokens prunes at least 5x, as on B=64: Mixtral-8x7B on a synthetic
B=1024 routing trace (uniform, seed 1), the default space of 336 candidates.

At B=1024 most static layouts with a region per expert deadlock at the FIFO depth of 2 (their experts' paths
cannot hold the tokens routed between one expert's tile and the next token that closes it); the static proof
(stepsim.analysis.deadlock_proof, dedicated regions) finds 42 of them without simulating, which takes the search
from 102 simulations (3.3x) to 64 (5.25x) with the same front.
"""

from __future__ import annotations

import shutil

import pytest

from stepsim.base.errors import DeadlockError
from stepsim.cli import main
from stepsim.optimize import optimize
from stepsim.results.records import run_config

pytestmark = pytest.mark.slow


def _front(result) -> list:
    return sorted((c.run_id, c.cycles, c.on_chip_bytes, c.allocated_flops_per_cycle) for c in result.front)


def test_mixtral_b1024_prunes_5x_with_the_front_of_the_search_without_the_new_proof(tmp_path, serial, monkeypatch,
                                                                                    capsys):
    trace = tmp_path / "mixtral_b1024.arrow"
    assert main(["trace", "synth", "routing", "--model", "mixtral", "--tokens", "1024", "--seed", "1",
                 "--out", str(trace)]) == 0
    capsys.readouterr()
    result = optimize("moe", out=tmp_path / "with", model="mixtral-8x7b", trace=str(trace), executor=serial)
    assert (result.candidates, result.simulations, result.to_json()["proven_deadlocks"]) == (336, 64, 189)
    assert result.candidates >= 5 * result.simulations
    # the same search without the dedicated-region proof: 42 more simulations, every one a deadlock. It starts from
    # a copy of the first search's simulations (runs/, a resumable sweep keyed by each candidate's configuration:
    # the 64 both make are read back, the other 38 run); its metrics sweep, which holds the proofs, is its own
    from stepsim.analysis import deadlock_proof

    monkeypatch.setattr(deadlock_proof, "DEDICATED_KINDS", ())  # no dedicated path qualifies
    shutil.copytree(tmp_path / "with" / "runs", tmp_path / "without" / "runs")
    without = optimize("moe", out=tmp_path / "without", model="mixtral-8x7b", trace=str(trace), executor=serial)
    assert (without.simulations, without.to_json()["proven_deadlocks"]) == (102, 147)
    assert _front(without) == _front(result)
    before = {c.run_id: c.status for c in without.candidate_list}
    newly = [c for c in result.candidate_list if c.status == "deadlock" and before[c.run_id] != "deadlock"]
    assert len(newly) == 42 and {before[c.run_id] for c in newly} == {"failed", "pruned"}
    for c in newly:  # those the search without it never simulated deadlock too
        if before[c.run_id] == "pruned":
            with pytest.raises(DeadlockError):
                run_config({**c.config, "mode": "simulate"})
