"""Lower bounds on a workload's simulated cycles, from its graph, the trace's values and the hardware alone.

``stepsim optimize`` prunes a candidate without simulating it when a simulated point beats even its lower bound,
so every bound here must hold for *every* run (the tests check each one against the engine on many workloads,
unit by unit). Each bound is "the busiest unit of one kind, doing its work back to back":

* :func:`load_unit_cycles`: an off-chip load keeps one tile in flight, so its tiles follow one another;
* :func:`compute_unit_cycles`: a compute unit fires one element at a time, each firing costing at least its
  function's ``ceil(FLOPs / compute_bw)`` cycles and at least the on-chip (PMU) reads of its operand tiles;
* :func:`hbm_request_cycles`: the busiest HBM channel serves its requests ``hbm_init_interval`` apart. It
  counts 64-byte requests, not bytes, so it sees what a bytes roofline misses: a weight tile of 56 bf16
  columns (112 bytes a row) takes two requests a row, 128 bytes of channel time.
* :func:`pipeline_cycles`: a unit cannot start before its first operands exist, so the load and compute bounds
  above also pay the pipeline's fill in front of the unit (:func:`first_output_times`): on a time-multiplexed
  region of 256-column weight tiles, one 2 MiB tile load and one 32,768-cycle firing before the down
  projection's first firing; and on a MoE layer no expert's first token tile, so no weight request, exists
  before its tokens are loaded (a tile closes on its last token, or on the end of the token stream: 5,250
  cycles for Qwen3's 64 tokens). The HBM's last weight request, which comes no earlier than its load can
  start, still leaves its tile a firing to do (:func:`hbm_drain_cycles`): 16,384 cycles of PMU reads for a
  2048 x 256 bf16 tile.
* :func:`link_cycles`: a link between chips serializes its elements one after another, each at least
  ``ceil(bytes / bandwidth)`` cycles and at least one, and its last element arrives ``latency`` cycles after
  its last byte left; so a multi-chip run takes at least the busiest link's serialization plus its latency.

The whole-graph roofline (:func:`stepsim.optimize.pareto.roofline_lower_bound`) sums bandwidth over every unit;
these see what the sum hides: one busy region among idle ones, padded static tiles on few time-multiplexed
regions, and the skew of a real routing trace.

Per-unit work is exact where the graph fixes it. Where a dispatcher assigns work to regions *during* the run
(dynamic parallelization, ``Workload.balanced_units``), the per-region values come from a nominal assignment
and only their sum over the regions is exact; such units count with the mean of their counterparts in the
other regions (the busiest of them does at least that much).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from fractions import Fraction

import numpy as np

from stepsim.base.errors import MetricError
from stepsim.base.hardware import Hardware
from stepsim.graph.numeric import python_bindings
from stepsim.workloads.base import Workload, evaluate, evaluate_exact, factors_int, factors_value

__all__ = ["busiest_unit", "compute_unit_bounds", "compute_unit_cycles", "cycle_bounds", "first_output_times",
           "hbm_drain_cycles", "hbm_request_cycles", "load_tiles", "link_cycles", "load_unit_bounds",
           "load_unit_cycles", "pipeline_cycles", "pipeline_unit_bounds"]

#: operator kinds that load from off-chip memory one tile at a time
LOAD_KINDS = ("LinearOffChipLoad", "RandomOffChipLoad")
#: operator kinds that store to off-chip memory
STORE_KINDS = ("LinearOffChipStore", "RandomOffChipStore")
#: operator kinds whose tiles pass through unchanged, ``read_from_mu`` flag included (docs/timing_model.md §3.1;
#: Reshape only without padding, since its pad tiles carry its own flag)
PASS_THROUGH_KINDS = ("Flatten", "RepeatStatic", "Broadcast", "Parallelize", "EagerMerge", "Reshape")
#: compute kinds whose firing costs ``max(PMU reads of the operands, compute)`` or more (§6; Scan's cost differs
#: between step-perf versions, so it is charged its FLOPs only)
PMU_READING_KINDS = ("Map", "Accum", "MapAccum")
#: kinds that may emit an output before the stamp of the input it answers: EagerMerge's selector is enqueued
#: when the merge *sees* an element, which the canonical visibility rule allows at the sender's clock, one
#: cycle before the element's stamp (docs/timing_model.md §1.2, §7.3)
EARLY_EMITTING_KINDS = ("EagerMerge",)
#: kinds that pass every element of their (one) input on, in order, to every output (the fill bound follows
#: element times and stream ends through them)
ELEMENT_KEEPING_KINDS = ("Flatten", "Broadcast")
#: longest stream whose per-element arrival times the fill bound follows (elements; a batch's tokens)
MAX_TIMED_ELEMENTS = 1 << 16


def cycle_bounds(workload: Workload, hardware: Hardware, values: dict | None = None) -> dict[str, int]:
    """The four bounds by record column (``load_unit_cycles``, ``compute_unit_cycles``, ``hbm_request_cycles``,
    ``pipeline_cycles``), sharing the per-operator evaluations; ``values``: an ``op_values`` result to reuse."""
    values = values if values is not None else workload.op_values()
    tiles = load_tiles(workload)
    loads = load_unit_bounds(workload, hardware, tiles)
    computes = compute_unit_bounds(workload, hardware, values, tiles)
    return {"load_unit_cycles": busiest_unit(workload, loads),
            "compute_unit_cycles": busiest_unit(workload, computes),
            "hbm_request_cycles": hbm_request_cycles(workload, hardware, tiles, values),
            "pipeline_cycles": pipeline_cycles(workload, hardware, values, tiles, loads, computes)}


def link_cycles(workload: Workload) -> int:
    """A lower bound on the simulated cycles from the links between chips alone (cycles); 0 without links.

    A link unit (:mod:`stepsim.kernels.units_link`) serializes one element at a time, ``ceil(b / B)`` cycles
    for an element of ``b`` bytes (at least one cycle), and sends it with the stamp ``T + ceil(b / B) +
    latency``; its receiver dequeues it no earlier. So the run takes at least the busiest link's elements back
    to back plus its latency. ``b`` is the element's timed width: an fp32 tile counts at the lowering's fp32
    timing width (:func:`stepsim.graph.lower.fp32_timing_bytes`); an element whose size is not static counts
    one cycle, and a stream whose length stays symbolic counts nothing (the bound only gets weaker).
    """
    from stepsim.graph.dims import is_static
    from stepsim.graph.dtypes import FP32, Tile
    from stepsim.graph.lower import fp32_timing_bytes

    links = [op for op in workload.graph.ops if op.kind == "Link"]
    if not links:
        return 0
    f32 = fp32_timing_bytes(workload.graph)
    bindings = python_bindings(workload.bindings)
    best = 0
    for op in links:
        busy = 0
        for stream in op.outputs:
            try:
                elements = product_value(stream.shape, bindings)
            except MetricError:
                continue
            dtype = stream.dtype
            size = dtype.size_in_bytes() if hasattr(dtype, "size_in_bytes") else 1
            if isinstance(dtype, Tile) and dtype.dtype == FP32 and is_static(size):
                size = dtype.rows * dtype.cols * f32  # the width the lowering times fp32 tiles at
            per_element = max(1, -(-int(size) // op.bandwidth)) if is_static(size) else 1
            busy += elements * per_element
        best = max(best, busy + op.latency)
    return best


def load_tiles(workload: Workload) -> dict[str, int]:
    """``{load op name: tiles it loads}`` with the trace's bindings; a count that stays symbolic is left out."""
    out = {}
    bindings = python_bindings(workload.bindings)
    for op in workload.graph.ops:
        if op.kind in LOAD_KINDS:
            try:
                out[op.name] = product_value(op.outputs[0].shape, bindings)
            except MetricError:
                continue
    return out


def product_value(dims, bindings) -> int:
    """The product of ``dims`` (a stream's shape) with ``bindings`` (:func:`~stepsim.graph.numeric.python_bindings`'
    result, whose memo every call with it shares), dim by dim: no sympy product is built, and a stream's dims
    (an expert's tile count, a region's sum of them) repeat over the graph's streams. MetricError when it stays
    symbolic (the value of :func:`~stepsim.workloads.base.evaluate` of the product, or its error)."""
    return factors_int(tuple(dims), lambda: math.prod(dims), bindings, "elements")


def load_unit_cycles(workload: Workload, hardware: Hardware, tiles: dict | None = None) -> int:
    """A lower bound on the simulated cycles from the off-chip loads alone (cycles): the busiest load unit's
    tiles one after another (:func:`load_unit_bounds`; ``tiles``: a :func:`load_tiles` result to reuse)."""
    return busiest_unit(workload, load_unit_bounds(workload, hardware, tiles))


def load_unit_bounds(workload: Workload, hardware: Hardware, tiles: dict | None = None) -> dict[str, int]:
    """``{load op name: a lower bound on its unit's final clock}`` (cycles).

    An off-chip load keeps one tile in flight (:mod:`stepsim.kernels.units_memory`): it registers a tile with
    the HBM at its clock ``t0``, waits for it, and starts the next tile no earlier. A tile of ``n`` requests
    (``rows * ceil(cols * elem_bytes / addr_offset)``) dispatched ``P`` per tick has its last chunk taken at
    tick ``t0 + ceil(n / P)`` at the earliest and served at the next tick, and a response arrives
    ``start_up + latency + 1`` cycles after service (docs/timing_model.md §4; ``kernels/hbm.py``). So the
    tile completes no earlier than ``t0 + ceil(n / P) + start_up + latency + 2``, and a load unit's final clock
    is at least its tile count times that (:func:`load_tiles`, or ``tiles`` when given; a count that stays
    symbolic is left out, which only weakens the bound). Stores are left out (their tile shapes follow the
    data).
    """
    tiles = tiles if tiles is not None else load_tiles(workload)
    ops = {op.name: op for op in workload.graph.ops}
    return {name: n * _tile_cycles(ops[name], hardware) for name, n in tiles.items()}


def hbm_request_cycles(workload: Workload, hardware: Hardware, tiles: dict | None = None,
                       values: dict | None = None) -> int:
    """A lower bound on the simulated cycles from the HBM channels alone (cycles).

    Requests are spread over ``C`` channels, and a channel starts a request no earlier than ``hbm_init_interval``
    (``II``) after its previous one and no earlier than tick 2 (a tile's first chunk is taken at tick ``t0 + 1``
    and served one cycle later; docs/timing_model.md §4). So the busiest channel, with at least ``k =
    ceil(R / C)`` of the ``R`` requests, starts its last one at ``2 + (k - 1) * II`` or later, whose response
    reaches its unit ``start_up + latency + 1`` cycles after that. A load's requests are exact (tiles times
    ``rows * ceil(cols * bytes / addr_offset)``); a store moves at most ``addr_offset`` bytes a request, so its
    off-chip bytes over ``addr_offset`` is a lower bound on its requests. A count that stays symbolic is left
    out, which only weakens the bound. ``tiles`` (:func:`load_tiles`) and ``values`` (``op_values``) are
    reused when given.
    """
    tiles = tiles if tiles is not None else load_tiles(workload)
    values = values if values is not None else workload.op_values()
    ops = {op.name: op for op in workload.graph.ops}
    requests: dict[int, Fraction] = {}  # per chip: each chip has its own HBM (docs/system.md)
    for name, n in tiles.items():
        chip = _chip(ops[name])
        requests[chip] = requests.get(chip, Fraction(0)) + n * _tile_requests(ops[name], hardware)
    for op in workload.graph.ops:
        if op.kind in STORE_KINDS:
            requests[_chip(op)] = requests.get(_chip(op), Fraction(0)) + \
                -(-values[op.name].off_chip_bytes // hardware.addr_offset)
    per_channel = max((math.ceil(r / hardware.hbm_channels) for r in requests.values()), default=0)
    if not per_channel:
        return 0
    return 2 + (per_channel - 1) * hardware.hbm_init_interval + hardware.hbm_start_up + hardware.hbm_latency + 1


def _chip(op) -> int:
    """The chip an operator is on (0 unless placed, :func:`stepsim.graph.network.place_on_chips`); its loads and
    stores use that chip's HBM."""
    return getattr(op, "chip", 0)


def compute_unit_cycles(workload: Workload, hardware: Hardware, values: dict | None = None,
                        tiles: dict | None = None) -> int:
    """A lower bound on the simulated cycles from the compute units alone (cycles): the busiest compute unit's
    firings back to back (:func:`compute_unit_bounds`; ``values``, ``tiles``: ``op_values`` and
    :func:`load_tiles` results to reuse)."""
    return busiest_unit(workload, compute_unit_bounds(workload, hardware, values, tiles))


def compute_unit_bounds(workload: Workload, hardware: Hardware, values: dict | None = None,
                        tiles: dict | None = None) -> dict[str, Fraction]:
    """``{compute op name: a lower bound on its unit's busy cycles}`` (cycles).

    A compute unit fires one element at a time. A Map, Accum or MapAccum firing advances its clock by
    ``max(L, ceil(FLOPs / compute_bw), ...)`` (docs/timing_model.md §3.3, §6), ``L`` being the PMU reads of its
    operand tiles that carry ``read_from_mu``: ``ceil(bytes / pmu_bw)`` each. This counts ``L`` only for
    operands whose tiles come straight from an off-chip load (:func:`loaded_operand`), which always carry the
    flag; other operands count 0, which only weakens the bound. A firing of a small token tile against a
    weight tile is PMU-bound (Qwen3's four-row tiles read a 2048 x 64 bf16 weight tile in 4,096 cycles and
    multiply it in 1,024), so per firing the larger term is what counts.

    The firings are the loaded operand's tiles (times the repeats on its way), and every firing does the same
    FLOPs, except along a ragged tile dimension of :attr:`Workload.tile_rows`, whose tiles fire equally often:
    each of them is charged its own ``max`` and the unit the mean over them. Without PMU reads this is the
    operator's exact FLOPs over ``compute_bw`` (``values``' ``exact_flops``).
    """
    values = values if values is not None else workload.op_values()
    tiles = tiles if tiles is not None else load_tiles(workload)
    ops = {op.name: op for op in workload.graph.ops}
    out = {}
    for name, flops in workload.op_flops(values).items():
        op = ops[name]
        bound = Fraction(flops, op.compute_bw) if type(flops) is int else flops / op.compute_bw
        if op.kind in PMU_READING_KINDS:
            reads, firings = _pmu_reads(op, hardware, tiles)
            if reads and firings:
                bound = max(bound, firings * _firing_cycles(op, Fraction(flops) / firings, reads, workload))
        out[name] = bound
    return out


def loaded_operand(ref, tiles: Mapping[str, int]) -> tuple[int, int | None] | None:
    """``(bytes of every tile, number of tiles or None)`` of stream ``ref`` (an
    :class:`stepsim.graph.graph.OutputRef`) when each tile comes unchanged from an off-chip load, through
    operators that pass tiles on (:data:`PASS_THROUGH_KINDS`); else None. Such tiles carry ``read_from_mu``,
    and the engine sizes them by the loaded tensor's dtype. The count is the load's tiles (``tiles``, a
    :func:`load_tiles` result) times the repeats on the way, None past an operator that splits or merges
    streams or a load whose count stays symbolic."""
    sizes, count = set(), 1
    pending = [ref]
    while pending:
        ref = pending.pop()
        op = ref.op
        if op.kind in LOAD_KINDS:
            sizes.add(op.tile_rows * op.tile_cols * op.tensor.dtype.bytes)
            count = count * tiles[op.name] if count is not None and op.name in tiles else None
            continue
        if op.kind not in PASS_THROUGH_KINDS or getattr(op, "pad", None) is not None:
            return None
        if op.kind in ("EagerMerge", "Reshape") and ref.index != 0:  # the selector / padding-flag output
            return None
        if op.kind in ("EagerMerge", "Parallelize"):
            count = None
        elif op.kind == "RepeatStatic" and count is not None:
            count *= op.count
        pending.extend(op.inputs)
    return (sizes.pop(), count) if len(sizes) == 1 else None


def _pmu_reads(op, hardware: Hardware, tiles: Mapping[str, int]) -> tuple[int, int | None]:
    """``(PMU read cycles of one firing of op that are certain, its firings or None)``: its operands' loaded
    tiles (cycles); the firings from the first loaded operand whose count is known."""
    reads, firings = 0, None
    for ref in op.inputs:
        loaded = loaded_operand(ref, tiles)
        if loaded is not None:
            reads += -(-loaded[0] // hardware.pmu_bw)
            firings = firings or loaded[1]
    return reads, firings


def _firing_cycles(op, mean_flops: Fraction, reads: int, workload: Workload) -> Fraction:
    """Mean over ``op``'s firings of ``max(PMU reads, FLOPs / compute_bw)`` (cycles): ``mean_flops`` when every
    firing does the same work, else each tile of a :attr:`Workload.tile_rows` dimension on its own."""
    expr = op.firing_flops() if workload.tile_rows else 0
    ragged = [s for s in getattr(expr, "free_symbols", ()) if s in workload.tile_rows]
    if len(ragged) != 1:  # max(reads, mean) is at most the mean of the maxima, so this is a bound too
        return max(Fraction(reads), mean_flops / op.compute_bw)
    (symbol,) = ragged
    bindings = workload.flop_bindings()
    costs = [max(Fraction(reads), _fraction(evaluate_exact(expr, {**bindings, symbol: rows},
                                                           f"FLOPs of {op.name}")) / op.compute_bw)
             for rows in workload.tile_rows[symbol]]
    return sum(costs, Fraction(0)) / len(costs) if costs else Fraction(0)


def pipeline_cycles(workload: Workload, hardware: Hardware, values: dict | None = None, tiles: dict | None = None,
                    loads: dict | None = None, computes: dict | None = None) -> int:
    """A lower bound on the simulated cycles (cycles) from the pipeline's fill and drain: the largest of
    :func:`pipeline_unit_bounds` (each unit's earliest start plus its work) and :func:`hbm_drain_cycles` (the
    last weight request plus the firing its tile still gets). ``values``, ``tiles``, ``loads``
    (:func:`load_unit_bounds`) and ``computes`` (:func:`compute_unit_bounds`) are reused when given."""
    values = values if values is not None else workload.op_values()
    tiles = tiles if tiles is not None else load_tiles(workload)
    firing = _cheapest_firings(workload, hardware, values, tiles)
    first = first_output_times(workload, hardware, values, tiles, firing)
    per_unit = pipeline_unit_bounds(workload, hardware, values, tiles, loads, computes, firing, first)
    return max(math.ceil(max(per_unit.values(), default=0)),
               hbm_drain_cycles(workload, hardware, values, tiles, firing, first))


def hbm_drain_cycles(workload: Workload, hardware: Hardware, values: dict | None = None,
                     tiles: dict | None = None, firing: dict | None = None, first: dict | None = None) -> int:
    """A lower bound on the simulated cycles (cycles): the HBM's last request of some loads, and the firing its
    tile still gets.

    A loaded tile goes, through operators that pass it on (:data:`PASS_THROUGH_KINDS`), to compute units that
    fire on it: its *drain* is the cheapest such firing (:func:`_cheapest_firings`; 0 when the tile may reach
    anything else). A load registers its first tile no earlier than its inputs' first elements exist (its
    *start*, from :func:`first_output_times`): the weight loads of a MoE layer wait for the routed tokens'
    tiles. For the loads whose drain is at least ``d`` and whose start is at least ``a``, with ``R`` requests
    together, the busiest of the ``C`` channels starts the last of its at least ``ceil(R / C)`` of them no
    earlier than ``a + 2 + (ceil(R / C) - 1) * II`` (a tile's first chunk is taken the tick after it is
    registered and served one cycle later; :func:`hbm_request_cycles`); the response reaches its load
    ``start_up + latency + 1`` cycles later, the tile its consumer one cycle after that, and the firing takes
    ``d`` more. The bound is the largest over ``a`` and ``d``. Stores are left out: their requests only delay
    the loads'. ``values``, ``tiles``, ``firing`` (:func:`_cheapest_firings`) and ``first`` are reused when given.
    """
    values = values if values is not None else workload.op_values()
    tiles = tiles if tiles is not None else load_tiles(workload)
    firing = firing if firing is not None else _cheapest_firings(workload, hardware, values, tiles)
    first = first if first is not None else first_output_times(workload, hardware, values, tiles, firing)
    consumers = workload.graph.consumers()
    ops = {op.name: op for op in workload.graph.ops}
    loads = [(_start(ops[name], first), _drain(ops[name], consumers, firing), n * _tile_requests(ops[name], hardware),
              _chip(ops[name])) for name, n in tiles.items() if n > 0]
    after = hardware.hbm_start_up + hardware.hbm_latency + 2
    best = 0
    for chip in {c for *_, c in loads}:  # each chip's HBM serves its own loads
        on_chip = [load[:3] for load in loads if load[3] == chip]
        for drain in {d for _, d, _ in on_chip}:
            requests = 0
            for start, _, count in sorted((load for load in on_chip if load[1] >= drain), reverse=True):
                requests += count  # every load so far starts at `start` or later
                last = start + 2 + (math.ceil(requests / hardware.hbm_channels) - 1) * hardware.hbm_init_interval
                best = max(best, last + after + drain)
    return best


def _drain(load, consumers: Mapping, firing: Mapping[str, int]) -> int:
    """The cheapest firing any compute unit does on a tile of ``load`` (cycles): the smallest
    :func:`_cheapest_firings` value among the units its tiles reach through :data:`PASS_THROUGH_KINDS`; 0 when a
    tile may reach another kind of operator or none."""
    cheapest, pending, seen = None, [load], set()
    while pending:
        op = pending.pop()
        outputs = [consumer for index in range(op.num_outputs)
                   for consumer, _ in consumers.get((op.id, index), ())]
        if not outputs:
            return 0
        for consumer in outputs:
            if consumer.name in firing:
                cost = firing[consumer.name]
            elif consumer.kind in PASS_THROUGH_KINDS and getattr(consumer, "pad", None) is None:
                if consumer.name not in seen:
                    seen.add(consumer.name)
                    pending.append(consumer)
                continue
            else:
                return 0
            cheapest = cost if cheapest is None else min(cheapest, cost)
    return cheapest or 0


def pipeline_unit_bounds(workload: Workload, hardware: Hardware, values: dict | None = None,
                         tiles: dict | None = None, loads: dict | None = None, computes: dict | None = None,
                         firing: dict | None = None, first: dict | None = None) -> dict[str, Fraction]:
    """``{unit: a lower bound on its final clock}`` (cycles) for the off-chip loads and compute units: the
    earliest time its first tile or firing can start plus its work back to back.

    A unit starts no earlier than its inputs' first elements exist (:func:`first_output_times`), and then a load
    needs :func:`load_unit_bounds`' time for its tiles, a compute unit :func:`compute_unit_bounds`' busy cycles
    for its firings (one at a time). A unit without work (an expert without tokens) is left out: it never
    starts. Units whose work a dispatcher assigns during the run (``workload.balanced_units``) count as one per
    position: the earliest start of the counterparts plus the mean of their work (the busiest of them does at
    least that much, and starts no earlier than the earliest). ``firing`` (:func:`_cheapest_firings`), ``first``
    (:func:`first_output_times`) and the other optional arguments are reused when given.
    """
    values = values if values is not None else workload.op_values()
    tiles = tiles if tiles is not None else load_tiles(workload)
    loads = loads if loads is not None else load_unit_bounds(workload, hardware, tiles)
    computes = computes if computes is not None else compute_unit_bounds(workload, hardware, values, tiles)
    first = first if first is not None else first_output_times(workload, hardware, values, tiles, firing)
    ops = {op.name: op for op in workload.graph.ops}
    work = {name: w for name, w in (*loads.items(), *computes.items()) if w > 0}
    start = {name: _start(ops[name], first) for name in work}
    dispatched, groups = _dispatched_units(workload, work)
    out = {name: start[name] + w for name, w in work.items() if name not in dispatched}
    for counterparts in groups:
        mean = sum((Fraction(work[name]) for name in counterparts), Fraction(0)) / len(counterparts)
        out[counterparts[0]] = min(start[name] for name in counterparts) + mean
    return out


def _start(op, first: Mapping[str, int]) -> int:
    """The earliest time the load or compute unit ``op`` can start (cycles): once every input's first element
    exists (``first``: :func:`first_output_times`); 0 for a unit without inputs."""
    return max((first[ref.op.name] for ref in op.inputs), default=0)


def first_output_times(workload: Workload, hardware: Hardware, values: dict | None = None,
                       tiles: dict | None = None, firing: dict | None = None) -> dict[str, int]:
    """``{op name: a lower bound on the stamp of its first output element}`` (cycles), over any of its outputs.

    From the sources on (every context's clock starts at 0; docs/timing_model.md §1):

    * an operator emits no earlier than one cycle after it read an input (an element is stamped at least the
      sender's clock + 1, and a reader's clock is at least the stamp it read; §1.2, §1.4). Which input comes
      first is not known, so the earliest counts; a source emits at 1 or later;
    * an off-chip load reads its address or reference first, if it has one, and its first tile of ``n``
      requests completes ``ceil(n / P) + start_up + latency + 2`` cycles after it starts (:func:`load_unit_bounds`);
    * a compute unit (FLOP-based or fixed-cost) fires once every operand is there: its output waits for the
      latest input plus the cheapest firing it can do (:func:`_cheapest_firings`);
    * an Accum emits only on the stop that closes a group of its reduced dims (:func:`_first_group_close`): on
      the MoE layer an expert's first token tile closes on its token after the tile, or, with fewer tokens or
      dynamic tiles, on the end of the token stream, so it follows the tokens' load (:func:`_element_times`);
    * an :data:`EARLY_EMITTING_KINDS` operator gets no cycle beyond its earliest input.

    Operators are visited producers first (:func:`_producers_first`); on a feedback loop an input not visited
    yet counts from 0, which only weakens the bound. These times are lower bounds on the sender's clock at the
    enqueue plus one, not only on the stamps, so they also hold where a stamp is requested in the future (HBM
    responses). ``values``, ``tiles`` and ``firing`` (:func:`_cheapest_firings`) are reused when given.
    """
    values = values if values is not None else workload.op_values()
    tiles = tiles if tiles is not None else load_tiles(workload)
    firing = firing if firing is not None else _cheapest_firings(workload, hardware, values, tiles)
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    end: dict[str, int] = {}
    times: dict[tuple[str, int], np.ndarray] = {}
    for op in _producers_first(workload.graph):
        arrivals = [first.get(ref.op.name, 0) for ref in op.inputs]
        if op.kind in LOAD_KINDS:
            time = max(arrivals, default=0) + _tile_cycles(op, hardware) + 1
        elif op.name in firing:
            time = max(arrivals, default=0) + firing[op.name] + 1
            if op.kind == "Accum":
                time = max(time, _first_group_close(op, workload, last, end, times) + firing[op.name] + 1)
        elif op.kind in EARLY_EMITTING_KINDS:
            time = min(arrivals, default=0)
        else:
            time = min(arrivals, default=0) + 1
        first[op.name] = time
        last[op.name], end[op.name] = _stream_ends(op, workload, hardware, first, last, end, tiles)
        times.update(_element_times(op, hardware, times, tiles))
    return first


def _stream_ends(op, workload: Workload, hardware: Hardware, first: Mapping[str, int], last: Mapping[str, int],
                 end: Mapping[str, int], tiles: Mapping[str, int]) -> tuple[int, int]:
    """``(last, end)``: lower bounds on the stamp of the last element of each of ``op``'s outputs and on its
    final clock, when the close of its input stream is passed on (cycles; 0 where not modelled). ``first``,
    ``last`` and ``end`` hold the values of ``op``'s producers (one not visited yet, on a feedback loop, counts 0).

    * An off-chip load without an input (its tiles are not waited for) completes its tiles one after another
      (:func:`load_unit_bounds`): its last tile no earlier than their count times the per-tile time.
    * A Flatten or Broadcast passes every element on, after reading it.
    * A Partition ends (closes its outputs) no earlier than it read the last element of its data input; the
      last element of one output may be any earlier token.
    * A Reshape that adds an outer dim, or pads a partial chunk, emits its last element only once it has seen
      its input closed (``units_shape.step_reshape``: the closing element waits for the next one or the close;
      the pad follows the close), so no earlier than its producer's end.
    """
    if op.kind in LOAD_KINDS and not op.inputs and op.name in tiles:
        time = tiles[op.name] * _tile_cycles(op, hardware)
        return time, time
    if op.kind in ELEMENT_KEEPING_KINDS:
        source = op.inputs[0].op.name
        return last.get(source, 0), max(last.get(source, 0), end.get(source, 0))
    if op.kind == "Partition":
        return 0, last.get(op.inputs[0].op.name, 0)
    if op.kind == "Reshape":
        source = op.inputs[0].op.name
        elements = _elements(op.inputs[0].stream, workload)
        if op.add_outer_dim or (op.pad is not None and elements is not None and elements % op.chunk_size):
            return max(last.get(source, 0), end.get(source, 0)), end.get(source, 0)
        return last.get(source, 0), end.get(source, 0)
    return 0, 0


def _first_group_close(op, workload: Workload, last: Mapping[str, int], end: Mapping[str, int],
                       times: Mapping[tuple[str, int], np.ndarray]) -> int:
    """A lower bound on the stamp of the element that closes the first group of the Accum ``op`` (its innermost
    ``op.rank`` dims; cycles; 0 when not known). An Accum emits only on a group's closing stop, so its first
    output waits for it.

    * A single group (the stream holds no more elements than one group: an expert's tokens in one static tile,
      or a dynamic tile): its closing element is the stream's last (:func:`_stream_ends`).
    * A first group that is the first chunk of ``S`` elements of a rank-0 Reshape (through Flattens that keep
      the rank-0 dim): the chunk's last element, or, when the Reshape adds an outer dim, the element after it,
      which the Reshape looks at before it emits the close (``units_shape.step_reshape``). The element times
      come from :func:`_element_times`: an expert with more tokens than a tile closes its first tile no earlier
      than its tile's last token is loaded.
    """
    stream = op.inputs[0].stream
    total = _elements(stream, workload)
    group = _elements(stream, workload, stream.shape[len(stream.shape) - op.rank:])
    if total is None or group is None:
        return 0
    if total <= group:
        return last.get(op.inputs[0].op.name, 0)
    ref = op.inputs[0]
    while ref.op.kind == "Flatten":
        ref = ref.op.inputs[0]
    reshape = ref.op
    if (op.rank != 1 or reshape.kind != "Reshape" or ref.index != 0 or reshape.rank != 0
            or reshape.chunk_size != group or stream.shape[-1] != reshape.outputs[0].shape[-1]):
        return 0
    source = reshape.inputs[0]
    arrivals = times.get((source.op.name, source.index))
    lookahead = 1 if reshape.add_outer_dim else 0
    if arrivals is None or len(arrivals) < group + lookahead:
        return 0
    return int(arrivals[group - 1 + lookahead])


def _element_times(op, hardware: Hardware, times: Mapping[tuple[str, int], np.ndarray],
                   tiles: Mapping[str, int]) -> dict[tuple[str, int], np.ndarray]:
    """``{(op name, output index): lower bounds on the stamps of that output's elements, in order}`` (cycles)
    where they are known, from ``times`` (the producers'):

    * an off-chip load without an input, of ``n`` tiles: tile ``j`` (one element) completes no earlier than
      ``(j + 1)`` per-tile times (one tile in flight; :func:`load_unit_bounds`);
    * a Flatten keeps its input's elements, and a Broadcast gives each of its outputs a copy of every one;
    * a rank-0 Partition whose selectors come from a SelectorSource sends data element ``i`` to the outputs
      selector ``i`` names, no earlier than it arrived: each output's element times are its input's at the
      positions routed there.
    """
    if op.kind in LOAD_KINDS and not op.inputs and 0 < tiles.get(op.name, 0) <= MAX_TIMED_ELEMENTS:
        return {(op.name, 0): _tile_cycles(op, hardware) * np.arange(1, tiles[op.name] + 1, dtype=np.int64)}
    if op.kind in ELEMENT_KEEPING_KINDS and (op.inputs[0].op.name, op.inputs[0].index) in times:
        return {(op.name, index): times[op.inputs[0].op.name, op.inputs[0].index] for index in range(op.num_outputs)}
    if op.kind == "Partition" and op.rank == 0:
        data, selector = op.inputs[0], op.inputs[1]
        arrivals = times.get((data.op.name, data.index))
        source = selector.op
        if arrivals is None or source.kind != "SelectorSource" or len(source.ptr) - 1 != len(arrivals):
            return {}
        position = np.repeat(np.arange(len(arrivals)), np.diff(source.ptr))
        return {(op.name, e): arrivals[position[source.targets == e]] for e in range(op.num_outputs)}
    return {}


def _elements(stream, workload: Workload, dims=None) -> int | None:
    """The product of ``dims`` (default: every dim of ``stream``) with the trace's bindings; None when it stays
    symbolic."""
    expr = stream.total_elements() if dims is None else math.prod(dims)
    try:
        return evaluate(expr, workload.bindings)
    except MetricError:
        return None


def _producers_first(graph) -> list:
    """The graph's operators in an order that puts every operator after its producers (Kahn's algorithm over
    the graph's cached consumer map; the graph lists broadcasts, inserted last, after their consumers), then
    those left on a feedback loop in graph order."""
    consumers = graph.consumers()
    waiting = {op.id: len(op.inputs) for op in graph.ops}  # one consumer-map entry per input
    ready = [op for op in graph.ops if not op.inputs]
    order = []
    while ready:
        op = ready.pop()
        order.append(op)
        for index in range(op.num_outputs):
            for consumer, _ in consumers.get((op.id, index), ()):
                waiting[consumer.id] -= 1
                if not waiting[consumer.id]:
                    ready.append(consumer)
    if len(order) < len(graph.ops):
        placed = {op.id for op in order}
        order += [op for op in graph.ops if op.id not in placed]
    return order


def _cheapest_firings(workload: Workload, hardware: Hardware, values: dict,
                      tiles: Mapping[str, int]) -> dict[str, int]:
    """``{compute op name: a lower bound on the cycles of any one of its firings}``: for a FLOP-based unit the
    larger of its certain PMU reads and its FLOPs at ``compute_bw`` on the smallest tile it can fire on (the
    fewest rows of a :attr:`Workload.tile_rows` dimension; otherwise every firing does the same work), for a
    fixed-cost function its cycles; 0 where the FLOPs of one firing stay symbolic."""
    flops = workload.op_flops(values)
    bindings = python_bindings(workload.bindings)
    out = {}
    for op in workload.graph.ops:
        fn = getattr(op, "fn", None)
        if fn is None or not hasattr(op, "firing_flops"):
            continue
        if fn.fixed_cycles is not None:
            out[op.name] = fn.fixed_cycles
            continue
        if op.name not in flops or not op.compute_bw:
            continue
        reads = _pmu_reads(op, hardware, tiles)[0] if op.kind in PMU_READING_KINDS else 0
        # the engine charges whole cycles: ceil(FLOPs / compute_bw) (docs/timing_model.md §3.3)
        out[op.name] = max(reads, math.ceil(_fewest_flops(op, workload, bindings) / op.compute_bw))
    return out


def _fewest_flops(op, workload: Workload, bindings: dict) -> Fraction:
    """FLOPs of ``op``'s cheapest firing: its firing FLOPs with the fewest rows of a ragged
    :attr:`Workload.tile_rows` dimension, else with ``bindings`` (the workload's, as Python numbers); 0 when
    they stay symbolic. A static tile's FLOPs count its padding, as the engine charges them (docs/timing_model.md
    §3.3). Evaluated factor by factor (:func:`factors_value`): a sympy product per operator would cost more than
    all the other bounds together."""
    types = op.firing_types()
    factors = op.fn.flops_factors(types)
    symbols = set().union(*(getattr(f, "free_symbols", ()) for f in factors))
    ragged = [s for s in symbols if s in workload.tile_rows]
    if len(ragged) > 1:
        return Fraction(0)
    if ragged:
        rows = workload.tile_rows[ragged[0]]
        if not rows:
            return Fraction(0)
        bindings = {**bindings, ragged[0]: min(rows)}
    try:
        return _fraction(factors_value(factors, lambda: op.fn.flops(types), bindings, f"FLOPs of {op.name}"))
    except MetricError:
        return Fraction(0)


def busiest_unit(workload: Workload, per_unit: Mapping[str, Fraction]) -> int:
    """``ceil`` of the largest per-unit lower bound in ``per_unit`` ({op name: cycles}), 0 when empty.

    Units of ``workload.balanced_units`` (work assigned during the run) count with the mean over their
    counterparts, the units at the same position of every region, which must be of one kind; when the
    regions are not built alike, their units are left out (module docstring).
    """
    dispatched, groups = _dispatched_units(workload, per_unit)
    values = {name: value for name, value in per_unit.items() if name not in dispatched}
    for counterparts in groups:
        values[counterparts[0]] = sum((per_unit[name] for name in counterparts), Fraction(0)) / len(counterparts)
    return math.ceil(max(values.values(), default=0))


def _dispatched_units(workload: Workload, units: Mapping) -> tuple[set, list[tuple]]:
    """``(names, groups)``: the names among ``units`` whose work a dispatcher assigns during the run
    (``workload.balanced_units``), and their counterparts, one tuple per position of a region (the units at that
    position in every region, of one kind). Regions not built alike, and positions of mixed kinds, give no
    group: their units are left out."""
    kinds = {op.name: op.kind for op in workload.graph.ops}
    names, groups = set(), []
    for regions in workload.balanced_units:
        members = [[name for name in region if name in units] for region in regions]
        names.update(name for region in members for name in region)
        if len({len(region) for region in members}) == 1:
            groups += [c for c in zip(*members) if len({kinds[name] for name in c}) == 1]
    return names, groups


def _tile_cycles(op, hardware: Hardware) -> int:
    """The fewest cycles from an off-chip load registering a tile to the tile's completion:
    ``ceil(n / P) + start_up + latency + 2`` for ``n`` requests dispatched ``P`` per tick
    (:func:`load_unit_bounds`)."""
    return -(-_tile_requests(op, hardware) // op.par_dispatch) + hardware.hbm_start_up + hardware.hbm_latency + 2


def _tile_requests(op, hardware: Hardware) -> int:
    """HBM requests of one tile of the memory operator ``op``: ``rows * ceil(cols * bytes / addr_offset)``."""
    return op.tile_rows * -(-(op.tile_cols * op.tensor.dtype.bytes) // hardware.addr_offset)


def _fraction(value) -> Fraction:
    """An int, Fraction or sympy Rational as a Fraction (trace bindings may be sympy Rationals)."""
    if isinstance(value, (int, Fraction)):
        return Fraction(value)
    return Fraction(int(value.p), int(value.q))
