"""The MoE block over a system's chips by expert parallelism, mapped chip by chip (issue 41; docs/mapping.md).

A dataflow compiler given an expert-parallel deployment compiles one program a chip: the chip's experts (and its
shard of the batch, the all-to-alls' ends) spread over that chip's units. stepsim does the same in three steps:

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
* **Regions searched on the system** (:func:`search_knobs`): the proxy leaves out the all-to-all's ends and the
  links, and keeps more time-multiplexed regions a chip than the system runs fastest with (``bench/ep_proxy_gap.py``:
  on the small MoE its choice took 1.17x the best of its whole space simulated on ``ring-2`` at 8 tokens, 1.28x on
  ``ring-4`` at 9), so its regions a chip are tried again on the system's own graph (each of the one-chip kind's
  halvings of a chip's experts), on the mapper's representative routings, and the fewest mean cycles win; cached
  like a mapped schedule (kind ``ep``, its own key).
* **Units** (:func:`assign_chip_units`): every chip's compute operators get that chip's compute units as the
  one-chip mapper hands them out (:func:`stepsim.mapping.units.assign_compute_units`: one each, the rest by FLOPs),
  on the mapper's representative routing of the same token count (:func:`stepsim.mapping.kinds.ffn.ffn_routing`), so
  a layer's units depend on its shape, never on its routing (a serving template rebound to any step's routing is
  the layer built for it).

The whole system's graph (:func:`stepsim.workloads.moe.mapped_ep.build_mapped_ep`) is then simulated as any
expert-parallel layer: the dispatch and combine over the links, every chip's HBM, exactly. Only the regions are
searched on the system (a handful of whole-system simulations a token-count bucket); the tiles and lanes stay the
proxy's (a search of the whole space there simulates the whole system for each of its hundreds of candidates).
"""

from __future__ import annotations

import functools
import math
from types import SimpleNamespace

from stepsim.base.hardware import Hardware
from stepsim.mapping.units import Infeasible, assign_compute_units, compute_ops
from stepsim.models.presets import MoEModel

#: schedules already made (:func:`ep_schedule`, or the search that chose them): :func:`_plan_key` -> (knobs,
#: {operator name: compute_bw})
_PLANS: dict = {}


def chip_block(tokens: int, model: MoEModel, chips: int) -> tuple[MoEModel, int]:
    """``(dims, tokens)`` of the one-chip block that stands for one chip's share (module docstring)."""
    local = model.experts // chips
    top_k = min(-(-model.top_k // chips), local)
    dims = MoEModel(f"{model.name}/ep{chips}", hidden=model.hidden, intermediate=model.intermediate,
                    experts=local, top_k=top_k)
    return dims, max(1, math.ceil(tokens * model.top_k / (chips * top_k)))


def ep_knobs(tokens: int, model: MoEModel, chips: int, hardware: Hardware, cache=True) -> dict:
    """The knobs of the expert-parallel layer of ``tokens`` tokens on ``chips`` chips (module docstring):
    ``{"tile_n", "tile_f", "lanes", "regions"}``, ``regions`` in all. A ``tile_f`` that does not divide the shared
    experts' width is halved until it does. ``cache``: the proxy schedule's (as :func:`stepsim.mapping.schedule_for`'s)."""
    from stepsim.mapping import schedule_for

    dims, size = chip_block(tokens, model, chips)
    knobs = dict(schedule_for("ffn", size, dims, hardware, cache=cache).knobs)
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


#: bump when the search changes (its key also hashes its sources: :func:`_search_source`)
EP_SEARCH_VERSION = 1
#: the modules besides the ``ffn`` kind's (:func:`stepsim.mapping.mapper.source_hash`) that the search's choice
#: depends on: this one and the system's graph builders
SEARCH_SOURCES = ("stepsim.mapping.expert_parallel", "stepsim.workloads.moe.mapped_ep", "stepsim.workloads.sharding",
                  "stepsim.workloads.moe.sharded", "stepsim.workloads.moe.parallel", "stepsim.workloads.chips")
#: searched knobs already found, this process (cache key -> knobs)
_SEARCHED: dict = {}


def region_options(model: MoEModel, chips: int) -> list[int]:
    """The regions in all that :func:`search_knobs` tries: a chip's ``E / n`` experts in one region each or
    time-multiplexed on ``E / n``, ``E / 2n``, ... 1 regions a chip (the one-chip ``ffn`` kind's halvings), times
    the chips."""
    from stepsim.mapping.kinds.ffn import REGION_HALVINGS

    local = model.experts // chips
    return [r * chips for r in sorted({max(1, local >> k) for k in range(REGION_HALVINGS + 1)}, reverse=True)]


def _fitting(tokens: int, model: MoEModel, system, hardware: Hardware, knobs: dict):
    """``(knobs, {operator name: compute_bw}, the layer on the representative routing with those units)`` with
    ``lanes`` stepped down to the next divisor of the expert's weight tiles until every chip's operators fit its
    units, or None when even one lane does not fit."""
    from stepsim.mapping.kinds.ffn import ffn_routing
    from stepsim.workloads.moe.mapped_ep import build_mapped_ep

    knobs, routing, stripes = dict(knobs), ffn_routing(tokens, model), model.intermediate // knobs["tile_f"]
    while True:
        representative = build_mapped_ep(model, routing, system=system, **knobs)
        try:
            assign_chip_units(representative, hardware)
        except Infeasible:
            if knobs["lanes"] == 1:
                return None
            knobs["lanes"] = max(n for n in range(1, knobs["lanes"]) if stripes % n == 0)
            continue
        return knobs, {op.name: op.compute_bw for op in compute_ops(representative.graph)}, representative


def _mean_cycles(tokens: int, model: MoEModel, system, hardware: Hardware, knobs: dict, plan: dict,
                 first=None) -> float:
    """The mean engine cycles of the layer with ``knobs`` and units ``plan`` over the ``ffn`` kind's representative
    routings of ``tokens`` tokens (:func:`stepsim.mapping.kinds.ffn.ffn_samples` of them, as the one-chip mapper
    decides). ``first``: the first routing's layer already built with those units (:func:`_fitting`'s)."""
    from stepsim.mapping.kinds.ffn import ffn_routing, ffn_samples
    from stepsim.mapping.mapper import _simulate
    from stepsim.workloads.moe.mapped_ep import build_mapped_ep

    total = 0
    for sample in range(ffn_samples(tokens)):
        workload = first if sample == 0 and first is not None else None
        if workload is None:
            workload = build_mapped_ep(model, ffn_routing(tokens, model, sample), system=system, **knobs)
            for op in compute_ops(workload.graph):
                op.compute_bw = plan[op.name]
        total += _simulate(workload, hardware)
    return total / ffn_samples(tokens)


@functools.cache
def _search_source() -> str:
    """The hash of the ``ffn`` kind's sources and :data:`SEARCH_SOURCES`, once a process."""
    import importlib

    from stepsim.base.files import file_sha256, stable_hash
    from stepsim.mapping.mapper import source_hash

    files = [importlib.import_module(name).__file__ for name in SEARCH_SOURCES]
    return stable_hash([source_hash("ffn"), *(file_sha256(f) for f in files)])


def search_material(tokens: int, model: MoEModel, system, hardware: Hardware) -> dict:
    """What the searched knobs depend on (its hash is the cache key): the search's and the timing model's versions,
    the token count, the model's dimensions, the system (its name, so that tests/mapping_seeds/refresh.py can load
    it again, and its links), the hardware and the sources."""
    import dataclasses

    from stepsim.base.defaults import TIMING_MODEL_VERSION

    links = [[link.src, link.dst, link.bandwidth, link.latency] for link in system.links]
    return {"ep_search_version": EP_SEARCH_VERSION, "timing_model_version": TIMING_MODEL_VERSION, "kind": "ep",
            "size": tokens, "dims": {k: v for k, v in dataclasses.asdict(model).items() if k != "name"},
            "system": system.name, "chips": system.chips, "links": links, "switches": system.n_switches,
            "hardware": hardware.values(), "hardware_explicit": list(hardware.explicit), "source": _search_source()}


def search_knobs(tokens: int, model: MoEModel, system, hardware: Hardware, cache=True) -> dict:
    """The knobs of the expert-parallel layer of ``tokens`` tokens on ``system``: the proxy's (:func:`ep_knobs`)
    with its regions searched on the system's own graph (:func:`region_options`, each with ``lanes`` stepped down
    until every chip fits: :func:`_fitting`), the fewest mean cycles over the representative routings winning (a
    tie: the proxy's). Cached in the process and in the mapper's folder (``cache``: as
    :func:`stepsim.mapping.mapper.map_layer`'s), keyed by :func:`search_material`.

    Why: the proxy leaves out the all-to-all's ends and the links, and chooses more time-multiplexed regions a chip
    than the system runs fastest with (``bench/ep_proxy_gap.py``: on the small MoE 1.17x the best on ``ring-2`` at
    8 tokens, 1.28x on ``ring-4`` at 9). Only the regions are searched: the proxy's tiles and lanes are its own
    search's, and a whole-space search on the system simulates the whole system for every candidate."""
    from stepsim.base.files import stable_hash
    from stepsim.mapping.mapper import _cache_folder, _load, _save
    from stepsim.mapping.schedule import Schedule

    material = search_material(tokens, model, system, hardware)
    key = stable_hash(material)
    if key in _SEARCHED:
        return dict(_SEARCHED[key])
    folder = _cache_folder(cache)
    found = _load(folder, key) if folder is not None else None
    if found is None:
        proxy = ep_knobs(tokens, model, system.chips, hardware, cache)
        options = [proxy["regions"], *(r for r in region_options(model, system.chips) if r != proxy["regions"])]
        best = None
        for regions in options:
            fit = _fitting(tokens, model, system, hardware, dict(proxy, regions=regions))
            if fit is None:
                continue
            cycles = _mean_cycles(tokens, model, system, hardware, *fit)
            if best is None or cycles < best[0]:
                best = (cycles, fit)
        if best is None:
            raise Infeasible(f"no expert-parallel schedule of {tokens} tokens fits the chips of system "
                             f"{system.name!r}, even one lane an expert")
        knobs, plan, _ = best[1]
        _PLANS[_plan_key(tokens, model, system, hardware, knobs)] = (knobs, plan)  # ep_schedule's, not fitted again
        # only the knobs and the mean cycles are what the search measured (the bytes, FLOPs and units of a
        # whole system are the run's, not one chip's schedule's): the other fields stay 0
        found = Schedule("ep", knobs, round(best[0]))
        if folder is not None:
            _save(folder, key, found, material)
    _SEARCHED[key] = dict(found.knobs)
    return dict(found.knobs)


def _plan_key(tokens: int, model: MoEModel, system, hardware: Hardware, knobs: dict) -> tuple:
    return tokens, repr(model), repr(system), tuple(sorted(hardware.values().items())), tuple(sorted(knobs.items()))


def ep_schedule(tokens: int, model: MoEModel, system, hardware: Hardware) -> tuple[dict, dict]:
    """``(knobs, {operator name: compute_bw})`` of the expert-parallel layer of ``tokens`` tokens on ``system``: the
    knobs searched at its token-count bucket (:func:`search_knobs` at :func:`stepsim.mapping.mapper.bucket`, as a
    one-chip layer takes its bucket's schedule), their ``lanes`` stepped down if this many tokens' chips do not fit
    them (:func:`_fitting`), and the units of :func:`assign_chip_units` on the representative routing of that many
    tokens. Memoised a process.

    Why the bucket: the search simulates the whole system a few times a region option (seconds to minutes each on a
    large model); searched at every token count, an expert-parallel calibration searched once for each of its pilot
    steps' counts (69 of the suite's 82 stored searches were at other counts than a bucket's; a 300-request
    calibration of the 4-layer Qwen3 shape on ``ring-2`` searched about once a minute for 45 minutes), and the fast
    model's bucket estimate (:func:`stepsim.serve.fast_mapped_ep.ep_reference`) priced its bottom point under other
    knobs than its bucket's."""
    from stepsim.mapping.mapper import bucket

    knobs = search_knobs(bucket(tokens), model, system, hardware)
    key = _plan_key(tokens, model, system, hardware, knobs)
    if key not in _PLANS:
        fit = _fitting(tokens, model, system, hardware, knobs)
        if fit is None:
            raise Infeasible(f"the expert-parallel knobs {knobs} searched at {bucket(tokens)} tokens do not fit the "
                             f"chips of system {system.name!r} at {tokens} tokens, even one lane an expert")
        _PLANS[key] = fit[:2]
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
