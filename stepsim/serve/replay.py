"""The replay loop: arrivals, scheduler steps back to back, one latency per step, per-request and per-step records.

Time (seconds) starts at 0. Order at one instant, fixed so a replay is deterministic:

1. every request whose arrival is at or before the current time joins the tail of ``waiting``, in trace order
   (vLLM adds requests between steps only: one arriving during a step waits for the next);
2. an idle engine (nothing running or waiting) jumps to the next arrival and starts a step at that instant;
3. the scheduler picks the step's batch; the provider prices it; the step ends ``seconds`` later, and the tokens
   it produced carry that end time. A schedule that only preempted (no tokens) is retried at the same instant.

:func:`replay` runs this loop in machine code for ``--iteration-latency`` and a calibrated ``--fidelity fast``
(:mod:`stepsim.serve.replay_compiled`), with the same result bit for bit; :func:`replay_reference` is the loop in
Python, the reference and the path of every other provider.
"""

from __future__ import annotations

import numbers
from array import array
from collections.abc import Callable

import numpy as np

from stepsim.base.errors import LatencyProviderError, SimulationError
from stepsim.base.ranges import MAX_TIME_S, MAX_TIME_TEXT, is_real
from stepsim.serve.latency import WORK_COLUMNS, IterationBatch, IterationCost, LatencyProvider
from stepsim.serve.replay_result import ReplayResult
from stepsim.serve.replay_stop import ReplayStopped, StopRule, StopTracker
from stepsim.serve.scheduler import Request, Scheduler


def replay(arrival_s: np.ndarray, prompt: np.ndarray, output: np.ndarray, scheduler: Scheduler,
           provider: LatencyProvider, progress: Callable[[int, int], None] | None = None,
           stop: StopRule | None = None) -> ReplayResult:
    """Serve every request of a trace to completion: in machine code for ``--iteration-latency`` and a calibrated
    ``--fidelity fast`` (:mod:`stepsim.serve.replay_compiled`, the same result bit for bit), else
    :func:`replay_reference`. Parameters as :func:`replay_reference`'s (``progress`` is called every few thousand
    steps on the compiled path)."""
    from stepsim.serve.replay_compiled import compiled_replay

    result = compiled_replay(arrival_s, prompt, output, scheduler, provider, progress, stop)
    if result is not None:
        return result
    return replay_reference(arrival_s, prompt, output, scheduler, provider, progress, stop)


def replay_reference(arrival_s: np.ndarray, prompt: np.ndarray, output: np.ndarray, scheduler: Scheduler,
                     provider: LatencyProvider, progress: Callable[[int, int], None] | None = None,
                     stop: StopRule | None = None) -> ReplayResult:
    """Serve every request of a trace to completion, one Python step at a time: the reference the compiled
    replay reproduces (tests/serve/test_replay_compiled.py), and the loop of every other provider.

    Parameters
    ----------
    arrival_s : ndarray of float64
        Arrival times (s), sorted.
    prompt, output : ndarray of int64
        Prompt and output tokens per request (each fits the scheduler's ``max_model_len``).
    scheduler : Scheduler
        A fresh scheduler (its policy, knobs and KV capacity).
    provider : LatencyProvider
        Prices each step.
    progress : callable, optional
        ``progress(requests finished, steps)`` after every step (a progress bar; it changes nothing).
    stop : StopRule, optional
        Raise :class:`~stepsim.serve.replay_stop.ReplayStopped` once the SLO is provably missed at its percentile
        (:mod:`stepsim.serve.replay_stop`; a run it does not stop is unchanged).
    """
    arrivals = arrival_s.tolist()
    requests = [Request(i, p, o, a) for i, (p, o, a) in enumerate(zip(prompt.tolist(), output.tolist(), arrivals))]
    total = len(requests)
    gaps = array("d")
    starts, durations, ntokens, nseqs, nprefill, ndecode, blocks, npreempt, nwaiting = ([] for _ in range(9))
    cycles: dict[str, list[int]] = {}
    work: dict[str, list] = {}
    now = 0.0
    checked = object()  # the last cost checked (a constant provider's is checked once)
    nxt = 0
    done = 0
    tracker = None if stop is None else StopTracker(stop, arrivals, output.tolist())
    while done < total:
        while nxt < total and arrivals[nxt] <= now:
            scheduler.waiting.append(requests[nxt])
            nxt += 1
        if not scheduler.running and not scheduler.waiting:
            now = arrivals[nxt]  # idle: the next step starts the moment a request arrives
            continue
        batch = scheduler.schedule()
        if not batch:
            if scheduler.preempted:
                continue  # only preempted: schedule again at this instant
            head = scheduler.waiting[0]
            raise SimulationError(f"request {head.index} ({head.prompt} prompt + {head.output} output tokens) cannot "
                                  "be scheduled on an idle engine")
        for r, _ in batch:
            if r.first_scheduled < 0.0:
                r.first_scheduled = now
        step = iteration_batch(batch)
        prefill = step.prefill_tokens
        tokens = prefill + step.decode_tokens
        cost = provider(step)
        if cost is not checked or not now < now + cost.seconds <= MAX_TIME_S:  # a constant cost checked once
            checked = checked_cost(cost, now, len(starts), provider)
        starts.append(now)
        durations.append(cost.seconds)
        ntokens.append(tokens)
        nseqs.append(len(batch))
        nprefill.append(prefill)
        ndecode.append(tokens - prefill)
        blocks.append(scheduler.blocks_used)
        npreempt.append(scheduler.preempted)
        nwaiting.append(len(scheduler.waiting))
        for kind, c in cost.cycles.items():
            cycles.setdefault(kind, [0] * (len(starts) - 1)).append(c)
        for name, value in cost.work.items():
            work.setdefault(name, []).append(value)
        now = now + cost.seconds
        done += scheduler.finish_step(batch, now, gaps)
        if progress is not None:
            progress(done, len(starts))
        if tracker is not None:
            missed = tracker.after_step(batch, now)
            if missed is not None:
                raise ReplayStopped(missed, len(starts), now, max_utilisation(work))
    iterations = {
        "start_s": np.array(starts, dtype=np.float64), "duration_s": np.array(durations, dtype=np.float64),
        "tokens": np.array(ntokens, dtype=np.int64), "sequences": np.array(nseqs, dtype=np.int64),
        "prefill_tokens": np.array(nprefill, dtype=np.int64), "decode_tokens": np.array(ndecode, dtype=np.int64),
        "kv_blocks_used": np.array(blocks, dtype=np.int64), "preemptions": np.array(npreempt, dtype=np.int64),
        "waiting": np.array(nwaiting, dtype=np.int64),
    }
    for kind in sorted(cycles):
        iterations[f"cycles_{kind}"] = np.array(cycles[kind], dtype=np.int64)
    for name in WORK_COLUMNS:  # a provider that prices layers says them for every step
        if name in work:
            iterations[name] = np.array(work[name], dtype=np.float64 if name.endswith("_utilisation") else np.int64)
    return ReplayResult(
        first_scheduled=np.array([r.first_scheduled for r in requests], dtype=np.float64),
        first_token=np.array([r.first_token for r in requests], dtype=np.float64),
        finish=np.array([r.finish for r in requests], dtype=np.float64),
        preemptions=np.array([r.preemptions for r in requests], dtype=np.int64),
        itl=np.frombuffer(gaps, dtype=np.float64).copy(),
        iterations=iterations,
        max_blocks_used=int(max(blocks, default=0)),
    )


def max_utilisation(work: dict) -> float:
    """The largest HBM or compute utilisation of the steps made (0.0 when the provider reports none)."""
    return max((max(work.get(name, ()), default=0.0) for name in ("hbm_utilisation", "compute_utilisation")),
               default=0.0)


def iteration_batch(batch) -> IterationBatch:
    """The step a latency provider prices for the scheduler's ``batch`` of ``(request, new tokens)``: each
    request's cached tokens and new tokens, and the new tokens summed over prefilling and decoding requests."""
    context, new, prefill = [], [], 0
    for r, n in batch:
        context.append(r.computed)
        new.append(n)
        if r.prefilling:
            prefill += n
    return IterationBatch(context, new, prefill, sum(new) - prefill)


def checked_cost(cost, now: float, step: int, provider=None) -> IterationCost:
    """``cost`` when it is an :class:`IterationCost` of a finite number of seconds > 0 that moves time on from
    ``now`` (s) and ends within :data:`~stepsim.base.ranges.MAX_TIME_S`, with cycle counts that are ints >= 0;
    else a LatencyProviderError naming the provider's ``mode``, the step (0-based) and what came back. A step of 0, NaN or negative
    seconds, or one lost in rounding, would report latencies of 0 (or NaN in every metric and the JSON)."""
    mode = getattr(provider, "mode", None)
    where = f"latency provider{'' if mode is None else f' {mode!r}'}: step {step} (at {now!r} s)"
    if not isinstance(cost, IterationCost):
        raise LatencyProviderError(f"{where}: returned {cost!r} ({type(cost).__name__}); expected an IterationCost "
                                   "(seconds, cycles)")
    seconds = cost.seconds
    if not is_real(seconds) or not seconds > 0 or seconds == float("inf"):
        raise LatencyProviderError(f"{where}: seconds must be a positive finite number, got {seconds!r}")
    end = now + seconds
    if end > MAX_TIME_S:
        raise LatencyProviderError(f"{where}: the step of {seconds!r} s would end beyond {MAX_TIME_TEXT}")
    if end <= now:
        raise LatencyProviderError(f"{where}: a step of {seconds!r} s is lost in rounding (it does not move time "
                                   "on)")
    for kind, value in cost.cycles.items():
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
            raise LatencyProviderError(f"{where}: cycles[{kind!r}] must be an int >= 0, got {value!r}")
    return cost
