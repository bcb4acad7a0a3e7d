"""Graph fingerprints: evidence that a refactor of the builders leaves every workload's graph as it was.

As a pytest plugin it writes one line per :class:`~stepsim.workloads.base.Workload` a test builds: the test, the
workload's number within it, the graph's name and a hash of every operator in creation order (its kind, every
attribute: name, group, chip, FIFO depths, inputs by operator id, output streams), the bindings, the tile rows,
the params, the idle groups and the FLOPs. With ``FP_NOSIM=1`` the engines, ``simulate`` and ``lower`` raise at
once, so a run builds the graphs only (the tests that simulate then fail, at the same place before and after).
Equal fingerprints mean equal graphs and so equal cycles, bytes and event counts (the engine is deterministic).

Use it on a checkout of the old tree and on the new one, then compare::

    cd OLD && FP_NOSIM=1 FP_OUT=/tmp/old.txt PYTHONPATH=OLD:NEW/bench python -m pytest -p no:xdist \
        -p graph_fingerprints --basetemp=/tmp/fp tests/workloads/test_moe_pipeline.py ...
    cd NEW && FP_NOSIM=1 FP_OUT=/tmp/new.txt PYTHONPATH=NEW:NEW/bench python -m pytest ... (same files)
    python NEW/bench/graph_fingerprints.py /tmp/old.txt /tmp/new.txt

(``--basetemp`` the same in both runs: a workload named after a file under the test's tmp directory hashes it.)
"""

from __future__ import annotations

import hashlib
import os
import re
import sys

_OUT = os.environ.get("FP_OUT", "fingerprints.txt")
_current = {"node": "?", "n": 0}


def _canon(v, depth: int = 0) -> str:
    """A text of ``v`` that is the same in two processes (no ids or addresses)."""
    import numpy as np

    if isinstance(v, (int, float, str, bool, type(None))):
        return repr(v)
    if isinstance(v, np.ndarray):
        return f"nd{v.shape}{v.dtype}{hashlib.sha1(np.ascontiguousarray(v).tobytes()).hexdigest()}"
    if isinstance(v, (tuple, list)):
        return "(" + ",".join(_canon(x, depth + 1) for x in v) + ")"
    if isinstance(v, dict):
        return "{" + ",".join(sorted(f"{_canon(k)}:{_canon(x, depth + 1)}" for k, x in v.items())) + "}"
    if isinstance(v, (set, frozenset)):
        return "{" + ",".join(sorted(_canon(x) for x in v)) + "}"
    if hasattr(v, "op") and hasattr(v, "index") and hasattr(v.op, "id"):
        return f"ref{v.op.id}.{v.index}"
    if hasattr(v, "id") and hasattr(v, "graph"):
        return f"op{v.id}"
    return re.sub(r" at 0x[0-9a-f]+", "", repr(v) if depth < 3 else type(v).__name__)


def fingerprint(workload) -> str:
    """16 hex digits of the workload's graph (every operator, in creation order) and its other fields."""
    h = hashlib.sha1()
    for op in workload.graph.ops:
        items = []
        for key, v in sorted(vars(op).items()):
            if key == "graph":
                continue
            if key == "inputs":
                items.append((key, [(r.op.id, r.index) for r in v]))
            elif key == "outputs":
                items.append((key, [str(s) for s in v]))
            else:
                items.append((key, _canon(v)))
        h.update(f"{type(op).__name__}|{items}\n".encode())
    for part in ({str(k): v for k, v in workload.bindings.items()}, {str(k): v for k, v in
                 (workload.tile_rows or {}).items()}, workload.params, workload.idle_groups):
        h.update(_canon(part).encode())
    h.update(repr(workload.algorithmic_flops).encode())
    return h.hexdigest()[:16]


class _NoSimulation(Exception):
    pass


def _refuse(*args, **kwargs):
    raise _NoSimulation("graph fingerprints only (FP_NOSIM=1)")


def pytest_configure(config):
    from stepsim.workloads import base

    init = base.Workload.__init__

    def recorded(self, *args, **kwargs):
        init(self, *args, **kwargs)
        _current["n"] += 1
        with open(_OUT, "a") as f:
            f.write(f"{_current['node']}\t{_current['n']}\t{self.graph.name}\t{fingerprint(self)}\n")

    base.Workload.__init__ = recorded
    if os.environ.get("FP_NOSIM"):
        import stepsim.graph.lower as lower_module
        import stepsim.kernels.api as fast
        import stepsim.kernels.reference as reference
        import stepsim.simulation.simulate as simulate_module

        simulate_module.simulate = fast.run = reference.run = lower_module.lower = _refuse


def pytest_runtest_setup(item):
    _current["node"], _current["n"] = item.nodeid, 0


def compare(old: str, new: str) -> int:
    """Print how many workloads of two runs are identical and every one that is not; returns how many differ."""
    def load(path):
        out = {}
        for line in open(path):
            node, n, name, fp = line.rstrip("\n").split("\t")
            out[re.sub(r"pytest-\d+", "pytest-N", node), int(n)] = (name, fp)
        return out

    a, b = load(old), load(new)
    common = [k for k in a if k in b]
    differ = [k for k in common if a[k] != b[k]]
    print(f"{len(a)} old, {len(b)} new, {len(common)} in both, {len(common) - len(differ)} identical")
    for k in differ:
        print("differs:", k, a[k], b[k])
    return len(differ)


if __name__ == "__main__":
    sys.exit(1 if compare(sys.argv[1], sys.argv[2]) else 0)
