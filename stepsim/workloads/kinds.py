"""The registry of workload kinds: everything stepsim needs to know about a kind, in one entry.

A kind names the knobs it takes beyond the common ones, their defaults, what its ``trace`` knob holds, and the
functions that build it from a normalized config, draw seeded functional-mode inputs, compute its NumPy
reference and say how long its reductions are (for the tolerance). Configuration validation
(:mod:`stepsim.workloads.config`), the result schema (:mod:`stepsim.results.records`), the CLI flags and the functional
check (:mod:`stepsim.workloads.reference`) read this table instead of keeping their own per-kind lists, so a new
kind is its builder module plus one entry here (``tests/workloads/test_kinds.py`` checks every entry is
complete: defaults, a builder, CLI flags for its knobs, and inputs / reference that pass the functional check).

Functions are named as ``"module:function"`` strings and imported on first use, so reading the registry (the
CLI does, to build its parser) imports no builder, sympy or numba.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

#: knobs every kind takes (``workload`` itself aside)
COMMON_KNOBS = ("channel_depth", "fifo_depths", "hardware", "convention")


@dataclass(frozen=True)
class WorkloadKind:
    """One kind of workload.

    Attributes
    ----------
    name : str
        The ``workload`` knob's value.
    knobs : tuple of str
        Knobs of :data:`stepsim.workloads.config.KNOBS` this kind takes besides :data:`COMMON_KNOBS`.
    defaults : mapping
        Values :func:`~stepsim.workloads.config.normalize_config` fills in for unset knobs.
    trace : str or None
        What the ``trace`` knob holds (``"routing"``: expert ids per token; ``"kv_lengths"``: KV-cache lengths
        per request), None when the kind reads no trace.
    build : str
        ``"module:function"``: ``function(normalized config) -> Workload``.
    inputs, reference, reduction_length : str or None
        ``"module:function"``: seeded functional inputs ``(workload, seed) -> {tensor: array}``, the NumPy
        reference ``(workload, inputs) -> {stored tensor: array}``, the reduction length behind a stored
        tensor's tolerance ``(workload, tensor) -> int``; None when the kind has none of its own (a user
        program's workload brings the kind it was built as).
    hardware : str
        The hardware preset of the kind's paper experiment (the default run hardware).
    channel_depth : int or None
        The FIFO depth of that experiment (elements; None means 1024), the builder's default.
    """

    name: str
    knobs: tuple[str, ...]
    build: str
    defaults: Mapping[str, Any] = field(default_factory=dict)
    trace: str | None = None
    inputs: str | None = None
    reference: str | None = None
    reduction_length: str | None = None
    hardware: str = "step-eval"
    channel_depth: int | None = 2

    def function(self, attr: str):
        """The function an attribute names (imported now)."""
        spec = getattr(self, attr)
        module, _, name = spec.partition(":")
        return getattr(importlib.import_module(module), name)


_REF = "stepsim.workloads.reference"
_CFG = "stepsim.workloads.config"

KINDS: dict[str, WorkloadKind] = {k.name: k for k in (
    WorkloadKind("moe", knobs=("model", "hidden", "intermediate", "experts", "top_k", "trace", "iteration", "layer",
                               "tiling", "tile_n", "tile_f", "regions", "compute_bw"),
                 defaults={"model": "mixtral-8x7b", "tiling": "static"}, trace="routing",
                 build=f"{_CFG}:_build_moe", inputs=f"{_REF}:_moe_inputs", reference=f"{_REF}:_moe_outputs",
                 reduction_length=f"{_REF}:_moe_reduction_length"),
    WorkloadKind("swiglu", knobs=("tile_n", "tile_m", "compute_bw"), defaults={"tile_m": 16, "tile_n": 16},
                 hardware="step-hdl", channel_depth=1,
                 build=f"{_CFG}:_build_swiglu", inputs=f"{_REF}:_swiglu_inputs", reference=f"{_REF}:_swiglu_outputs",
                 reduction_length=f"{_REF}:_swiglu_reduction_length"),
    WorkloadKind("attention", knobs=("trace", "batch_id", "regions", "strategy", "softmax", "compute_bw"),
                 defaults={"strategy": "dynamic"}, trace="kv_lengths", build=f"{_CFG}:_build_attention",
                 channel_depth=1,
                 inputs=f"{_REF}:_attention_inputs", reference=f"{_REF}:_attention_outputs",
                 reduction_length=f"{_REF}:_attention_reduction_length"),
    WorkloadKind("decoder", knobs=("model", "routing", "kv_lengths", "iteration", "layer", "batch_id", "kv_heads",
                                   "strategy", "softmax", "tiling", "tile_n", "tile_f", "regions", "compute_bw"),
                 defaults={"model": "qwen3-30b-a3b", "tiling": "static", "strategy": "dynamic"}, trace="routing",
                 build=f"{_CFG}:_build_decoder", inputs=f"{_REF}:_decoder_inputs",
                 reference=f"{_REF}:_decoder_outputs", reduction_length=f"{_REF}:_decoder_reduction_length"),
    WorkloadKind("program", knobs=("program",), build=f"{_CFG}:_build_program"),
)}


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
