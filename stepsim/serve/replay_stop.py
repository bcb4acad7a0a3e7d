"""Stopping a replay once its SLO is provably missed at a percentile (docs/plan.md §4, "Early stop"): a plan probes
rates at which most deployments fail, and a failure is often certain long before the trace is served.

A :class:`StopRule` gives the SLO's limits (s; ``inf`` for a metric the SLO does not hold) and, per metric, how many
requests may miss it (``*_misses``): with ``n`` values, numpy's linear p-th percentile is at least the sorted value
at ``floor((n - 1) p / 100)`` (:func:`allowed_misses`), so once more than ``n - 1 - floor((n - 1) p / 100)`` values
are over the limit the percentile is over it too, whatever the rest of the run does. A replay with a rule counts,
after every step (at its end ``now``):

* a request's TTFT when its first token comes (``first - arrival``, the float its metrics compute), and the TTFT of
  every request still without its first token once ``now - arrival`` is over the limit (its first token comes at a
  later step's end, so its TTFT is at least that: float subtraction is monotone);
* its E2E when it finishes, and likewise for every unfinished request once ``now - arrival`` is over the limit;
* its TPOT (outputs of more than one token) when it finishes, as the metrics compute it.

Each request counts at most once per metric. When a count passes its allowance the replay raises
:class:`ReplayStopped`. A rule never changes a step: a run that is not stopped is the run without a rule, bit for
bit. The counts are the replay's own requests: a replica of a deployment that alone misses more than the whole
deployment may proves the deployment misses too (its misses are among the deployment's).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


def allowed_misses(n: int, percentile: float) -> int:
    """How many of ``n`` values may exceed a limit with numpy's linear ``percentile`` (0..100] still possibly at
    most the limit: ``n - 1 - floor((n - 1) q)`` with ``q = percentile / 100`` as numpy computes the index
    (``numpy.lib._function_base_impl._quantile``: ``(n - 1) * q``, floored); ``n`` (every one) when ``n`` is 0."""
    if n <= 0:
        return 0
    below = int(np.floor((n - 1) * np.true_divide(np.float64(percentile), 100)))
    return n - 1 - below


@dataclass(frozen=True)
class StopRule:
    """Limits (s, ``inf``: not held) and the misses each may have before the replay stops (module docstring)."""

    ttft: float = math.inf
    tpot: float = math.inf
    e2e: float = math.inf
    ttft_misses: int = 0
    tpot_misses: int = 0
    e2e_misses: int = 0

    @classmethod
    def of_slo(cls, slo: dict, percentile: float, requests: int, many: int) -> StopRule:
        """The rule of an SLO (``{"ttft": s, ...}``) at ``percentile`` over ``requests`` requests of which ``many``
        have more than one output token (TPOT's values)."""
        return cls(slo.get("ttft", math.inf), slo.get("tpot", math.inf), slo.get("e2e", math.inf),
                   allowed_misses(requests, percentile), allowed_misses(many, percentile),
                   allowed_misses(requests, percentile))

    def after(self, ttft: np.ndarray, tpot: np.ndarray, e2e: np.ndarray) -> StopRule | None:
        """The rule for a deployment's other requests once some of its requests were served in full, with these
        TTFT, TPOT (outputs of more than one token) and E2E values (s, the floats its metrics compute): each
        allowance less their misses (the deployment's misses add up over its replicas); None when a count already
        passed its allowance: the SLO is missed, whatever the others do."""
        left = (self.ttft_misses - int(np.count_nonzero(ttft > self.ttft)),
                self.tpot_misses - int(np.count_nonzero(tpot > self.tpot)),
                self.e2e_misses - int(np.count_nonzero(e2e > self.e2e)))
        if min(left) < 0:
            return None
        return StopRule(self.ttft, self.tpot, self.e2e, *left)

    def as_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """The compiled replay's ``stop_f`` (the limits) and ``stop_i`` (stop.ACTIVE, the allowances, then the
        counts and the two arrival pointers at 0): :mod:`stepsim.kernels.serve_replay`'s layout."""
        return (np.array([self.ttft, self.tpot, self.e2e]),
                np.array([1, self.ttft_misses, self.tpot_misses, self.e2e_misses, 0, 0, 0, 0, 0], dtype=np.int64))


class ReplayStopped(Exception):  # noqa: N818 (an outcome, not an error: the SLO is missed)
    """A replay with a :class:`StopRule` stopped: ``metric`` (``ttft`` / ``tpot`` / ``e2e``) has more misses than
    its allowance after ``steps`` steps, at ``now`` s; ``max_utilisation``: the largest HBM or compute utilisation
    of those steps (0 when the provider reports none)."""

    def __init__(self, metric: str, steps: int, now: float, max_utilisation: float = 0.0):
        super().__init__(f"{metric} missed by more requests than the percentile allows after {steps} steps "
                         f"(at {now!r} s)")
        self.metric, self.steps, self.now, self.max_utilisation = metric, steps, now, max_utilisation


class StopTracker:
    """The Python replay's side of a rule (:func:`stepsim.serve.replay.replay_reference`); the compiled replay
    counts the same in :func:`stepsim.kernels.serve_replay._stop_check`."""

    def __init__(self, rule: StopRule, arrival: list, output: list, position: dict | None = None,
                 since: list | None = None):
        """``arrival`` (s, sorted) and ``output`` by position; ``position[r.index]``: a request's position (None: its
        index); ``since``: what a request's metrics are measured from (s; None: its arrival). A disaggregated decode
        pool's requests keep their trace indices, arrive in their own order and are measured from their arrivals
        in the trace (:mod:`stepsim.serve.disaggregated`, "Early stop")."""
        self.rule, self.arrival, self.output, self.position = rule, arrival, output, position
        self.since = arrival if since is None else since
        n = len(arrival)
        self.ttft_seen = [False] * n
        self.end_seen = [False] * n
        self.e2e_seen = [False] * n
        self.misses = {"ttft": 0, "tpot": 0, "e2e": 0}
        self.ptr_ttft = self.ptr_e2e = 0

    def after_step(self, batch, now: float) -> str | None:
        """Count the step's first tokens and finishes and the requests now late; the metric over its allowance,
        or None."""
        rule, arrival, since, misses = self.rule, self.arrival, self.since, self.misses
        n = len(arrival)  # a request with now - arrival > a limit > 0 has arrived
        for r, _ in batch:
            i = r.index if self.position is None else self.position[r.index]
            if r.first_token >= 0.0 and not self.ttft_seen[i]:
                self.ttft_seen[i] = True
                if r.first_token - since[i] > rule.ttft:
                    misses["ttft"] += 1
            if r.finish >= 0.0 and not self.end_seen[i]:
                self.end_seen[i] = True
                e2e = r.finish - since[i]
                if not self.e2e_seen[i]:
                    self.e2e_seen[i] = True
                    if e2e > rule.e2e:
                        misses["e2e"] += 1
                out = self.output[i]
                if out > 1 and (e2e - (r.first_token - since[i])) / (out - 1) > rule.tpot:
                    misses["tpot"] += 1
        while self.ptr_ttft < n and now - arrival[self.ptr_ttft] > rule.ttft:
            i = self.ptr_ttft
            if not self.ttft_seen[i]:  # no first token yet: it comes at a later step's end
                self.ttft_seen[i] = True
                misses["ttft"] += 1
            self.ptr_ttft += 1
        while self.ptr_e2e < n and now - arrival[self.ptr_e2e] > rule.e2e:
            i = self.ptr_e2e
            if not self.e2e_seen[i]:
                self.e2e_seen[i] = True
                misses["e2e"] += 1
            self.ptr_e2e += 1
        for metric, allowed in (("ttft", rule.ttft_misses), ("tpot", rule.tpot_misses), ("e2e", rule.e2e_misses)):
            if misses[metric] > allowed:
                return metric
        return None
