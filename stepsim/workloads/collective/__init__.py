"""Collectives over many chips as STeP graphs over link units: all-reduce, reduce-scatter, all-gather (ring,
ring-chunked or direct) and all-to-all, on a system of chips and links (``--system``, docs/system.md).

``build.py`` builds them (and ``from_config`` from a run config), ``closed_form.py`` gives the cycles the engine
must reproduce on an idle system, ``reference.py`` draws seeded inputs and computes the NumPy reference;
``KIND`` is the entry in :mod:`stepsim.workloads.kinds`.

Importing this package imports no builder (the registry is read by the CLI to build its parser).
"""

from stepsim.workloads.kind import WorkloadKind

_HERE = __name__

#: the collectives (``op`` knob) and their algorithms (``algorithm`` knob): ``ring`` streams each chunk in tiles
#: (reduced as they arrive), ``ring-chunked`` moves and reduces whole chunks, ``direct`` sends straight
OPS = ("all-reduce", "reduce-scatter", "all-gather", "all-to-all")
ALGORITHMS = ("ring", "ring-chunked", "direct")

KIND = WorkloadKind("collective", knobs=("op", "bytes", "algorithm", "system", "compute_bw"),
                    defaults={"op": "all-reduce", "bytes": 1 << 20, "algorithm": "ring", "system": "ring-4"},
                    build=f"{_HERE}.build:from_config", inputs=f"{_HERE}.reference:inputs",
                    reference=f"{_HERE}.reference:outputs", reduction_length=f"{_HERE}.reference:reduction_length")
