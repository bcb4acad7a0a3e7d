"""The rate search of one deployment, the upper bounds that prune, and the plan's loop over the space
(docs/plan.md §4).

**Rate search.** Rates are multipliers of the offered rate on a grid ``m = 2**(e / STEPS_PER_DOUBLING)`` (integer
e), so every run is reproducible bit for bit. Bracket: serve at m = 1; while the SLO is met double m (up to
``2**MAX_DOUBLINGS``: a deployment that meets it there is reported at that rate, ``capped``); while it is not met
halve m (down to ``2**-MAX_DOUBLINGS``: below it the deployment sustains no rate, 0). Then bisect the exponent
between the highest rate that met the SLO and the lowest above it that did not, until they are one grid step apart
(``2**(1/16)``, 4.4 %). The sustainable rate is the last that met it; its goodput and SLO attainment are that run's.
The bisection takes the SLO at the percentile to hold below any rate where it held (as every capacity search does);
a plan and a brute-force search of every deployment run the same probes, so they agree whether it does or not.

**Bounds.** A deployment's goodput at its sustainable rate m* is at most ``requests / duration`` with the duration
at least its floor at m* (:class:`DurationFloor`: each request's arrival plus the larger of its least latency and
the least time of the work arriving from it on), which falls as m rises; so it is below ``N / floor(m_hi)``
whenever the search has seen the SLO fail at ``m_hi`` (m* < m_hi), and at most ``N / floor(m_ub)`` for the bound
m_ub of :func:`rate_bound` before any run. A deployment of C chips can only be on the front (fewest chips
for its goodput) if its goodput beats every deployment of fewer chips; a deployment whose bound cannot is
``pruned`` (by the bound, before any run) or ``cut`` (by the failed rate, during its search). Deployments are
searched in waves, one per chip count, fewest chips first (:mod:`stepsim.plan.waves`), so the front of fewer chips
is final when a wave starts.

**Front probe.** The search's result is below the first rate of its doubling phase (1, 2, 4, ... times the offered
rate) where the SLO fails, whatever the SLO does elsewhere: the bracket and the bisection stay below it. So a
failure at any doubling rate ``2**k`` (k >= 1) bounds the result below ``2**k`` on its own. Before its search a
deployment is served at the highest doubling rate where such a failure proves it cannot reach the front; failing
there it is ``cut`` after one probe, else the search runs as always and reuses that run when it gets there.
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


def multiplier(e: int) -> float:
    return 2.0 ** (e / STEPS_PER_DOUBLING)


@dataclass
class SearchResult:
    """How a deployment's search ended: ``status`` ``searched`` / ``capped`` / ``unsustainable`` / ``cut``, the
    probes ``(exponent, met)``, the best evaluation (the highest rate that met the SLO) and the lowest failing
    exponent."""

    status: str
    probes: list = field(default_factory=list)
    best: object = None
    hi: int | None = None
    offered: object = None
    #: the largest HBM or compute utilisation of any step of any probe (at most 1: the floors held)
    max_utilisation: float = 0.0
    #: the front-rate probe ``(exponent, met)`` made before the search (None: none made)
    front_probe: tuple | None = None


def front_exponent(can_win) -> int | None:
    """The highest grid exponent e at which a failed SLO already proves the deployment cannot reach the front
    (``can_win(e)`` False; it is monotone: a higher failing rate leaves a higher goodput bound), or
    None when a failure at the search's lowest rate would not (nothing to probe)."""
    top = MAX_DOUBLINGS * STEPS_PER_DOUBLING
    if can_win(-top):
        return None
    lo, hi = -top, top + 1  # can_win False at lo; hi: above the grid
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if can_win(mid):
            hi = mid
        else:
            lo = mid
    return lo


def search_rate(evaluate, can_win, front_probe: bool = False) -> SearchResult:
    """The rate search (module docstring). ``evaluate(m)`` serves at multiplier m; ``can_win(e)`` says whether
    the deployment could still reach the front when the SLO failed at ``multiplier(e)`` (its sustainable rate at
    most ``multiplier(e - 1)``; False: stop, ``cut``).

    ``front_probe``: first serve at the highest doubling rate (exponent a positive multiple of
    STEPS_PER_DOUBLING) at or below :func:`front_exponent`; if the SLO fails there, stop (``cut``, one probe): the
    search's result would be below the first doubling rate where the SLO fails, so below this one (module
    docstring), with no premise on the SLO's shape. Else search as without it, from the offered rate: the same
    probes and the same result (the probe is one of them; its run is reused)."""
    res = SearchResult("searched")
    lo = hi = None  # exponents: highest met, lowest failed
    start = 0
    if front_probe:
        e = front_exponent(can_win)
        # the highest rate of the search's doubling phase (0, 16, 32, ...) at most there: a failure at any of them
        # bounds the search's result below it, whatever the SLO does at other rates (module docstring)
        e = None if e is None else min(e, MAX_DOUBLINGS * STEPS_PER_DOUBLING) // STEPS_PER_DOUBLING * STEPS_PER_DOUBLING
        if e is not None and e > 0:  # at 0 the search's own first probe and cut check do it
            ev = evaluate(multiplier(e))
            res.front_probe = (e, ev.meets)
            res.max_utilisation = ev.max_utilisation
            if e == 0:
                res.offered = ev
            if not ev.meets:
                res.status, res.hi = "cut", e
                return res

    def probe(e: int) -> bool:
        ev = evaluate(multiplier(e))
        res.probes.append((e, ev.meets))
        res.max_utilisation = max(res.max_utilisation, ev.max_utilisation)
        if e == 0:
            res.offered = ev
        if ev.meets:
            res.best = ev
        return ev.meets

    step = STEPS_PER_DOUBLING
    top = MAX_DOUBLINGS * step
    if probe(start):
        lo = start
        while lo < top:
            if probe(lo + step):
                lo += step
            else:
                hi = lo + step
                break
        if hi is None:
            res.status = "capped"
            return res
    else:
        hi = start
        while True:
            if not can_win(hi):
                res.status, res.hi = "cut", hi
                return res
            if hi - step < -top:
                res.status, res.hi = "unsustainable", hi
                return res
            if probe(hi - step):
                lo = hi - step
                break
            hi -= step
    while hi - lo > 1:
        if not can_win(hi):
            res.status, res.hi = "cut", hi
            return res
        mid = (lo + hi) // 2
        if probe(mid):
            lo = mid
            # the best met so far is the highest: probes rise from lo
        else:
            hi = mid
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


def rate_bound(dep, model, hardware, base, slo: dict, percentile: float) -> tuple[float, DurationFloor, str]:
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

    The duration floor (:class:`DurationFloor`) is, for each request j, its arrival plus the larger of
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
    floor = StepFloor(model, hardware, c)
    one = floor(1, 1)
    prompt_steps = [-(-int(p) // per_request) for p in base.prompt]
    lone = np.array([floor(s, int(p)) for s, p in zip(prompt_steps, base.prompt)])
    least = lone + (base.output - 1) * one
    duration = _duration_floor(base, least, prompt_steps, sched.max_seqs, per_step, floor, R)
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


def _duration_floor(base, least, prompt_steps, max_seqs: int, per_step: int, floor, replicas: int) -> DurationFloor:
    """:func:`rate_bound`'s duration floor (its docstring): per request j (in arrival order), its delay after the
    first arrival and the larger of its least latency and the floor of the work arriving from it on."""
    order = np.argsort(base.arrival, kind="stable")
    first = float(base.arrival[order[0]])
    delays, rests = [], []
    seq_steps = tokens = 0  # of the requests arriving from j on (Python integers: exact)
    for j in order[::-1].tolist():
        seq_steps += prompt_steps[j] + int(base.output[j]) - 1
        tokens += int(base.prompt[j]) + int(base.output[j]) - 1
        steps = max(-(-seq_steps // max_seqs), -(-tokens // per_step))
        delays.append(float(base.arrival[j]) - first)
        rests.append(max(float(least[j]), floor(steps, tokens) / replicas))
    return DurationFloor.of(delays, rests)


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

