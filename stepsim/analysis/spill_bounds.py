"""A lower bound on the cycles of a graph with spills (:mod:`stepsim.graph.ops_spill`): a spill *materializes*
its tensor, so what reads it back waits for the whole of it.

:func:`stepsim.analysis.bounds.pipeline_cycles` follows first outputs only: a spill's read-back waits for the
completion token, whose first (and only) output it dates from the store's *first* ack, so behind a spill the bound
restarts almost from zero (on the Llama block, spilling ``z`` lowers that bound from 2,082 to 1,555 cycles while
the run gets slower). Here the last elements are followed too:

* a load or compute unit with work ``W`` (:func:`~stepsim.analysis.bounds.load_unit_bounds`,
  :func:`~stepsim.analysis.bounds.compute_unit_bounds`) starts no earlier than its inputs' first elements exist,
  and its last firing, which emits its last element (a Map emits on every firing, an Accum on the close of its
  last group), ends no earlier than ``start + W``; a Map, Accum or MapAccum reads every element of every input,
  so that firing also comes after each input's last element, and costs at least its cheapest firing;
* Flatten, Promote, Broadcast, RepeatStatic and an unpadded Reshape pass every element on, so their last
  element is no earlier than their input's; a store acks a tile only after reading it;
* an Accum whose one group is its whole input (the spill's "all written" token, ``SignalReqAllRead``) emits
  after its input's last element; the read-back's first tile comes after that token;
* first elements follow the rules of :func:`~stepsim.analysis.bounds.first_output_times` (and are never below
  them).

The bound is the largest ``start + W`` over the units (cycles). Adding a spill replaces a streamed edge (whose
consumer waits for the producer's first element) by the chain store -> token -> read-back (whose consumer waits
for the producer's last element, later), and leaves every unit's work as it was: the bound of a graph with more
spills is never lower, which is what lets :mod:`stepsim.optimize.onnx_hierarchy` drop a whole subtree of spill
sets at once (tests check both the bound and that order against the engine on whole spaces).
"""

from __future__ import annotations

import math
from fractions import Fraction

from stepsim.analysis.bounds import (
    EARLY_EMITTING_KINDS,
    LOAD_KINDS,
    PMU_READING_KINDS,
    STORE_KINDS,
    _cheapest_firings,
    _dispatched_units,
    _elements,
    _producers_first,
    _tile_cycles,
    compute_unit_bounds,
    first_output_times,
    load_tiles,
    load_unit_bounds,
)
from stepsim.base.hardware import Hardware
from stepsim.workloads.base import Workload

__all__ = ["spill_chain_cycles"]

#: kinds whose (one followed) output carries every element of their first input, after reading it
ELEMENT_PASSING_KINDS = ("Flatten", "Promote", "Broadcast", "RepeatStatic")


def spill_chain_cycles(workload: Workload, hardware: Hardware, values: dict | None = None,
                       tiles: dict | None = None) -> int:
    """A lower bound on ``workload``'s simulated cycles that follows last elements through spills (module
    docstring; cycles). ``values`` (``op_values``) and ``tiles`` (:func:`load_tiles`) are reused when given."""
    values = values if values is not None else workload.op_values()
    tiles = tiles if tiles is not None else load_tiles(workload)
    firing = _cheapest_firings(workload, hardware, values, tiles)
    first = first_output_times(workload, hardware, values, tiles, firing)
    work = {**load_unit_bounds(workload, hardware, tiles), **compute_unit_bounds(workload, hardware, values, tiles)}
    dispatched, _ = _dispatched_units(workload, work)  # work assigned during the run: only its mean is known
    work = {name: w for name, w in work.items() if w > 0 and name not in dispatched}
    emit: dict[str, Fraction] = {}  # op -> a lower bound on its first output's stamp
    last: dict[str, Fraction] = {}  # op -> a lower bound on its last output's stamp (0: not followed)
    best = Fraction(0)
    for op in _producers_first(workload.graph):
        arrivals = [emit.get(ref.op.name, Fraction(0)) for ref in op.inputs]  # a feedback input counts 0
        start = max(arrivals, default=Fraction(0))
        if op.kind in LOAD_KINDS:
            t = start + _tile_cycles(op, hardware) + 1
        elif op.name in firing:
            t = start + firing[op.name] + 1
        elif op.kind in EARLY_EMITTING_KINDS:
            t = min(arrivals, default=Fraction(0))
        else:
            t = min(arrivals, default=Fraction(0)) + 1
        if op.kind == "Accum" and _one_group(op, workload):  # it emits once, on its input's last element
            t = max(t, last.get(op.inputs[0].op.name, Fraction(0)) + firing.get(op.name, 0) + 1)
        emit[op.name] = max(t, Fraction(first[op.name]))
        last[op.name] = _last(op, start, work, firing, last)
        if op.name in work or op.kind in PMU_READING_KINDS:  # a unit's last output is stamped within the run
            best = max(best, last[op.name])
    return math.ceil(best)


def _last(op, start: Fraction, work: dict, firing: dict, last: dict) -> Fraction:
    """A lower bound on the stamp of ``op``'s last output element (cycles; 0 where not followed), from its
    start, its work and its producers' ``last`` (module docstring)."""
    ins = [last.get(ref.op.name, Fraction(0)) for ref in op.inputs]  # a feedback input counts 0
    out = start + work[op.name] if op.name in work else Fraction(0)
    if op.kind in PMU_READING_KINDS and ins:  # its last firing reads every input's last element
        out = max(out, max(ins) + firing.get(op.name, 0))
    if op.name in work or op.kind in PMU_READING_KINDS:
        return out
    passes = op.kind in ELEMENT_PASSING_KINDS or op.kind in STORE_KINDS or (
        op.kind == "Reshape" and getattr(op, "pad", None) is None)
    return ins[0] if passes and ins else Fraction(0)


def _one_group(op, workload: Workload) -> bool:
    """Whether the Accum ``op`` reduces its whole input in one group (so it emits once, after the last element)."""
    stream = op.inputs[0].stream
    total = _elements(stream, workload)
    group = _elements(stream, workload, stream.shape[len(stream.shape) - op.rank:])
    return total is not None and group is not None and total <= group
