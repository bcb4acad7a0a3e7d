"""A decoder layer: decode attention per KV head, the output projection and residual, then the MoE or dense FFN.

``build.py`` builds it (and ``from_config`` from a run config), ``reference.py`` draws its seeded functional
inputs and computes its NumPy reference; ``KIND`` is its entry in :mod:`stepsim.workloads.kinds`.

Importing this package imports no builder (the registry is read by the CLI to build its parser).
"""

from stepsim.workloads.kind import WorkloadKind

_HERE = __name__

KIND = WorkloadKind("decoder", knobs=("model", "routing", "kv_lengths", "iteration", "layer", "batch_id", "kv_heads",
                                      "strategy", "softmax", "tiling", "tile_n", "tile_f", "regions", "compute_bw", "tp",
                                      "ep", "placement", "system", "algorithm", "layers", "pp", "micro_batches"),
                    defaults={"model": "qwen3-30b-a3b", "tiling": "static", "strategy": "dynamic"}, trace="routing",
                    build=f"{_HERE}.build:from_config", inputs=f"{_HERE}.reference:inputs",
                    reference=f"{_HERE}.reference:outputs", reduction_length=f"{_HERE}.reference:reduction_length",
                    parallel=("tp", "ep", "pp"))


def __getattr__(name: str):
    """The names of the module ``stepsim.workloads.<kind>`` of the last release (its builder, now ``build.py``),
    deprecated (:mod:`stepsim.base.deprecated`)."""
    from stepsim.base.deprecated import moved_attribute

    return moved_attribute(__name__, name)
