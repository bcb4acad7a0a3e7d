"""The registry of workload kinds: everything stepsim needs to know about a kind, in one entry.

A kind names the knobs it takes beyond the common ones, their defaults, what its ``trace`` knob holds, and the
functions that build it from a normalized config, draw seeded functional-mode inputs, compute its NumPy
reference and say how long its reductions are (for the tolerance). Each kind is a package of its own,
``stepsim/workloads/<kind>/``: ``build.py`` (the builder and ``from_config``), ``reference.py`` (inputs and
NumPy reference) and, in its ``__init__.py``, its registry entry ``KIND`` (:class:`~stepsim.workloads.kind.WorkloadKind`). Configuration validation
(:mod:`stepsim.workloads.config`), the result schema (:mod:`stepsim.results.records`), the CLI flags and the functional
check (:mod:`stepsim.workloads.reference`) read this table instead of keeping their own per-kind lists, so a new
kind is its package plus one line here (``tests/workloads/test_kinds.py`` checks every entry is
complete: defaults, a builder, CLI flags for its knobs, and inputs / reference that pass the functional check).

Functions are named as ``"module:function"`` strings and imported on first use, so reading the registry (the
CLI does, to build its parser) imports no builder, sympy or numba.
"""

from __future__ import annotations

from stepsim.workloads import (
    attention,
    collective,
    decoder,
    mla_attention,
    mla_prefill,
    moe,
    prefill_attention,
    program,
    sliding_attention,
    swiglu,
)
from stepsim.workloads.kind import COMMON_KNOBS, WorkloadKind

__all__ = ["COMMON_KNOBS", "DEFAULT_WORKLOAD_CHANNEL_DEPTH", "KINDS", "WORKLOAD_CHANNEL_DEPTH", "WORKLOAD_HARDWARE",
           "WorkloadKind", "kind"]

#: every workload kind by name, in the order the CLI lists them (a user ``program`` last)
KINDS: dict[str, WorkloadKind] = {k.name: k for k in (
    moe.KIND, swiglu.KIND, attention.KIND, prefill_attention.KIND, mla_attention.KIND, mla_prefill.KIND,
    sliding_attention.KIND,
    decoder.KIND, collective.KIND,
    program.KIND)}


def kind(name: str) -> WorkloadKind:
    """The registry entry of a workload kind (KeyError for an unknown name; callers validate first)."""
    return KINDS[name]


#: default FIFO depth (elements) of each workload kind's paper experiment (the builders' ``channel_depth``
#: default), from the registry above
WORKLOAD_CHANNEL_DEPTH: dict[str, int | None] = {k.name: k.channel_depth for k in KINDS.values()}

#: hardware preset of each workload kind's paper experiment (from the registry too)
WORKLOAD_HARDWARE: dict[str, str] = {k.name: k.hardware for k in KINDS.values()}

#: the ``Workload`` dataclass's default depth (a workload built without a builder); MoE's experiment depth
DEFAULT_WORKLOAD_CHANNEL_DEPTH = WORKLOAD_CHANNEL_DEPTH["moe"]
