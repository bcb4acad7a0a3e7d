"""Decode attention of one layer of a model with sliding-window and full layers and attention sinks (gpt-oss):
GQA over a ring of ``window`` cache rows (sliding) or the whole cache (full), sinks in the softmax.

``build.py`` builds it (and ``from_config`` from a run config), ``reference.py`` draws its seeded functional
inputs and computes its NumPy reference; ``KIND`` is its entry in :mod:`stepsim.workloads.kinds`.

Importing this package imports no builder (the registry is read by the CLI to build its parser).
"""

from stepsim.workloads.kind import WorkloadKind

_HERE = __name__

KIND = WorkloadKind("sliding_attention", knobs=("model", "layer", "trace", "batch_id", "tile_n", "compute_bw"),
                    defaults={"model": "gpt-oss-20b", "tile_n": 32}, trace="kv_lengths", channel_depth=1,
                    build=f"{_HERE}.build:from_config", inputs=f"{_HERE}.reference:inputs",
                    reference=f"{_HERE}.reference:outputs", reduction_length=f"{_HERE}.reference:reduction_length")
