"""The MoE block over a system's chips by expert parallelism, mapped chip by chip (issue 41; docs/mapping.md).

A dataflow compiler given an expert-parallel deployment compiles one program a chip: the chip's experts (and its
shard of the batch, the all-to-alls' ends) spread over that chip's units. stepsim does the same in two steps:

* **Knobs** (:func:`ep_knobs`): the schedule the one-chip mapper (:func:`stepsim.mapping.schedule_for`, kind
  ``ffn``, cached like any one-chip FFN) chooses for the block one chip holds: ``E / n`` experts, each token taking
  ``k' = min(ceil(k / n), E / n)`` of them, over ``ceil(t k / (n k'))`` tokens (``t`` tokens of top-``k`` routing
  over ``E`` experts on ``n`` chips: a chip's experts get ``t k / n`` token slots, as many as the proxy's, so an
  expert averages the tokens it gets in the deployment), without the shared experts. Its ``tile_n``, ``tile_f``
  and ``lanes`` are the deployment's; its regions a chip, times ``n``, its regions in all. The shared experts (each
  chip runs them whole on its shard of the batch) are spread over as many column stripes as an expert's lanes
  (:func:`stepsim.workloads.sharding._shared_lanes`). Why not in the proxy: the one-chip layer's shared experts are
  one stripe (its mapper has no knob for them), so on DeepSeek-V3's shape (a 88 MB shared expert beside 16 experts a
  chip) they set the proxy's time whatever its knobs: the mapper chose 2 lanes at 1 token and the layer on 16 chips
  took 488,180 cycles against the paper's 498,330 (without the shared expert 79,894). Loads issuing more requests a
  cycle (``par_dispatch`` 9) did not help: a stripe's stream is read one tile row at a time.
* **Units** (:func:`assign_chip_units`): every chip's compute operators get that chip's compute units as the
  one-chip mapper hands them out (:func:`stepsim.mapping.units.assign_compute_units`: one each, the rest by FLOPs),
  on the mapper's representative routing of the same token count (:func:`stepsim.mapping.kinds.ffn.ffn_routing`), so
  a layer's units depend on its shape, never on its routing (a serving template rebound to any step's routing is
  the layer built for it).

The whole system's graph (:func:`stepsim.workloads.moe.mapped_ep.build_mapped_ep`) is then simulated as any
expert-parallel layer: the dispatch and combine over the links, every chip's HBM, exactly. The knobs are chosen on the
one-chip proxy, not searched on the system's graph: a search there would simulate the whole system per candidate
and key its cache by the system too; the proxy's choice is what compiling each chip on its own gives.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

from stepsim.base.hardware import Hardware
from stepsim.mapping.units import Infeasible, assign_compute_units, compute_ops
from stepsim.models.presets import MoEModel

#: schedules already made (:func:`ep_schedule`): key -> (knobs, {operator name: compute_bw})
_PLANS: dict = {}


def chip_block(tokens: int, model: MoEModel, chips: int) -> tuple[MoEModel, int]:
    """``(dims, tokens)`` of the one-chip block that stands for one chip's share (module docstring)."""
    local = model.experts // chips
    top_k = min(-(-model.top_k // chips), local)
    dims = MoEModel(f"{model.name}/ep{chips}", hidden=model.hidden, intermediate=model.intermediate,
                    experts=local, top_k=top_k)
    return dims, max(1, math.ceil(tokens * model.top_k / (chips * top_k)))


def ep_knobs(tokens: int, model: MoEModel, chips: int, hardware: Hardware) -> dict:
    """The knobs of the expert-parallel layer of ``tokens`` tokens on ``chips`` chips (module docstring):
    ``{"tile_n", "tile_f", "lanes", "regions"}``, ``regions`` in all. A ``tile_f`` that does not divide the shared
    experts' width is halved until it does."""
    from stepsim.mapping import schedule_for

    dims, size = chip_block(tokens, model, chips)
    knobs = dict(schedule_for("ffn", size, dims, hardware).knobs)
    knobs["regions"] *= chips
    while model.shared_intermediate % knobs["tile_f"]:
        knobs["tile_f"] //= 2
    return knobs


def assign_chip_units(workload, hardware: Hardware) -> tuple[int, ...]:
    """Every chip's compute operators given that chip's compute units (module docstring), in place; returns the
    units each chip uses, chip by chip (an operator's ``chip``).

    Raises
    ------
    Infeasible
        A chip with more compute operators than compute units (naming the chip).
    """
    by_chip: dict[int, list] = {}
    for op in compute_ops(workload.graph):
        by_chip.setdefault(getattr(op, "chip", 0), []).append(op)
    flops = workload.op_flops()
    used = []
    for chip in sorted(by_chip):
        view = SimpleNamespace(graph=SimpleNamespace(ops=by_chip[chip]), op_flops=lambda: flops)
        try:
            used.append(assign_compute_units(view, hardware))
        except Infeasible as exc:
            raise Infeasible(f"chip {chip}: {exc}") from None
    return tuple(used)


def ep_schedule(tokens: int, model: MoEModel, system, hardware: Hardware) -> tuple[dict, dict]:
    """``(knobs, {operator name: compute_bw})`` of the expert-parallel layer of ``tokens`` tokens on ``system``: the
    knobs of :func:`ep_knobs` and the units of :func:`assign_chip_units` on the representative routing of that many
    tokens. The proxy fits one chip's units without the all-to-alls' ends and the shared experts; when the whole
    chip's operators do not, ``lanes`` steps down to the next divisor of the expert's weight tiles until they do.
    Memoised a process."""
    from stepsim.mapping.kinds.ffn import ffn_routing
    from stepsim.workloads.moe.mapped_ep import build_mapped_ep

    knobs = ep_knobs(tokens, model, system.chips, hardware)
    key = (tokens, repr(model), repr(system), tuple(sorted(hardware.values().items())), tuple(sorted(knobs.items())))
    if key not in _PLANS:
        routing = ffn_routing(tokens, model)
        stripes = model.intermediate // knobs["tile_f"]
        while True:
            representative = build_mapped_ep(model, routing, system=system, **knobs)
            try:
                assign_chip_units(representative, hardware)
                break
            except Infeasible:
                if knobs["lanes"] == 1:
                    raise
                knobs["lanes"] = max(n for n in range(1, knobs["lanes"]) if stripes % n == 0)
        _PLANS[key] = (knobs, {op.name: op.compute_bw for op in compute_ops(representative.graph)})
    knobs, plan = _PLANS[key]
    return dict(knobs), plan


def mapped_ep_workload(model: MoEModel, routing, system, hardware: Hardware, channel_depth: int | None = None):
    """The expert-parallel layer of ``routing`` on ``system`` with its mapped knobs and units (:func:`ep_schedule`
    of its token count). Returns ``(workload, knobs)``."""
    from stepsim.workloads.moe.mapped_ep import build_mapped_ep

    knobs, plan = ep_schedule(len(routing), model, system, hardware)
    workload = build_mapped_ep(model, routing, system=system, channel_depth=channel_depth, **knobs)
    for op in compute_ops(workload.graph):
        op.compute_bw = plan[op.name]
    return workload, knobs
