"""A deployment's replicas behind a router, served through :func:`stepsim.serve` (docs/plan.md §3).

Each replica is a ``stepsim serve`` run of the requests the router sends it. The routers:

* ``round-robin``: request i (in arrival order) to replica ``i mod R``;
* ``least-outstanding``: to the replica with the fewest outstanding requests (routed to it and not finished) at
  the request's arrival;
* ``kv-load``: to the replica whose outstanding requests will hold the fewest KV tokens (their prompt + output
  tokens, what they hold when they finish);

ties to the lowest replica. A request finishing exactly at another's arrival is no longer outstanding.

The two state-dependent routers need each replica's finish times, which depend on what was routed to it. The plan
replays such replicas together, routing each request at its arrival (:mod:`stepsim.plan.joint`, one replay each);
where a replica's loop is not the compiled one, the same routing is found by a fixed-point iteration that is exact.
Route every request from the finish times of the last replay (a request whose replica changed counts as
outstanding), replay the replicas whose requests changed, repeat until the routing does not change. Whether request
i's earlier requests are outstanding at its arrival depends only on the requests that arrived before it (a request
joins a step at or after its arrival, so it cannot change anything that finished before), so if the last routing is
right for the first k requests, the next is right for the first k + 1: the iteration ends, after at most N + 1
rounds, at the routing a router running alongside the replicas makes. It is not cheap: on 24 requests of a small
model, a 2-replica deployment's rate search took 74 to 110 replica runs against 16 with round-robin (several rounds
a rate); a 2-replica least-outstanding deployment of the 4-layer Qwen3 shape on 300 conversation requests, 736 over
its nine rates (820 with every rate's rounds from scratch). The argument holds from any first routing (the first
request's replica depends on nothing; then by induction), and the fixed point is unique, so a rate search starts
each rate's rounds from the routing its last rate settled on (:class:`stepsim.plan.evaluate.Evaluator`): the same
routing, usually in fewer rounds (tests/plan/test_plan.py: 12 requests on 3 replicas over a search's 7 rates, 27
rounds against 49 from scratch).
"""

from __future__ import annotations

import numpy as np

#: the rounds a state-dependent routing may take (the bound above is N + 1; this stops a runaway loop sooner)
MAX_ROUNDS = 10_000


def round_robin(n: int, replicas: int) -> np.ndarray:
    return np.arange(n, dtype=np.int64) % replicas


def route(router: str, arrival: np.ndarray, kv_tokens: np.ndarray, replicas: int, previous: np.ndarray | None,
          finish: np.ndarray | None) -> np.ndarray:
    """The replica of every request for ``router`` given the finish times of a replay of ``previous`` (the first
    round: none, every routed request outstanding)."""
    n = len(arrival)
    if router == "round-robin" or replicas == 1:
        return round_robin(n, replicas)
    out = np.empty(n, dtype=np.int64)
    weight = np.ones(n, dtype=np.float64) if router == "least-outstanding" else kv_tokens.astype(np.float64)
    # outstanding requests of each replica as a list of (finish time, weight); a small trace per replica
    pending: list[list[tuple[float, float]]] = [[] for _ in range(replicas)]
    load = np.zeros(replicas)
    for i in range(n):
        now = arrival[i]
        for r in range(replicas):
            keep = []
            for f, w in pending[r]:
                if f > now:
                    keep.append((f, w))
                else:
                    load[r] -= w
            pending[r] = keep
        r = int(np.argmin(load))
        out[i] = r
        known = previous is not None and previous[i] == r
        pending[r].append((float(finish[i]) if known else np.inf, weight[i]))
        load[r] += weight[i]
    return out
