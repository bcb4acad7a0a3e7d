"""What a workload kind declares: :class:`WorkloadKind` (its knobs, defaults, trace, builder, inputs, reference).

Each kind's package (``stepsim/workloads/<kind>/__init__.py``) holds its entry, ``KIND``; the registry of every
kind is :mod:`stepsim.workloads.kinds`.
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

    @property
    def pipeline_parallel(self) -> bool:
        """Whether the kind takes ``--pp N`` (its layers split into N stages on N chips, micro-batches streaming
        through; docs/system.md): the one declaration the CLI, the config checks and ``stepsim optimize`` read."""
        return "pp" in self.knobs

    def function(self, attr: str):
        """The function an attribute names (imported now)."""
        spec = getattr(self, attr)
        module, _, name = spec.partition(":")
        return getattr(importlib.import_module(module), name)
