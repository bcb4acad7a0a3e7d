"""What a built layer needs of the chip, and the compute units each compute operator gets.

A STeP compute operator with ``compute_bw`` c FLOPs/cycle stands for ``c / unit_flops_per_cycle`` compute units
working on it together; a memory operator or an on-chip buffer occupies as many memory units as its bytes need
(each unit holds ``memory_unit_bytes``), and a load issuing ``par_dispatch`` HBM requests a cycle needs that many
units' ports. A mapping is feasible when the layer's compute operators fit the compute units, its memory operators
and buffers fit the memory units, and its on-chip bytes fit the capacity.

Compute units are handed out as a dataflow compiler balances a pipeline: every compute operator gets one, and the
rest go to the FLOP-based operators in proportion to their FLOPs (largest remainders first, ties to the earlier
operator), so an operator's time per FLOP is about the same everywhere and no stage starves the others.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from stepsim.base.errors import StepsimError
from stepsim.base.hardware import Hardware


class Infeasible(StepsimError):
    """A candidate schedule needs more of the chip than it has (the message says what and how much)."""


@dataclass(frozen=True)
class Usage:
    """Units and bytes a built layer uses (:func:`usage`)."""

    compute_units: int
    memory_units: int
    on_chip_bytes: int
    off_chip_bytes: int
    flops: int
    bound_cycles: int


def compute_ops(graph) -> list:
    """The operators that run on compute units (those with a ``compute_bw``), in graph order."""
    return [op for op in graph.ops if hasattr(op, "compute_bw")]


def assign_compute_units(workload, hardware: Hardware) -> int:
    """Set every compute operator's ``compute_bw`` from the units it gets (module docstring); returns the units used.

    Operators built with ``compute_bw`` 0 (fixed-cost functions only) keep it and take one unit.

    Raises
    ------
    Infeasible
        More compute operators than compute units.
    """
    ops = compute_ops(workload.graph)
    if len(ops) > hardware.compute_units:
        raise Infeasible(f"{len(ops)} compute operators, {hardware.compute_units} compute units")
    flops = workload.op_flops()
    weights = [math.ceil(flops.get(op.name) or 0) if op.compute_bw > 0 else 0 for op in ops]
    spare, total = hardware.compute_units - len(ops), sum(weights)
    extra = [spare * w // total if total else 0 for w in weights]
    left = spare - sum(extra)
    # largest remainder first, ties to the earlier operator: deterministic for a given graph
    by_remainder = sorted(range(len(ops)), key=lambda i: (-(spare * weights[i] % total) if total else 0, i))
    for i in by_remainder[:left] if total else ():
        extra[i] += 1
    for op, more in zip(ops, extra):
        if op.compute_bw > 0:
            op.compute_bw = (1 + more) * hardware.unit_flops_per_cycle
    return len(ops) + (sum(extra) if total else 0)


def usage(workload, hardware: Hardware, compute_units: int) -> Usage:
    """The chip the layer uses, checked against ``hardware``.

    Raises
    ------
    Infeasible
        More memory units than the chip has, or more on-chip bytes than its capacity.
    """
    values = workload.op_values()
    unit_bytes = hardware.memory_unit_bytes
    memory_units = 0
    for op in workload.graph.ops:
        v = values.get(op.name)
        needed = math.ceil(int(v.on_chip_bytes) / unit_bytes) if v is not None else 0
        memory_units += max(needed, getattr(op, "par_dispatch", 0))  # a memory operator: at least its ports
    on_chip = sum(int(v.on_chip_bytes) for v in values.values())
    if memory_units > hardware.memory_units:
        raise Infeasible(f"{memory_units} memory units, {hardware.memory_units} on the chip")
    if on_chip > hardware.on_chip_capacity_bytes:
        raise Infeasible(f"{on_chip:,} bytes on chip, {hardware.on_chip_capacity_bytes:,} available")
    metrics = workload.metrics(values=values)
    off_chip, flops = int(metrics["off_chip_bytes"]), int(metrics["graph_flops"])
    return Usage(compute_units, memory_units, on_chip, off_chip, flops,
                 bound_cycles(workload, values, hardware, compute_units, off_chip, flops))


def bound_cycles(workload, values: dict, hardware: Hardware, compute_units: int, off_chip_bytes: int,
                 flops: int) -> int:
    """A lower bound on the layer's cycles: its bytes at the HBM's peak, its FLOPs at the peak of the units it was
    given (no operator computes faster than its ``compute_bw``, and they add up to that), and the busiest unit's
    work back to back (:func:`stepsim.analysis.bounds.cycle_bounds`, each checked against the engine)."""
    from stepsim.analysis.bounds import cycle_bounds

    peak_flops = compute_units * hardware.unit_flops_per_cycle
    return max(math.ceil(off_chip_bytes / hardware.hbm_peak_bytes_per_cycle), math.ceil(flops / peak_flops),
               *cycle_bounds(workload, hardware, values).values())
