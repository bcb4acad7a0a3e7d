"""A user's program, ``path/to/file.py:function`` returning a Graph or a Workload (it brings its own inputs and
reference through the kind it was built as).

``build.py`` loads the function (and ``from_config`` from a run config); ``KIND`` is its entry in
:mod:`stepsim.workloads.kinds`.

Importing this package imports no builder (the registry is read by the CLI to build its parser).
"""

from stepsim.workloads.kind import WorkloadKind

_HERE = __name__

# trace / iteration / layer: an ONNX model's MoE routing, read as the moe kind reads its trace; no_fuse / spill: its
# fusion policy (stepsim.frontend.fusion); only for .onnx
KIND = WorkloadKind("program", knobs=("program", "trace", "iteration", "layer", "no_fuse", "spill"),
                    build=f"{_HERE}.build:from_config")


def __getattr__(name: str):
    """The names of the module ``stepsim.workloads.<kind>`` of the last release (its builder, now ``build.py``),
    deprecated (:mod:`stepsim.base.deprecated`)."""
    from stepsim.base.deprecated import moved_attribute

    return moved_attribute(__name__, name)
