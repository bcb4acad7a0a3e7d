"""The MoE stage of :func:`stepsim.workloads.moe.build.build_moe` (its tiling, experts, time-multiplexed
regions and shared experts; the module docstring of :mod:`stepsim.workloads.moe.build` says what it builds),
in a module of its own so that the one-chip layer (``build.py``) and its many-chip forms (``many_chips.py``) both
build on it without importing each other."""

from __future__ import annotations

import dataclasses

import numpy as np

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
    LinearOffChipLoad,
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
from stepsim.workloads.routing import expert_counts, multihot, onehot_per_slot

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
