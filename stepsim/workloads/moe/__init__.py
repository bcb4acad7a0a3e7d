"""The Mixture-of-Experts layer: static or dynamic token tiling, configuration time-multiplexing (``regions``),
shared experts; routed by a trace of expert ids per token.

``build.py`` builds it (and ``from_config`` from a run config), ``reference.py`` draws its seeded functional
inputs and computes its NumPy reference; ``KIND`` is its entry in :mod:`stepsim.workloads.kinds`.

Importing this package imports no builder (the registry is read by the CLI to build its parser).
"""

from stepsim.workloads.kind import WorkloadKind

_HERE = __name__

KIND = WorkloadKind("moe", knobs=("model", "hidden", "intermediate", "experts", "top_k", "trace", "iteration", "layer",
                                  "tiling", "tile_n", "tile_f", "regions", "compute_bw", "ep", "placement", "system", "tp",
                                  "algorithm", "layers", "pp", "micro_batches"),
                    defaults={"model": "mixtral-8x7b", "tiling": "static"}, trace="routing",
                    build=f"{_HERE}.build:from_config", inputs=f"{_HERE}.reference:inputs",
                    reference=f"{_HERE}.reference:outputs", reduction_length=f"{_HERE}.reference:reduction_length",
                    parallel=("tp", "ep", "pp"))


def __getattr__(name: str):
    """The names of the module ``stepsim.workloads.<kind>`` of the last release (its builder, now ``build.py``),
    deprecated (:mod:`stepsim.base.deprecated`)."""
    from stepsim.base.deprecated import moved_attribute

    return moved_attribute(__name__, name)
