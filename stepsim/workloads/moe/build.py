"""The Mixture-of-Experts layer of the paper (Fig. 2; docs/semantics.md §6.1), weight-stationary per expert.

Variants:

* ``tiling="static"``: each expert's tokens are padded to tiles of ``tile_n`` rows;
* ``tiling="dynamic"``: each expert's tokens are packed into one dynamically sized tile (round_N = 1);
* ``regions < experts``: configuration time-multiplexing; ``experts / regions`` experts share one compute
  region whose weights are fetched with random loads addressed by an EagerMerge selector (§6.1, last part);
* ``model.shared_intermediate > 0``: shared experts (DeepSeek, Qwen2-MoE), which every token visits besides its
  routed ones, modelled as one SwiGLU FFN of that width in its own region (group ``("shared_expert", 0)``,
  weights ``shared_gate`` / ``shared_up`` / ``shared_down``): a Broadcast of the token stream feeds it, tiles
  of ``tile_n`` tokens (32 with dynamic tiling), and its rows are added to the routed experts' sum before the
  store. Its output FIFO holds the whole batch (``batch`` rows), because the sum waits for the routed experts,
  which need most of the batch before their first row; shallower, the shared branch back-pressures the token
  broadcast and the layer deadlocks. Qwen2-MoE's sigmoid gate on the shared expert is not modelled.

Memory operators are created in the order the artifact's scripts register them with the HBM, because that
order decides same-cycle arbitration (docs/timing_model.md §2 step 2, §4.2). One region per expert: the token load,
the routing-weight load, then each expert's up, gate and down loads. Time-multiplexed: the token load, every
region's up load, then every gate load, then every down load, then the routing-weight load.

Storage types reproduce the experiments' ``mock_bf16``: activations, routing weights and expert weights are
stored in bf16 and computed in fp32; the output is stored in fp32.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping

import numpy as np

from stepsim.base.errors import ArgumentError, StepsimWarning
from stepsim.graph import (
    BF16,
    FP32,
    Flatten,
    Graph,
    LinearOffChipLoad,
    LinearOffChipStore,
    Reshape,
    Tensor,
)
from stepsim.models.presets import MoEModel
from stepsim.workloads.base import Workload
from stepsim.workloads.kinds import WORKLOAD_CHANNEL_DEPTH

#: §5.3: static tiling runs use 4096 FLOPs/cycle per compute node; dynamic tiling 6400
# the MoE stage and its constants (stage.py), named here too: build.py is where callers and the last release found them
from stepsim.workloads.moe.stage import (
    DEFAULT_TILE_F,  # noqa: F401
    DEFAULT_TILE_N,  # noqa: F401
    DYNAMIC_COMPUTE_BW,  # noqa: F401
    PACKING_COMPUTE_BW,  # noqa: F401
    STATIC_COMPUTE_BW,  # noqa: F401
    TIMESHARE_COMPUTE_BW,  # noqa: F401
    TIMESHARE_TILE_F,  # noqa: F401
    _expert_ffn,  # noqa: F401
    _ffn_body,  # noqa: F401
    _label,  # noqa: F401
    _micro_batch_tiles,  # noqa: F401
    _timeshared_ffns,  # noqa: F401
    _weights,  # noqa: F401
    algorithmic_flops,  # noqa: F401
    expert_ffns,  # noqa: F401
    idle_groups,  # noqa: F401
    moe_stage,  # noqa: F401
    shared_ffn,  # noqa: F401
    sum_tree,  # noqa: F401
)
from stepsim.workloads.routing import check_routing, expert_counts


def build_moe(model: MoEModel, routing, *, tiling: str = "static", tile_n: int | None = None,
              tile_f: int | None = None, regions: int | None = None, compute_bw: int | None = None,
              packing_compute_bw: int = PACKING_COMPUTE_BW,
              channel_depth: int | None = WORKLOAD_CHANNEL_DEPTH["moe"], ep: int | None = None,
              placement: str = "contiguous", system=None, tp: int | None = None,
              algorithm: str = "ring", layers: int | None = None, pp: int | None = None,
              micro_batches: int | None = None, par_dispatch: int = 1, lanes: int = 1) -> Workload:
    """Build the MoE layer for one decoding batch.

    Parameters
    ----------
    model : MoEModel
        Layer dimensions (D, F, experts, top_k).
    routing : array [tokens, top_k], or a list of them (one per layer of a stack)
        Expert ids chosen for each token (a routing trace); the batch size is ``tokens``.
    tiling : {"static", "dynamic"}
        Token tiling per expert.
    tile_n : int
        Tokens per tile for static tiling (default 32); ignored for dynamic tiling.
    tile_f : int
        Columns of F per weight tile (default 64; 48 when ``regions`` is given, as in §5.4).
    regions : int
        Parallel expert regions (default: one per expert). Giving it selects the time-multiplexing
        experiment's defaults (``tile_f`` 48, ``compute_bw`` 1024).
    compute_bw : int
        FLOPs/cycle of every compute node (default 4096 static, 6400 dynamic, 1024 time-multiplexed).
    packing_compute_bw : int
        FLOPs/cycle of the token-packing Accum (1024 in every experiment).
    channel_depth : int or None
        Default FIFO depth for simulation (2 in the experiments; None means 1024).
    ep : int, optional
        Expert parallelism: place the experts on ``ep`` chips (:func:`stepsim.workloads.sharding.expert_parallel`); with
        a stack, each of its ``pp`` stages' layers over its own ``ep`` chips (:func:`stepsim.workloads.sharding.expert_parallel`).
    placement : {"contiguous", "round-robin", "load-balanced"}
        How the experts are placed on the chips (with ``ep``).
    system : System, optional
        The chips and links (with ``ep`` or ``tp``; its chip count must be theirs); default: fully connected chips.
    tp : int, optional
        Tensor parallelism: every expert's (and the shared experts') F columns split over ``tp`` chips, an
        all-reduce (``algorithm``: ring or direct) of the partial outputs after (:mod:`stepsim.workloads.moe.many_chips`). With
        ``ep`` too, the experts are placed on ``ep`` groups of ``tp`` chips, each expert's columns split over its
        group (``tp x ep`` chips: :func:`stepsim.workloads.sharding.expert_tensor_parallel`).
    layers, pp, micro_batches : int, optional
        Any of them given: a stack of ``layers`` (default 1) MoE layers (tensors ``layer<i>.<name>``; ``routing``
        one array for every layer or a list of ``[tokens, top_k]`` arrays, one per layer), in ``pp`` pipeline
        stages on the chips of ``system``, ``micro_batches`` of ``B / M`` tokens streaming through
        (:mod:`stepsim.workloads.moe.many_chips`).
    par_dispatch : int
        HBM requests each expert-weight load issues per cycle (1 in the paper: at most 64 B/cycle a load). A
        mapped schedule (:mod:`stepsim.mapping`) raises it so that a layer's weight streams reach the HBM's peak;
        one chip without ``ep`` / ``tp`` / a stack only.
    lanes : int
        Column stripes each routed expert (or time-multiplexed region) is spread over (1 in the paper;
        :func:`_expert_ffn`); ``F / lanes`` must be a multiple of ``tile_f``. One chip without ``ep`` / ``tp`` / a
        stack.
    """
    for knob, value in (("par_dispatch", par_dispatch), ("lanes", lanes)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ArgumentError(f"{knob} must be a positive int, got {value!r}")
        if value != 1 and any(v is not None for v in (layers, pp, micro_batches, ep, tp)):
            raise ArgumentError(f"{knob} {value} applies to the one-chip MoE layer only (not with ep, tp, pp, layers "
                                "or micro_batches)")
    if ep is not None and tp is None and (isinstance(ep, bool) or not isinstance(ep, int) or ep < 2):
        # --ep 1 built the sharded graph (dispatch and combine through one chip), not the one-chip layer, so it
        # was another run than the layer without --ep; refused as the stack and the decoder refuse it
        raise ArgumentError(f"--ep must be an int >= 2 (chips), got {ep!r}")
    stack = layers is not None or pp is not None or micro_batches is not None
    routings = None
    if stack:
        layers = 1 if layers is None else layers
        if isinstance(layers, bool) or not isinstance(layers, int) or layers < 1:
            raise ArgumentError(f"--layers must be an int >= 1, got {layers!r}")
        per_layer = isinstance(routing, (list, tuple)) and all(np.ndim(r) == 2 for r in routing)
        routings = list(routing) if per_layer else [routing] * layers
        if len(routings) != layers:
            raise ArgumentError(f"--layers {layers}: got the routing of {len(routings)} layers")
        routings = [check_routing(r, model.experts, model.top_k) for r in routings]
        if len({r.shape[0] for r in routings}) != 1:
            raise ArgumentError(f"every layer's routing must hold the same tokens; got "
                                f"{sorted({r.shape[0] for r in routings})}")
        routing = routings[0]
    if tiling not in ("static", "dynamic"):
        raise ArgumentError(f"tiling must be 'static' or 'dynamic', got {tiling!r}")
    routing = check_routing(routing, model.experts, model.top_k)
    experts, k, d, f = model.experts, model.top_k, model.hidden, model.intermediate
    timeshare = regions is not None
    regions = experts if regions is None else regions
    if not isinstance(regions, int) or regions < 1 or experts % regions:
        raise ArgumentError(f"regions must divide the number of experts {experts}, got {regions!r}")
    dynamic = tiling == "dynamic"
    tile_n = None if dynamic else (DEFAULT_TILE_N if tile_n is None else tile_n)
    tile_f = tile_f or (TIMESHARE_TILE_F if timeshare else DEFAULT_TILE_F)
    if compute_bw is None:
        compute_bw = TIMESHARE_COMPUTE_BW if timeshare else (DYNAMIC_COMPUTE_BW if dynamic else STATIC_COMPUTE_BW)
    if not dynamic and (not isinstance(tile_n, int) or tile_n < 1):
        raise ArgumentError(f"tile_n must be a positive int, got {tile_n!r}")
    if not isinstance(tile_f, int) or tile_f < 1 or f % tile_f:
        raise ArgumentError(f"tile_f must be a positive divisor of the intermediate size {f}, got {tile_f!r}")
    if f % (tile_f * lanes):
        raise ArgumentError(f"lanes {lanes} x tile_f {tile_f} must divide the intermediate size {f}")
    if model.shared_intermediate % tile_f:
        raise ArgumentError(f"tile_f must also divide the shared experts' intermediate size "
                            f"{model.shared_intermediate}, got {tile_f!r}")

    batch = routing.shape[0]
    if not dynamic and tile_n > batch:
        warnings.warn(f"tile_n {tile_n} is larger than the batch ({batch} tokens): every expert tile is mostly "
                      f"padding; tiles up to {batch} give the same traffic with less on-chip memory",
                      StepsimWarning, stacklevel=3)  # 3: past the gc_paused wrapper, to the caller
    counts = expert_counts(routing, experts)
    g = Graph(f"moe-{model.name}-{tiling}")

    # 1: token loads; 2-7: the MoE stage (selectors, routing weights, experts, gather and sum); 8: store
    parallel, tile_rows = {}, {}
    flops = algorithmic_flops(counts, model, tile_n)
    if stack or tp is not None or ep is not None:
        from stepsim.workloads.moe.many_chips import many_chips

        g, bindings, tile_rows, stack_flops, parallel = many_chips(
            g, model, routings if stack else [routing], counts, stack=stack, tp=tp, ep=ep, pp=pp, system=system,
            micro_batches=micro_batches, placement=placement, algorithm=algorithm, timeshare=timeshare,
            tiling=tiling, dynamic=dynamic, tile_n=tile_n, tile_f=tile_f, regions=regions, compute_bw=compute_bw,
            packing_compute_bw=packing_compute_bw)
        flops = flops if stack_flops is None else stack_flops
    else:
        x = Tensor("x", (batch, d), BF16)
        tokens = Flatten(g, LinearOffChipLoad(g, x, (1, d), (batch, 1), (1, 1), stream_dtype=FP32), 0, 1)
        summed, bindings, tile_rows = moe_stage(
            g, tokens, model, routing, counts, dynamic=dynamic, tile_n=tile_n, tile_f=tile_f, regions=regions,
            compute_bw=compute_bw, packing_compute_bw=packing_compute_bw, par_dispatch=par_dispatch, lanes=lanes)
        LinearOffChipStore(g, Reshape(g, summed, 1, 0, write_back_mu=True), tensor_name="y")
    if stack:  # expert e of layer i is group ("layer<i>.expert", e) (sharding.relabel)
        idle = {(f"layer{i}.expert", e) for i, r in enumerate(routings)
                for e, c in enumerate(expert_counts(r, experts)) if c == 0}
        routing = np.stack(routings)  # [layers, tokens, top_k]: the reference routes layer i by routing[i]
    else:
        idle = idle_groups(counts, regions, parallel.get("region_experts"))
    routing.flags.writeable = False
    return Workload(
        name="moe", graph=g, bindings=bindings, tile_rows=tile_rows, idle_groups=idle,
        channel_depth=channel_depth,
        algorithmic_flops=flops,
        params=dict(model=model.name, hidden=d, intermediate=f, experts=experts, top_k=k, batch=batch,
                    tiling=tiling, tile_n=tile_n, tile_f=tile_f, regions=regions, compute_bw=compute_bw,
                    packing_compute_bw=packing_compute_bw, channel_depth=channel_depth,
                    # a mapped schedule's knobs only when set, so every run id from before them is unchanged
                    **{knob: v for knob, v in (("par_dispatch", par_dispatch), ("lanes", lanes)) if v != 1},
                    **({"shared_intermediate": model.shared_intermediate} if model.shared_intermediate else {}),
                    **parallel),
        trace={"routing": routing},  # check_routing's own int64 copy
    )




def from_config(cfg: Mapping) -> Workload:
    """The moe workload of a normalized run config (:func:`stepsim.workloads.config.normalize_config`)."""
    from stepsim.models.presets import moe_model
    from stepsim.trace_io.load import load_routing
    from stepsim.workloads.config import CUSTOM_MODEL_KEYS, bandwidth_kwargs, resolved_trace

    model = moe_model(cfg["model"], **{key: cfg[key] for key in CUSTOM_MODEL_KEYS})
    if any(cfg.get(k) is not None for k in ("layers", "pp", "micro_batches")):
        return _stack_from_config(cfg, model)
    routing = load_routing(resolved_trace(cfg), model.experts, iteration=cfg["iteration"], layer=cfg["layer"])
    parallel = {}
    if cfg.get("ep") is not None:
        from stepsim.workloads.chips import ep_system_of

        parallel = dict(ep=cfg["ep"], placement=cfg.get("placement") or "contiguous", system=ep_system_of(cfg))
        if cfg.get("tp") is not None:  # tp x ep: each expert's columns over its group's chips
            parallel.update(tp=cfg["tp"], algorithm=cfg.get("algorithm") or "ring")
    elif cfg.get("tp") is not None:
        from stepsim.base.system import System

        if cfg.get("system") is not None and cfg.get("hardware") is not None:
            raise ArgumentError("--hardware does not apply with --system: the system file names the chips' hardware")
        if cfg.get("placement") is not None:
            raise ArgumentError("--placement applies to the MoE layer with --ep N (expert parallelism)")
        parallel = dict(tp=cfg["tp"], algorithm=cfg.get("algorithm") or "ring",
                        system=System.load(cfg["system"]) if cfg.get("system") is not None else None)
    elif cfg.get("placement") is not None or cfg.get("system") is not None:
        raise ArgumentError("--placement and --system apply to the MoE layer with --ep N (expert parallelism)")
    if cfg.get("algorithm") is not None and cfg.get("tp") is None:
        raise ArgumentError("--algorithm applies to the MoE layer with --tp N (its all-reduce)")
    return build_moe(model, routing, tiling=cfg["tiling"], tile_n=cfg["tile_n"], tile_f=cfg["tile_f"],
                     regions=cfg["regions"], **bandwidth_kwargs(cfg), **parallel)


def _stack_from_config(cfg: Mapping, model: MoEModel) -> Workload:
    """``--layers L [--pp N --system FILE] [--micro-batches M] [--ep E --placement P]``: one-line errors for the
    flags that do not combine,
    before the trace is read; each layer's routing from the trace (:func:`stepsim.workloads.routing.layer_routings`)."""
    from stepsim.workloads.chips import stack_knobs
    from stepsim.workloads.config import bandwidth_kwargs, resolved_trace
    from stepsim.workloads.routing import layer_routings

    if cfg.get("placement") is not None and cfg.get("ep") is None:
        raise ArgumentError("--placement applies to the MoE layer with --ep N (expert parallelism)")
    if cfg.get("algorithm") is not None and cfg.get("tp") is None:
        raise ArgumentError("--algorithm applies to the MoE layer with --tp N (its all-reduce)")
    stack = stack_knobs(cfg, "MoE layers", ("regions",), chip_knobs=("pp", "ep", "tp"))
    if cfg.get("ep") is not None:
        stack.update(ep=cfg["ep"], placement=cfg.get("placement") or "contiguous")
    if cfg.get("tp") is not None:  # tensor-parallel stages (the sharding pass: workloads/sharding.py)
        stack.update(tp=cfg["tp"], algorithm=cfg.get("algorithm") or "ring")
    routings = layer_routings(resolved_trace(cfg), model.experts, model.top_k, stack["layers"], cfg["iteration"],
                              cfg["layer"])
    return build_moe(model, routings, tiling=cfg["tiling"], tile_n=cfg["tile_n"], tile_f=cfg["tile_f"],
                     **bandwidth_kwargs(cfg), **stack)
