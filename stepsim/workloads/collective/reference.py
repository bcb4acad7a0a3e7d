"""The collectives' NumPy reference and seeded functional inputs (kind ``collective``)."""

from __future__ import annotations

import numpy as np

from stepsim.workloads.base import Workload
from stepsim.workloads.numerics import seeded_normal


def inputs(w: Workload, seed: int) -> dict:
    """Every resident input chunk ``x<c>.<k>`` (``x<c>`` for all-gather): seeded N(0, 1), shape [1, S/(4n)]."""
    n, m = w.params["chips"], w.params["chunk_bytes"] // 4
    if w.params["op"] == "all-gather":
        names = [f"x{c}" for c in range(n)]
    else:
        names = [f"x{c}.{k}" for c in range(n) for k in range(n)]
    return {name: seeded_normal(seed, name, (1, m), 1.0, bf16=False) for name in names}


def outputs(w: Workload, inputs: dict) -> dict:
    """What every chip holds after the collective (float64 sums, returned as float32)."""
    n, op = w.params["chips"], w.params["op"]
    x = {k: np.asarray(v, dtype=np.float64) for k, v in inputs.items()}
    if op == "all-reduce":
        out = {f"y{i}.{k}": sum(x[f"x{j}.{k}"] for j in range(n)) for i in range(n) for k in range(n)}
    elif op == "reduce-scatter":
        out = {f"y{i}": sum(x[f"x{j}.{i}"] for j in range(n)) for i in range(n)}
    elif op == "all-gather":
        out = {f"y{i}.{k}": x[f"x{k}"] for i in range(n) for k in range(n)}
    else:
        out = {f"y{i}.{j}": x[f"x{j}.{i}"] for i in range(n) for j in range(n)}
    return {name: v.astype(np.float32) for name, v in out.items()}


def reduction_length(w: Workload, tensor: str) -> int:
    """Terms summed into a stored value: n for the reducing collectives, 1 (a copy) otherwise."""
    return w.params["chips"] if w.params["op"] in ("all-reduce", "reduce-scatter") else 1
