"""The schedulers against their rules (docs/serving.md, SERVING.md section 5): a lone request's exact timing,
per-step limits, KV-block accounting, recompute preemption, token conservation; Orca and Sarathi variants."""

from __future__ import annotations

import numpy as np
import pytest

from stepsim.serve.kv_cache import blocks_for, kv_capacity
from stepsim.serve.latency import ConstantLatency, IterationCost
from stepsim.serve.replay import replay
from stepsim.serve.scheduler import Scheduler, SchedulerConfig

T = 2.0**-6  # a binary-exact step time (s): sums of steps are exact, so times compare with ==


def _capacity(blocks, block_size=16):
    """A KV cache of exactly ``blocks`` blocks (1 byte per token)."""
    return kv_capacity(blocks * block_size, 0, 1, block_size)


class CheckedScheduler(Scheduler):
    """A scheduler that checks the invariants every step and counts the KV tokens preemption threw away."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.lost = 0
        self.victims = []
        self.steps = 0
        self.scheduled_tokens = 0

    def _preempt(self, victim):
        self.lost += victim.computed
        self.victims.append(victim.index)
        super()._preempt(victim)
        assert self.waiting[0] is victim and victim.blocks == 0 and victim.computed == 0

    def schedule(self):
        bs = self.block_size
        if self.config.policy == "vllm":  # after a step a request holds exactly ceil(computed / block_size) blocks
            assert all(r.blocks == blocks_for(r.computed, bs) for r in self.running)
        if not self.running:
            assert self.free == self.usable  # an idle engine holds no block
        waiting_before = {r.index for r in self.waiting}
        batch = self._policy()
        tokens = sum(n for _, n in batch)
        self.steps += 1
        self.scheduled_tokens += tokens
        assert len(self.running) <= self.config.max_num_seqs
        assert 0 <= self.free and sum(r.blocks for r in self.running) == self.usable - self.free
        if self.config.policy == "vllm":
            assert tokens <= self.config.max_num_batched_tokens
            for r, n in batch:
                assert r.blocks == blocks_for(r.computed + n, bs)
        if self.config.policy == "orca":
            assert self.preempted == 0
            assert all(r.blocks == blocks_for(self.max_model_len, bs) for r in self.running)
        if self.preempted and self.config.policy == "vllm":  # a step that preempts admits nobody
            assert not any(r.index in waiting_before for r, _ in batch)
        return batch


def _run(config, capacity, max_model_len, arrival, prompt, output):
    s = CheckedScheduler(config, capacity, max_model_len)
    res = replay(np.asarray(arrival, dtype=np.float64), np.asarray(prompt, dtype=np.int64),
                 np.asarray(output, dtype=np.int64), s, ConstantLatency(T))
    return s, res


def test_lone_request_exact_timing():
    # P = 5000 with a 2048 budget: 3 prefill steps (2048, 2048, 904), then 9 decode steps
    s, res = _run(SchedulerConfig.make("vllm"), _capacity(1000), 16000, [0.25], [5000], [10])
    assert res.iterations["tokens"].tolist() == [2048, 2048, 904] + [1] * 9
    assert res.iterations["prefill_tokens"].tolist() == [2048, 2048, 904] + [0] * 9
    assert res.first_scheduled.tolist() == [0.25]
    assert res.first_token.tolist() == [0.25 + 3 * T]  # TTFT = ceil(P / B) steps
    assert res.finish.tolist() == [0.25 + 3 * T + 9 * T]  # E2E = TTFT + (O - 1) steps
    assert res.itl.tolist() == [T] * 9
    assert res.iterations["kv_blocks_used"].tolist() == [128, 256, 313, 313, 313, 313, 313, 313, 313, 313, 313, 314]
    assert s.free == s.usable


def test_arrival_during_a_step_waits_for_the_next():
    # B arrives while A's first step runs: B is in step 2, not step 1; the idle engine starts at A's arrival
    _, res = _run(SchedulerConfig.make("vllm"), _capacity(100), 1600, [1.0, 1.0 + T / 2], [10, 10], [2, 2])
    assert res.iterations["start_s"].tolist() == [1.0, 1.0 + T, 1.0 + 2 * T]
    assert res.iterations["sequences"].tolist() == [1, 2, 1]
    assert res.first_scheduled.tolist() == [1.0, 1.0 + T]
    # an arrival exactly at a step's end joins the next step
    _, res = _run(SchedulerConfig.make("vllm"), _capacity(100), 1600, [1.0, 1.0 + T], [10, 10], [2, 2])
    assert res.iterations["sequences"].tolist() == [1, 2, 1]


def _pressure_trace(n=300, seed=7):
    rng = np.random.default_rng(seed)
    arrival = np.sort(rng.uniform(0.0, 2.0, n))
    return arrival, rng.integers(100, 3000, n), rng.integers(1, 300, n)


def test_vllm_preemption_conserves_tokens():
    arrival, prompt, output = _pressure_trace()
    config = SchedulerConfig.make("vllm", max_num_seqs=64, max_num_batched_tokens=2048)
    s, res = _run(config, _capacity(600), 600 * 16 - 16, arrival, prompt, output)
    # 9,584 tokens of KV for up to 64 requests of 100-3,000 prompt tokens: vLLM V1 admits on the first chunk's
    # blocks and then thrashes (one request is preempted 36 times)
    assert len(s.victims) == int(res.preemptions.sum()) == 524
    assert (res.preemptions > 0).sum() == 112 and int(res.preemptions.max()) == 36
    assert s.lost == 955233
    # every request finishes and emits exactly its output tokens at strictly increasing times
    assert (res.finish > 0).all() and (res.first_token <= res.finish).all()
    assert len(res.itl) == int((output - 1).sum()) and (res.itl > 0).all()
    # scheduled tokens = sum(P + O - 1) + the KV tokens thrown away by preemption and recomputed
    assert s.scheduled_tokens == int((prompt + output - 1).sum()) + s.lost == int(res.iterations["tokens"].sum())
    assert int(res.iterations["kv_blocks_used"].max()) == res.max_blocks_used <= 599
    assert res.max_blocks_used == 599


def test_sarathi_chunks_and_preempts():
    arrival, prompt, output = _pressure_trace()
    config = SchedulerConfig.make("sarathi", max_num_seqs=64, chunk_tokens=512)
    s, res = _run(config, _capacity(600), (600 - 1 - 6) * 16, arrival, prompt, output)
    assert config.chunk_tokens == 512 and s.watermark == 6
    assert int(res.iterations["tokens"].max()) == 512  # decodes fit the chunk here, so no step exceeds it
    assert int(res.preemptions.sum()) == len(s.victims) == 19 and (res.finish > 0).all()
    assert len(res.itl) == int((output - 1).sum()) and (res.itl > 0).all()
    assert s.scheduled_tokens == int((prompt + output - 1).sum()) + s.lost


def test_orca_reserves_max_model_len_and_never_preempts():
    arrival, prompt, output = _pressure_trace(60)
    s, res = _run(SchedulerConfig.make("orca", max_num_seqs=8), _capacity(2000), 4096, arrival, prompt, output)
    assert int(res.preemptions.sum()) == 0 and s.lost == 0
    # 256 blocks per request, 1999 usable, watermark 20: at most 7 run at once
    assert int(res.iterations["sequences"].max()) == 7 + 0 and int(res.iterations["kv_blocks_used"].max()) == 7 * 256
    # a prompt is never split: every prefill is whole
    assert s.scheduled_tokens == int((prompt + output - 1).sum())
    assert res.iterations["prefill_tokens"].sum() == prompt.sum()


def test_orca_and_vllm_agree_for_one_sequence_at_a_time():
    arrival, prompt, output = _pressure_trace(40)
    big = _capacity(5000)
    _, a = _run(SchedulerConfig.make("orca", max_num_seqs=1), big, 4096, arrival, prompt, output)
    _, b = _run(SchedulerConfig.make("vllm", max_num_seqs=1, max_num_batched_tokens=4096), big, 4096, arrival,
                prompt, output)
    assert a.first_token.tolist() == b.first_token.tolist() and a.finish.tolist() == b.finish.tolist()


@pytest.mark.parametrize("policy, kwargs, message", [
    ("fifo", {}, "--scheduler 'fifo': expected one of vllm, sarathi, orca"),
    ("orca", {"max_num_batched_tokens": 100}, "--max-batch-tokens is vLLM's token budget; orca has none (it never "
     "chunks)"),
    ("sarathi", {"max_num_batched_tokens": 100}, "--max-batch-tokens is vLLM's token budget; sarathi has none (its "
     "budget is --chunk-tokens)"),
    ("orca", {"chunk_tokens": 100}, "--chunk-tokens: orca never chunks a prompt"),
    ("vllm", {"max_num_seqs": 0}, "--max-seqs must be a positive integer, got 0"),
    ("sarathi", {"chunk_tokens": 0}, "--chunk-tokens must be a positive integer, got 0"),
])
def test_scheduler_config_errors(policy, kwargs, message):
    from stepsim.base.errors import ConfigError

    with pytest.raises(ConfigError) as e:
        SchedulerConfig.make(policy, **kwargs)
    assert str(e.value) == message


def test_provider_cycles_become_columns():
    class Cycles:
        mode, error = "test", None

        def __call__(self, batch):
            return IterationCost(T, {"moe": sum(batch.new_tokens), "attention": len(batch.new_tokens)})

    res = replay(np.array([0.0, 0.0]), np.array([3, 5]), np.array([2, 1]),
                 Scheduler(SchedulerConfig.make("vllm"), _capacity(10), 160), Cycles())
    assert res.iterations["cycles_moe"].tolist() == [8, 1] and res.iterations["cycles_attention"].tolist() == [2, 1]
