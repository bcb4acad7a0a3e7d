"""The rate search of one deployment, the upper bounds that prune, and the plan's loop over the space
(docs/plan.md §4).

**Rate search, top down.** Rates are multipliers of the offered rate on a grid ``m = 2**(e / STEPS_PER_DOUBLING)``
(integer e), so every run is reproducible bit for bit. Descend from the top in the steps of :data:`LEVELS`: serve at
the grid's top ``2**MAX_DOUBLINGS`` (meeting the SLO there: ``capped``, one probe) and halve while the SLO is not met
(below ``2**-MAX_DOUBLINGS``: the deployment sustains no rate, ``unsustainable``); then from the failing doubling
above the first that met it, descend in quarters of a doubling to the first rate that meets it, and from the
failing rate above that one, grid step by grid step (``2**(1/16)``, 4.4 %). The sustainable rate is the last that
met it; its goodput and SLO attainment are that run's. Where the SLO holds below some rate and fails above it (as
every capacity search takes it) this is the highest grid rate meeting it; a plan and a brute-force search of every
deployment run the same search, so they agree whether it does or not.

Why top down (until 2026-11-27 the bracket doubled up from the offered rate): a probe that fails costs little (the
replay stops once the SLO is provably missed, :mod:`stepsim.serve.replay_stop`) and one that meets costs a whole
replay. From the top, a deployment's probes above its sustainable rate fail and the first that meets is its
bracket's floor; from the offered rate, every doubling below the sustainable rate met, a whole replay each. Why
descents below that floor, not a bisection (until 2026-11-27): over every sustainable rate of the grid they serve
2.5 rates that meet the SLO and 11.5 that fail on average, a bisection 3.0 and 10.5; a failing probe cost about 0.55
of a whole one's wall on issue 42's must-show case (docs/plan.md §4). And every failure bounds the result on its own,
with no premise on how the SLO varies with the rate: the result lies below every rate that failed before it. So a
search is ``cut`` as soon as a failure proves the deployment off the front, at any level.

**Bounds.** A deployment's goodput at its sustainable rate m* is at most ``requests / duration`` with the duration
at least its floor at m* (:class:`DurationFloor`: each request's arrival plus the larger of its least latency and
the least time of the work arriving from it on), which falls as m rises; so it is below ``N / floor(m_hi)``
whenever the search has seen the SLO fail at ``m_hi`` (m* < m_hi), and at most ``N / floor(m_ub)`` for the bound
m_ub of :func:`rate_bound` before any run. The SLO fails at every rate above m_ub (:func:`rate_bound` proves it
rate by rate), so a plan's search starts at the highest doubling rate at or below m_ub: the doublings above it are
``proved`` failures, not served (the brute force serves them and sees them fail), and so is a descent's rate above
it. A deployment of C chips can only be on the front (fewest chips for its goodput) if its goodput beats every
deployment of fewer chips and reaches every deployment of C chips; a deployment whose bound cannot is ``pruned``
(by the bound, before any run) or ``cut`` (by a failed rate, during its search).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from stepsim.plan.pricing import StepFloor

#: rate grid steps per doubling
STEPS_PER_DOUBLING = 16
#: the search goes at most this many doublings above and below the offered rate
MAX_DOUBLINGS = 8
#: the steps (grid steps) the search descends in, level after level (module docstring): a doubling, a quarter of
#: one, one grid step
LEVELS = (STEPS_PER_DOUBLING, STEPS_PER_DOUBLING // 4, 1)


def multiplier(e: int) -> float:
    return 2.0 ** (e / STEPS_PER_DOUBLING)


@dataclass
class SearchResult:
    """How a deployment's search ended: ``status`` ``searched`` / ``capped`` / ``unsustainable`` / ``cut``, the
    probes served ``(exponent, met)``, the exponents ``proved`` to fail by the rate bound (not served),
    the best evaluation (the highest rate that met the SLO), the lowest failing exponent, and the offered rate's
    evaluation when the search served it (exponent 0)."""

    status: str
    probes: list = field(default_factory=list)
    best: object = None
    hi: int | None = None
    offered: object = None
    #: the largest HBM or compute utilisation of any step of any probe (at most 1: the floors held)
    max_utilisation: float = 0.0
    #: exponents above the rate bound, in the order the search met them (failures the brute force serves)
    proved: list = field(default_factory=list)


def search_rate(evaluate, can_win, rate_bound: float = math.inf) -> SearchResult:
    """The rate search (module docstring). ``evaluate(m)`` serves at multiplier m; ``can_win(e)`` says whether
    the deployment could still reach the front when the SLO failed at ``multiplier(e)`` (its sustainable rate
    below it; False: stop, ``cut``); ``rate_bound``: a multiplier above which the SLO provably fails (the rates
    above it are not served: ``proved``)."""
    res = SearchResult("searched")
    top = MAX_DOUBLINGS * STEPS_PER_DOUBLING

    def probe(e: int) -> bool:
        ev = evaluate(multiplier(e))
        res.probes.append((e, ev.meets))
        res.max_utilisation = max(res.max_utilisation, ev.max_utilisation)
        if e == 0:
            res.offered = ev
        if ev.meets:
            res.best = ev  # each level's rate that met it is above the level before's: the last is the highest
        return ev.meets

    hi = None  # the lowest exponent known to fail
    lo = None  # the highest exponent served that met it
    for step in LEVELS:
        # descend from the failure above in steps of `step`: the first rate that meets is the next level's floor
        e = top if hi is None else hi - step
        while lo is None or e > lo:
            if hi is not None and not can_win(hi):
                res.status, res.hi = "cut", hi
                return res
            if e < -top:
                res.status, res.hi = "unsustainable", hi
                return res
            if multiplier(e) > rate_bound:
                res.proved.append(e)
            elif probe(e):
                lo = e
                break
            hi, e = e, e - step
        if hi is None:
            res.status = "capped"
            return res
    res.hi = hi
    return res


@dataclass(frozen=True)
class DurationFloor:
    """The least duration (s, first arrival to last completion) of a deployment's run at multiplier ``m``:
    ``max_j (d_j / m + c_j)`` over ``points`` ``(d_j, c_j)`` (:func:`rate_bound`). Request j arrives ``d_j``
    seconds after the first (at the offered rate; ``d_j / m`` at m) and the run goes on at least ``c_j`` after that:
    request j's least latency, and the least time the work of the requests arriving from j on takes on the
    replicas. Only the points no other exceeds in both are kept (a handful)."""

    points: tuple

    @classmethod
    def of(cls, delays, rests) -> DurationFloor:
        """The floor of the pairs ``(delays[j], rests[j])``, reduced to those no other pair exceeds in both."""
        kept, best = [], -math.inf
        for j in sorted(range(len(delays)), key=lambda j: (-delays[j], -rests[j])):
            if rests[j] > best:
                kept.append((float(delays[j]), float(rests[j])))
                best = rests[j]
        return cls(tuple(kept))

    def at(self, m: float) -> float:
        """Seconds at multiplier ``m`` (> 0)."""
        return max(d / m + c for d, c in self.points)

    def to_json(self) -> list:
        return [[d, c] for d, c in self.points]

    @classmethod
    def from_json(cls, pairs) -> DurationFloor:
        return cls(tuple((float(d), float(c)) for d, c in pairs))


def rate_bound(dep, model, hardware, base, slo: dict, percentile: float,
               touched=None) -> tuple[float, DurationFloor, str]:
    """``(m_ub, duration floor, the bound that binds)``: an upper bound on the multiplier at which ``dep`` can
    meet the SLO at the percentile, from the least time of steps (:class:`stepsim.plan.pricing.StepFloor`):

    * ``tpot``: a TPOT is at least one step's floor; if that exceeds the SLO, no rate (0);
    * ``ttft-lone``: request i's TTFT is at least its prompt's steps' floor (``ceil(P / per step)`` steps); if fewer
      than the percentile's requests can meet it, no rate;
    * ``ttft-work``: at most ``N - K`` requests may miss the TTFT limit T (K: the requests a percentile below T
      needs), so of the first j + 1 requests at least ``j + 1 - (N - K)`` get their first token by ``a_j / m + T``,
      and their prompts (at least the smallest ones) are computed by then on R replicas: ``a_j / m + T >=
      floor / R`` bounds m for every j;
    * otherwise ``grid``: the search's own top rate.

    Every floor counts the steps' context (:func:`prefill_context`, :func:`decode_context`) and, with ``touched``
    (:func:`stepsim.plan.pricing.least_touched` of the deployment's providers' routing), the experts its decode
    tokens touch at the least (:class:`~stepsim.plan.pricing.StepFloor`). The duration floor
    (:class:`DurationFloor`) is, for each request j, its arrival plus the larger of
    * its least latency: its prompt's floor and ``O - 1`` one-token steps after it, and
    * the least time of the work of the requests arriving from j on (none of it can start before j arrives):
      request i is in at least ``ceil(P_i / per request) + O_i - 1`` steps (its prompt's, then one a further
      token) and computes ``P_i + O_i - 1`` tokens; a step holds at most ``max_seqs`` requests (every policy's
      cap on running requests) and at most the policy's tokens a step, so those requests take at least
      ``max(ceil(sum of their steps / max_seqs), ceil(tokens / per step))`` steps over the R replicas, whose floor
      over R is a bound (the floor is convex and homogeneous: the busiest replica takes at least the average).
      Preemption only adds steps and tokens. A disaggregated replica's pools hold the same cap and run no faster
      than the ``P + D``-chip floor of all their steps (:mod:`stepsim.plan.disaggregated`)."""
    c, R = dep.chips_per_replica, dep.replicas
    sched = dep.scheduler
    n = base.n
    # the most prompt tokens one step computes: for one request, and for a whole replica
    if sched.policy == "vllm":
        per_request = sched.max_batch_tokens if not sched.chunk_tokens else min(sched.chunk_tokens,
                                                                                 sched.max_batch_tokens)
        per_step = sched.max_batch_tokens
    elif sched.policy == "sarathi":
        per_request = per_step = sched.chunk_tokens
    else:  # orca: whole prompts, up to max_seqs of them
        per_request = int(base.prompt.max())
        per_step = sched.max_seqs * per_request
    floor = StepFloor(model, hardware, c, touched, sched.max_seqs)
    one = floor(1, 1)
    prompt_steps = [-(-int(p) // per_request) for p in base.prompt]
    contexts = [(prefill_context(int(p), per_request), decode_context(int(p), int(o)))
                for p, o in zip(base.prompt, base.output)]
    lone = np.array([floor(s, int(p), context=pc) for s, p, (pc, _) in zip(prompt_steps, base.prompt, contexts)])
    decodes = [floor(int(o) - 1, int(o) - 1, int(o) - 1, dc) for o, (_, dc) in zip(base.output, contexts)]
    least = lone + np.array(decodes)
    duration = _duration_floor(base, least, prompt_steps, contexts, sched.max_seqs, per_step, floor, R)
    k = math.floor(percentile / 100 * (n - 1)) + 1  # values at or below the percentile's
    if "tpot" in slo and (base.output > 1).any() and one > slo["tpot"]:
        return 0.0, duration, "tpot"
    for key, lower in (("ttft", lone), ("e2e", least)):
        if key in slo and int((lower <= slo[key]).sum()) < k:
            return 0.0, duration, f"{key}-lone"
    bound, binds = multiplier(MAX_DOUBLINGS * STEPS_PER_DOUBLING), "grid"
    if "ttft" in slo:
        T = slo["ttft"]
        misses = n - k
        prompts = base.prompt
        # the smallest (j + 1 - misses) prompts among the first j + 1, for every j
        import heapq

        heap: list[int] = []  # max-heap (negated) of the kept smallest prompts
        total = 0
        for j in range(n):
            need = j + 1 - misses
            heapq.heappush(heap, -int(prompts[j]))
            total += int(prompts[j])
            while len(heap) > max(need, 0):
                total += heapq.heappop(heap)  # drop the largest
            if need <= 0:
                continue
            work = floor(-(-total // per_step), total) / R
            if work > T:
                a = float(base.arrival[j])
                if a <= 0:
                    return 0.0, duration, "ttft-work"
                m = a / (work - T)
                if m < bound:
                    bound, binds = m, "ttft-work"
    return bound, duration, binds


def _duration_floor(base, least, prompt_steps, contexts, max_seqs: int, per_step: int, floor,
                    replicas: int) -> DurationFloor:
    """:func:`rate_bound`'s duration floor (its docstring): per request j (in arrival order), its delay after the
    first arrival and the larger of its least latency and the floor of the work arriving from it on."""
    order = np.argsort(base.arrival, kind="stable")
    first = float(base.arrival[order[0]])
    delays, rests = [], []
    seq_steps = tokens = decode = context = 0  # of the requests arriving from j on (Python integers: exact)
    for j in order[::-1].tolist():
        seq_steps += prompt_steps[j] + int(base.output[j]) - 1
        tokens += int(base.prompt[j]) + int(base.output[j]) - 1
        decode += int(base.output[j]) - 1
        context += sum(contexts[j])
        steps = max(-(-seq_steps // max_seqs), -(-tokens // per_step))
        delays.append(float(base.arrival[j]) - first)
        rests.append(max(float(least[j]), floor(steps, tokens, decode, context) / replicas))
    return DurationFloor.of(delays, rests)


def prefill_context(prompt: int, chunk: int) -> int:
    """The fewest cached tokens a prompt of ``prompt`` tokens computed in chunks of at most ``chunk`` reads in all
    (each chunk reads the ones before it): ``ceil(prompt / chunk)`` chunks, the short one first,
    ``r q + chunk q (q - 1) / 2`` (``q`` whole chunks, ``r`` the rest): a further chunk, or a larger one later, only
    adds."""
    q, r = divmod(prompt, chunk)
    return r * q + chunk * q * (q - 1) // 2


def decode_context(prompt: int, output: int) -> int:
    """The cached tokens a request's decode steps read in all: output token ``i`` (``2 .. output``; the first comes
    with the prompt's last chunk) is computed over the prompt and the ``i - 2`` tokens before its input,
    ``(output - 1) prompt + (output - 1) (output - 2) / 2``; a preempted request recomputes its cache in a prefill,
    its decode steps' contexts unchanged."""
    return max(output - 1, 0) * prompt + max(output - 1, 0) * max(output - 2, 0) // 2


def can_reach_front(bound: float, beat: float, match: float) -> bool:
    """Whether a deployment whose goodput is at most ``bound`` can be on the front: above ``beat`` (the best of
    fewer chips) and at least ``match`` (the best of equal chips so far: equal goodput on equal chips, both are)."""
    return bound > beat and bound >= match


def goodput_bound(n: int, m: float, duration: DurationFloor) -> float:
    """Goodput (requests/s) at most ``n`` over the least duration at multiplier ``m`` (0 for no rate)."""
    if m <= 0:
        return 0.0
    seconds = duration.at(m)
    return n / seconds if seconds > 0 else math.inf


def front(rows: list) -> list:
    """Indices of the front among ``rows`` (dicts with ``chips`` and ``goodput``; None: not on it): a row is on it
    when no other has at most its chips and at least its goodput, with fewer chips or more goodput."""
    out = []
    for i, r in enumerate(rows):
        if r["goodput"] is None:
            continue
        dominated = any(o["goodput"] is not None and o["chips"] <= r["chips"] and o["goodput"] >= r["goodput"]
                        and (o["chips"] < r["chips"] or o["goodput"] > r["goodput"]) for o in rows)
        if not dominated:
            out.append(i)
    return out

