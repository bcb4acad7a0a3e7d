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

import dataclasses
import warnings
from collections.abc import Mapping

import numpy as np

from stepsim.base.errors import ArgumentError, StepsimWarning
from stepsim.graph import (
    BF16,
    FP32,
    Accum,
    AccumAdd,
    Add,
    DynTile,
    EagerMerge,
    Empty,
    ExpertAddrGen,
    Flatten,
    Graph,
    LinearOffChipLoad,
    LinearOffChipStore,
    Map,
    MapAccum,
    Matmul,
    Mul,
    Partition,
    RandomOffChipLoad,
    Reassemble,
    RepeatStatic,
    Reshape,
    RetileRow,
    RetileStreamify,
    SelectorSource,
    Silu,
    Tensor,
    Tile,
    Zero,
)
from stepsim.graph.dims import ceil_div
from stepsim.graph.gcpause import gc_paused
from stepsim.models.presets import MoEModel
from stepsim.workloads.base import Workload
from stepsim.workloads.kinds import WORKLOAD_CHANNEL_DEPTH
from stepsim.workloads.routing import check_routing, expert_counts, multihot, onehot_per_slot

#: §5.3: static tiling runs use 4096 FLOPs/cycle per compute node; dynamic tiling 6400
STATIC_COMPUTE_BW = 4096
DYNAMIC_COMPUTE_BW = 6400
#: §5.3 / §5.4: the token-packing Accum(RetileRow) is hard-coded to 1024 FLOPs/cycle
PACKING_COMPUTE_BW = 1024
#: §5.4: the time-multiplexing experiment uses 1024 FLOPs/cycle per node and F tiles of 48
TIMESHARE_COMPUTE_BW = 1024
TIMESHARE_TILE_F = 48
DEFAULT_TILE_F = 64
DEFAULT_TILE_N = 32


def algorithmic_flops(counts, model: MoEModel, tile_n: int | None) -> int:
    """The paper scripts' FLOPs: per expert with ``b`` tokens after padding to ``tile_n`` (``b = c`` when
    dynamic), ``2*b*D*F*3 + b*F + 8*b*D*F``. The SiLU term multiplies by D (sic, docs/semantics.md §9.5).
    Shared experts add the same terms with F the shared width and ``b`` the batch padded to their tiles."""
    d, f = model.hidden, model.intermediate

    def ffn(b, width):
        return 2 * b * d * width * 3 + b * width + 8 * b * d * width

    total = 0
    for c in (int(x) for x in counts):
        total += ffn(c if tile_n is None else ceil_div(c, tile_n) * tile_n, f)
    if model.shared_intermediate:
        batch = int(sum(int(x) for x in counts)) // model.top_k
        tn = tile_n or DEFAULT_TILE_N
        total += ffn(ceil_div(batch, tn) * tn, model.shared_intermediate)
    return total


@gc_paused  # see stepsim.graph.gcpause: collections made large builds superlinear
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
        (:mod:`stepsim.workloads.moe.pipeline`).
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
    if stack:  # expert e of layer i is group ("layer<i>.expert", e) (moe/pipeline.py)
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


def moe_stage(g, tokens, model: MoEModel, routing, counts, *, dynamic: bool, tile_n: int | None, tile_f: int,
              regions: int, compute_bw: int, packing_compute_bw: int, suffix: str = "", prefix: str = "",
              micro_batches: int = 1, par_dispatch: int = 1, lanes: int = 1):
    """The MoE block as a stage of graph ``g``: token rows in (``tokens``: the batch's rows, 1 x D fp32, in token
    order), the block's output rows out, in token order (routed experts weighted by the routing weights and
    summed, plus the shared experts' rows). Creates its operators in the order the artifact registers the
    memory operators (module docstring). ``routing`` is checked, ``counts`` its per-expert token counts.

    Returns ``(output rows, bindings, tile_rows)``: the symbols' values from the trace, and the rows of each
    time-multiplexed region's merged dynamic tiles (:attr:`stepsim.workloads.base.Workload.tile_rows`).
    ``suffix`` ends the names of the expert weight tensors (a tensor-parallel chip's shards: ``.<chip>``);
    ``prefix`` starts the names of the stage's tensors (a stack's layer: ``layer<i>.``, moe/pipeline.py).
    ``micro_batches`` M > 1 (one region per expert): every expert's tiles are packed per micro-batch of ``B / M``
    consecutive tokens (:func:`_micro_batch_tiles`; dynamic tiling: one tile per micro-batch with tokens), so a
    pipeline's next stage gets micro-batch m's rows without waiting for later micro-batches' tokens.
    ``par_dispatch``: HBM requests per cycle of each expert-weight load; ``lanes``: column stripes per expert
    (:func:`_expert_ffn`; both :func:`build_moe`).
    """
    experts, k, d = model.experts, model.top_k, model.hidden
    batch = routing.shape[0]
    bw = dict(compute_bw=compute_bw)

    # 2-3: selectors, routing weights
    feature_select = SelectorSource(g, multihot(routing, experts), experts) if micro_batches == 1 else None
    weight_select = SelectorSource(g, onehot_per_slot(routing, experts), experts)
    route_w = Tensor(f"{prefix}routing_weights", (batch, k), BF16)

    def load_routing_weights():
        return LinearOffChipLoad(g, route_w, (1, 1), (batch, k), (k, 1), stream_dtype=FP32)

    # HBM registration order (graph order) decides same-cycle arbitration (docs/timing_model.md §2 step 2, §4.2): the
    # per-expert scripts load the routing weights here, the time-multiplexing script (regions < experts) after
    # the expert weights
    weights = load_routing_weights() if regions == experts else None

    tile_rows = {}
    if micro_batches > 1:  # 4-5a per micro-batch
        count_symbol, packed, bindings, tile_rows = _micro_batch_tiles(g, tokens, model, routing, micro_batches,
                                                                       tile_n, packing_compute_bw, prefix, dynamic)
        bindings.update({count_symbol[e]: int(counts[e]) for e in range(experts)})
    else:
        # 4: tokens to experts; the partition's count symbols are the per-expert token counts
        per_expert = Partition(g, tokens, feature_select, 0, experts)
        count_symbol = per_expert.count_symbols
        bindings = {count_symbol[e]: int(counts[e]) for e in range(experts)}
        packed = []
    for e in range(experts if micro_batches == 1 else 0):  # 5a: pack each expert's tokens into tiles
        c = count_symbol[e]
        before = len(g.ops)
        if dynamic:
            padded = Reshape(g, per_expert[e], 1, 0, pad=Zero(1, d), add_outer_dim=True)
            rows = Flatten(g, padded, 0, 1)
            out_dtype = DynTile(FP32, c, d)
        else:
            padded = Reshape(g, per_expert[e], tile_n, 0, pad=Zero(1, d), add_outer_dim=True)
            rows = Flatten(g, padded, 1, 2)
            out_dtype = Tile(FP32, tile_n, d)
        packed.append(Accum(g, rows, RetileRow(), Empty(0, d), 1, out_dtype=out_dtype,
                            compute_bw=packing_compute_bw))
        _label(g.ops[before:], ("expert", e))

    # 5b: expert FFNs, one region per expert or time-multiplexed regions
    if regions == experts:
        results = [_expert_ffn(g, packed[e], e, model, tile_f, dynamic, bw, suffix, prefix, par_dispatch, lanes)
                   for e in range(experts)]
    else:
        results, region_bindings, region_rows = _timeshared_ffns(g, packed, model, regions, tile_f, dynamic,
                                                                     counts, bw, par_dispatch=par_dispatch,
                                                                     lanes=lanes)
        bindings.update(region_bindings)
        tile_rows.update(region_rows)

    # 5c-7: unpack rows, scale by routing weights, reassemble tokens, sum over slots, store
    if weights is None:
        weights = load_routing_weights()
    slot_weights = Partition(g, weights, weight_select, 0, experts)
    scaled = []
    for e in range(experts):
        before = len(g.ops)
        slot_weights.assume_shape(e, (count_symbol[e],))
        rows = RetileStreamify(g, results[e], split_row=True, filter_mask=True)
        rows.assume_shape(0, (count_symbol[e],))
        scaled.append(Map(g, [slot_weights[e], rows], Mul(), **bw))
        _label(g.ops[before:], ("expert", e))
    reassemble_select = SelectorSource(g, multihot(routing, experts), experts)
    gathered = Reassemble(g, scaled, reassemble_select, 0)
    bindings[gathered.ragged_symbol] = k  # every token gathers exactly top_k expert outputs
    summed = Accum(g, gathered, AccumAdd(), Zero(1, d), 1, **bw)
    if model.shared_intermediate:
        before = len(g.ops)
        shared = shared_ffn(g, tokens, model, batch, tile_n or DEFAULT_TILE_N, tile_f, packing_compute_bw, bw,
                            suffix, prefix, par_dispatch)
        summed = Map(g, [summed, shared], Add(), **bw)
        _label(g.ops[before:], ("shared_expert", 0))
    return summed, bindings, tile_rows


def _micro_batch_tiles(g, tokens, model: MoEModel, routing, micro_batches: int, tile_n: int | None,
                       packing_compute_bw: int, prefix: str, dynamic: bool = False):
    """Steps 4-5a with M micro-batches of ``B / M`` consecutive tokens: every expert's tiles hold tokens of one
    micro-batch only, in micro-batch order.

    A Partition ends its outputs only when its selector ends, so one Partition of the whole batch would hold an
    expert's last padded tile of micro-batch m until the batch's last token. Hence the token rows are split by
    micro-batch (a Partition at rank 1 by a static selector), each micro-batch's rows are
    partitioned by expert (its own routing selector, which ends with the micro-batch) and packed into tiles of
    ``tile_n`` rows, and each expert's tiles are put back in micro-batch order by a Reassemble whose static
    selector names the micro-batch of each tile (the counts are the trace's). The FFN then sees one stream of
    tiles, as with one micro-batch; micro-batches with no token for an expert have no tile there.

    Dynamic tiling (``dynamic``): micro-batch m's tokens of expert e are one tile of ``c[m, e]`` rows (the
    count of its Partition), so expert e gets one tile per micro-batch with tokens. Their rows differ, so the
    Reassemble's tiles have a ragged row count (:class:`stepsim.graph.Reassemble`), bound to the largest
    ``c[m, e]`` (on-chip buffers hold the largest tile) and, for FLOPs and the per-unit bounds, to each tile's
    own rows (``tile_rows``, as the time-multiplexed regions' merged tiles). An expert with no token in the
    batch keeps micro-batch 0's one empty tile, as the one Partition of M = 1 gives it.

    Returns ``(count symbols, packed tile streams by expert, bindings, tile_rows)``; the count symbols (tokens
    per expert over the batch) are new: no single Partition has them.
    """
    from stepsim.graph.dims import make_symbol

    experts, d, batch = model.experts, model.hidden, routing.shape[0]
    m_count, rows = micro_batches, batch // micro_batches
    split = Partition(g, Reshape(g, tokens, rows, 0), SelectorSource(g, np.eye(m_count, dtype=np.int8), m_count),
                      1, m_count)  # (1, M, B/M) rows in
    bindings, tile_rows = {}, {}
    tiles = np.zeros((m_count, experts), np.int64)  # tiles of expert e in micro-batch m
    tokens_of = np.zeros((m_count, experts), np.int64)  # tokens of expert e in micro-batch m
    packed = [[None] * experts for _ in range(m_count)]
    for m in range(m_count):
        split.assume_shape(m, (1, rows))
        bindings[split.count_symbols[m]] = 1
        part_routing = routing[m * rows:(m + 1) * rows]
        part = Partition(g, split[m], SelectorSource(g, multihot(part_routing, experts), experts), 0, experts)
        tokens_of[m] = expert_counts(part_routing, experts)
        tiles[m] = (tokens_of[m] > 0) if dynamic else -(-tokens_of[m] // tile_n)
        for e in range(experts):
            before = len(g.ops)
            c = part.count_symbols[e]
            bindings[c] = int(tokens_of[m, e])
            if dynamic:  # the one-layer graph's dynamic packing (moe_stage), per micro-batch
                rows_in = Flatten(g, Reshape(g, part[e], 1, 0, pad=Zero(1, d), add_outer_dim=True), 0, 1)
                out_dtype = DynTile(FP32, c, d)
            else:
                rows_in = Flatten(g, Reshape(g, part[e], tile_n, 0, pad=Zero(1, d), add_outer_dim=True), 1, 2)
                out_dtype = Tile(FP32, tile_n, d)
            packed[m][e] = Accum(g, rows_in, RetileRow(), Empty(0, d), 1, out_dtype=out_dtype,
                                 compute_bw=packing_compute_bw)
            _label(g.ops[before:], ("expert", e))
    merged = []
    for e in range(experts):
        used = [m for m in range(m_count) if tiles[m, e]]
        if not used:  # no token in the batch: micro-batch 0's (empty) tiles, as one Partition would give
            merged.append(packed[0][e])
            continue
        before = len(g.ops)
        select = np.zeros((int(tiles[:, e].sum()), len(used)), np.int8)
        select[np.arange(len(select)), np.repeat(np.arange(len(used)), tiles[used, e])] = 1
        order = Reassemble(g, [packed[m][e] for m in used], SelectorSource(g, select, len(used)), 0)
        bindings[order.ragged_symbol] = 1  # one tile per selector element
        rows_symbol = order.stream.dtype.rows
        if dynamic and len(used) > 1:  # the tiles' ragged rows (docstring)
            bindings[rows_symbol] = int(tokens_of[used, e].max())
            tile_rows[rows_symbol] = tuple(int(tokens_of[m, e]) for m in used)
        flat = Flatten(g, order, 0, 2)
        flat.assume_shape(0, (len(select),))
        merged.append(flat)
        _label(g.ops[before:], ("expert", e))
    counts_symbols = tuple(make_symbol(f"{prefix}tokens_{e:03d}") for e in range(experts))
    return counts_symbols, merged, bindings, tile_rows


def idle_groups(counts, regions: int, members=None) -> set:
    """Expert (and time-multiplexed region) groups that received no token (``Workload.idle_groups``);
    ``members`` lists each region's experts (default: contiguous blocks of ``experts / regions``)."""
    experts = len(counts)
    idle = {("expert", e) for e in range(experts) if counts[e] == 0}
    if regions != experts:
        per_region = experts // regions
        if members is None:
            members = [range(r * per_region, (r + 1) * per_region) for r in range(regions)]
        idle |= {("region", r) for r, m in enumerate(members) if not any(counts[e] for e in m)}
    return idle


def _label(ops, group) -> None:
    for op in ops:
        op.group = group


def _weights(model: MoEModel, prefix: str, experts: int = 1, suffix: str = ""):
    d, f = model.hidden, model.intermediate
    return (Tensor(f"{prefix}_gate{suffix}", (experts * d, f), BF16),
            Tensor(f"{prefix}_up{suffix}", (experts * d, f), BF16),
            Tensor(f"{prefix}_down{suffix}", (experts * f, d), BF16))


def _ffn_body(g, tiles_rep, gate_w, up_w, down_w, model, tile_f, dynamic, bw):
    """gate/up matmuls, SiLU, product, and the down projection reduced over F tiles."""
    d = model.hidden
    gate = Map(g, [tiles_rep, gate_w], Matmul(), **bw)
    up = Map(g, [tiles_rep, up_w], Matmul(), **bw)
    hidden = Map(g, [up, Map(g, gate, Silu(), **bw)], Mul(), **bw)
    init = Empty(0, d) if dynamic else Zero(tiles_rep.stream.dtype.rows, d)
    return MapAccum(g, hidden, down_w, Matmul(), init, 1, **bw)


def shared_ffn(g, tokens, model, batch, tile_n, tile_f, packing_compute_bw, bw, suffix: str = "", prefix: str = "",
               par_dispatch: int = 1):
    """The shared experts as one FFN of width ``model.shared_intermediate`` over every token, in tiles of
    ``tile_n`` rows (the last one zero-padded); returns its ``batch`` output rows in token order."""
    d, fs = model.hidden, model.shared_intermediate
    rows_in = Reshape(g, tokens, tile_n, 0, pad=Zero(1, d))  # [1, ceil(B / tile_n), tile_n] rows
    tiles = Accum(g, rows_in, RetileRow(), Empty(0, d), 1, out_dtype=Tile(FP32, tile_n, d),
                  compute_bw=packing_compute_bw)
    n_f = fs // tile_f
    gate_t, up_t, down_t = (Tensor(f"{prefix}shared_gate{suffix}", (d, fs), BF16),
                            Tensor(f"{prefix}shared_up{suffix}", (d, fs), BF16),
                            Tensor(f"{prefix}shared_down{suffix}", (fs, d), BF16))
    rep = RepeatStatic(g, tiles, n_f)
    up_w, gate_w, down_w = (
        Flatten(g, LinearOffChipLoad(g, t, tile, (n_f, 1), (1, 1), ref=tiles, stream_dtype=FP32,
                                     par_dispatch=par_dispatch), 0, 1)
        for t, tile in ((up_t, (d, tile_f)), (gate_t, (d, tile_f)), (down_t, (tile_f, d))))
    out = _ffn_body(g, rep, gate_w, up_w, down_w, model, tile_f, False, bw)
    rows = RetileStreamify(g, out, split_row=True, filter_mask=True)
    rows.assume_shape(0, tokens.stream.shape)  # the padding rows are filtered out: one row per token
    rows.channel_depth = batch  # the residual-style buffer the sum needs (module docstring)
    return rows


def expert_ffns(model: MoEModel, *, tile_n, tile_f: int, dynamic: bool, bw: dict, packing_compute_bw: int,
                suffix: str = "", prefix: str = "") -> tuple:
    """``(ffns, shared)`` for the sharded layers (:mod:`stepsim.workloads.moe.parallel`): ``ffns(g, packed)`` builds
    one dedicated region per expert of ``model`` (:func:`_expert_ffn`) and returns ``(outputs, {}, {})``;
    ``shared(g, tokens, rows)`` the shared experts over a chip's rows (:func:`shared_ffn`), None without shared
    experts. ``suffix`` / ``prefix`` name the operators' tensors (a chip's ``.t``, a stack's ``layer<i>.``)."""
    def ffns(g, packed):
        return [_expert_ffn(g, packed[e], e, model, tile_f, dynamic, bw, suffix, prefix)
                for e in range(model.experts)], {}, {}

    def shared(g, tokens, rows):
        return shared_ffn(g, tokens, model, rows, tile_n or DEFAULT_TILE_N, tile_f, packing_compute_bw, bw, suffix,
                          prefix)
    return ffns, (shared if model.shared_intermediate else None)


def _expert_ffn(g, tiles, e, model, tile_f, dynamic, bw, suffix: str = "", prefix: str = "", par_dispatch: int = 1,
                lanes: int = 1):
    """One dedicated region: weights re-read once per token tile (LinearOffChipLoad with a reference).

    ``lanes`` > 1 spreads the expert over that many column stripes, as a dataflow compiler spreads a matrix product
    over many units (docs/mapping.md): lane ``j`` holds F columns ``[j F/lanes, (j+1) F/lanes)`` of the gate and up
    weights and the matching rows of the down weights (tensors ``<name>.lane<j>``), computes its partial down
    projection, and the lanes' partials are summed by a tree of Adds. Each lane's weight loads stream on their own,
    so the expert's weights arrive at ``lanes`` times a single load's rate; the traffic and the FLOPs are the same.
    """
    d, f = model.hidden, model.intermediate
    n_f = f // tile_f // lanes
    before = len(g.ops)
    partials = []
    for lane in range(lanes):
        lane_model = model if lanes == 1 else dataclasses.replace(model, intermediate=f // lanes)
        lane_suffix = suffix if lanes == 1 else f"{suffix}.lane{lane}"
        gate_t, up_t, down_t = _weights(lane_model, f"{prefix}expert{e:03d}", suffix=lane_suffix)
        rep = RepeatStatic(g, tiles, n_f)
        loads = [Flatten(g, LinearOffChipLoad(g, t, tile, (n_f, 1), (1, 1), ref=tiles, stream_dtype=FP32,
                                              par_dispatch=par_dispatch), 0, 1)
                 for t, tile in ((up_t, (d, tile_f)), (gate_t, (d, tile_f)), (down_t, (tile_f, d)))]
        up_w, gate_w, down_w = loads
        partials.append(_ffn_body(g, rep, gate_w, up_w, down_w, model, tile_f, dynamic, bw))
    out = sum_tree(g, partials, bw)
    _label(g.ops[before:], ("expert", e))
    return out


def sum_tree(g, streams: list, bw: dict):
    """The element-wise sum of ``streams`` (equal shapes) by a balanced tree of two-input Adds (``len - 1`` of them,
    ``ceil(log2 len)`` deep); one stream is returned as it is."""
    while len(streams) > 1:
        paired = [Map(g, [streams[i], streams[i + 1]], Add(), **bw) for i in range(0, len(streams) - 1, 2)]
        streams = paired + (streams[-1:] if len(streams) % 2 else [])
    return streams[0]


def _timeshared_ffns(g, packed, model, regions, tile_f, dynamic, counts, bw, members=None, par_dispatch: int = 1,
                     lanes: int = 1):
    """Regions of ``experts/regions`` experts: EagerMerge the token tiles, fetch the chosen expert's weights
    with random loads, compute, and route results back to per-expert streams.

    The weight loads are created stage by stage, as the artifact's time-multiplexing scripts build them (every
    region's up load, then every gate load, then every down load), because the HBM serves same-cycle requests
    in the order the loads were registered, which is graph order (docs/timing_model.md §2 step 2, §4.2).

    With dynamic tiling a region's merged tiles have a ragged row count; it is bound to the largest member
    expert's token count, because on-chip buffers must hold the largest tile (this makes the region's
    ``graph_flops`` an upper bound; ``algorithmic_flops`` is exact). For FLOP counting the same symbol is bound
    to the rows of each of the region's tiles (one tile per member expert with tokens, ``tile_rows``): every
    function's FLOPs are linear in a tile's rows, so tiles x mean rows is the exact sum, and the per-unit
    bounds charge each tile its own firing costs. ``members`` lists each region's experts (default: contiguous
    blocks of ``experts / regions``). ``lanes`` > 1 spreads each region over column stripes as
    :func:`_expert_ffn` does (tensors ``region<r>_<name>.lane<j>``, one random load of each per lane, the lanes'
    partials summed before the results go back to their experts). Returns (results by expert, bindings,
    tile_rows).
    """
    bindings, tile_rows = {}, {}
    d, f = model.hidden, model.intermediate
    n_f = f // tile_f // lanes
    per_region = model.experts // regions
    if members is None:  # region r: experts r * per_region .. (with --ep, each chip's experts: moe/sharded.py)
        members = [list(range(r * per_region, (r + 1) * per_region)) for r in range(regions)]
    merges, reps, addrs = [], [], []
    for r in range(regions):
        before = len(g.ops)
        merge = EagerMerge(g, [packed[e] for e in members[r]], 0)
        merged_rows = merge.outputs[0].dtype.rows
        if dynamic and merged_rows not in [packed[e].stream.dtype.rows for e in members[r]]:
            bindings[merged_rows] = int(max(counts[e] for e in members[r]))
            tile_rows[merged_rows] = tuple(int(counts[e]) for e in members[r] if counts[e])
        merges.append(merge)
        reps.append(RepeatStatic(g, merge[0], n_f))
        addrs.append(ExpertAddrGen(g, merge[1], n_f))
        _label(g.ops[before:], ("region", r))
    lane_model = model if lanes == 1 else dataclasses.replace(model, intermediate=f // lanes)
    tensors = {(r, lane): _weights(lane_model, f"region{r:03d}", per_region, "" if lanes == 1 else f".lane{lane}")
               for r in range(regions) for lane in range(lanes)}  # (gate, up, down)
    loads = {}
    for name, which, tile in (("up", 1, (d, tile_f)), ("gate", 0, (d, tile_f)), ("down", 2, (tile_f, d))):
        for r in range(regions):
            before = len(g.ops)
            for lane in range(lanes):
                loads[name, r, lane] = Flatten(g, RandomOffChipLoad(g, addrs[r], tensors[r, lane][which], tile,
                                                                    stream_dtype=FP32, par_dispatch=par_dispatch), 0, 1)
            _label(g.ops[before:], ("region", r))
    results = [None] * model.experts
    for r in range(regions):
        before = len(g.ops)
        out = sum_tree(g, [_ffn_body(g, reps[r], loads["gate", r, lane], loads["up", r, lane], loads["down", r, lane],
                                     model, tile_f, dynamic, bw) for lane in range(lanes)], bw)
        back = Partition(g, out, merges[r][1], 0, per_region)
        _label(g.ops[before:], ("region", r))
        for i, e in enumerate(members[r]):
            # The partition's count for expert e is its number of token tiles, already known upstream.
            back.assume_shape(i, packed[e].stream.shape)
            if dynamic:
                back.assume_dtype(i, packed[e].stream.dtype)
            results[e] = back[i]
    return results, bindings, tile_rows


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
    before the trace is read; each layer's routing from the trace (:func:`stepsim.workloads.moe.pipeline.layer_routings`)."""
    from stepsim.workloads.chips import stack_knobs
    from stepsim.workloads.config import bandwidth_kwargs, resolved_trace
    from stepsim.workloads.moe.pipeline import layer_routings

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
