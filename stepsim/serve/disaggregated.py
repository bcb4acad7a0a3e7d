"""Disaggregated serving: a prefill pool and a decode pool, each with its own scheduler and KV cache, the KV cache
moved between them over the system's links (DistServe, Splitwise; vLLM's disaggregated prefill).

A request's life (times in seconds; every order below is fixed, so a replay is deterministic):

1. **Prefill pool.** The request joins the prefill pool's scheduler at its arrival as a request of one output
   token: the pool's steps compute prompts (chunked as its policy chunks them) and nothing else, and the step that
   completes a prompt produces the request's first token at its end (``prefill_end_s``). The prefill pool is a
   colocated replay of such requests (:func:`stepsim.serve.replay.replay`, the same loop bit for bit); it frees the
   request's blocks at that instant (the copy being sent is not counted against its KV cache).
2. **KV transfer.** The request's KV cache (:func:`stepsim.serve.kv_transfer.kv_transfer_bytes`) crosses the links
   between the pools (:class:`stepsim.serve.kv_transfer.KVTransferPricer`: the engine's link units, or their closed
   form where it is proven equal). Transfers go one at a time, first come first served by ``prefill_end_s`` (ties:
   trace order), each holding the links from its start to its arrival: ``start = max(prefill_end, previous
   arrival)``. (The engine would overlap one transfer's link latency, ``alpha`` cycles, with the next one's bytes;
   that overlap is not taken.)
3. **Decode pool.** Between the decode pool's steps every request whose transfer has arrived joins its incoming
   queue (by arrival, ties in trace order); when no preempted request is waiting, the incoming requests are
   admitted from the head, each with the blocks of the KV it brought (Orca: its reservation), while they fit (above
   the watermark for Orca and Sarathi) and fewer than ``max_num_seqs`` run; the first that does not fit stops
   admission (FCFS, as vLLM admits). Admitted requests are running decodes: the pool's steps are decode steps (a
   request preempted there recomputes its tokens in the decode pool, as vLLM's decode instance does).

First token (``first_token``):

* ``"prefill"`` (DistServe's definition, its footnote 1: TTFT is the prefill's duration, the prefill
  instance returns the first token): the first token is the prefill's, at ``prefill_end_s``, so **TTFT does not
  count the transfer**; the transfer and the wait for the decode pool fall in the gap to the second token (ITL and
  TPOT count them). An output of one token ends at the prefill: no transfer.
* ``"decode"`` (the default: what a user of vLLM's disaggregated prefill sees, its proxy streaming the decode instance's tokens): the prefill's token
  is not the user's; the decode pool recomputes the prompt's last token (vLLM recomputes the last token of a fully
  cached prompt) and its first step produces the first token, so **TTFT = prefill + transfer + waiting for the
  decode pool + its first decode step** (issue 42's definition for a lone request). The default, because a plan
  compares colocated and disaggregated deployments by the TTFT a user sees: DistServe's would leave the
  transfer out of the disaggregated side only.

Either way TPOT = (last token - first token) / (output - 1), from the decode pool's steps.

**Early stop** (``stop``, a plan's :class:`~stepsim.serve.replay_stop.StopRule`): a disaggregated replay stops once
its SLO is provably missed, at three points, each counting only misses that the whole run would have:

* the prefill pool replays with the rule itself: a request's first token and finish there (its prefill's end) are no
  later than in the run (``"decode"``: the first token comes from a decode step after the transfer; ``"prefill"``:
  it is the prefill's), and its outputs are one token, so TPOT is not counted;
* after the transfers, before the decode pool: a request's first token comes no earlier than its transfer's end
  (``"decode"``; its prefill's end with ``"prefill"``) and it finishes no earlier than that either;
* the decode pool replays with the rule on its own requests, each measured from its arrival in the trace (the
  floats the metrics compute); one still without its first token, or unfinished, once the pool's clock is past its
  transfer's end by more than a limit is past its arrival by more than that too. TTFT is not held there with
  ``"prefill"`` (the first token came before the request reached the pool, and the prefill pool counted it).

A replay that is not stopped is the replay without the rule, bit for bit.
"""

from __future__ import annotations

import dataclasses
import math
from array import array
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from stepsim.base.errors import ConfigError, SimulationError
from stepsim.base.ranges import MAX_TIME_S
from stepsim.serve.kv_cache import blocks_for
from stepsim.serve.latency import WORK_COLUMNS, LatencyProvider
from stepsim.serve.replay import checked_cost, iteration_batch, max_utilisation, replay
from stepsim.serve.replay_result import ReplayResult
from stepsim.serve.replay_stop import ReplayStopped, StopRule, StopTracker
from stepsim.serve.scheduler import Request, Scheduler

#: where a request's first token comes from (module docstring)
FIRST_TOKEN = ("prefill", "decode")


@dataclass
class DisaggregatedResult:
    """A disaggregated replay (times in seconds, per request in trace order).

    Attributes
    ----------
    result : ReplayResult
        The whole run as a colocated replay reports it: ``first_scheduled`` (in the prefill pool), ``first_token``,
        ``finish``, ``preemptions`` (both pools), ``itl`` (every gap), ``iterations`` (both pools' steps by start,
        the prefill pool's first at equal starts, with a ``pool`` column: 0 prefill, 1 decode) and
        ``max_blocks_used`` (the decode pool's).
    prefill_end, transfer_start, transfer_end : ndarray of float64
        End of the prefill step that completed the prompt; the KV transfer's start and arrival (both equal to
        ``prefill_end`` when nothing moves).
    transfer_bytes : ndarray of int64
        KV bytes moved (0 for an output of one token with ``first_token="prefill"``).
    prefill_blocks_used : int
        The prefill pool's most blocks in use.
    """

    result: ReplayResult
    prefill_end: np.ndarray
    transfer_start: np.ndarray
    transfer_end: np.ndarray
    transfer_bytes: np.ndarray
    prefill_blocks_used: int


def replay_disaggregated(arrival_s: np.ndarray, prompt: np.ndarray, output: np.ndarray, kv_bytes: np.ndarray,
                         prefill: Scheduler, decode: Scheduler, prefill_provider: LatencyProvider,
                         decode_provider: LatencyProvider, transfer_seconds: Callable[[int], float],
                         first_token: str = "decode", stop: StopRule | None = None) -> DisaggregatedResult:
    """Serve every request of a trace on a prefill pool and a decode pool (module docstring).

    Parameters
    ----------
    arrival_s : ndarray of float64
        Arrival times (s), sorted.
    prompt, output : ndarray of int64
        Prompt and output tokens per request (each fits both pools' ``max_model_len``).
    kv_bytes : ndarray of int64
        Each request's KV bytes to move (:func:`stepsim.serve.kv_transfer.kv_transfer_bytes`).
    prefill, decode : Scheduler
        Fresh schedulers of the two pools (their policies, knobs and KV capacities).
    prefill_provider, decode_provider : LatencyProvider
        Price each pool's steps.
    transfer_seconds : callable
        Seconds a transfer of so many bytes takes over the links between the pools.
    first_token : {"prefill", "decode"}
        Where the first token comes from (module docstring).
    stop : StopRule, optional
        Raise :class:`~stepsim.serve.replay_stop.ReplayStopped` once the SLO is provably missed (module docstring,
        "Early stop").
    """
    if first_token not in FIRST_TOKEN:
        raise ConfigError(f"first token must come from {' or '.join(FIRST_TOKEN)}, got {first_token!r}")
    n = len(arrival_s)
    ones = np.ones(n, dtype=np.int64)
    pre = replay(arrival_s, prompt, ones, prefill, prefill_provider, stop=stop)
    prefill_end = pre.first_token
    moves = np.ones(n, dtype=bool) if first_token == "decode" else output > 1
    moved = np.where(moves, kv_bytes, 0).astype(np.int64)
    start = prefill_end.copy()
    end = prefill_end.copy()
    free = 0.0  # when the links are free again
    for i in np.lexsort((np.arange(n), prefill_end)).tolist():  # by prefill end, ties in trace order
        if not moves[i]:
            continue
        start[i] = max(prefill_end[i], free)
        free = end[i] = start[i] + transfer_seconds(int(moved[i]))
    if stop is not None:
        _stop_after_transfers(stop, arrival_s, end if first_token == "decode" else prefill_end, end, pre)
    dec, first, finish, preempted, gaps = _decode_pool(end, prompt, output, prefill_end, moves, decode,
                                                       decode_provider, first_token, stop, arrival_s)
    iterations = _merged(pre.iterations, dec["iterations"])
    result = ReplayResult(first_scheduled=pre.first_scheduled, first_token=first, finish=finish,
                          preemptions=pre.preemptions + preempted, itl=gaps, iterations=iterations,
                          max_blocks_used=dec["max_blocks_used"])
    return DisaggregatedResult(result, prefill_end, start, end, moved, pre.max_blocks_used)


def _stop_after_transfers(stop: StopRule, arrival: np.ndarray, first_from: np.ndarray, finish_from: np.ndarray,
                          pre: ReplayResult) -> None:
    """Raise :class:`~stepsim.serve.replay_stop.ReplayStopped` when more requests miss a limit than the rule allows
    with each first token at ``first_from`` and each finish at ``finish_from`` (s), the earliest they can come
    (module docstring, "Early stop": float subtraction is monotone, so a TTFT or E2E over the limit here is over
    it in the run); ``pre``: the prefill pool's run (its steps and their utilisation for the exception)."""
    for metric, values, limit, allowed in (("ttft", first_from - arrival, stop.ttft, stop.ttft_misses),
                                           ("e2e", finish_from - arrival, stop.e2e, stop.e2e_misses)):
        if int(np.count_nonzero(values > limit)) > allowed:
            raise ReplayStopped(metric, len(pre.iterations["start_s"]), float(np.max(finish_from)),
                                float(max_utilisation(pre.iterations)))


def _merged(prefill: dict, decode: dict) -> dict:
    """Both pools' steps in one table: by start, the prefill pool's first at equal starts; a ``pool`` column (0
    prefill, 1 decode); a cycles or work column one pool lacks is 0 there."""
    pools = np.concatenate([np.zeros(len(prefill["start_s"]), np.int64), np.ones(len(decode["start_s"]), np.int64)])
    order = np.lexsort((pools, np.concatenate([prefill["start_s"], decode["start_s"]])))
    names = list(prefill) + [k for k in decode if k not in prefill]
    merged = {}
    for name in names:
        a, b = prefill.get(name), decode.get(name)
        dtype = (a if a is not None else b).dtype
        a = np.zeros(len(prefill["start_s"]), dtype) if a is None else a
        b = np.zeros(len(decode["start_s"]), dtype) if b is None else b
        merged[name] = np.concatenate([a, b])[order]
        if name == "waiting":
            merged["pool"] = pools[order]
    return merged


def _decode_pool(arrive: np.ndarray, prompt: np.ndarray, output: np.ndarray, prefill_end: np.ndarray,
                 moves: np.ndarray, scheduler: Scheduler, provider: LatencyProvider, first_token: str,
                 stop: StopRule | None = None, since: np.ndarray | None = None):
    """The decode pool's replay (module docstring, 3): ``(steps, first token, finish, preemptions, gaps)`` per
    request in trace order; a request that never reaches the pool finishes at its prefill's end. ``stop``: the
    run's rule, its metrics measured from ``since`` (s: the requests' arrivals in the trace; module docstring,
    "Early stop")."""
    n = len(arrive)
    first = prefill_end.copy()
    finish = prefill_end.copy()
    preempted = np.zeros(n, dtype=np.int64)
    order = [i for i in np.lexsort((np.arange(n), arrive)).tolist() if moves[i]]
    if stop is not None and first_token == "prefill":  # the first tokens came before the pool: TTFT is not its
        stop = dataclasses.replace(stop, ttft=math.inf)
    if order:  # in machine code when the compiled replay takes this provider (the same numbers bit for bit)
        from stepsim.serve.replay_compiled import compiled_decode_pool

        pick = np.array(order, dtype=np.int64)
        run = compiled_decode_pool(arrive[pick], prompt[pick], output[pick], scheduler, provider, first_token,
                                   prefill_end[pick], stop, None if since is None else since[pick])
        if run is not None:
            first[pick], finish[pick], preempted[pick] = run.first_token, run.finish, run.preemptions
            return ({"iterations": run.iterations, "max_blocks_used": run.max_blocks_used}, first, finish, preempted,
                    run.itl)
    return _decode_pool_reference(arrive, prompt, output, prefill_end, order, scheduler, provider, first_token,
                                  first, finish, preempted, stop, since)


def _decode_pool_reference(arrive, prompt, output, prefill_end, order, scheduler, provider, first_token, first,
                           finish, preempted, stop=None, since=None):
    """The decode pool one Python step at a time: the reference the compiled pool reproduces
    (tests/serve/test_disaggregated_compiled.py) and the loop of every other provider."""
    # the rule counts the pool's requests in the order they arrive, as the compiled pool holds them
    tracker = None if stop is None else StopTracker(stop, arrive[order].tolist(), output[order].tolist(),
                                                    {i: k for k, i in enumerate(order)},
                                                    None if since is None else since[order].tolist())
    requests = {}
    for i in order:
        p, o = int(prompt[i]), int(output[i])
        r = Request(i, p, o, float(arrive[i]))
        if first_token == "prefill":  # the prefill's token is the first: p tokens cached, p + 1 known
            r.computed, r.num_tokens, r.outputs = p, p + 1, 1
            r.first_token = r.last_token = float(prefill_end[i])
        else:  # the decode pool recomputes the prompt's last token and produces the first token
            r.computed, r.num_tokens, r.outputs = p - 1, p, 0
        r.prefilling = False
        requests[i] = r
    policy = scheduler.config.policy
    reserve = blocks_for(scheduler.max_model_len, scheduler.block_size) if policy == "orca" else None
    spare = 0 if policy == "vllm" else scheduler.watermark
    incoming: deque[Request] = deque()
    gaps = array("d")
    cols = {k: [] for k in ("start_s", "duration_s", "tokens", "sequences", "prefill_tokens", "decode_tokens",
                            "kv_blocks_used", "preemptions", "waiting")}
    cycles: dict[str, list[int]] = {}
    work: dict[str, list] = {}
    checked = object()
    now, nxt, done, total = 0.0, 0, 0, len(order)
    while done < total:
        while nxt < total and requests[order[nxt]].arrival <= now:
            incoming.append(requests[order[nxt]])
            nxt += 1
        if not scheduler.waiting:  # preempted requests first: they waited longer
            while incoming and len(scheduler.running) < scheduler.config.max_num_seqs:
                r = incoming[0]
                need = reserve if reserve is not None else blocks_for(r.prompt, scheduler.block_size)
                if need > scheduler.free - spare:
                    break
                incoming.popleft()
                scheduler.free -= need
                r.blocks = need
                r.first_scheduled = now
                scheduler.running.append(r)
        if not scheduler.running and not scheduler.waiting:
            if incoming:
                head = incoming[0]
                raise SimulationError(f"request {head.index} ({head.prompt} prompt tokens) cannot join the idle "
                                      "decode pool: its KV cache does not fit")
            now = requests[order[nxt]].arrival
            continue
        batch = scheduler.schedule()
        if not batch:
            if scheduler.preempted:
                continue
            raise SimulationError("the decode pool scheduled nothing with requests running")
        step = iteration_batch(batch)
        prefill = step.prefill_tokens
        tokens = prefill + step.decode_tokens
        cost = provider(step)
        if cost is not checked or not now < now + cost.seconds <= MAX_TIME_S:
            checked = checked_cost(cost, now, len(cols["start_s"]), provider)
        for name, value in (("start_s", now), ("duration_s", cost.seconds), ("tokens", tokens),
                            ("sequences", len(batch)), ("prefill_tokens", prefill),
                            ("decode_tokens", tokens - prefill), ("kv_blocks_used", scheduler.blocks_used),
                            ("preemptions", scheduler.preempted), ("waiting", len(scheduler.waiting) + len(incoming))):
            cols[name].append(value)
        steps = len(cols["start_s"])
        for kind, c in cost.cycles.items():
            cycles.setdefault(kind, [0] * (steps - 1)).append(c)
        for name, value in cost.work.items():
            work.setdefault(name, []).append(value)
        now = now + cost.seconds
        done += scheduler.finish_step(batch, now, gaps)
        if tracker is not None:
            missed = tracker.after_step(batch, now)
            if missed is not None:
                raise ReplayStopped(missed, steps, now, max_utilisation(work))
    for i, r in requests.items():
        first[i], finish[i], preempted[i] = r.first_token, r.finish, r.preemptions
    iterations = {k: np.array(v, dtype=np.float64 if k.endswith("_s") else np.int64) for k, v in cols.items()}
    for kind in sorted(cycles):
        iterations[f"cycles_{kind}"] = np.array(cycles[kind], dtype=np.int64)
    for name in WORK_COLUMNS:
        if name in work:
            iterations[name] = np.array(work[name], dtype=np.float64 if name.endswith("_utilisation") else np.int64)
    steps = {"iterations": iterations, "max_blocks_used": int(max(cols["kv_blocks_used"], default=0))}
    return steps, first, finish, preempted, np.frombuffer(gaps, dtype=np.float64).copy()
