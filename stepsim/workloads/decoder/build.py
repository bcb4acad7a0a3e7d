"""A decoder layer in one graph: GQA decode attention over every KV head, the output projection with the residual,
then an MoE block (routed and shared experts) or a dense SwiGLU FFN with the residual.

Stages (each a function that adds operators to one graph and passes a stream on):

1. **Attention** (:func:`stepsim.workloads.attention.build.attention_stage`), once per KV head (``kv_heads``; 1 is
   the paper's one-head run): the same operators as the ``attention`` workload, each head with its own
   ``regions`` and tensors ``h<h>_*``. Each head's region results are put back in request order with a
   Reassemble (the dynamic dispatcher's own one-hot region per request; the static strategies' assignment).
2. **Output projection**: a head's result tile ``(q, head_dim)`` per request is split into its ``q`` rows;
   row ``j`` of every request goes to its own stream (a Partition), is packed into tiles of ``o_tile``
   requests and multiplied by ``wo_h<h>_q<j>`` ``(head_dim, D)``, one weight tile per token tile; the products
   of all query heads are summed (a tree of Adds), and ``x`` is added: ``h = x + attn @ W_o``.
3. **FFN**: the rows of ``h`` feed :func:`stepsim.workloads.moe.build.moe_stage` (its routing from the ``routing``
   trace) or, for a dense model, one SwiGLU FFN over every token (the shared-expert operators); the output
   adds ``h`` back and is stored as ``y``. The rows of ``h`` wait in a ``batch``-deep FIFO for that last
   add (the FFN needs most of the batch before its first row).

With ``tp`` (``--tp N``) the KV heads and the FFN's columns split over N chips, an all-reduce after the output
projection and one after the FFN (:mod:`stepsim.workloads.decoder.many_chips`); chip c stores rows ``k B/N ..`` of y
as ``y<c>.<k>``.

With ``layers`` / ``pp`` / ``micro_batches`` a stack of layers (:func:`_stack`), whose
q, k, v are computed from each layer's input rows, in pipeline stages on chips.

Not modelled: the normalizations (RMSNorm), the query / key / value projections of one layer (the new token's q,
k, v are read from HBM as in the paper's attention graph; a stack computes them) and rotary embeddings.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from stepsim.base.errors import ArgumentError
from stepsim.graph import (
    BF16,
    FP32,
    Accum,
    Add,
    Empty,
    Flatten,
    Graph,
    LinearOffChipLoad,
    LinearOffChipStore,
    Map,
    Matmul,
    Partition,
    Promote,
    Reassemble,
    Reshape,
    RetileRow,
    RetileStreamify,
    SelectorSource,
    Tensor,
    Tile,
    Zero,
)
from stepsim.graph.gcpause import gc_paused
from stepsim.models.presets import ModelConfig, MoEModel
from stepsim.workloads.attention import build as att
from stepsim.workloads.base import Workload
from stepsim.workloads.kinds import WORKLOAD_CHANNEL_DEPTH
from stepsim.workloads.moe.build import (
    DEFAULT_TILE_F,
    DEFAULT_TILE_N,
    PACKING_COMPUTE_BW,
    STATIC_COMPUTE_BW,
    idle_groups,
    moe_stage,
    shared_ffn,
)
from stepsim.workloads.routing import check_routing, expert_counts

#: requests per tile of the output projection (and of the dense FFN)
O_TILE = 32


def _label(ops, group) -> None:
    for op in ops:
        op.group = group


@gc_paused  # see stepsim.graph.gcpause
def build_decoder(model: ModelConfig, kv_lengths, routing=None, *, strategy: str = "dynamic",
                  softmax: str = "plain", kv_heads: int | None = None, attention_regions: int = 4,
                  tiling: str = "static", tile_n: int | None = None, tile_f: int | None = None,
                  regions: int | None = None, compute_bw: int = STATIC_COMPUTE_BW,
                  channel_depth: int | None = WORKLOAD_CHANNEL_DEPTH["moe"], tp: int | None = None, system=None,
                  algorithm: str = "ring", layers: int | None = None, pp: int | None = None,
                  micro_batches: int | None = None, ep: int | None = None,
                  placement: str = "contiguous") -> Workload:
    """Build one decoder layer for a decode batch (see the module docstring).

    Parameters
    ----------
    model : ModelConfig
        The model (:func:`stepsim.models.presets.resolve_model`): hidden size, heads, KV heads, head
        dimension, and its MoE block (experts, top-k, expert and shared FFN sizes) or dense FFN size.
    kv_lengths : array [B]
        KV-cache length of each request.
    routing : array [B, top_k], optional
        Expert ids per token (required for an MoE model, refused for a dense one).
    strategy, softmax : str
        The attention's parallelization and softmax form (:func:`stepsim.workloads.attention.build.build_attention`).
    kv_heads : int, optional
        KV heads simulated (default: all of the model's; 1 simulates one head, as the paper's runs).
    attention_regions : int
        Parallel regions per KV head (4).
    tiling, tile_n, tile_f, regions : MoE block settings (:func:`stepsim.workloads.moe.build.build_moe`); ``tile_f``
        also tiles the dense FFN.
    compute_bw : int
        FLOPs/cycle of the projection, residual and FFN compute nodes.
    channel_depth : int or None
        Default FIFO depth (2).
    tp, system, algorithm
        ``--tp N``: the KV heads and the FFN's columns split over N chips of ``system`` (default: fully connected
        chips), an all-reduce (``algorithm``) after the output projection and one after the FFN
        (:mod:`stepsim.workloads.decoder.many_chips`).
    ep, placement
        ``--ep N``: the KV heads split over N chips of ``system`` and reduce-scattered (``algorithm``), the MoE
        block expert-parallel over the same chips, its experts placed by ``placement``
        (:mod:`stepsim.workloads.decoder.many_chips`); chip c stores its shard's rows of y as ``y.<c>``.
    layers, pp, micro_batches : int, optional
        Any of them given: a stack of ``layers`` (default 1) decoder layers whose q / k / v are computed from
        their input (tensors ``layer<i>.*``; ``routing`` one array for every layer or a list of ``[B, top_k]``
        arrays, one per layer), in ``pp`` stages on the chips of ``system``, ``micro_batches`` of ``B / M``
        requests (:func:`_stack`).
    """
    stack = layers is not None or pp is not None or micro_batches is not None
    routings = None
    if stack:
        layers = 1 if layers is None else layers
        if isinstance(layers, bool) or not isinstance(layers, int) or layers < 1:
            raise ArgumentError(f"--layers must be an int >= 1, got {layers!r}")
        if routing is not None:
            per_layer = isinstance(routing, (list, tuple)) and all(np.ndim(r) == 2 for r in routing)
            routings = list(routing) if per_layer else [routing] * layers
            if len(routings) != layers:
                raise ArgumentError(f"--layers {layers}: got the routing of {len(routings)} layers")
            routing = routings[0]
    kv = att._check_lengths(kv_lengths)
    batch = len(kv)
    d, hd = model.hidden, model.head_dim
    q_rows = model.heads // model.kv_heads
    n_heads = model.kv_heads if kv_heads is None else int(kv_heads)
    if not 1 <= n_heads <= model.kv_heads:
        raise ArgumentError(f"kv_heads must be between 1 and the model's {model.kv_heads}, got {kv_heads!r}")
    o_tile = min(O_TILE, batch)
    if stack:
        micro_batches, o_tile = check_pipeline(layers, pp, batch, micro_batches, strategy=strategy, tiling=tiling,
                                               tp=tp, regions=regions)
    if batch % o_tile:
        raise ArgumentError(f"the decoder layer needs a batch that is a multiple of {O_TILE} (or at most "
                            f"{O_TILE}), got {batch} requests")
    if ep is not None and not model.is_moe:
        raise ArgumentError(f"--ep {ep}: model {model.name!r} is dense; expert parallelism needs routed experts "
                            f"(use --tp {ep})")
    if model.is_moe and routing is None:
        raise ArgumentError(f"model {model.name!r} is an MoE model: give its routing (expert ids per token)")
    if not model.is_moe and routing is not None:
        raise ArgumentError(f"model {model.name!r} is dense: it takes no routing")
    moe = model.moe if model.is_moe else None
    if moe is not None:
        routing = check_routing(routing, moe.experts, moe.top_k)
        if routings is not None:
            routings = [check_routing(r, moe.experts, moe.top_k) for r in routings]
        if any(r.shape[0] != batch for r in (routings or [routing])):
            raise ArgumentError(f"the routing has {routing.shape[0]} tokens but the KV lengths {batch} requests; "
                                "a decode batch has one token per request")
    tile_f = tile_f or DEFAULT_TILE_F
    widths = [moe.intermediate, moe.shared_intermediate] if moe is not None else [model.dense_intermediate]
    for width in (w for w in widths if w):
        if width % tile_f:
            raise ArgumentError(f"tile_f must divide the FFN widths {[w for w in widths if w]}, got {tile_f}")
    if tiling not in ("static", "dynamic"):
        raise ArgumentError(f"tiling must be 'static' or 'dynamic', got {tiling!r}")
    if moe is not None and regions is not None and (regions < 1 or moe.experts % regions):
        raise ArgumentError(f"regions must divide the number of experts {moe.experts}, got {regions!r}")
    kv_tile = 32
    seq_len_tiled, offset = att.kv_metadata(kv, kv_tile)
    max_n = att._default_max_n(batch, seq_len_tiled, kv_tile)
    g = Graph(f"decoder-{model.name}-{strategy}-b{batch}")
    bw = dict(compute_bw=compute_bw)
    bindings: dict = {}

    # 1-2: attention per KV head, then the output projection of its query heads
    att_cfg = dict(head_dim=hd, q_rows=q_rows, tile_n=kv_tile, row_offset=max_n // kv_tile,
                   compute_bw=att.COMPUTE_BW, wb_depth=4, wb_channel_depth=None, softmax=softmax)
    relabel: list = []
    stage = dict(g=g, seq_len_tiled=seq_len_tiled, offset=offset, strategy=strategy,
                 attention_regions=attention_regions, max_n=max_n, att_cfg=att_cfg, o_tile=o_tile, hidden=d, bw=bw,
                 bindings=bindings, relabel=relabel)
    moe_kw, counts, ffn_tile_n, ffn_regions, tile_rows, idle = {}, None, tile_n, regions, {}, set()
    if moe is not None:
        counts = expert_counts(routing, moe.experts)
        dynamic = tiling == "dynamic"
        ffn_tile_n = None if dynamic else (tile_n or DEFAULT_TILE_N)
        ffn_regions = moe.experts if regions is None else regions
        moe_kw = dict(dynamic=dynamic, tile_n=ffn_tile_n, tile_f=tile_f, regions=ffn_regions, compute_bw=compute_bw,
                      packing_compute_bw=PACKING_COMPUTE_BW)
        idle = idle_groups(counts, ffn_regions)
    parallel = {}
    if stack:
        if tp is not None and ep is not None:
            raise ArgumentError("--tp does not combine with --ep in a stack of decoder layers yet")
        if tp is not None:  # tensor-parallel stages (the sharding pass, workloads/sharding.py)
            parallel = _tp_stack(g, model, routings, layers, tp=tp, pp=pp, system=system, algorithm=algorithm,
                                 n_heads=n_heads, batch=batch, o_tile=o_tile, tile_f=tile_f, moe_kw=moe_kw, bw=bw,
                                 stage=stage)
            idle = {(f"layer{i}.expert", e) for i, r in enumerate(routings or [])
                    for e, c in enumerate(expert_counts(r, moe.experts)) if c == 0} if moe is not None else set()
        elif ep is not None:  # expert-parallel stages (many_chips.expert_parallel_decoder, on the sharding pass)
            from stepsim.workloads.decoder.many_chips import expert_parallel_decoder

            parallel, tile_rows = expert_parallel_decoder(
                ep, system, algorithm, placement, model=model, n_heads=n_heads, batch=batch, routings=routings,
                moe_kw=moe_kw, stage=stage, pp=pp, micro_batches=micro_batches,
                partial=lambda i, hs, rows: _stack_partial(g, model, i, hs, rows, n_heads=n_heads, batch=batch,
                                                           o_tile=o_tile, bw=bw, stage=stage))
            idle = {(f"layer{i}.expert", e) for i, r in enumerate(routings)
                    for e, c in enumerate(expert_counts(r, moe.experts)) if c == 0}
        else:
            parallel, idle, tile_rows = _stack(g, model, routings, layers, pp, system, micro_batches,
                                               n_heads=n_heads, batch=batch, o_tile=o_tile, tile_f=tile_f,
                                               moe_kw=moe_kw, bw=bw, stage=stage)
        flat_routing = np.stack(routings) if moe is not None else None
    elif ep is not None:
        from stepsim.workloads.decoder.many_chips import expert_parallel_decoder

        parallel, tile_rows = expert_parallel_decoder(
            ep, system, algorithm, placement, model=model, n_heads=n_heads, batch=batch, routings=[routing],
            moe_kw=moe_kw, heads=lambda hs: _sum_pairwise(g, _heads(hs, **stage), bw), stage=stage, tp=tp)
        if "region_experts" in parallel:  # each chip's experts time-multiplexed on its regions
            idle = idle_groups(counts, ffn_regions, parallel["region_experts"])
    elif tp is None:
        products = _sum_pairwise(g, _heads(range(n_heads), **stage), bw)
        x = Flatten(g, LinearOffChipLoad(g, Tensor("x", (batch, d), BF16), (o_tile, d), (batch // o_tile,), (1,),
                                         stream_dtype=FP32), 0, 1)  # [1, n] -> [n] tiles of o_tile rows
        residual = Map(g, [products, x], Add(), **bw)
        h_rows = Promote(g, RetileStreamify(g, residual, split_row=True), 1)  # [B] -> [1, B], the MoE's token stream
        h_rows.fanout_depth = batch  # the rows wait for the FFN's first output (module docstring)

        # 3: the FFN block and the second residual
        before = len(g.ops)
        if moe is not None:
            ffn_out, moe_bindings, tile_rows = moe_stage(g, h_rows, moe, routing, counts, **moe_kw)
            bindings.update(moe_bindings)
        else:
            ffn_out = shared_ffn(g, h_rows, _dense(model, model.dense_intermediate), batch, o_tile, tile_f,
                                 PACKING_COMPUTE_BW, bw)
            _label(g.ops[before:], ("ffn", 0))
        out = Map(g, [ffn_out, h_rows], Add(), **bw)
        LinearOffChipStore(g, Reshape(g, out, 1, 0, write_back_mu=True), tensor_name="y")
    else:
        parallel = _tp_stack(g, model, [routing], 1, tp=tp, pp=None, system=system, algorithm=algorithm,
                             n_heads=n_heads, batch=batch, o_tile=o_tile, tile_f=tile_f, moe_kw=moe_kw, bw=bw,
                             stage=stage, heads=lambda hs: _sum_pairwise(g, _heads(hs, **stage), bw))

    g.finalize()
    for head_ops, offset_r, distributors in relabel:  # regions of head h are numbered h * regions + r
        dist = {id(op) for op in distributors}
        for op in head_ops:
            if isinstance(op.group, tuple) and op.group[0] == "region":
                op.group = ("region", offset_r + op.group[1])
        for op in g.ops:
            if op.kind == "Broadcast" and op.group is None and id(op.inputs[0].op) in dist:
                op.group = ("region", offset_r + op.inputs[0].index)
    if stack:
        routing = flat_routing  # [layers, B, top_k]: the reference routes layer i by routing[i]
    balanced = [att.region_units(list(head_ops), attention_regions, offset_r)
                for head_ops, offset_r, _ in relabel] if strategy == "dynamic" else []
    workload = Workload(
        name="decoder", graph=g, bindings=bindings, tile_rows=tile_rows, balanced_units=balanced,
        idle_groups=idle, channel_depth=channel_depth,
        params=dict(model=model.name, hidden=d, heads=model.heads, kv_heads=n_heads, head_dim=hd,
                    query_per_kv_head=q_rows, batch=batch, strategy=strategy, softmax=softmax,
                    attention_regions=attention_regions, max_n=max_n, o_tile=o_tile, tiling=tiling,
                    # the FFN's tile and regions as built (a static MoE FFN's default tile, every expert its region)
                    tile_n=ffn_tile_n if moe is not None else tile_n, tile_f=tile_f,
                    regions=ffn_regions if moe is not None else regions, compute_bw=compute_bw,
                    channel_depth=channel_depth,
                    **(dict(experts=moe.experts, top_k=moe.top_k, intermediate=moe.intermediate,
                            ffn_regions=ffn_regions, shared_intermediate=moe.shared_intermediate) if moe is not None
                       else dict(dense_intermediate=model.dense_intermediate)), **parallel),
        trace={"kv_lengths": kv, **({"routing": routing} if moe is not None else {})},
    )
    # the attention's symbols, for the round-robin / block assignment of every head
    head_symbols = _attention_bindings(workload, seq_len_tiled, strategy, attention_regions,
                                       n_heads * (layers if stack else 1))  # a stack's layer i: heads i H ..
    workload.bindings.update(head_symbols)
    return workload


def _heads(hs, *, g, seq_len_tiled, offset, strategy, attention_regions, max_n, att_cfg, o_tile, hidden, bw,
           bindings, relabel, prefix: str = "", qkv_of=None, region_base: int = 0) -> list:
    """Stages 1-2 for the KV heads ``hs``: each head's attention (tensors ``<prefix>h<h>_*``), its results in
    request order, and one product per query head with ``<prefix>wo_h<h>_q<j>``; returns the products (tiles of
    ``o_tile`` requests). Appends each head's operators to ``relabel`` (its regions are renumbered after finalize,
    from ``region_base``: a stack's layers number their heads' regions apart). ``qkv_of(h)``: head h's q, k, v
    streams (a stack's projections of its input), else they are loaded from HBM."""
    batch, hd, d, q_rows = len(seq_len_tiled), att_cfg["head_dim"], hidden, att_cfg["q_rows"]
    products = []
    for h in hs:
        before = len(g.ops)
        results: list = []
        assignment, distributors, control = att.attention_stage(
            g, seq_len_tiled, offset, strategy, attention_regions, max_n, None, att_cfg, prefix=f"{prefix}h{h}_",
            collect=results, qkv=None if qkv_of is None else qkv_of(h))
        region_of = np.empty(batch, dtype=np.int64)
        for r, reqs in enumerate(assignment):
            region_of[reqs] = r
        if control is not None:  # the dispatcher's choice per request; deep enough not to hold it back
            selector = control
            control.fanout_depth = batch
        else:
            selector = SelectorSource(g, np.eye(len(assignment), dtype=np.int8)[region_of], len(assignment))
        ordered = Reassemble(g, results, selector, 0)
        bindings[ordered.ragged_symbol] = 1  # one region's result per request
        rows = Flatten(g, RetileStreamify(g, ordered, split_row=True), 0, 2)
        rows.assume_shape(0, (batch * q_rows,))  # q rows of each request's one result tile
        head_of_row = np.tile(np.arange(q_rows), batch)
        query_select = Flatten(g, SelectorSource(g, np.eye(q_rows, dtype=np.int8)[head_of_row], q_rows), 0, 1)
        per_query = Partition(g, rows, query_select, 0, q_rows)
        for j in range(q_rows):
            per_query.assume_shape(j, (batch,))
            tiles = Accum(g, Reshape(g, per_query[j], o_tile, 0, pad=Zero(1, hd)), RetileRow(), Empty(0, hd), 1,
                          out_dtype=Tile(FP32, o_tile, hd), compute_bw=PACKING_COMPUTE_BW)
            w = LinearOffChipLoad(g, Tensor(f"{prefix}wo_h{h}_q{j}", (hd, d), BF16), (hd, d), (1, 1), (1, 1),
                                  ref=tiles, stream_dtype=FP32)
            products.append(Map(g, [tiles, Flatten(g, Flatten(g, w, 0, 1), 0, 1)], Matmul(), **bw))
        # the head's operators themselves, not their positions: a stack's network later removes the placeholders of
        # earlier layers' transfers from g.ops, which would shift the positions
        relabel.append((tuple(g.ops[before:]), region_base + h * len(assignment), distributors))
    return products


def check_pipeline(layers: int, pp: int | None, batch: int, micro_batches: int | None, *, strategy: str,
                   tiling: str, tp, regions) -> tuple[int, int]:
    """One-line ArgumentError unless the stack fits; returns ``(M, o_tile)``. ``tp`` (the sharding pass) takes
    one micro-batch."""
    if regions is not None:
        raise ArgumentError("--regions does not combine with --layers / --pp / --micro-batches (a stack's MoE "
                            "layers have one region per expert)")
    if strategy == "coarse":
        raise ArgumentError("--strategy coarse does not combine with --layers / --pp / --micro-batches (its regions "
                            "load their own q / k / v tensors; a stack computes them from its input: dynamic or "
                            "interleave)")
    from stepsim.workloads.chips import check_stack
    from stepsim.workloads.moe.many_chips import MICRO_BATCH_TILINGS

    m = check_stack(layers, pp, batch, micro_batches, "requests") or 1
    if tp is not None and m > 1:
        raise ArgumentError(f"--micro-batches {m} does not combine with --tp yet (a tensor-parallel stack's layer "
                            f"all-reduces the whole batch)")
    rows = batch // m
    o_tile = min(O_TILE, rows)
    if rows % o_tile:
        raise ArgumentError(f"--micro-batches {m}: a micro-batch of {rows} requests must be a multiple of the "
                            f"projection tile of {O_TILE} requests (or at most {O_TILE})")
    if m > 1 and tiling not in MICRO_BATCH_TILINGS:  # every tiling today; kept for a tiling added later
        raise ArgumentError(f"--micro-batches {m} needs --tiling {' or '.join(MICRO_BATCH_TILINGS)}")
    return m, o_tile


def input_tiles(g, rows, *, batch: int, hidden: int, o_tile: int, packing_compute_bw: int):
    """A layer's input rows ``(1, B)`` of ``(1, D)`` packed into ``(o_tile, D)`` tiles, stream ``(1, B / o_tile)``;
    deep enough to hold the batch, since the residual add waits for the attention while the projections read
    them."""
    tiles = Accum(g, Reshape(g, rows, o_tile, 0), RetileRow(), Empty(0, hidden), 1,
                  out_dtype=Tile(FP32, o_tile, hidden), compute_bw=packing_compute_bw)
    tiles.fanout_depth = batch // o_tile
    return tiles


def _project(g, tiles, name: str, *, hidden: int, head_dim: int, bw: dict):
    """``tiles @ <name>`` ([D, head_dim], one weight tile per input tile), split back into ``(1, head_dim)`` rows:
    stream ``(1, B)``."""
    w = LinearOffChipLoad(g, Tensor(name, (hidden, head_dim), BF16), (hidden, head_dim), (1, 1), (1, 1), ref=tiles,
                          stream_dtype=FP32)
    product = Map(g, [tiles, Flatten(g, Flatten(g, w, 0, 1), 0, 1)], Matmul(), **bw)
    return RetileStreamify(g, product, split_row=True)


def qkv_streams(g, tiles, prefix: str, h: int, *, batch: int, hidden: int, head_dim: int, q_rows: int, bw: dict,
                packing_compute_bw: int) -> tuple:
    """KV head ``h``'s new q, k, v from a layer's input tiles, in the shapes ``attention_stage`` loads them
    (``(1, B, 1)``: one ``(q_rows, head_dim)`` tile, one ``(1, head_dim)`` row, one row per request).

    Weights ``<prefix>wq_h<h>_q<j>`` (query head j of KV head h), ``<prefix>wk_h<h>``, ``<prefix>wv_h<h>``, each
    ``[D, head_dim]``. A request's q tile gathers its row of every query head in order j = 0 .. q_rows - 1: a
    Reassemble whose static selector names one query head per element (never two, so arrival order cannot
    reorder them), then rows packed by q_rows.
    """
    def rows_to_requests(rows):  # (1, B) -> (1, B, 1), the loads' shape: each request its own group (a Promote
        return Reshape(g, rows, 1, 0)  # would make the batch one group, routed whole to one attention region)

    k, v = (rows_to_requests(_project(g, tiles, f"{prefix}w{part}_h{h}", hidden=hidden, head_dim=head_dim, bw=bw))
            for part in ("k", "v"))
    # (B,) rows, no stop before the end: a Reassemble passes its inputs' stops on, and a query head's last row
    # would otherwise end the gathered stream's dimension in the middle
    per_head = [Flatten(g, _project(g, tiles, f"{prefix}wq_h{h}_q{j}", hidden=hidden, head_dim=head_dim, bw=bw), 0, 1)
                for j in range(q_rows)]
    order = np.eye(q_rows, dtype=np.int8)[np.tile(np.arange(q_rows), batch)]  # request r: heads 0 .. q_rows - 1
    gathered = Reassemble(g, per_head, SelectorSource(g, order, q_rows), 0)
    rows = Flatten(g, gathered, 0, 1)
    rows.assume_shape(0, (1, batch * q_rows))
    q = Accum(g, Reshape(g, rows, q_rows, 0), RetileRow(), Empty(0, head_dim), 1,
              out_dtype=Tile(FP32, q_rows, head_dim), compute_bw=packing_compute_bw)
    return rows_to_requests(q), k, v, gathered.ragged_symbol


def _stack(g, model, routings, layers: int, pp, system, micro_batches: int, *, n_heads: int, batch: int,
           o_tile: int, tile_f: int, moe_kw: dict, bw: dict, stage: dict) -> tuple:
    """The layers of a decoder stack in ``g`` (module docstring), placed on the chips of ``system`` with ``pp``
    (the sharding pass's :func:`~stepsim.workloads.sharding.pipeline`). Micro-batches of ``B / M`` requests: the
    input rows are packed into tiles of ``o_tile`` requests that never span a micro-batch, the MoE FFN packs its
    expert tiles per micro-batch (``moe_stage(micro_batches=M)``); the attention streams request by request.
    Returns ``(params, idle groups, tile_rows)`` (tile_rows: the ragged rows of dynamic tiles merged over
    micro-batches, :func:`stepsim.workloads.moe.build.moe_stage`)."""
    d, moe = model.hidden, model.moe if model.is_moe else None
    from stepsim.workloads.sharding import load_rows, pipeline

    idle: set = set()
    tile_rows: dict = {}

    def layer(i, rows):
        prefix = f"layer{i}."
        if rows is None:  # layer 0 reads x as (1, B) rows
            rows = load_rows(g, "x", batch, d)
        products, tiles = _stack_heads(g, model, i, range(n_heads), rows, n_heads=n_heads, batch=batch,
                                       o_tile=o_tile, bw=bw, stage=stage)
        residual = Map(g, [products, Flatten(g, tiles, 0, 1)], Add(), **bw)
        h_rows = Promote(g, RetileStreamify(g, residual, split_row=True), 1)
        h_rows.fanout_depth = batch  # the rows wait for the FFN's first output (module docstring)
        ffn_start = len(g.ops)
        if moe is not None:
            ffn_out, moe_bindings, rows_of = moe_stage(g, h_rows, moe, routings[i],
                                                       expert_counts(routings[i], moe.experts), prefix=prefix,
                                                       micro_batches=micro_batches, **moe_kw)
            stage["bindings"].update(moe_bindings)
            tile_rows.update(rows_of)
            idle.update((f"layer{i}.expert", e) for e, c in enumerate(expert_counts(routings[i], moe.experts))
                        if c == 0)
        else:
            ffn_out = shared_ffn(g, h_rows, _dense(model, model.dense_intermediate), batch, o_tile, tile_f,
                                 PACKING_COMPUTE_BW, bw, prefix=prefix)
            _label(g.ops[ffn_start:], ("ffn", 0))
        return Map(g, [ffn_out, h_rows], Add(), **bw)

    report = pipeline(g, system, layers, pp, layer, lambda rows: LinearOffChipStore(
        g, Reshape(g, rows, 1, 0, write_back_mu=True), tensor_name="y"), bindings=stage["bindings"],
        what="decoder layers", kinds=("expert", "ffn"))  # not the attention's regions
    return {"layers": layers, "micro_batches": micro_batches, **report}, idle, tile_rows


def _tp_stack(g, model, routings, layers: int, *, tp, pp, system, algorithm, n_heads, batch, o_tile, tile_f, moe_kw, bw,
              stage, heads=None) -> dict:
    """``--tp T``: the sharding pass's :func:`stepsim.workloads.sharding.tp_layers` (checks:
    :func:`stepsim.workloads.decoder.many_chips.check_tp`), chip t running KV heads ``t H/T ..`` and F / T columns.
    ``heads`` given: the one layer (:mod:`stepsim.workloads.decoder.many_chips`), ``heads(hs)`` the attention and
    output projection of KV heads ``hs`` reading q / k / v from HBM, x read after the reduced rows are in order;
    else ``--layers L [--pp P]``, q / k / v projected from each layer's input rows (:func:`_stack_partial`), x read
    first on every chip of stage 0."""
    from stepsim.workloads.decoder.many_chips import check_tp
    from stepsim.workloads.sharding import columns, load_rows, tensor_parallel

    d, stack = model.hidden, heads is None
    moe = model.moe if model.is_moe else None
    widths = ({"intermediate": moe.intermediate, "shared intermediate": moe.shared_intermediate} if moe is not None
              else {"dense intermediate": model.dense_intermediate})
    check_tp(tp, n_heads, batch, {k: w for k, w in widths.items() if w}, tile_f)
    if moe is not None and moe_kw["regions"] != moe.experts:  # region tensors hold whole experts, not shards
        raise ArgumentError("--tp does not combine with --regions (time-multiplexed expert regions) yet")
    shard = None if moe is None else columns(moe, tp)

    def ffn_partial(g, rows, i, t):
        prefix = f"layer{i}." if stack else ""
        if moe is not None:
            out, chip_bindings, _ = moe_stage(g, rows, shard, routings[i], expert_counts(routings[i], moe.experts),
                                              suffix=f".{t}", prefix=prefix, **moe_kw)
            stage["bindings"].update(chip_bindings)
            return out
        before = len(g.ops)
        out = shared_ffn(g, rows, _dense(model, model.dense_intermediate // tp), batch, o_tile, tile_f,
                         PACKING_COMPUTE_BW, bw, suffix=f".{t}", prefix=prefix)
        if stack:
            _label(g.ops[before:], ("ffn", 0))
        return out

    per_head, bindings = n_heads // tp, stage["bindings"]

    def attention_partial(i, t, rows):  # chip t's KV heads' share of attn @ W_o
        hs = range(t * per_head, (t + 1) * per_head)
        if not stack:
            return Promote(g, RetileStreamify(g, heads(hs), split_row=True), 1)
        return _stack_partial(g, model, i, hs, rows, n_heads=n_heads, batch=batch, o_tile=o_tile, bw=bw, stage=stage)

    return tensor_parallel(g, system, layers, tp=tp, pp=pp, algorithm=algorithm, batch=batch,
                           compute_bw=bw["compute_bw"], bindings=bindings, kinds=("expert", "shared_expert", "ffn"),
                           stack=stack, first=(lambda t: load_rows(g, "x", batch, d)) if stack else None,  # stage 0
                           load=lambda t: load_rows(g, "x", batch, d),  # the one layer's x, replicated in every HBM
                           blocks=lambda i: [("attn_allreduce", lambda t, rows: attention_partial(i, t, rows), True),
                                             ("ffn_allreduce", lambda t, rows: ffn_partial(g, rows, i, t), True)])


def _stack_partial(g, model, i: int, hs, rows, **kw):
    """One chip's share of layer i's ``attn @ W_o`` in a parallel stack (:func:`_stack_heads`) as ``(1, B)`` rows
    (1, D): the partial sum the pass all-reduces or reduce-scatters."""
    return Promote(g, RetileStreamify(g, _stack_heads(g, model, i, hs, rows, **kw)[0], split_row=True), 1)


def _stack_heads(g, model, i: int, hs, rows, *, n_heads: int, batch: int, o_tile: int, bw: dict, stage: dict):
    """Layer i's attention and output projection of KV heads ``hs`` in a stack, q / k / v projected from the
    layer's input ``rows`` (``(1, B)``: every request's row, :func:`qkv_streams`): ``(products summed, the input
    tiles)``."""
    d, hd, q_rows, prefix = model.hidden, model.head_dim, model.heads // model.kv_heads, f"layer{i}."
    tiles = input_tiles(g, rows, batch=batch, hidden=d, o_tile=o_tile, packing_compute_bw=PACKING_COMPUTE_BW)

    def qkv_of(h):
        q, k, v, ragged = qkv_streams(g, tiles, prefix, h, batch=batch, hidden=d, head_dim=hd, q_rows=q_rows, bw=bw,
                                      packing_compute_bw=PACKING_COMPUTE_BW)
        stage["bindings"][ragged] = 1  # one query head's row per selector element
        return q, k, v

    return _sum_pairwise(g, _heads(hs, **stage, prefix=prefix, qkv_of=qkv_of,
                                   region_base=i * n_heads * stage["attention_regions"]), bw), tiles


def _sum_pairwise(g, products, bw):
    """The query heads' products summed pairwise (a tree of Adds)."""
    while len(products) > 1:
        products = [Map(g, [a, b], Add(), **bw) for a, b in zip(products[::2], products[1::2])] + (
            [products[-1]] if len(products) % 2 else [])
    return products[0]


def _dense(model, width: int):
    """A dense model's FFN of ``width`` columns as the MoE block's shared experts (:func:`shared_ffn`)."""
    return MoEModel(model.name, hidden=model.hidden, intermediate=1, experts=1, top_k=1, shared_intermediate=width)


def _attention_bindings(workload, seq_len_tiled, strategy, regions, n_heads) -> dict:
    """Every head's per-region request count and mean KV tiles per request (see
    :func:`stepsim.workloads.attention.build.assignment_bindings`)."""
    import sympy as sp

    assignment = att.region_assignment(len(seq_len_tiled), strategy, regions)
    out = {}
    for h in range(n_heads):
        for r, reqs in enumerate(assignment):
            group = ("region", h * len(assignment) + r)
            crag = next(op for op in workload.graph.ops if op.kind == "CacheReadAddrGen" and op.group == group)
            req_dim, tiles_sym = crag.stream.shape[0], crag.tiles_symbol
            if isinstance(req_dim, sp.Symbol):
                out[req_dim] = len(reqs)
            tiles = int(seq_len_tiled[reqs].sum())
            out[tiles_sym] = sp.Rational(tiles, len(reqs)) if len(reqs) else sp.Integer(0)
    return out


def from_config(cfg: Mapping) -> Workload:
    """The decoder workload of a normalized run config (:func:`stepsim.workloads.config.normalize_config`)."""
    from stepsim.base.errors import ConfigError
    from stepsim.models.presets import resolve_model
    from stepsim.trace_io.load import load_kv_lengths, load_routing

    model = resolve_model(cfg["model"])
    model.refuse_unmodelled("the decoder workload")
    stack = {}
    if any(cfg.get(k) is not None for k in ("layers", "pp", "micro_batches")):
        from stepsim.workloads.chips import stack_knobs

        stack = stack_knobs(cfg, "decoder layers", ("regions",), chip_knobs=("pp", "ep", "tp"))
        if cfg.get("ep") is not None:  # expert-parallel stages (many_chips.expert_parallel_decoder)
            stack.update(ep=cfg["ep"], placement=cfg.get("placement") or "contiguous")
        elif cfg.get("placement") is not None:
            raise ArgumentError("--placement applies to a stack of decoder layers with --ep N (expert parallelism)")
        if cfg.get("tp") is not None:  # tensor-parallel stages (workloads/sharding.py)
            stack["tp"] = cfg["tp"]
        if cfg.get("ep") is not None or cfg.get("tp") is not None:
            stack["algorithm"] = cfg.get("algorithm") or "ring"
        elif cfg.get("algorithm") is not None:
            raise ArgumentError("--algorithm applies to a stack of decoder layers with --ep N or --tp N")
    if cfg.get("kv_lengths") is None:
        raise ConfigError("workload 'decoder' needs the KV lengths of its decode batch: --kv-lengths PATH "
                          "(config key 'kv_lengths')")
    routing = None
    if model.is_moe:
        if cfg.get("routing") is None:
            raise ConfigError(f"model {model.name!r} has routed experts: give its routing, --routing PATH (config "
                              "key 'routing')")
        if stack:  # each layer's routing (routing.layer_routings: a multi-layer trace, else one batch for every layer)
            from stepsim.workloads.routing import layer_routings

            routing = layer_routings(cfg["routing"], model.experts, model.top_k, stack["layers"], cfg["iteration"],
                                     cfg["layer"])
        else:
            routing = load_routing(cfg["routing"], model.experts, iteration=cfg["iteration"], layer=cfg["layer"])
    elif cfg.get("routing") is not None:
        raise ConfigError(f"model {model.name!r} is dense: --routing does not apply")
    kv = load_kv_lengths(cfg["kv_lengths"], cfg["batch_id"])
    kw = {key: cfg[key] for key in ("tile_n", "tile_f", "regions", "compute_bw", "channel_depth")
          if cfg.get(key) is not None}
    if stack:
        kw.update(stack)
    elif cfg.get("ep") is not None:
        from stepsim.workloads.chips import ep_system_of

        kw.update(ep=cfg["ep"], placement=cfg.get("placement") or "contiguous", algorithm=cfg.get("algorithm") or "ring",
                  system=ep_system_of(cfg),
                  **({"tp": cfg["tp"]} if cfg.get("tp") is not None else {}))
    elif cfg.get("placement") is not None:
        raise ArgumentError("--placement applies to the decoder layer with --ep N (expert parallelism)")
    elif cfg.get("tp") is not None:
        from stepsim.base.system import System

        if cfg.get("system") is not None and cfg.get("hardware") is not None:
            raise ArgumentError("--hardware does not apply with --system: the system file names the chips' hardware")
        kw.update(tp=cfg["tp"], algorithm=cfg.get("algorithm") or "ring",
                  system=System.load(cfg["system"]) if cfg.get("system") is not None else None)
    elif cfg.get("system") is not None or cfg.get("algorithm") is not None:
        raise ArgumentError("--system and --algorithm apply to the decoder layer with --tp N or --ep N")
    return build_decoder(model, kv, routing, strategy=cfg["strategy"], softmax=cfg["softmax"] or "plain",
                         kv_heads=cfg["kv_heads"], tiling=cfg["tiling"], **kw)
