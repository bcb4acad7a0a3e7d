"""The duration floor that bounds a deployment's goodput in stepsim plan's pruning (stepsim/plan/search.py
DurationFloor, docs/plan.md §4): each request's arrival plus the larger of its least latency and the floor of the
work arriving from it on (steps capped by max_seqs and the token budget, over the replicas). Its soundness on
served runs: tests/plan/test_plan.py::test_every_run_lasts_at_least_its_duration_floor."""

from __future__ import annotations

import math

import numpy as np
import pytest

from stepsim.models.presets import resolve_model
from stepsim.plan.evaluate import BaseTrace
from stepsim.plan.pricing import StepFloor
from stepsim.plan.search import DurationFloor, goodput_bound, rate_bound
from stepsim.plan.space import Deployment, SchedulerChoice
from stepsim.serve.api import resolve_serving_hardware

DENSE = {"model_type": "llama", "hidden_size": 256, "intermediate_size": 512, "num_attention_heads": 4,
         "num_key_value_heads": 2, "head_dim": 64, "num_hidden_layers": 2, "vocab_size": 1000,
         "max_position_embeddings": 4096}


def test_the_floor_keeps_only_the_pairs_no_other_exceeds_and_loses_nothing():
    rng = np.random.default_rng(5)
    delays, rests = rng.uniform(0, 1, 300).tolist(), rng.uniform(0, 1, 300).tolist()
    floor = DurationFloor.of(delays, rests)
    assert 1 <= len(floor.points) < 20
    for m in (2.0 ** (e / 4) for e in range(-32, 33)):
        assert floor.at(m) == max(d / m + c for d, c in zip(delays, rests))
    assert DurationFloor.from_json(floor.to_json()) == floor


def _contexts(prompt: int, output: int, chunk: int) -> tuple[int, int]:
    """The cached tokens a request's prompt chunks and decode steps read, as docs/plan.md §4 counts them: chunks of
    ``chunk`` tokens, the short one first, each reading the ones before it; output token i (2 .. output) computed
    over the prompt and the i - 2 outputs before its input."""
    sizes = ([prompt % chunk] if prompt % chunk else []) + [chunk] * (prompt // chunk)
    return sum(sum(sizes[:k]) for k in range(len(sizes))), sum(prompt + i - 2 for i in range(2, output + 1))


def _naive_floor(dep, model, hw, base, per_request, per_step):
    """The floor as docs/plan.md §4 states it, request by request over the requests arriving at or after it."""
    floor = StepFloor(model, hw, dep.chips_per_replica)
    prompt_steps = [math.ceil(int(p) / per_request) for p in base.prompt]
    contexts = [_contexts(int(p), int(o), per_request) for p, o in zip(base.prompt, base.output)]
    out = []
    for j in range(base.n):
        later = [i for i in range(base.n) if base.arrival[i] >= base.arrival[j]]
        o = int(base.output[j])
        least = (floor(prompt_steps[j], int(base.prompt[j]), context=contexts[j][0])
                 + floor(o - 1, o - 1, o - 1, contexts[j][1]))
        seq_steps = sum(prompt_steps[i] + int(base.output[i]) - 1 for i in later)
        tokens = sum(int(base.prompt[i]) + int(base.output[i]) - 1 for i in later)
        decode = sum(int(base.output[i]) - 1 for i in later)
        context = sum(sum(contexts[i]) for i in later)
        steps = max(math.ceil(seq_steps / dep.scheduler.max_seqs), math.ceil(tokens / per_step))
        out.append((float(base.arrival[j] - base.arrival.min()),
                    max(least, floor(steps, tokens, decode, context) / dep.replicas)))
    return out


@pytest.mark.parametrize("replicas,scheduler,work_binds", [(1, SchedulerChoice("vllm", 2, 64), True),
                                                           (3, SchedulerChoice("vllm", 128, 64), False),
                                                           (3, SchedulerChoice("orca", 1), True)])
def test_the_floor_is_the_stated_one(tmp_path, replicas, scheduler, work_binds):
    (tmp_path / "dense.json").write_text(__import__("json").dumps(DENSE))
    model = resolve_model(str(tmp_path / "dense.json"))
    hw = resolve_serving_hardware("sn40l")
    rng = np.random.default_rng(11)
    # 20 requests, the last 8 arriving together (ties), prompts 5-299 tokens, 1-40 outputs
    arrival = np.sort(np.concatenate([rng.uniform(0, 0.002, 12), np.full(8, 0.003)]))
    base = BaseTrace(arrival, rng.integers(5, 300, 20), rng.integers(1, 41, 20))
    dep = Deployment(1, replicas, "none" if replicas == 1 else "round-robin", scheduler)
    per_request = 64 if scheduler.policy == "vllm" else int(base.prompt.max())
    per_step = 64 if scheduler.policy == "vllm" else scheduler.max_seqs * per_request
    naive = _naive_floor(dep, model, hw, base, per_request, per_step)
    floor = rate_bound(dep, model, hw, base, {}, 99.0)[1]
    for m in (2.0 ** (e / 16) for e in range(-128, 129, 7)):
        assert floor.at(m) == max(d / m + c for d, c in naive)
        assert goodput_bound(20, m, floor) == 20 / floor.at(m)
    # at a rate high enough that every request arrives at once: the whole work over the replicas, when few
    # sequences a step (max_seqs 2; Orca's 1) make it longer than any request's least latency
    floor_s = StepFloor(model, hw, 1)
    least = max(floor_s(math.ceil(int(p) / per_request), int(p), context=_contexts(int(p), int(o), per_request)[0])
                + floor_s(int(o) - 1, int(o) - 1, int(o) - 1, _contexts(int(p), int(o), per_request)[1])
                for p, o in zip(base.prompt, base.output))
    assert floor.at(1e12) == pytest.approx(max(c for _, c in naive), rel=1e-9)
    assert (floor.at(1e12) > least * (1 + 1e-9)) == work_binds
