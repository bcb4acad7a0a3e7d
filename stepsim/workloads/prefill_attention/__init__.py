"""Causal prefill attention over prompt chunks against each request's KV cache (one KV head, tiled).

``build.py`` builds it (and ``from_config`` from a run config), ``reference.py`` draws its seeded functional
inputs and computes its NumPy reference; ``KIND`` is its entry in :mod:`stepsim.workloads.kinds`.

Importing this package imports no builder (the registry is read by the CLI to build its parser).
"""

from stepsim.workloads.kind import WorkloadKind

_HERE = __name__

KIND = WorkloadKind("prefill_attention", knobs=("model", "trace", "batch_id", "tile_n", "tile_m", "softmax",
                                                "compute_bw"),
                    defaults={"model": "qwen3-30b-a3b", "tile_n": 32, "tile_m": 128}, trace="kv_lengths", channel_depth=1,
                    build=f"{_HERE}.build:from_config", inputs=f"{_HERE}.reference:inputs",
                    reference=f"{_HERE}.reference:outputs", reduction_length=f"{_HERE}.reference:reduction_length")
