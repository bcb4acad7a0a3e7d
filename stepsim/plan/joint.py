"""A state-dependent router's replicas replayed together, in time order (docs/plan.md §3).

``least-outstanding`` and ``kv-load`` route a request by the replicas' state at its arrival: which of their
requests are still outstanding then. :mod:`stepsim.plan.replicas` finds that routing by rounds of separate replays
(up to N + 1 of them; about 40 a rate on 300 conversation requests). Here the router runs alongside the replicas,
as the fixed point's own definition says, in one replay of each:

* before routing request i (arriving at ``a_i``), every replica runs each step that *starts before* ``a_i``
  (:meth:`stepsim.serve.replay_compiled.CompiledLoop.run_until`). None of them can take request i (a step takes the
  requests that arrived by its start), and every step ending by ``a_i`` has run (a step lasts more than 0 s), so
  each request routed earlier is known to have finished by ``a_i`` or is outstanding;
* request i goes to the replica with the least load (:func:`stepsim.plan.replicas.route`'s rule for one request,
  ties to the lowest), the next column of that replica's table.

A replica's steps depend only on the requests it was sent and their arrivals, so each replica's run is, step for
step, its separate replay of the same requests, and the routing is the fixed point's, bit for bit
(tests/plan/test_joint.py on random traces, tests/plan/test_plan.py on the fast model). A replica's loop is the
compiled one; a provider or scheduler it does not reproduce makes :func:`joint_replay` return None (the caller then
iterates).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np


@dataclass
class JointRun:
    """Every request's replica (``assignment``), first-token and finish times (s), and the largest utilisation
    (HBM or compute) of any replica's step."""

    assignment: np.ndarray
    first_token: np.ndarray
    finish: np.ndarray
    max_utilisation: float


def _check_shared_allowance(loops: list, now: float, kr) -> None:
    """Raise :class:`~stepsim.serve.replay_stop.ReplayStopped` when the replicas' misses so far, added up, pass the
    deployment's allowance of a metric (each loop stops on its own misses alone; its requests are the deployment's,
    so the sum counts distinct misses of the deployment: stepsim/serve/replay_stop.py)."""
    stop_i = loops[0].stop_i
    if not stop_i[kr.SP_ACTIVE]:
        return
    for name, miss, allow in kr.SP_METRICS:
        if sum(int(loop.stop_i[miss]) for loop in loops) > stop_i[allow]:
            from stepsim.serve.replay_stop import ReplayStopped

            raise ReplayStopped(name, sum(int(loop.st[kr.S_STEPS]) for loop in loops), now)


def joint_replay(router: str, replicas: int, arrival: np.ndarray, prompt: np.ndarray, output: np.ndarray,
                 replica: Callable) -> JointRun | None:
    """Replay ``replicas`` replicas behind ``router`` (``least-outstanding`` or ``kv-load``) over the requests
    (``arrival`` s, sorted; ``prompt`` and ``output`` tokens). ``replica()`` gives a fresh replica as
    ``(CompiledLoop or None, scheduler, close)``. None when a replica's loop is not the compiled one or refuses a
    step (the caller replays separately, and the reference raises its error); once the SLO is provably missed (by a
    replica's misses alone, or by the replicas' added up at an arrival or an end) it raises
    :class:`~stepsim.serve.replay_stop.ReplayStopped` (every replica closed first)."""
    from stepsim.kernels import serve_replay as kr
    from stepsim.serve.replay import max_utilisation

    n = len(arrival)
    weight = np.ones(n) if router == "least-outstanding" else (prompt + output).astype(np.float64)
    made = [replica() for _ in range(replicas)]
    try:
        loops = [loop for loop, _, _ in made]
        if any(loop is None for loop in loops):
            return None
        assignment = np.empty(n, dtype=np.int64)
        outstanding = [deque() for _ in range(replicas)]  # (column, weight) in routing order
        load = np.zeros(replicas)
        for i in range(n):
            now = float(arrival[i])
            for r, loop in enumerate(loops):
                if loop.clock[kr.CLOCK_NOW] < now and loop.run_until(now) is None:
                    return None
                finish = loop.times[kr.T_FINISH]
                keep = deque()
                for k, w in outstanding[r]:
                    if 0.0 <= finish[k] <= now:
                        load[r] -= w
                    else:
                        keep.append((k, w))
                outstanding[r] = keep
            _check_shared_allowance(loops, now, kr)
            r = int(np.argmin(load))
            assignment[i] = r
            outstanding[r].append((int(loops[r].st[kr.S_KNOWN]), weight[i]))  # its column in r's table
            loops[r].send(now, int(prompt[i]), int(output[i]))
            load[r] += weight[i]
        for loop in loops:  # every request routed: each replica to its end, the misses counted together
            if loop.st[kr.S_KNOWN] and loop.run_until(np.inf) is None:
                return None
            _check_shared_allowance(loops, float(loop.clock[kr.CLOCK_NOW]), kr)
        first = np.empty(n)
        finish = np.empty(n)
        util = 0.0
        for r, (loop, scheduler, _) in enumerate(made):
            if loop.st[kr.S_KNOWN] == 0:
                continue
            result = loop.result(scheduler)
            mine = assignment == r
            first[mine], finish[mine] = result.first_token, result.finish
            util = max(util, max_utilisation(result.iterations))
        return JointRun(assignment, first, finish, util)
    finally:
        for _, _, close in made:
            close()

