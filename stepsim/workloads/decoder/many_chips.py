"""The decoder layer on many chips: its pieces for the sharding pass (:mod:`stepsim.workloads.sharding`), which
holds what every parallel form shares (stages, placement, collectives, labels, the report). docs/system.md, "The
decoder layer (``--tp N``)", "(``--ep N``)" and "Decoder stacks", describes each form; in short:

* ``--tp N`` (one layer or a stack): decoder/build.py's ``_tp_stack`` (KV heads and FFN columns over the chips, two
  all-reduces per layer, the residuals added after them); its checks are :func:`check_tp`.
* ``--ep N`` (one layer, or a stack with ``--pp`` / ``--micro-batches``): :func:`expert_parallel_decoder`. Attention
  chip a of A = min(N, H) owns KV heads ``a H/A ..``; the partials of ``attn @ W_o`` are reduce-scattered in A
  chunks (the all-gather half is not run: the MoE block wants each chip's own shard), each chip adds its rows of
  x (``x.<c>``), and its shard's rows enter the pass's expert-parallel layer (the all-to-alls of the routing
  trace) as ``home_in``; ``home_out`` adds ``h`` back and stores ``y.<c>``.
* ``--tp T --ep E``: the same attention over min(T E, H) chips; shard s's group of T chips runs the MoE block
  tensor-parallel and chip ``s T + t`` stores ``y<s T + t>.<k>`` (reduced chunk k plus its ``h`` chunk).

Why by heads rather than data-parallel by requests: it is how ``stepsim serve --system`` splits a served MoE model
(docs/serving.md §13), and it keeps every KV cache and output projection in one chip's HBM, unreplicated.
"""

from __future__ import annotations

from stepsim.base.errors import ArgumentError
from stepsim.graph import Add, Flatten, LinearOffChipStore, Map, Promote, Reshape, RetileStreamify
from stepsim.workloads.moe.build import PACKING_COMPUTE_BW
from stepsim.workloads.sharding import check_chips, check_columns


def check_ep(ep, model, n_heads: int, batch: int, regions, placement: str, counts, tp: int | None = None) -> None:
    """One-line ArgumentError unless ``ep`` (x ``tp``) chips can run the layer: an MoE model, at most one chip per
    expert, KV heads that the chips divide or are a multiple of, a batch that splits evenly over the chips, and
    with ``tp`` one region per expert."""
    from stepsim.workloads.moe.parallel import place_experts

    check_chips("--ep", ep)
    if not model.is_moe:
        raise ArgumentError(f"--ep {ep}: model {model.name!r} is dense; expert parallelism needs routed experts "
                            f"(use --tp {ep})")
    place_experts(counts, ep, placement)  # more chips than experts, an unknown placement: its one line
    chips = ep * (tp or 1)
    if n_heads % chips and chips % n_heads:
        flag = f"--ep {ep}" if tp is None else f"--tp {tp} --ep {ep}"
        raise ArgumentError(f"{flag}: the attention splits its {n_heads} KV heads (--kv-heads) over the {chips} "
                            f"chips; the chips must divide them or be a multiple of them")
    if batch % ep:
        raise ArgumentError(f"--ep {ep}: the reduce-scatter cuts the {batch} rows into {ep} shards; the batch must "
                            f"be a multiple of {ep}")
    if tp is not None and regions != model.moe.experts:  # as the MoE layer's --tp
        raise ArgumentError("--tp does not combine with --regions (time-multiplexed expert regions) yet")


def check_tp(tp, n_heads: int, batch: int, widths: dict, tile_f: int) -> None:
    """One-line ArgumentError unless the KV heads, the batch and every FFN width split over ``tp`` chips."""
    check_chips("--tp", tp)
    if n_heads % tp:
        raise ArgumentError(f"--tp {tp}: the {n_heads} KV heads (--kv-heads) must split evenly over {tp} chips")
    if batch % tp:
        raise ArgumentError(f"--tp {tp}: the all-reduces cut the {batch} rows into {tp} chunks; the batch must be "
                            f"a multiple of {tp}")
    check_columns(tp, widths, tile_f)


def expert_parallel_decoder(ep: int, system, algorithm: str, placement: str, *, model, n_heads: int, batch: int,
                            routings: list, moe_kw: dict, stage: dict, heads=None, partial=None, pp=None,
                            micro_batches: int = 1, tp: int | None = None) -> tuple[dict, dict]:
    """Build the expert-parallel layer (module docstring) into ``stage["g"]``: the one layer (``heads(hs)``: the
    attention and output projection of KV heads ``hs``, q / k / v read from HBM, their summed products) or, with
    ``partial``, a stack's layers (decoder/build.py's stack: ``partial(i, hs, rows)`` is layer i's share of KV
    heads ``hs`` on every request's ``rows``; ``pp`` stages of E chips, ``micro_batches``). ``tp`` (``--tp T --ep
    E``, one layer): every shard's group of T chips runs the MoE block tensor-parallel. Returns ``(params,
    tile_rows)``: the record's parallel params (the pass's ``expert_parallel`` or ``expert_tensor_parallel``, plus
    ``algorithm``) and the experts' tile rows. The layers are the pass's; this function gives it the attention and
    the residuals (``hooks``)."""
    from stepsim.workloads.chips import cross_stage, stages_system
    from stepsim.workloads.moe.build import DEFAULT_TILE_N
    from stepsim.workloads.routing import expert_counts
    from stepsim.workloads.sharding import (
        Sharding,
        check_tp_ep,
        expert_parallel,
        in_order,
        load_rows,
        split_chunks,
        tp_ep_system,
    )

    stack, moe = heads is None, model.moe
    if tp is not None:
        check_tp_ep(tp, ep, batch, system)
    for routing in routings:  # a stack: every layer's routing
        check_ep(ep, model, n_heads, batch, None if stack else moe_kw["regions"], placement,
                 expert_counts(routing, moe.experts), tp)
    tile_n, dynamic, tile_f, m = moe_kw["tile_n"], moe_kw["dynamic"], moe_kw["tile_f"], micro_batches
    if m > 1 and batch % (ep * m):
        raise ArgumentError(f"--micro-batches {m} --ep {ep}: each chip's shard of the batch of {batch} requests must "
                            f"split into {m} equal micro-batches (the batch a multiple of {ep * m})")
    if m > 1 and moe.shared_intermediate and (batch // (ep * m)) % (tile_n or DEFAULT_TILE_N):
        raise ArgumentError(f"--micro-batches {m} --ep {ep}: the shared experts' tiles of {tile_n or DEFAULT_TILE_N} "
                            f"tokens must not span a chip's micro-batches of {batch // (ep * m)} requests")
    g, bw, bindings = stage["g"], stage["bw"], stage["bindings"]
    d, stride, layers = model.hidden, tp or 1, len(routings)  # shard s's group: chips s * stride ..
    attn_chips = min(ep * stride, n_heads)  # A (module docstring): chip a * gap runs KV heads a * per_head ..
    per_head, gap, shard = n_heads // attn_chips, ep * stride // attn_chips, batch // ep
    sh = Sharding(g, stages_system(pp, ep, system, "--ep") if tp is None else
                  tp_ep_system(moe, tp, ep, batch, system, tile_f))
    rows_in, per_stage, homes = {}, layers // (pp or 1), {}
    for c in range(ep if stack else 0):  # a stack: shard c's input rows of the current layer, (1, shard)
        before = len(g.ops)
        rows_in[c] = load_rows(g, f"x.{c}", shard, d)
        sh.place(before, c)
    build = dict(dynamic=dynamic, tile_n=tile_n, tile_f=tile_f, compute_bw=bw["compute_bw"],
                 packing_compute_bw=PACKING_COMPUTE_BW)

    def hooks(i, base):  # layer i's attention, reduce-scattered; its home_in / home_out (the residuals)
        prefix, own = f"layer{i}." if stack else "", rows_in.copy()
        if i and i % per_stage == 0:  # a stage boundary: shard c crosses to its new home chip once, fanned out there
            cross_stage(g, own, [base + c for c in range(ep)], sh.op_chip)
        for rows in own.values():  # the rows wait for the attention (all shards) before the residual reads them
            rows.fanout_depth = shard

        def attention_partial(a):  # [1, B] rows (1, D): chip a's share of attn @ W_o
            hs = range(a * per_head, (a + 1) * per_head)
            if not stack:
                return Promote(g, RetileStreamify(g, heads(hs), split_row=True), 1)
            return partial(i, hs, in_order(g, [Flatten(g, own[c], 0, 1) for c in range(ep)], batch, bindings))

        chips = [base + a * gap for a in range(attn_chips)]
        chunks = sh.reduce_scatter(chips, attention_partial, batch, algorithm=algorithm, compute_bw=bw["compute_bw"],
                                   prefix=f"{prefix}attn_reducescatter.")
        reduced = sh.scatter_shards(chunks, chips, ep, batch)

        def home_in(s, rows, t=0):  # h = x + attn @ W_o, shard s's rows
            if attn_chips > ep:  # the shard's A / E chunks in row order, from the chips that reduced them
                k = attn_chips // ep
                attn = in_order(g, [reduced[s * k + j] for j in range(k)], rows, bindings, promote=False)
            else:
                attn = Promote(g, reduced[s], 1)  # [rows] -> [1, rows], as x
            h = Map(g, [attn, own[s] if stack else load_rows(g, f"x.{s}", rows, d)], Add(), **bw)
            h.fanout_depth = rows  # the rows wait for the MoE block's output (the decoder's h_rows)
            homes[(s, t)] = h
            return h

        def home_out(c, combined):  # y = h + moe(h), chip c's rows
            out = Map(g, [combined, homes[(c, 0)]], Add(), **bw)
            if i == layers - 1:
                LinearOffChipStore(g, Reshape(g, out, 1, 0, write_back_mu=True), tensor_name=f"y.{c}")
            rows_in[c] = out

        return home_in, home_out

    parts = {}

    def store(s, t, k, reduced):  # --tp: y chunk k = reduced MoE chunk k + h chunk k
        if (s, t) not in parts:
            parts[(s, t)] = split_chunks(g, homes[(s, t)], shard, tp)
        LinearOffChipStore(g, Map(g, [reduced, parts[(s, t)][k]], Add(), **bw), tensor_name=f"y{s * tp + t}.{k}")

    params, layer_bindings, tile_rows = expert_parallel(
        sh, moe, routings, ep, placement, stack=stack, pp=pp, micro_batches=m, hooks=hooks, algorithm=algorithm,
        regions=None if moe_kw["regions"] == moe.experts else moe_kw["regions"], tp=tp, store=store, **build)
    bindings.update(layer_bindings)
    return params, tile_rows
