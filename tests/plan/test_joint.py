"""Replicas replayed together (stepsim/plan/joint.py) against the fixed point of separate replays
(stepsim/plan/replicas.py) on random traces with constant-time steps: the same routing and every request's times
bit for bit, for both state-dependent routers, 2-4 replicas and the three schedulers (no calibration needed: the
loop and the routing are what is checked; tests/plan/test_plan.py does it on the fast model's mapped steps)."""

from __future__ import annotations

import numpy as np
import pytest

from stepsim.plan.joint import joint_replay
from stepsim.plan.replicas import route
from stepsim.serve.kv_cache import kv_capacity
from stepsim.serve.latency import ConstantLatency
from stepsim.serve.replay import replay
from stepsim.serve.replay_compiled import CompiledLoop
from stepsim.serve.scheduler import Scheduler, SchedulerConfig

SETTINGS = {"vllm": {"max_num_seqs": 4, "max_num_batched_tokens": 64}, "sarathi": {"max_num_seqs": 3,
                                                                                   "chunk_tokens": 32},
            "orca": {"max_num_seqs": 2}}


def _scheduler(policy: str, blocks: int) -> Scheduler:
    return Scheduler(SchedulerConfig.make(policy, **SETTINGS[policy]), kv_capacity(blocks * 16, 0, 1, 16), 512)


def _fixed_point(router, replicas, arrival, prompt, output, policy, blocks, seconds):
    """Rounds of separate replays until the routing repeats (:mod:`stepsim.plan.replicas`)."""
    kv = prompt + output
    assignment = route(router, arrival, kv, replicas, None, None)
    while True:
        first, finish = np.full(len(arrival), np.nan), np.full(len(arrival), np.nan)
        for r in range(replicas):
            idx = np.flatnonzero(assignment == r)
            if len(idx):
                out = replay(arrival[idx], prompt[idx], output[idx], _scheduler(policy, blocks),
                             ConstantLatency(seconds))
                first[idx], finish[idx] = out.first_token, out.finish
        again = route(router, arrival, kv, replicas, assignment, finish)
        if np.array_equal(again, assignment):
            return assignment, first, finish
        assignment = again


@pytest.mark.parametrize("policy", ["vllm", "sarathi", "orca"])
@pytest.mark.parametrize("router", ["least-outstanding", "kv-load"])
def test_replicas_replayed_together_are_the_fixed_point_on_random_traces(policy, router):
    rng = np.random.default_rng({"vllm": 1, "sarathi": 2, "orca": 3}[policy] + 10 * (router == "kv-load"))
    routed_apart = 0
    for _ in range(25):
        n = int(rng.integers(1, 40))
        replicas = int(rng.integers(2, 5))
        # arrivals on a coarse grid: ties, and steps ending exactly at an arrival
        arrival = np.sort(rng.integers(0, 60, n)) * 0.25
        prompt, output = rng.integers(1, 90, n), rng.integers(1, 12, n)
        # few blocks: preemption (Orca reserves max_model_len, 32 blocks, a request: one to three at once)
        blocks = int(rng.integers(32, 100)) if policy == "orca" else int(rng.integers(8, 40))
        seconds = float(rng.choice([0.25, 0.5, 0.75, 1.0]))

        def replica():
            scheduler = _scheduler(policy, blocks)
            return CompiledLoop.make(n, scheduler, ConstantLatency(seconds)), scheduler, lambda: None

        together = joint_replay(router, replicas, arrival, prompt, output, replica)
        assignment, first, finish = _fixed_point(router, replicas, arrival, prompt, output, policy, blocks, seconds)
        assert together.assignment.tolist() == assignment.tolist()
        assert together.first_token.tolist() == first.tolist()
        assert together.finish.tolist() == finish.tolist()
        routed_apart += len(np.unique(assignment)) > 1
    assert routed_apart >= 10  # the routers did spread the requests (not every case one replica's)
