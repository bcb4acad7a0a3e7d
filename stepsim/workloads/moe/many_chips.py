"""The MoE layer on many chips: :func:`stepsim.workloads.moe.build.build_moe` with ``--tp``, ``--ep``, ``--tp
--ep``, or a stack (``--layers L [--pp P] [--micro-batches M]``, each layer on one chip or over ``--ep E`` or
``--tp T`` chips). Every form is the sharding pass (:mod:`stepsim.workloads.sharding`) on the layer's own pieces
(:func:`~stepsim.workloads.moe.build.moe_stage`, :func:`~stepsim.workloads.moe.build.expert_ffns`); this module
only says which placement and hands the pass those pieces.

* ``--tp T``, one layer or a stack's layers (``--pp P`` stages of T chips): chip t runs the whole layer (every
  token, every expert) on columns ``t F/T ..`` of every expert's gate / up projections and those rows of its down
  projection (tensors ``[layer<i>.]expert<e>_<part>.<t>``, the shared experts likewise), with ``x`` and the
  routing weights replicated; its output rows are a partial sum of y, all-reduced by the pass
  (:func:`~stepsim.workloads.sharding.tp_layers`); after the last layer chip t stores rows ``k B/T ..`` of y in
  ``y<t>.<k>``.
* ``--ep E``: :func:`~stepsim.workloads.sharding.expert_parallel` (one layer: the placements' cost model, with
  ``--regions`` time-multiplexed regions; a stack's layer on its stage's chips).
* ``--tp T --ep E``: :func:`~stepsim.workloads.sharding.expert_tensor_parallel`.
* ``--pp P`` alone: :func:`~stepsim.workloads.sharding.pipeline` (:func:`_stack`).

Why a module apart from ``moe/build.py``: the mapper keys its cached schedules by that file's hash
(:func:`stepsim.mapping.mapper.source_hash`); the one-chip layer it maps does not depend on this one.
"""

from __future__ import annotations

from stepsim.base.errors import ArgumentError
from stepsim.graph import Graph, LinearOffChipStore, Reshape
from stepsim.models.presets import MoEModel
from stepsim.workloads.chips import check_stack
from stepsim.workloads.moe.stage import DEFAULT_TILE_N, algorithmic_flops, moe_stage
from stepsim.workloads.routing import expert_counts
from stepsim.workloads.sharding import check_chips

#: the tilings a stack takes ``--micro-batches M`` > 1 with (``stepsim optimize`` searches M for these only)
MICRO_BATCH_TILINGS = ("static", "dynamic")


def check_pipeline(layers: int, pp: int | None, batch: int, micro_batches: int | None, *, tiling: str,
                   tile_n: int | None, shared: int) -> int:
    """One-line ArgumentError unless L, N and M fit the batch and tiling; returns M (default 1). ``tile_n``: the
    shared experts' tile (tokens; with dynamic tiling their default tile), checked with ``shared`` experts."""
    m = check_stack(layers, pp, batch, micro_batches, "tokens") or 1
    if m > 1 and tiling not in MICRO_BATCH_TILINGS:
        raise ArgumentError(f"--micro-batches {m} needs --tiling {' or '.join(MICRO_BATCH_TILINGS)}")
    if m > 1 and shared and (batch // m) % tile_n:
        what = f"--tile-n {tile_n} tokens" if tiling == "static" else f"{tile_n} tokens (dynamic tiling's default)"
        raise ArgumentError(f"--micro-batches {m}: the shared experts' tiles of {what} must not "
                            f"span micro-batches of {batch // m} tokens (a multiple of {tile_n})")
    return m


def many_chips(g, model: MoEModel, routings: list, counts, *, stack: bool, tp, ep, pp, system, micro_batches,
               placement: str, algorithm: str, timeshare: bool, tiling: str, dynamic: bool, **stage) -> tuple:
    """``build_moe``'s many-chip forms (module docstring). ``g``: the one layer's graph (a stack names its own);
    ``routings``: every layer's routing (one without ``stack``), ``counts`` the first's tokens per expert; ``stage``:
    :func:`~stepsim.workloads.moe.build.moe_stage`'s keywords ``tile_n``, ``tile_f``, ``regions``, ``compute_bw``,
    ``packing_compute_bw``. Returns ``(graph, bindings, tile_rows, algorithmic FLOPs or None (the one layer's),
    params)``."""
    from stepsim.workloads.chips import chips_system
    from stepsim.workloads.sharding import Sharding, expert_parallel, expert_tensor_parallel, tp_ep_system

    if stack:
        return _stack(model, routings, pp, system, micro_batches, ep=ep, placement=placement, tp=tp,
                      algorithm=algorithm, timeshare=timeshare, tiling=tiling, dynamic=dynamic, **stage)
    if tp is not None and timeshare:
        raise ArgumentError("--tp does not combine with --regions: a time-multiplexed region fetches whole experts' "
                            "weights by address, not a chip's column block")
    if tp is not None and ep is None:
        return _tp(model, routings, None, system, 1, tp=tp, algorithm=algorithm, dynamic=dynamic, g=g, **stage)
    build = dict(dynamic=dynamic, **{k: v for k, v in stage.items() if k != "regions"})
    if tp is not None:
        parallel, bindings, tile_rows = expert_tensor_parallel(
            Sharding(g, tp_ep_system(model, tp, ep, routings[0].shape[0], system, stage["tile_f"])), model,
            routings[0], tp, ep, placement, algorithm, **build)
        return g, bindings, tile_rows, None, parallel
    parallel, bindings, tile_rows = expert_parallel(  # one region per expert, or each chip's experts time-multiplexed
        Sharding(g, chips_system(ep, system, "--ep")), model, routings, ep, placement, stack=False,
        regions=stage["regions"] if timeshare else None, **build)
    return g, bindings, tile_rows, None, parallel


def _stack(model: MoEModel, routings, pp, system, micro_batches, *, ep, placement, tp, algorithm, timeshare, tiling,
           dynamic, **stage) -> tuple:
    """``--layers L [--pp N] [--micro-batches M] [--ep E | --tp T]``: the stack of
    ``--pp`` alone (with ``ep``: :func:`_ep_stack`, with ``tp``: :func:`_tp`). Returns
    :func:`many_chips`'s results."""
    from stepsim.workloads.sharding import load_rows, pipeline

    if timeshare or (tp is not None and ep is not None):
        raise ArgumentError("--layers / --pp / --micro-batches do not combine with --regions or --tp with --ep yet "
                            "(a stack runs each layer on one chip or over E (--ep) or T (--tp) chips, one region "
                            "per expert)")
    layers, batch = len(routings), routings[0].shape[0]
    m = check_pipeline(layers, pp, batch, micro_batches, tiling=tiling, tile_n=stage["tile_n"] or DEFAULT_TILE_N,
                       shared=model.shared_intermediate)
    if tp is not None:
        return _tp(model, routings, pp, system, m, tp=tp, algorithm=algorithm, dynamic=dynamic, **stage)
    if ep is not None:
        return _ep_stack(model, routings, pp, system, m, ep=ep, placement=placement, dynamic=dynamic, **stage)
    g = Graph(f"moe-{model.name}-l{layers}" + (f"-pp{pp}" if pp else "") + f"-mb{m}")
    bindings, tile_rows = {}, {}  # tile_rows: every layer's ragged dynamic tiles (moe_stage with micro-batches)

    def layer(i, tokens):  # layer 0 loads x; a later one takes the previous layer's rows, (1, B) as the loaded x
        out, layer_bindings, rows = moe_stage(
            g, load_rows(g, "x", batch, model.hidden) if tokens is None else tokens, model, routings[i],
            expert_counts(routings[i], model.experts), prefix=f"layer{i}.", micro_batches=m, dynamic=dynamic, **stage)
        tile_rows.update(rows)
        bindings.update(layer_bindings)
        return out

    report = pipeline(g, system, layers, pp, layer, lambda out: LinearOffChipStore(
        g, Reshape(g, out, 1, 0, write_back_mu=True), tensor_name="y"), bindings=bindings, what="MoE layers")
    rows = batch // m  # FLOPs as built: each micro-batch pads its own tiles
    flops = sum(algorithmic_flops(expert_counts(r[k * rows:(k + 1) * rows], model.experts), model, stage["tile_n"])
                for r in routings for k in range(m))
    return g, bindings, tile_rows, flops, {"layers": layers, "micro_batches": m, **report}


def _ep_stack(model: MoEModel, routings, pp, system, m: int, *, ep, placement, dynamic, **stage) -> tuple:
    """``--layers L --ep E [--pp P]``: the sharding pass (:func:`stepsim.workloads.sharding.expert_parallel`) on
    ``(P or 1) x E`` chips, shard c's rows on chip c of every stage; its results as :func:`_stack`'s."""
    from stepsim.workloads.chips import stages_system
    from stepsim.workloads.moe.sharded_micro import micro_batch_tokens
    from stepsim.workloads.sharding import Sharding, expert_parallel

    check_chips("--ep", ep)
    batch = routings[0].shape[0]
    if m > 1:
        _check_ep_micro_batches(batch, ep, m, stage["tile_n"] or DEFAULT_TILE_N, model.shared_intermediate,
                                dynamic)
    g = Graph(f"moe-{model.name}-l{len(routings)}" + (f"-pp{pp}" if pp else "") + f"-ep{ep}"
              + (f"-mb{m}" if m > 1 else ""))
    rows = {}  # shard c's rows of the layer before, on chip c of its stage (an ordinary edge across stages)

    def hooks(i, base):  # layer 0 loads x.<c>, the last stores y.<c>
        return (None if i == 0 else lambda c, n, rows=dict(rows): rows[c],
                None if i == len(routings) - 1 else rows.__setitem__)

    params, bindings, tile_rows = expert_parallel(
        Sharding(g, stages_system(pp, ep, system, "--ep")), model, routings, ep, placement, stack=True, pp=pp,
        micro_batches=m, hooks=hooks, dynamic=dynamic, **{k: v for k, v in stage.items() if k != "regions"})
    # FLOPs as built: each micro-batch (the m-th piece of every shard) pads its own tiles
    parts = [slice(None)] if m == 1 else micro_batch_tokens(batch, ep, m)
    flops = sum(algorithmic_flops(expert_counts(r[p], model.experts), model, stage["tile_n"])
                for r in routings for p in parts)
    return g, bindings, tile_rows, flops, params


def _tp(model: MoEModel, routings, pp, system, m: int, *, tp, algorithm, dynamic, g=None, **stage) -> tuple:
    """``--tp T`` (module docstring) on ``(P or 1) x T`` chips: a stack's layers (``g`` None) or, into ``g``, the one
    layer (its tensors and the all-reduce's operators without the ``layer0.`` of a stack's). Results as
    :func:`many_chips`'s."""
    from stepsim.workloads.sharding import load_rows, tensor_parallel

    stack, batch = g is None, routings[0].shape[0]
    check_chips("--tp", tp)
    if m > 1:
        raise ArgumentError(f"--micro-batches {m} does not combine with --tp yet (a tensor-parallel stack's layer "
                            f"all-reduces the whole batch)")
    shard = column_shard(model, tp, stage["tile_f"], batch)
    g = Graph(f"moe-{model.name}-l{len(routings)}" + (f"-pp{pp}" if pp else "") + f"-tp{tp}") if stack else g
    bindings: dict = {}

    def partial(i, t, tokens):  # chip t's columns of layer i (every token, every expert); layer 0 reads x
        out, layer_bindings, _ = moe_stage(
            g, load_rows(g, "x", batch, model.hidden) if tokens is None else tokens, shard, routings[i],
            expert_counts(routings[i], model.experts), dynamic=dynamic, suffix=f".{t}",
            prefix=f"layer{i}." if stack else "", **stage)
        bindings.update(layer_bindings)
        return out

    params = tensor_parallel(g, system, len(routings), tp=tp, pp=pp, algorithm=algorithm, batch=batch,
                             compute_bw=stage["compute_bw"], bindings=bindings, stack=stack, blocks=lambda i: [
                                 ("allreduce", lambda t, rows: partial(i, t, rows), False)])
    flops = sum(algorithmic_flops(expert_counts(r, model.experts), model, stage["tile_n"]) for r in routings)
    return g, bindings, {}, flops if stack else None, params  # one layer: chip c stores chunk k as y<c>.<k>


def _check_ep_micro_batches(batch: int, ep: int, m: int, tile_n: int, shared: int, dynamic: bool) -> None:
    """One-line ArgumentError unless every chip's shard of an expert-parallel stack splits into ``m`` equal
    micro-batches (``moe/sharded_micro.py``) whose shared-expert tiles of ``tile_n`` tokens stay within one."""
    if batch % (ep * m):
        raise ArgumentError(f"--micro-batches {m} --ep {ep}: each chip's shard of the batch of {batch} tokens must "
                            f"split into {m} equal micro-batches (the batch a multiple of {ep * m})")
    if shared and (batch // (ep * m)) % tile_n:
        what = f"{tile_n} tokens (dynamic tiling's default)" if dynamic else f"--tile-n {tile_n} tokens"
        raise ArgumentError(f"--micro-batches {m} --ep {ep}: the shared experts' tiles of {what} must not span a "
                            f"chip's micro-batches of {batch // (ep * m)} tokens (a multiple of {tile_n})")


def column_shard(model: MoEModel, tp: int, tile_f: int, batch: int) -> MoEModel:
    """One chip's share of ``--tp T``: every expert's (and the shared experts') ``F / T`` columns, after the
    one-line checks that the columns split into whole ``tile_f`` tiles and the batch into the all-reduce's T chunks
    of rows."""
    from stepsim.workloads.sharding import check_columns, columns

    check_columns(tp, {"intermediate": model.intermediate, "shared intermediate": model.shared_intermediate}, tile_f)
    if batch % tp:
        raise ArgumentError(f"--tp {tp}: the all-reduce cuts y's {batch} rows into {tp} chunks; the batch must be "
                            f"a multiple of {tp}")
    return columns(model, tp)
