"""Batch schedulers: vLLM V1 (default), Orca and Sarathi-Serve, one step at a time.

Each policy's :meth:`~Scheduler.schedule` picks the requests and token counts of one step from ``running`` and
``waiting``, allocating KV blocks and preempting as its engine does; :meth:`~Scheduler.finish_step` then
advances every scheduled request and emits the tokens the step produced. The rules, with their sources, are in
docs/serving.md; in short:

vLLM V1 (vllm/v1/core/sched/scheduler.py ``Scheduler.schedule``, v0.11.0)
    budget ``max_num_batched_tokens``; running requests first in admission order, each given
    ``num_tokens - num_computed`` tokens capped by ``long_prefill_token_threshold`` (if > 0), the budget left
    and ``max_model_len - 1 - num_computed``; blocks for ``ceil((num_computed + n) / block_size)`` tokens; while
    they do not fit, the last running request is preempted (blocks freed, computed tokens reset to 0, to the
    head of waiting) and the pass stops if that was the request being scheduled. Then, only if nobody was
    preempted, waiting requests from the head while the budget lasts and ``len(running) < max_num_seqs``;
    the first that cannot get its blocks stops admission.
Orca (microsoft/sarathi-serve sarathi/core/scheduler/orca_scheduler.py)
    no token budget and no chunking: every running request decodes, then waiting requests are admitted whole
    while ``ceil(max_model_len / block_size)`` blocks (reserved at admission) fit above the watermark and
    ``len(running) < max_num_seqs``. Never preempts.
Sarathi-Serve (sarathi/core/scheduler/sarathi_scheduler.py)
    budget ``chunk_size`` including decode tokens: decodes first (one slot each; with no free block the last
    running request is preempted, itself if none is left), then unfinished prefills, then new requests, each
    prefill chunk ``min(rest of prompt, chunk_size - tokens in batch)``; a new request's whole prompt is
    allocated at admission, which needs the free blocks minus its blocks to stay at or above the watermark.

Watermark (Orca and Sarathi): ``int(0.01 * num_blocks)`` blocks (sarathi/core/block_space_manager/
base_block_space_manager.py ``can_allocate``). Tokens: a step produces a request's next token when the request
has then computed all its tokens (prompt plus outputs so far); a partial prefill chunk produces nothing.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from stepsim.base.errors import ConfigError
from stepsim.serve.kv_cache import DEFAULT_BLOCK_SIZE, KVCapacity, blocks_for

SCHEDULERS = ("vllm", "sarathi", "orca")
#: vLLM SchedulerConfig defaults (vllm/config/scheduler.py): max_num_seqs, max_num_batched_tokens
VLLM_MAX_SEQS, VLLM_MAX_BATCH_TOKENS = 128, 2048
#: Sarathi-Serve's default chunk size (sarathi/config/config.py SarathiSchedulerConfig)
SARATHI_CHUNK = 512
#: Orca's and Sarathi's spare blocks at admission, as a fraction of all blocks
WATERMARK = 0.01


@dataclass(frozen=True)
class SchedulerConfig:
    """Scheduler knobs.

    Attributes
    ----------
    policy : str
        ``vllm``, ``sarathi`` or ``orca``.
    max_num_seqs : int
        Most requests running at once.
    max_num_batched_tokens : int or None
        vLLM: tokens per step (None for the others).
    chunk_tokens : int
        vLLM: ``long_prefill_token_threshold`` (0: off); Sarathi: ``chunk_size``; Orca: unused (0).
    block_size : int
        Tokens per KV block.
    """

    policy: str = "vllm"
    max_num_seqs: int = VLLM_MAX_SEQS
    max_num_batched_tokens: int | None = VLLM_MAX_BATCH_TOKENS
    chunk_tokens: int = 0
    block_size: int = DEFAULT_BLOCK_SIZE

    @classmethod
    def make(cls, policy: str = "vllm", *, max_num_seqs: int | None = None, max_num_batched_tokens: int | None = None,
             chunk_tokens: int | None = None, block_size: int = DEFAULT_BLOCK_SIZE) -> SchedulerConfig:
        """A config with each policy's defaults; refuses a knob the policy does not have (one line)."""
        if policy not in SCHEDULERS:
            raise ConfigError(f"--scheduler {policy!r}: expected one of {', '.join(SCHEDULERS)}")
        for flag, v in (("--max-seqs", max_num_seqs), ("--max-batch-tokens", max_num_batched_tokens),
                        ("--chunk-tokens", chunk_tokens)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < (0 if flag == "--chunk-tokens"
                                                                                       and policy == "vllm" else 1)):
                raise ConfigError(f"{flag} must be a positive integer, got {v!r}")
        if policy != "vllm" and max_num_batched_tokens is not None:
            raise ConfigError(f"--max-batch-tokens is vLLM's token budget; {policy} has none "
                              + ("(its budget is --chunk-tokens)" if policy == "sarathi" else "(it never chunks)"))
        if policy == "orca" and chunk_tokens is not None:
            raise ConfigError("--chunk-tokens: orca never chunks a prompt")
        seqs = VLLM_MAX_SEQS if max_num_seqs is None else max_num_seqs
        if policy == "vllm":
            budget = VLLM_MAX_BATCH_TOKENS if max_num_batched_tokens is None else max_num_batched_tokens
            return cls(policy, seqs, budget, chunk_tokens or 0, block_size)
        chunk = (SARATHI_CHUNK if chunk_tokens is None else chunk_tokens) if policy == "sarathi" else 0
        return cls(policy, seqs, None, chunk, block_size)


class Request:
    """One request's scheduling state (token counts in tokens, times in seconds).

    ``num_tokens`` is the prompt plus the outputs so far; ``computed`` the tokens whose KV is cached;
    ``blocks`` the KV blocks held; ``prefilling`` is True from admission (or resumption) until the request
    has computed all its tokens.
    """

    __slots__ = ("index", "prompt", "output", "arrival", "num_tokens", "computed", "outputs", "blocks", "prefilling",
                 "first_scheduled", "first_token", "last_token", "finish", "preemptions")

    def __init__(self, index: int, prompt: int, output: int, arrival: float):
        self.index = index
        self.prompt = prompt
        self.output = output
        self.arrival = arrival
        self.num_tokens = prompt
        self.computed = 0
        self.outputs = 0
        self.blocks = 0
        self.prefilling = True
        self.first_scheduled = -1.0
        self.first_token = -1.0
        self.last_token = -1.0
        self.finish = -1.0
        self.preemptions = 0


class Scheduler:
    """The state one policy schedules: ``running`` (admission order), ``waiting`` (FCFS) and the free blocks.

    Parameters
    ----------
    config : SchedulerConfig
    capacity : KVCapacity
    max_model_len : int
        The longest sequence (prompt + output, tokens) a request may reach.
    """

    def __init__(self, config: SchedulerConfig, capacity: KVCapacity, max_model_len: int):
        self.config = config
        self.block_size = capacity.block_size
        self.free = capacity.usable_blocks
        self.usable = capacity.usable_blocks
        self.watermark = int(WATERMARK * capacity.num_blocks)
        self.max_model_len = max_model_len
        self.running: list[Request] = []
        self.waiting: deque[Request] = deque()
        self.preempted = 0  # preemptions in the last schedule()
        self._policy = {"vllm": self._vllm, "orca": self._orca, "sarathi": self._sarathi}[config.policy]

    @property
    def blocks_used(self) -> int:
        return self.usable - self.free

    def schedule(self) -> list[tuple[Request, int]]:
        """The next step's batch: ``(request, new tokens)`` pairs; KV blocks allocated, preemptions done
        (counted in :attr:`preempted`)."""
        return self._policy()

    def _preempt(self, victim: Request) -> None:
        """Recompute preemption: free the victim's blocks, forget its KV, put it at the head of waiting."""
        self.free += victim.blocks
        victim.blocks = 0
        victim.computed = 0
        victim.prefilling = True
        victim.preemptions += 1
        self.waiting.appendleft(victim)
        self.preempted += 1

    # --- vLLM V1 ------------------------------------------------------------------------------------------
    def _vllm(self) -> list[tuple[Request, int]]:
        cfg = self.config
        budget = cfg.max_num_batched_tokens
        threshold = cfg.chunk_tokens
        bs = self.block_size
        limit = self.max_model_len - 1
        running, waiting = self.running, self.waiting
        batch = []
        self.preempted = 0
        i = 0
        while i < len(running) and budget > 0:
            r = running[i]
            n = r.num_tokens - r.computed
            if 0 < threshold < n:
                n = threshold
            if n > budget:
                n = budget
            if n > limit - r.computed:
                n = limit - r.computed
            if n <= 0:
                i += 1
                continue
            need = blocks_for(min(r.computed + n, self.max_model_len), bs) - r.blocks
            stopped = False
            while need > self.free:
                victim = running.pop()
                self._preempt(victim)
                if victim is r:
                    stopped = True
                    break
            if stopped:
                break
            self.free -= need
            r.blocks += need
            batch.append((r, n))
            budget -= n
            i += 1
        if self.preempted:  # a step that preempts admits nobody
            return batch
        while waiting and budget > 0 and len(running) < cfg.max_num_seqs:
            r = waiting[0]
            n = r.num_tokens  # new, or resumed: recompute prompt + outputs so far
            if 0 < threshold < n:
                n = threshold
            if n > budget:
                n = budget
            if n > limit:
                n = limit
            need = blocks_for(min(n, self.max_model_len), bs)
            if need > self.free:
                break  # a waiting request never preempts
            waiting.popleft()
            running.append(r)
            self.free -= need
            r.blocks = need
            batch.append((r, n))
            budget -= n
        return batch

    # --- Orca ---------------------------------------------------------------------------------------------
    def _orca(self) -> list[tuple[Request, int]]:
        running, waiting = self.running, self.waiting
        self.preempted = 0
        batch = [(r, 1) for r in running]  # every running request has its prompt done: one decode token each
        reserve = blocks_for(self.max_model_len, self.block_size)
        while waiting and len(running) < self.config.max_num_seqs and self.free - reserve >= self.watermark:
            r = waiting.popleft()
            running.append(r)
            self.free -= reserve
            r.blocks = reserve
            batch.append((r, r.num_tokens))
        return batch

    # --- Sarathi-Serve ------------------------------------------------------------------------------------
    def _sarathi(self) -> list[tuple[Request, int]]:
        chunk = self.config.chunk_tokens
        bs = self.block_size
        rest = deque(self.running)
        running: list[Request] = []
        prefills: list[Request] = []
        batch = []
        self.preempted = 0
        tokens = 0
        while rest:
            r = rest.popleft()
            if r.prefilling:
                prefills.append(r)
                continue
            # can_append_slot: one free block, whether or not this decode needs a new one
            while self.free == 0 and rest:
                self._preempt(rest.pop())
            if self.free == 0:
                self._preempt(r)
                continue
            need = blocks_for(r.computed + 1, bs) - r.blocks
            self.free -= need
            r.blocks += need
            running.append(r)
            batch.append((r, 1))
            tokens += 1
        for r in prefills:  # their whole prompt was allocated at admission
            running.append(r)
            n = min(r.num_tokens - r.computed, chunk - tokens)
            if n > 0:
                batch.append((r, n))
                tokens += n
        waiting = self.waiting
        while waiting:
            r = waiting[0]
            need = blocks_for(r.num_tokens, bs)
            if self.free - need < self.watermark or len(running) >= self.config.max_num_seqs:
                break
            n = min(r.num_tokens, chunk - tokens)
            if n <= 0:
                break
            waiting.popleft()
            running.append(r)
            self.free -= need
            r.blocks = need
            batch.append((r, n))
            tokens += n
        self.running = running
        return batch

    # --- after a step -------------------------------------------------------------------------------------
    def finish_step(self, batch: list[tuple[Request, int]], end: float, gaps) -> int:
        """Advance the scheduled requests by their tokens; each that has computed all its tokens emits one at
        ``end`` (s); finished requests leave ``running`` and free their blocks. Appends inter-token gaps (s) to
        ``gaps``. Returns the number of requests finished."""
        finished = 0
        for r, n in batch:
            r.computed += n
            if r.computed != r.num_tokens:
                continue  # a partial prefill chunk produces nothing
            r.prefilling = False
            r.outputs += 1
            r.num_tokens += 1
            if r.outputs == 1:
                r.first_token = end
            else:
                gaps.append(end - r.last_token)
            r.last_token = end
            if r.outputs == r.output:
                r.finish = end
                finished += 1
        if finished:
            keep = []
            for r in self.running:
                if r.finish >= 0.0:
                    self.free += r.blocks
                    r.blocks = 0
                else:
                    keep.append(r)
            self.running = keep
        return finished
