"""Multi-head latent attention (DeepSeek-V2/V3/R1) for prefill, expanded: the latent cache expanded into per-head
keys and values once per request, then causal attention over them (decode runs absorbed: ``mla_attention``).

``build.py`` builds it (and ``from_config`` from a run config), ``reference.py`` draws its seeded functional
inputs and computes its NumPy reference; ``KIND`` is its entry in :mod:`stepsim.workloads.kinds`.

Importing this package imports no builder (the registry is read by the CLI to build its parser).
"""

from stepsim.workloads.kind import WorkloadKind

_HERE = __name__

KIND = WorkloadKind("mla_prefill", knobs=("model", "trace", "batch_id", "tile_n", "tile_m", "compute_bw"),
                    defaults={"model": "deepseek-v3", "tile_n": 32, "tile_m": 128}, trace="kv_lengths", channel_depth=1,
                    build=f"{_HERE}.build:from_config", inputs=f"{_HERE}.reference:inputs",
                    reference=f"{_HERE}.reference:outputs", reduction_length=f"{_HERE}.reference:reduction_length")
