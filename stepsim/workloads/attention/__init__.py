"""Grouped-query decode attention with coarse / interleaved / dynamic parallelization, over a trace of KV-cache
lengths.

``build.py`` builds it (and ``from_config`` from a run config), ``reference.py`` draws its seeded functional
inputs and computes its NumPy reference; ``KIND`` is its entry in :mod:`stepsim.workloads.kinds`.

Importing this package imports no builder (the registry is read by the CLI to build its parser).
"""

from stepsim.workloads.kind import WorkloadKind

_HERE = __name__

KIND = WorkloadKind("attention", knobs=("trace", "batch_id", "regions", "strategy", "softmax", "compute_bw"),
                    defaults={"strategy": "dynamic"}, trace="kv_lengths", channel_depth=1,
                    build=f"{_HERE}.build:from_config", inputs=f"{_HERE}.reference:inputs",
                    reference=f"{_HERE}.reference:outputs", reduction_length=f"{_HERE}.reference:reduction_length")


def __getattr__(name: str):
    """The names of the module ``stepsim.workloads.<kind>`` of the last release (its builder, now ``build.py``),
    deprecated (:mod:`stepsim.base.deprecated`)."""
    from stepsim.base.deprecated import moved_attribute

    return moved_attribute(__name__, name)
