"""The SwiGLU FFN of the paper's validation against HDL (``step-hdl`` hardware, FIFOs of 1).

``build.py`` builds it (and ``from_config`` from a run config), ``reference.py`` draws its seeded functional
inputs and computes its NumPy reference; ``KIND`` is its entry in :mod:`stepsim.workloads.kinds`.

Importing this package imports no builder (the registry is read by the CLI to build its parser).
"""

from stepsim.workloads.kind import WorkloadKind

_HERE = __name__

KIND = WorkloadKind("swiglu", knobs=("tile_n", "tile_m", "compute_bw", "tp", "system", "algorithm",
                                       "layers", "pp", "micro_batches"), defaults={"tile_m": 16, "tile_n": 16},
                    hardware="step-hdl", channel_depth=1,
                    build=f"{_HERE}.build:from_config", inputs=f"{_HERE}.reference:inputs",
                    reference=f"{_HERE}.reference:outputs", reduction_length=f"{_HERE}.reference:reduction_length",
                    parallel=("tp", "pp"))


def __getattr__(name: str):
    """The names of the module ``stepsim.workloads.<kind>`` of the last release (its builder, now ``build.py``),
    deprecated (:mod:`stepsim.base.deprecated`)."""
    from stepsim.base.deprecated import moved_attribute

    return moved_attribute(__name__, name)
