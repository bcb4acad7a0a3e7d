"""Expert parallelism of the decoder layer (``--ep N``), as serving engines run an MoE layer on N chips: the
attention tensor-parallel by KV heads, the MoE block expert-parallel, the batch sharded over the same N chips.

* **Attention.** A = N chips (or, with more chips than KV heads, A = H of them: chips ``a N/A``, one KV head each)
  own KV heads ``a H/A .. (a+1) H/A - 1`` of the H simulated (``kv_heads``), their caches ``h<h>_*`` and output
  projections ``wo_h<h>_q<j>``, as with ``--tp`` (:mod:`stepsim.workloads.decoder.parallel`): their query heads'
  products summed are a partial sum of ``attn @ W_o``, B rows ``(1, D)``.
* **Reduce-scatter.** The partials are reduce-scattered over the A attention chips in A chunks of B / A rows
  (:func:`stepsim.workloads.chips.reduce_scatter_partials`, the collectives' ring or direct graph, operators
  ``attn_reducescatter.*``): attention chip a ends with rows ``a B/A ..`` of ``attn @ W_o``. This is the first half
  of ``--tp``'s all-reduce; its all-gather half is not run because the MoE block below wants each chip's own shard
  only (the sharded all-to-all moves every token row to its experts' chips anyway). With A < N, attention chip
  ``a N/A`` cuts its chunk into N/A shards of B / N rows and sends shard j to chip ``a N/A + j`` (a Partition by a
  static selector; the sends are the cross-chip edges :func:`~stepsim.graph.network.place_on_chips` routes). So
  chip c holds rows ``c B/N ..``: :func:`~stepsim.workloads.moe.sharded.shard_bounds` for a batch of a multiple
  of N.
* **Residual.** Chip c adds its rows of ``x`` (tensor ``x.<c>``, rows ``c B/N ..`` of x): ``h`` rows of its shard.
* **MoE.** The sharded expert-parallel layer of the MoE workload's ``--ep`` (:func:`stepsim.workloads.moe.parallel.
  expert_parallel`, :func:`stepsim.workloads.moe.sharded.build_sharded`): experts placed on the chips by
  ``--placement``, each chip's ``h`` rows dispatched to their experts' chips and combined back by the all-to-alls
  of the routing trace (routing weights ``routing_weights.<c>``), the shared experts on the home chip; with
  ``regions`` (``--regions R``) each chip's experts time-multiplexed on R / N regions
  (:func:`~stepsim.workloads.moe.parallel.region_members`).
* **Residual and store.** Chip c adds its ``h`` rows to the combined rows and stores them as ``y.<c>``.

Why the attention is split by heads rather than data-parallel by requests: it is how ``stepsim serve --system``
splits a served MoE model (docs/serving.md §13: attention weights and KV heads tensor-parallel, routed experts
expert-parallel), and it keeps every KV cache and output projection in one chip's HBM, unreplicated. Its cost is
that N must divide the KV heads or be a multiple of them: with more chips than heads (Qwen3-30B-A3B's 4 KV heads
on 8 chips) only H chips run the attention, the others wait for their shard (a head is not split by requests).

**``--tp T --ep E``** (T x E chips): shard s of the batch (B / E rows) belongs to the group of chips
``s T .. s T + T - 1``, which runs the MoE block of the MoE layer's ``--tp T --ep E``
(:func:`stepsim.workloads.moe.parallel.expert_tensor_parallel`: expert group s's experts on those chips, each chip
F / T columns, ``expert<e>_<part>.<t>``, ``shared_<part>.<t>``). The attention splits over A = min(T E, H) of the
T E chips as above and is reduce-scattered in A chunks; every chip of group s needs all of shard s's rows: with
A <= E they come from the chip that reduced (and, A < E, cut) them, with A > E each chip gathers its shard's A / E
chunks in row order (a Reassemble by a static selector; the chunks cross from the chips that reduced them). Chip
``s T + t`` adds its rows of x (``x.<s>``, read on each chip of the group), runs rank t of the MoE block, and after
the group's all-reduce adds chunk k of its ``h`` rows to the reduced chunk k and stores ``y<s T + t>.<k>`` (rows
``shard[s] + k B/(E T) ..`` of y).

All transfers (the reduce-scatter's steps, shards, dispatch, combine, all-reduces) share the system's links (one
network).
"""

from __future__ import annotations

import numpy as np

from stepsim.base.errors import ArgumentError
from stepsim.graph import (
    BF16,
    FP32,
    Add,
    Flatten,
    LinearOffChipLoad,
    LinearOffChipStore,
    Map,
    Partition,
    Promote,
    Reassemble,
    Reshape,
    RetileStreamify,
    SelectorSource,
    Tensor,
)
from stepsim.workloads.moe.build import PACKING_COMPUTE_BW, _timeshared_ffns, expert_ffns


def check_ep(ep, model, n_heads: int, batch: int, regions, placement: str, counts, tp: int | None = None) -> None:
    """One-line ArgumentError unless ``ep`` (x ``tp``) chips can run the layer: an MoE model, at most one chip per
    expert, KV heads that the chips divide or are a multiple of, a batch that splits evenly over the chips, and
    with ``tp`` one region per expert."""
    from stepsim.workloads.moe.parallel import place_experts

    if isinstance(ep, bool) or not isinstance(ep, int) or ep < 2:
        raise ArgumentError(f"--ep must be an int >= 2 (chips), got {ep!r}")
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


def expert_parallel_decoder(ep: int, system, algorithm: str, placement: str, *, model, n_heads: int, batch: int,
                            routing, counts, moe_kw: dict, heads, stage: dict, tp: int | None = None) -> tuple[dict, dict]:
    """Build the expert-parallel layer (module docstring) into ``stage["g"]``. ``heads(hs)`` builds the attention
    and output projection of KV heads ``hs`` and returns their summed products (tiles of ``o_tile`` requests).
    ``tp`` (``--tp T --ep E``): every shard's group of T chips runs the MoE block tensor-parallel (module
    docstring). Returns ``(params, tile_rows)``: the record's parallel params (those of
    :func:`~stepsim.workloads.moe.parallel.expert_parallel` or ``expert_tensor_parallel``, plus ``algorithm``) and
    the experts' tile rows."""
    from stepsim.graph.network import Network
    from stepsim.workloads.chips import reduce_scatter_partials
    from stepsim.workloads.moe.parallel import _GroupNetwork, check_tp_ep, expert_parallel

    if tp is not None:
        check_tp_ep(tp, ep, batch, system)
    check_ep(ep, model, n_heads, batch, moe_kw["regions"], placement, counts, tp)
    g, bw, bindings = stage["g"], stage["bw"], stage["bindings"]
    moe, d, stride = model.moe, model.hidden, tp or 1  # shard s's group: chips s * stride ..
    attn_chips = min(ep * stride, n_heads)  # A (module docstring): chip a * gap runs KV heads a * per_head ..
    per_head, gap, shard = n_heads // attn_chips, ep * stride // attn_chips, batch // ep
    spread = max(1, ep // attn_chips)  # shards a chunk holds (A <= E), else a shard is A / E chunks
    reduced, homes = {}, {}

    def attention_partial(a):  # [1, B] rows (1, D): this chip's heads' share of attn @ W_o
        return Promote(g, RetileStreamify(g, heads(range(a * per_head, (a + 1) * per_head)), split_row=True), 1)

    def prelude(system):  # the attention and its reduce-scatter, before the MoE layer; reduced[s]: shard s's rows
        net = Network(g, system)
        chips = [a * gap for a in range(attn_chips)]
        chunks = reduce_scatter_partials(g, _GroupNetwork(net, chips), attn_chips, attention_partial, batch,
                                         algorithm=algorithm, compute_bw=bw["compute_bw"],
                                         prefix="attn_reducescatter.")
        # the builders placed their operators by attention chip index (op.chip = a)
        op_chip = {op.id: chips[op.chip] for op in g.ops if hasattr(op, "chip")}
        for tr in net.transfers:  # a chunk delivered to a chip is read there (the send's placeholder)
            op_chip[tr.delivered.id] = tr.dst
        for a in range(attn_chips):
            if attn_chips >= ep:  # chunk a is shard a (A = E) or a part of shard a E/A that home_in gathers
                reduced[a] = chunks[a]
                continue
            before = len(g.ops)  # the attention chip cuts its chunk into the shards of the chips it feeds
            part = Partition(g, Promote(g, chunks[a], 1), SelectorSource(g, np.eye(spread, dtype=np.int8)[
                np.arange(batch // attn_chips) // shard], spread), 0, spread)
            part.channel_depth = shard  # a shard waits whole for its link, not blocking the next one
            for j in range(spread):
                part.assume_shape(j, (shard,))
                reduced[a * spread + j] = part[j]
            op_chip.update({op.id: chips[a] for op in g.ops[before:]})
        return net, op_chip

    def home_in(s, rows, t=0):  # h = x + attn @ W_o, shard s's rows (on its group's chip t)
        if attn_chips > ep:  # the shard's A / E chunks in row order, from the chips that reduced them
            m = attn_chips // ep
            ordered = Reassemble(g, [reduced[s * m + j] for j in range(m)], SelectorSource(
                g, np.eye(m, dtype=np.int8)[np.arange(rows) // (rows // m)], m), 0)
            bindings[ordered.ragged_symbol] = 1  # one row per selector
            attn = Flatten(g, ordered, 1, 2)  # [1, rows, 1] -> [1, rows]
            attn.assume_shape(0, (1, rows))
        else:
            attn = Promote(g, reduced[s], 1)  # [rows] -> [1, rows], as x
        x = Flatten(g, LinearOffChipLoad(g, Tensor(f"x.{s}", (rows, d), BF16), (1, d), (rows, 1), (1, 1),
                                         stream_dtype=FP32), 0, 1)
        h = Map(g, [attn, x], Add(), **bw)
        h.fanout_depth = rows  # the rows wait for the MoE block's output (the decoder's h_rows)
        homes[(s, t)] = h
        return h

    dynamic, tile_n, tile_f = moe_kw["dynamic"], moe_kw["tile_n"], moe_kw["tile_f"]
    if tp is not None:
        return _tensor_parallel_experts(g, moe, routing, counts, tp, ep, placement, system, algorithm, bw=bw,
                                        bindings=bindings, prelude=prelude, home_in=home_in, homes=homes,
                                        dynamic=dynamic, tile_n=tile_n, tile_f=tile_f, shard=shard)

    def home_out(c, combined):  # y = h + moe(h), chip c's rows
        out = Map(g, [combined, homes[(c, 0)]], Add(), **bw)
        LinearOffChipStore(g, Reshape(g, out, 1, 0, write_back_mu=True), tensor_name=f"y.{c}")

    dedicated, shared = expert_ffns(moe, tile_n=tile_n, tile_f=tile_f, dynamic=dynamic, bw=bw,
                                    packing_compute_bw=PACKING_COMPUTE_BW)
    regions = moe_kw["regions"]

    def ffns(g, packed, members):  # one region per expert, or each chip's experts time-multiplexed (--regions)
        if members is None:
            return dedicated(g, packed)
        return _timeshared_ffns(g, packed, moe, regions, tile_f, dynamic, counts, bw, members)

    ep_bindings, tile_rows, params = expert_parallel(
        g, moe, routing, counts, ep, placement, system, regions=None if regions == moe.experts else regions,
        ffns=ffns, prelude=prelude, dynamic=dynamic,
        tile_n=tile_n, tile_f=tile_f, compute_bw=bw["compute_bw"], packing_compute_bw=PACKING_COMPUTE_BW,
        shared_ffn=shared, home_in=home_in, home_out=home_out)
    bindings.update(ep_bindings)
    return {**params, "algorithm": algorithm}, tile_rows


def _tensor_parallel_experts(g, moe, routing, counts, tp, ep, placement, system, algorithm, *, bw, bindings, prelude,
                             home_in, homes, dynamic, tile_n, tile_f, shard) -> tuple[dict, dict]:
    """``--tp T --ep E``: the MoE block of :func:`~stepsim.workloads.moe.parallel.expert_tensor_parallel` (expert
    group s on chips ``s T ..``, each chip F / T columns of its experts) on the decoder's shards: chip ``s T + t``
    adds the attention's rows of shard s (sent from the chip that reduced them) to its rows of x, and after the
    group's all-reduce adds chunk k of them to the reduced chunk k and stores it as ``y<s T + t>.<k>``."""
    from stepsim.workloads.moe.parallel import expert_tensor_parallel

    chunk = shard // tp
    chunk_of_row = np.eye(tp, dtype=np.int8)[np.arange(shard) // chunk]
    parts = {}

    def chip_ffns(t, sharded):  # chip t of a group: its F / T columns of every expert
        return expert_ffns(sharded, tile_n=tile_n, tile_f=tile_f, dynamic=dynamic, bw=bw,
                           packing_compute_bw=PACKING_COMPUTE_BW, suffix=f".{t}")

    def store(s, t, k, reduced):  # y chunk k = reduced MoE chunk k + h chunk k
        if (s, t) not in parts:
            part = Partition(g, homes[(s, t)], SelectorSource(g, chunk_of_row, tp), 0, tp)
            part.channel_depth = chunk
            for j in range(tp):
                part.assume_shape(j, (chunk,))
            parts[(s, t)] = part
        LinearOffChipStore(g, Map(g, [reduced, parts[(s, t)][k]], Add(), **bw), tensor_name=f"y{s * tp + t}.{k}")

    ep_bindings, tile_rows, params = expert_tensor_parallel(
        g, moe, routing, counts, tp, ep, placement, system, algorithm,
        ffns_of=lambda t, sharded: chip_ffns(t, sharded)[0], shared_of=lambda t, sharded: chip_ffns(t, sharded)[1],
        compute_bw=bw["compute_bw"], prelude=prelude, home_in_of=lambda t: lambda s, rows: home_in(s, rows, t),
        store=store, dynamic=dynamic, tile_n=tile_n, tile_f=tile_f, packing_compute_bw=PACKING_COMPUTE_BW)
    bindings.update(ep_bindings)
    return params, tile_rows
