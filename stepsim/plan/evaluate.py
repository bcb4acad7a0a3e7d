"""One deployment at one arrival rate: its replicas served through :func:`stepsim.serve`, their requests merged,
the SLO checked at the percentile (docs/plan.md §3).

The metrics are serve's (docs/serving.md §6) over every request of every replica: TTFT, TPOT (outputs of more than
one token), E2E; ``duration_s`` from the first arrival to the last completion; a request is good when each metric
of the SLO is at most its limit (a one-token output's TPOT counts as 0); ``slo_attainment`` = good / requests,
``goodput_requests_per_s`` = good / duration. The deployment *meets the SLO at percentile p* when each metric's
p-th percentile (numpy's linear one, as serve's p99) is at most its limit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from stepsim.plan.replicas import MAX_ROUNDS, route
from stepsim.plan.space import Deployment


@dataclass(frozen=True)
class BaseTrace:
    """The requests at the offered rate: ``arrival`` (s, the first at 0), ``prompt``, ``output`` tokens."""

    arrival: np.ndarray
    prompt: np.ndarray
    output: np.ndarray

    @property
    def n(self) -> int:
        return len(self.arrival)

    @property
    def span_s(self) -> float:
        """First to last arrival (s)."""
        return float(self.arrival[-1] - self.arrival[0])

    @property
    def rate(self) -> float:
        """Offered requests per second: requests over the arrival span (requests - 1 gaps)."""
        return (self.n - 1) / self.span_s if self.span_s > 0 else math.inf


@dataclass
class Evaluation:
    """A deployment served at ``multiplier`` times the offered rate (``metrics`` None: a replay stopped early, the
    SLO provably missed)."""

    multiplier: float
    meets: bool
    metrics: dict
    rounds: int
    max_utilisation: float
    assignment: np.ndarray


#: a plan's replay counters (plan.json and deployments.parquet): full replays, stopped early (the SLO provably
#: missed), reused (the same replica run made before) and ended by a step the chip cannot run
REPLAY_COUNTS = ("replays", "replays_stopped", "replays_reused", "replays_unservable")


class Evaluator:
    """Serves deployments (``evaluate``) and counts the replays (one per replica run through serve): ``replays``
    served every request, ``stopped`` stopped early (``stop_early``: a replay whose SLO is provably missed at the
    percentile stops there, :mod:`stepsim.serve.replay_stop`), ``unservable`` ended by a step the chip cannot run
    (:class:`~stepsim.mapping.units.Infeasible`: no schedule of a layer at the step's tokens fits it; an Orca
    step of whole prompts at a high rate), which fails the probe: the deployment cannot serve that rate as priced.
    A state-dependent router's replicas are replayed together (:mod:`stepsim.plan.joint`: one replay of each)
    unless ``joint`` is False or their loops are not the compiled one; else by rounds of separate replays
    (:mod:`stepsim.plan.replicas`: the same routing)."""

    def __init__(self, model_arg, base: BaseTrace, slo: dict, percentile: float, pricers: dict, folder: Path,
                 stop_early: bool = False, joint: bool = True):
        self.model_arg, self.base, self.slo, self.percentile = model_arg, base, slo, percentile
        self.pricers, self.folder = pricers, Path(folder)
        self.joint = joint
        self.replays = 0
        self.stopped = 0
        self.reused = 0
        self.unservable = 0
        self.stop_rule = None
        if stop_early:
            from stepsim.serve.replay_stop import StopRule

            self.stop_rule = StopRule.of_slo(slo, percentile, base.n, int((base.output > 1).sum()))
        # a replica's run depends only on its shape, scheduler, requests and their arrivals: two deployments (or
        # two routing rounds) that send one replica the same requests at the same rate share its replay
        self._runs: dict[tuple, dict] = {}
        self._joint_runs: dict[tuple, Evaluation | None] = {}  # replicas replayed together: by deployment and arrivals
        # a state-dependent router's last settled routing of each deployment: the next rate's first round
        # (stepsim/plan/replicas.py: the rounds reach the same fixed point from any first routing)
        self._settled: dict = {}

    def counts(self) -> dict:
        """The replays so far, keyed as :data:`REPLAY_COUNTS`."""
        return dict(zip(REPLAY_COUNTS, (self.replays, self.stopped, self.reused, self.unservable)))

    def _serve_replica(self, dep: Deployment, arrival: np.ndarray, indices: np.ndarray, stop=None) -> dict:
        """Serve the requests ``indices`` (arriving at ``arrival[indices]``) on one replica of ``dep``; a run
        already made for the same replica shape, scheduler, requests and arrivals (and stop rule) is reused
        (``reused``). ``stop``: the replay's :class:`~stepsim.serve.replay_stop.StopRule` (a stopped run:
        ``{"stopped": metric, "max_utilisation": ...}``)."""
        key = (dep.hardware, dep.chips_per_replica, dep.disaggregate, dep.scheduler, indices.tobytes(),
               arrival[indices].tobytes(), stop)
        if key in self._runs:
            self.reused += 1
            return self._runs[key]
        self._runs[key] = out = self._replay(dep, arrival, indices, stop)
        return out

    def _replay(self, dep: Deployment, arrival: np.ndarray, indices: np.ndarray, stop=None) -> dict:
        from stepsim.mapping.units import Infeasible
        from stepsim.serve.api import serve
        from stepsim.trace_io.requests import RequestTrace

        # in memory, not a file (writing, reading back and removing a Parquet file was 4-5 ms of every replay); the
        # ids are the base trace's rows, as the written file held them
        b = self.base
        requests = RequestTrace(f"{dep.label()} replica requests", indices.astype(np.int64), arrival[indices],
                                b.prompt[indices], b.output[indices])

        from stepsim.serve.replay_stop import ReplayStopped

        try:
            if dep.disaggregate:  # a prefill pool and a decode pool: stepsim/plan/disaggregated.py
                from stepsim.plan.disaggregated import serve_replica

                result = serve_replica(self, dep, requests, stop)
            else:
                pricer = self.pricers[(dep.hardware, dep.chips_per_replica)]
                # report_layers=False: the replay is read for its requests only; the summary's per-bucket schedules
                # would map buckets no step was priced by (an expert-parallel system's one-chip FFN schedules)
                result = serve(self.model_arg, requests, provider=pricer.provider(), hardware=dep.hardware,
                               system=dep.system, stop=stop, report_layers=False, **dep.scheduler.serve_kwargs())
        except ReplayStopped as stopped:  # the SLO provably missed: this replica alone fails the deployment
            self.stopped += 1
            return {"stopped": stopped.metric, "max_utilisation": stopped.max_utilisation}
        except Infeasible as exc:  # a step this replica cannot run: it fails the deployment at this rate, as a
            # stopped replay does
            self.unservable += 1
            return {"stopped": str(exc), "max_utilisation": 0.0}
        self.replays += 1
        req = result.requests
        it = result.iterations
        util = 0.0
        for col in ("hbm_utilisation", "compute_utilisation"):
            if col in it.column_names and it.num_rows:
                util = max(util, float(np.max(it.column(col).to_numpy())))
        return {"first_token": req.column("first_token_s").to_numpy(), "finish": req.column("finish_s").to_numpy(),
                "max_utilisation": util}

    def evaluate(self, dep: Deployment, multiplier: float) -> Evaluation:
        """Serve ``dep`` with every arrival divided by ``multiplier`` (docs/plan.md §3). A state-dependent router's
        rounds start from the routing this deployment's last evaluation settled on (its search's previous rate):
        they reach the same fixed point from any first routing (:mod:`stepsim.plan.replicas`)."""
        b = self.base
        arrival = b.arrival / multiplier
        kv = b.prompt + b.output
        n, replicas = b.n, dep.replicas
        state_dependent = dep.router != "round-robin" and replicas > 1
        if state_dependent and self.joint and not dep.disaggregate:
            joint = self._joint(dep, multiplier, arrival)
            if joint is not None:
                return joint
        assignment = self._settled.get(dep) if state_dependent else None
        if assignment is None:
            assignment = route(dep.router, arrival, kv, replicas, None, None)
        # a replay may stop early only when its routing is final: a state-dependent router's first rounds route by
        # finish times that later rounds change, so a failure there proves nothing
        stop = self.stop_rule if not state_dependent else None
        rounds = 0
        while True:
            rounds += 1
            first = np.full(n, np.nan)
            finish = np.full(n, np.nan)
            util = 0.0
            left = stop  # the misses the deployment may still have: a replica's count against what the others left
            for r in range(replicas):
                idx = np.flatnonzero(assignment == r)
                if not len(idx):
                    continue
                out = self._serve_replica(dep, arrival, idx, left)
                if "stopped" in out:  # its misses exceed what the deployment has left, or a step it cannot run
                    return Evaluation(multiplier, False, None, rounds, max(util, out["max_utilisation"]), assignment)
                first[idx], finish[idx] = out["first_token"], out["finish"]
                util = max(util, out["max_utilisation"])
                if left is not None:
                    left = left.after(*self._values(arrival[idx], first[idx], finish[idx], b.output[idx]))
                    if left is None:  # the replicas served so far already miss it: the others need not be served
                        return Evaluation(multiplier, False, None, rounds, util, assignment)
            if not state_dependent:
                break
            nxt = route(dep.router, arrival, kv, replicas, assignment, finish)
            if np.array_equal(nxt, assignment):
                self._settled[dep] = assignment
                break
            if rounds >= MAX_ROUNDS:
                raise RuntimeError(f"{dep.label()}: routing did not settle in {MAX_ROUNDS} rounds")
            assignment = nxt
        metrics = self.metrics(arrival, first, finish)
        metrics["requests_per_replica"] = np.bincount(assignment, minlength=replicas).tolist()
        return Evaluation(multiplier, metrics["meets_slo"], metrics, rounds, util, assignment)

    def _joint(self, dep: Deployment, multiplier: float, arrival: np.ndarray) -> Evaluation | None:
        """``dep``'s replicas replayed together (:mod:`stepsim.plan.joint`: one replay of each, the fixed point's
        routing), stopping once a replica's SLO is provably missed (its routing is final as it is made); None when
        a replica's loop is not the compiled one. An evaluation made before (the same deployment, arrivals and stop
        rule) is reused."""
        key = (dep, arrival.tobytes(), self.stop_rule)
        if key in self._joint_runs:
            self.reused += dep.replicas
            return self._joint_runs[key]
        self._joint_runs[key] = out = self._joint_replay(dep, multiplier, arrival)
        return out

    def _joint_replay(self, dep: Deployment, multiplier: float, arrival: np.ndarray) -> Evaluation | None:
        from stepsim.mapping.units import Infeasible
        from stepsim.plan.joint import joint_replay
        from stepsim.serve.api import replica_schedulers
        from stepsim.serve.replay_compiled import CompiledLoop
        from stepsim.serve.replay_stop import ReplayStopped

        b = self.base
        pricer = self.pricers[(dep.hardware, dep.chips_per_replica)]
        schedulers = replica_schedulers(self.model_arg, hardware=dep.hardware, system=dep.system,
                                        **dep.scheduler.serve_kwargs())

        def replica():
            scheduler = schedulers()
            provider = pricer.provider()
            loop = CompiledLoop.make(b.n, scheduler, provider, stop=self.stop_rule)
            return loop, scheduler, getattr(provider, "close", lambda: None)

        try:
            run = joint_replay(dep.router, dep.replicas, arrival, b.prompt, b.output, replica)
        except ReplayStopped as stopped:  # the replicas' replays all end here
            self.stopped += dep.replicas
            return Evaluation(multiplier, False, None, 1, stopped.max_utilisation, np.empty(0, dtype=np.int64))
        except Infeasible:  # a step a replica cannot run (class docstring): the replays all end here
            self.unservable += dep.replicas
            return Evaluation(multiplier, False, None, 1, 0.0, np.empty(0, dtype=np.int64))
        if run is None:
            return None
        self.replays += len(np.unique(run.assignment))  # each replica sent a request, replayed once
        metrics = self.metrics(arrival, run.first_token, run.finish)
        metrics["requests_per_replica"] = np.bincount(run.assignment, minlength=dep.replicas).tolist()
        return Evaluation(multiplier, metrics["meets_slo"], metrics, 1, run.max_utilisation, run.assignment)

    @staticmethod
    def _values(arrival, first, finish, output) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(ttft, tpot, e2e)`` (s) of requests arriving at ``arrival`` with their first token at ``first`` and
        finishing at ``finish``; TPOT of those with more than one output token only."""
        ttft = first - arrival
        e2e = finish - arrival
        many = output > 1
        return ttft, ((e2e - ttft) / np.maximum(output - 1, 1))[many], e2e

    def metrics(self, arrival: np.ndarray, first: np.ndarray, finish: np.ndarray) -> dict:
        """The merged metrics and the SLO check (module docstring)."""
        out_tokens = self.base.output
        ttft, tpot_many, e2e = self._values(arrival, first, finish, out_tokens)
        many = out_tokens > 1
        tpot = np.zeros(len(arrival))  # a single-token request has none: 0 meets any limit
        tpot[many] = tpot_many
        values = {"ttft": ttft, "tpot": tpot_many, "e2e": e2e}
        duration = float(finish.max() - arrival.min())
        good = np.ones(len(arrival), dtype=bool)
        meets = True
        for key, limit in self.slo.items():
            good &= (tpot if key == "tpot" else values[key]) <= limit
            v = values[key]
            if len(v) and float(np.percentile(v, self.percentile)) > limit:
                meets = False
        pct = self.percentile

        def p(v):
            return float(np.percentile(v, pct)) if len(v) else None

        n_good = int(good.sum())
        return {"meets_slo": meets, "ttft_p": p(ttft), "tpot_p": p(tpot[many]), "e2e_p": p(e2e),
                "ttft_p99": p99(ttft), "tpot_p99": p99(tpot[many]), "duration_s": duration,
                "slo_attainment": n_good / len(arrival),
                "goodput_requests_per_s": n_good / duration if duration > 0 else math.inf}


def p99(v: np.ndarray) -> float | None:
    return float(np.percentile(v, 99)) if len(v) else None
