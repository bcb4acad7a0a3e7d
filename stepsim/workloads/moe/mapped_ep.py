"""The MoE layer over a system's chips by expert parallelism with a mapped chip schedule (issue 41): the graph of
``build_moe(..., ep=N, placement="contiguous")`` (the sharding pass's
:func:`~stepsim.workloads.sharding.expert_parallel`: the batch sharded over the chips, the all-to-all dispatch and
combine over the links), each chip's experts built with the knobs a dataflow compiler would choose for them
(``tile_n``, ``tile_f``, ``lanes`` column stripes an expert or region, time-multiplexed ``regions``) instead of the
paper's. Which knobs, and every compute operator's ``compute_bw``, are the mapper's
(:mod:`stepsim.mapping.expert_parallel`); this module only builds.

Why a module apart from ``moe/build.py`` (whose ``build_moe`` keeps ``lanes`` to one chip): the mapper keys every
cached one-chip FFN schedule by that file's hash (:func:`stepsim.mapping.mapper.source_hash`), and this form does
not change the one-chip layer.
"""

from __future__ import annotations

import warnings

from stepsim.base.errors import ArgumentError
from stepsim.graph import Graph
from stepsim.models.presets import MoEModel
from stepsim.workloads.base import Workload
from stepsim.workloads.moe.stage import algorithmic_flops, idle_groups
from stepsim.workloads.routing import check_routing, expert_counts

#: FLOPs/cycle every compute operator is built with before the mapper gives it its units (any positive value)
PLACEHOLDER_BW = 1


def build_mapped_ep(model: MoEModel, routing, *, system, tile_n: int, tile_f: int, lanes: int, regions: int,
                    channel_depth: int | None = None) -> Workload:
    """The MoE layer of ``routing`` (``[tokens, top_k]`` expert ids) with its experts on the ``system.chips`` chips
    of ``system`` (contiguous placement), static tiling of ``tile_n`` tokens, ``tile_f`` F columns per weight tile,
    ``lanes`` column stripes an expert (or region) and ``regions`` regions in all (``experts``: one an expert; fewer:
    ``regions / chips`` time-multiplexed regions a chip; the shared experts over as many stripes as ``lanes``:
    :func:`stepsim.workloads.sharding._shared_lanes`). Every compute operator at :data:`PLACEHOLDER_BW` FLOPs/cycle
    until its units are assigned.

    Raises
    ------
    ArgumentError
        Fewer than two chips, knobs that do not divide the layer (``tile_f`` and ``lanes`` the expert's F and
        the shared experts' width; ``regions`` the experts and a multiple of the chips), a routing of other experts.
    """
    from stepsim.workloads.chips import chips_system
    from stepsim.workloads.sharding import Sharding, expert_parallel

    chips, experts, f = system.chips, model.experts, model.intermediate
    if chips < 2:
        raise ArgumentError(f"the expert-parallel layer needs at least 2 chips, got a system of {chips}")
    for knob, value in (("tile_n", tile_n), ("tile_f", tile_f), ("lanes", lanes), ("regions", regions)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ArgumentError(f"{knob} must be a positive int, got {value!r}")
    if f % (tile_f * lanes) or model.shared_intermediate % tile_f:
        raise ArgumentError(f"lanes {lanes} x tile_f {tile_f} must divide the intermediate size {f} (and tile_f "
                            f"the shared experts' {model.shared_intermediate})")
    if experts % regions or regions % chips:
        raise ArgumentError(f"regions {regions} must divide the {experts} experts and be a multiple of the "
                            f"{chips} chips")
    routing = check_routing(routing, experts, model.top_k)
    counts = expert_counts(routing, experts)
    g = Graph(f"moe-{model.name}-ep{chips}-mapped")
    timeshared = regions != experts
    with warnings.catch_warnings():  # tile_n above a chip's tokens: padding, chosen knowingly
        warnings.simplefilter("ignore")
        parallel, bindings, tile_rows = expert_parallel(
            Sharding(g, chips_system(chips, system, "--system")), model, [routing], chips, "contiguous",
            stack=False, regions=regions if timeshared else None, lanes=lanes, dynamic=False, tile_n=tile_n,
            tile_f=tile_f, compute_bw=PLACEHOLDER_BW, packing_compute_bw=PLACEHOLDER_BW)
    routing.flags.writeable = False
    return Workload(
        name="moe", graph=g, bindings=bindings, tile_rows=tile_rows,
        idle_groups=idle_groups(counts, regions, parallel.get("region_experts")), channel_depth=channel_depth,
        algorithmic_flops=algorithmic_flops(counts, model, tile_n),
        params=dict(model=model.name, hidden=model.hidden, intermediate=f, experts=experts, top_k=model.top_k,
                    batch=routing.shape[0], tiling="static", tile_n=tile_n, tile_f=tile_f, regions=regions,
                    lanes=lanes, channel_depth=channel_depth,
                    **({"shared_intermediate": model.shared_intermediate} if model.shared_intermediate else {}),
                    **parallel),
        trace={"routing": routing})
