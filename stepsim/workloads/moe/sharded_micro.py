"""The micro-batches of the expert-parallel MoE layer (``stepsim run moe --layers L --ep E --micro-batches M``):
which tokens each micro-batch holds. The graph is :func:`stepsim.workloads.moe.sharded.build_sharded` with
``micro_batches=M`` (its module docstring, "Micro-batches").
"""

from __future__ import annotations

import numpy as np

from stepsim.workloads.moe.sharded import shard_bounds


def micro_batch_tokens(batch: int, chips: int, micro_batches: int) -> list[np.ndarray]:
    """The token indices of each micro-batch: micro-batch m is the m-th of M equal pieces of every chip's shard
    (the caller checks the shards split evenly).

    >>> [t.tolist() for t in micro_batch_tokens(8, 2, 2)]
    [[0, 1, 4, 5], [2, 3, 6, 7]]
    """
    bounds = shard_bounds(batch, chips)
    out = []
    for m in range(micro_batches):
        parts = []
        for c in range(chips):
            rows = (bounds[c + 1] - bounds[c]) // micro_batches
            parts.append(np.arange(bounds[c] + m * rows, bounds[c] + (m + 1) * rows))
        out.append(np.concatenate(parts))
    return out
