"""The sharding pass: a layer's graph placed on many chips, with the collectives its placement needs.

Every parallel form stepsim builds (``--tp T``, ``--ep E``, ``--tp T --ep E``, ``--pp P``, ``--micro-batches M``,
for the MoE and the decoder layer and their stacks) has one structure, which this module holds once; a workload
kind gives only its layer's pieces (hooks: the rows a chip computes, the partial sums it holds, its FFNs):

1. **System.** The chips are ``(P or 1) x W`` of the system (W = T, E or T x E), or that many fully connected
   chips with the preset links (:func:`stepsim.workloads.chips.chips_system`); one :class:`~stepsim.graph.network.
   Network` carries every transfer (a collective's explicit sends first, then the cross-chip edges).
2. **Stages.** Layer i of L belongs to stage ``i // (L / P)``, which runs on chips ``s W .. s W + W - 1``; at a
   stage boundary every chip's rows cross once to the chip of the same rank in the next stage (an ordinary edge,
   fanned out there: :func:`stepsim.workloads.chips.cross_stage`).
3. **Placement.** Every operator a hook builds belongs to one chip: either the builder that made it says so by
   rank within its group (``op.chip``, as the collectives' builders do) or the pass records it (``op_chip``);
   a transfer's delivered placeholder is read on its destination chip. :func:`stepsim.graph.network.place_on_chips`
   then turns every remaining cross-chip edge into a transfer.
4. **Collectives.** Tensor parallelism: every chip of a group holds a partial sum, cut into W chunks and
   all-reduced (or reduce-scattered) by :mod:`stepsim.workloads.collective.build` over the group's chips
   (:class:`GroupNetwork`); the reduced chunks go back in row order (:func:`in_order`, a Reassemble by a static
   selector) as the next block's rows, or are stored chunk by chunk (``y<t>.<k>``) after the last. Expert
   parallelism: the batch is sharded over the chips and the experts' rows cross by the all-to-all of
   :mod:`stepsim.workloads.moe.sharded` (dispatch and combine by the routing trace).
5. **Labels.** Expert e of layer i is not expert e of layer j: a stack's layer relabels its groups
   ``("layer<i>.<kind>", e)`` (the channel labels of the engine), the attention's regions excepted.
6. **Report.** The record's parallel params: the system's name, the links used and the bytes over every link
   (the symbolic per-link metric on the trace's bindings, at the width the engine times fp32 rows).

The placements and where they are built (every one on :class:`Sharding`):

* ``--tp T`` (heads or FFN columns over T chips), one layer or a stack in ``--pp`` stages:
  :func:`tensor_parallel` (:func:`tp_layers` on its system), a layer given as blocks (a partial sum per chip,
  all-reduced, with or without a residual): the MoE and SwiGLU layers' one block, the decoder's attention and FFN
  blocks;
* ``--ep E`` (experts over E chips, the batch sharded over them): :func:`expert_parallel`, one layer (the
  load-balanced placement's cost model, ``--regions``) or a stack's layers in their stages (``--micro-batches``),
  on the all-to-all of :func:`stepsim.workloads.moe.sharded.build_sharded`; a kind's hook builds what comes before
  each layer (the decoder's attention, reduce-scattered) and its residuals;
* ``--tp T --ep E``: :func:`expert_parallel` with ``tp`` (expert groups of T chips, an all-reduce per group;
  :func:`expert_tensor_parallel`);
* ``--pp P`` alone: :func:`pipeline` (the MoE, decoder and SwiGLU stacks).
* ``--pp P`` on a graph already built (graph in, graph out; an ONNX-lowered model's layers, the node names'
  prefixes): :func:`pipeline_graph`.

A kind that is not MoE needs no builder of its own: ``tests/workloads/test_sharding.py`` runs a toy layer
``--tp 2`` in two ``--pp`` stages through :func:`tp_layers` alone.

Why a module of ``stepsim.workloads`` and not a pass of ``stepsim.passes``: the import layers
(docs/architecture.md, pyproject.toml) put ``stepsim.passes`` among the drivers, above the workloads, and the
builders call this transform while they build (the hooks are the kind's own graph builders), so it must sit at or
below them; it needs the collectives (``stepsim.workloads.collective``) and the network (``stepsim.graph``), so it
cannot sit in ``stepsim.graph`` either.

Operators are created in the order the per-combination builders created them (the engine's HBM serves memory
units in registration order, and names carry operator ids): the cycles, bytes and event counts of every existing
``--tp/--ep/--pp/--micro-batches`` run are unchanged.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

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
    SelectorSource,
    Tensor,
)


class GroupNetwork:
    """One group's view of the whole system's network: a collective's builder numbers the group's chips
    ``0 .. n-1``; its transfers go between their chips in the system (``chips[i]``)."""

    def __init__(self, net, chips: list[int]):
        self.net, self.chips = net, chips
        self.system = SimpleNamespace(chips=len(chips))  # all the builder reads of it

    def send(self, src: int, dst: int, stream, name: str | None = None):
        return self.net.send(self.chips[src], self.chips[dst], stream, name=name)


class Sharding:
    """One graph's placement on a system (module docstring, steps 1, 3 and 6): the network, and the chip of every
    operator the pass or its hooks added (``op_chip``, by ``op.id``)."""

    def __init__(self, g, system):
        from stepsim.graph.network import Network

        self.g, self.system = g, system
        self.net = Network(g, system)
        self.op_chip: dict[int, int] = {}

    def place(self, since: int, chip: int) -> None:
        """The operators added since ``since`` (an index of ``g.ops``) on ``chip``."""
        self.op_chip.update({op.id: chip for op in self.g.ops[since:]})

    def place_ranked(self, since: int, chips: list[int]) -> None:
        """The operators added since ``since`` that a builder placed by rank (``op.chip``) on ``chips[rank]``."""
        self.op_chip.update({op.id: chips[op.chip] for op in self.g.ops[since:] if hasattr(op, "chip")})

    def delivered(self) -> None:
        """A chunk delivered to a chip is read there (the send's placeholder)."""
        for tr in self.net.transfers:
            self.op_chip[tr.delivered.id] = tr.dst

    def reduce_scatter(self, chips: list[int], partial_of, elems: int, *, algorithm: str, compute_bw: int,
                       prefix: str) -> dict:
        """Every chip of ``chips`` builds its partial sum (``partial_of(rank)``, ``(1, elems)``), reduce-scattered
        over them (:func:`stepsim.workloads.chips.reduce_scatter_partials`, operators ``<prefix>*``): returns
        ``{rank: chunk}``, the sum of chunk ``rank`` on ``chips[rank]``."""
        from stepsim.workloads.chips import reduce_scatter_partials

        start = len(self.g.ops)
        chunks = reduce_scatter_partials(self.g, GroupNetwork(self.net, chips), len(chips), partial_of, elems,
                                         algorithm=algorithm, compute_bw=compute_bw, prefix=prefix)
        self.place_ranked(start, chips)
        self.delivered()
        return chunks

    def scatter_shards(self, chunks: dict, chips: list[int], shards: int, elems: int) -> dict:
        """The reduce-scattered ``chunks`` (one per chip of ``chips``) as the batch's ``shards`` shards: with fewer
        chunks than shards chunk a cuts itself into the shards ``a s/n ..`` of the chips it feeds (a Partition by
        a static selector on ``chips[a]``); else shard s is chunk s (or, more chunks, one of its parts)."""
        out = {}
        for a, chip in enumerate(chips):
            if len(chips) >= shards:
                out[a] = chunks[a]
                continue
            before, spread = len(self.g.ops), shards // len(chips)
            part = split_chunks(self.g, Promote(self.g, chunks[a], 1), elems // len(chips), spread)
            for j in range(spread):  # a shard waits whole for its link, not blocking the next one
                out[a * spread + j] = part[j]
            self.place(before, chip)
        return out

    def finish(self, bindings: dict) -> dict:
        """Route every cross-chip edge (:func:`~stepsim.graph.network.place_on_chips`) and return the report's
        ``system``, ``links_used`` and ``link_bytes`` (bytes per link on ``bindings``)."""
        import sympy

        from stepsim.graph.lower import fp32_timing_bytes
        from stepsim.graph.network import place_on_chips

        net = place_on_chips(self.g, self.system, lambda op: self.op_chip[op.id], network=self.net)
        values = {sym: sympy.sympify(v) for sym, v in bindings.items()}  # xreplace: subs is quadratic here
        link_bytes = {name: int(sympy.sympify(b).xreplace(values))
                      for name, b in net.link_bytes(fp32_timing_bytes(self.g)).items()}
        return {"system": self.system.name, "links_used": len(net.links), "link_bytes": link_bytes}


def load_rows(g, name: str, rows: int, hidden: int):
    """Tensor ``name`` ([rows, hidden], bf16) read from its chip's HBM as ``(1, rows)`` rows of ``(1, hidden)``
    fp32: a layer's input as the one-chip layer loads ``x``."""
    return Flatten(g, LinearOffChipLoad(g, Tensor(name, (rows, hidden), BF16), (1, hidden), (rows, 1), (1, 1),
                                        stream_dtype=FP32), 0, 1)


def check_chips(flag: str, n, why: str = "") -> None:
    """One-line ArgumentError unless ``n`` (the value of ``flag``, ``--tp`` / ``--ep``) is an int >= 2."""
    from stepsim.base.errors import ArgumentError

    if isinstance(n, bool) or not isinstance(n, int) or n < 2:
        raise ArgumentError(f"{flag} must be an int >= 2 (chips){why}, got {n!r}")


def check_columns(tp: int, widths: dict, tile_f: int, flag: str = "--tile-f") -> None:
    """One-line ArgumentError unless every FFN width of ``widths`` (``{what: width}``) splits over ``tp`` chips
    into column blocks of whole ``tile_f`` tiles (``flag``: the tile's option)."""
    from stepsim.base.errors import ArgumentError

    for what, width in widths.items():
        if width % (tp * tile_f):
            raise ArgumentError(f"--tp {tp}: the {what} size {width} must split into {tp} column blocks of whole "
                                f"{flag} {tile_f} tiles (a multiple of {tp * tile_f})")


def columns(model, tp: int):
    """One chip's share of an MoE block under ``--tp T``: every expert's (and the shared experts') ``F / T``
    columns (the caller checks they split)."""
    from stepsim.models.presets import MoEModel

    return MoEModel(model.name, hidden=model.hidden, intermediate=model.intermediate // tp, experts=model.experts,
                    top_k=model.top_k, shared_intermediate=model.shared_intermediate // tp)


def relabel(ops, layer: int, kinds=None) -> None:
    """Step 5: a stack's layer ``layer`` names its groups ``("layer<i>.<kind>", index)`` (``kinds``: only those
    kinds; None: every tuple group)."""
    for op in ops:
        if isinstance(op.group, tuple) and (kinds is None or op.group[0] in kinds):
            op.group = (f"layer{layer}.{op.group[0]}", op.group[1])


def chunk_selector(rows: int, chunks: int) -> np.ndarray:
    """The static selector of ``rows`` rows cut into ``chunks`` consecutive chunks: row r in chunk ``r // (rows /
    chunks)``."""
    return np.eye(chunks, dtype=np.int8)[np.arange(rows) // (rows // chunks)]


def in_order(g, chunks: list, rows: int, bindings: dict, promote: bool = True):
    """The reduced ``chunks`` (each ``rows / n`` rows) back in row order: a Reassemble by a static selector, as
    ``(1, rows)`` rows (``promote``: flattened to ``(rows,)`` and promoted, a stream of its own rank; else the
    Reassemble's ``[1, rows, 1]`` flattened to ``[1, rows]``)."""
    ordered = Reassemble(g, chunks, SelectorSource(g, chunk_selector(rows, len(chunks)), len(chunks)), 0)
    bindings[ordered.ragged_symbol] = 1  # one row per selector element
    if not promote:
        flat = Flatten(g, ordered, 1, 2)
        flat.assume_shape(0, (1, rows))
        return flat
    flat = Flatten(g, ordered, 0, 2)
    flat.assume_shape(0, (rows,))
    return Promote(g, flat, 1)


def split_chunks(g, rows_stream, rows: int, chunks: int):
    """``rows_stream`` cut into ``chunks`` chunks of consecutive rows (a Partition by a static selector whose
    outputs hold a whole chunk)."""
    part = Partition(g, rows_stream, SelectorSource(g, chunk_selector(rows, chunks), chunks), 0, chunks)
    part.channel_depth = rows // chunks
    for k in range(chunks):
        part.assume_shape(k, (rows // chunks,))
    return part


def pipeline(g, system, layers: int, pp: int | None, layer, store, *, bindings: dict, what: str,
             kinds=None) -> dict:
    """``--pp P`` alone, or one chip (module docstring, steps 2, 3, 5, 6): ``layer(i, rows)`` builds layer i on the
    previous layer's output ``rows`` (None for layer 0) and returns its own, on chip ``i // (layers / P)``, its
    groups relabelled (``kinds``, as :func:`relabel`; ``()``: none); ``store(rows)`` takes the last layer's rows,
    on the last chip. A stage boundary is an ordinary cross-chip edge. ``system``: P chips (default: fully
    connected); without ``pp`` a one-line ArgumentError when given (``what``: "MoE layers", the stack's layers).
    Returns ``{"pp", **report}``, :meth:`Sharding.finish`'s report of the links on ``bindings`` (``{}`` without
    ``pp``)."""
    from stepsim.base.errors import ArgumentError
    from stepsim.workloads.chips import chips_system

    if pp is not None:
        system = chips_system(pp, system, "--pp")
    elif system is not None:
        raise ArgumentError(f"--system applies to a stack of {what} with --pp N (pipeline parallelism)")
    sh, per_stage, rows = Sharding(g, system), layers // (pp or 1), None
    for i in range(layers):
        before = len(g.ops)
        rows = layer(i, rows)
        sh.place(before, i // per_stage)
        relabel(g.ops[before:], i, kinds)  # expert e of layer i is not expert e of layer j (channel labels)
    before = len(g.ops)
    store(rows)
    sh.place(before, (pp or 1) - 1)
    return {} if pp is None else {"pp": pp, **sh.finish(bindings)}


def tp_layers(sh: Sharding, layers: int, *, tp: int, pp: int | None, algorithm: str, batch: int, compute_bw: int,
              bindings: dict, blocks, rows_in: dict | None = None, load=None, kinds=None, stack: bool = True,
              store_kw: dict | None = None) -> None:
    """Tensor-parallel layers (module docstring, steps 2-5) into ``sh.g``: stage s of ``pp`` on chips ``s tp ..``.

    ``rows_in[t]``: chip t's input rows of layer 0 (None: its blocks build their own). ``blocks(i)``: layer i's
    blocks in order, each ``(name, partial(t, rows), residual)``: chip t's partial sum (``(1, B)`` rows) on its
    block input ``rows`` (None when there are none yet) is all-reduced over the stage's chips (operators
    ``layer<i>.<name>.*``; one layer without ``stack``: ``<name>.*``, its groups not relabelled); with
    ``residual`` the block's input rows (without rows: ``load(t)``, built after the reduced rows are in order, as
    ``[1, B]`` rows of the Reassemble) are added to the reduced rows. After the last block of the last layer chip
    t stores reduced chunk k (plus its input chunk, with a residual) as ``y<t>.<k>`` (``store_kw``: the stores'
    other keywords); else the rows, in row order, are the next block's input."""
    from stepsim.workloads.chips import all_reduce_partials, cross_stage

    g, per_stage = sh.g, layers // (pp or 1)
    rows_in = {} if rows_in is None else rows_in
    for i in range(layers):
        chips = [(i // per_stage) * tp + t for t in range(tp)]
        if i and i % per_stage == 0:
            cross_stage(g, rows_in, chips, sh.op_chip)
        start = len(g.ops)
        group = GroupNetwork(sh.net, chips)
        steps = blocks(i)
        for b, (name, partial, residual) in enumerate(steps):
            if residual:  # the rows wait for the all-reduce before the residual reads them
                for rows in rows_in.values():
                    rows.fanout_depth = batch

            def partial_of(t, partial=partial, rows=dict(rows_in)):
                return partial(t, rows.get(t))

            reduced = all_reduce_partials(g, group, tp, partial_of, batch, algorithm=algorithm,
                                          compute_bw=compute_bw, prefix=f"layer{i}.{name}." if stack else f"{name}.")
            last = i == layers - 1 and b == len(steps) - 1
            for t in range(tp):
                before = len(g.ops)
                chunks = [reduced[(t, k)] for k in range(tp)]
                if last:
                    extra = split_chunks(g, rows_in[t], batch, tp) if residual else None
                    for k in range(tp):  # the all-reduce's rows are in on-chip memory, as the one-layer --tp's
                        out = chunks[k] if extra is None else Map(g, [chunks[k], extra[k]], Add(),
                                                                  compute_bw=compute_bw)
                        LinearOffChipStore(g, out, tensor_name=f"y{t}.{k}", **(store_kw or {}))
                elif residual:
                    rows_in[t] = Map(g, [in_order(g, chunks, batch, bindings, promote=stack),
                                         rows_in[t] if t in rows_in else load(t)], Add(), compute_bw=compute_bw)
                else:
                    rows_in[t] = in_order(g, chunks, batch, bindings)
                    rows_in[t].fanout_depth = batch  # tokens feed the partition and the shared experts
                for op in g.ops[before:]:
                    op.chip = t
        sh.place_ranked(start, chips)
        sh.delivered()
        if stack:
            relabel(g.ops[start:], i, kinds)


def tensor_parallel(g, system, layers: int, *, tp: int, pp: int | None, algorithm: str, bindings: dict,
                    first=None, stack: bool = True, **kw) -> dict:
    """``--tp T`` on ``(P or 1) x T`` chips of ``system`` (:func:`~stepsim.workloads.chips.stages_system`): the
    layers of :func:`tp_layers` (``kw``: its other keywords) into ``g``, ``first(t)`` (when given) chip t's input
    rows of layer 0, built on it first. Returns the record's params: ``tp``, ``algorithm`` and
    :meth:`Sharding.finish`'s report on ``bindings`` (a stack's also ``layers``, ``micro_batches`` 1 and ``pp``)."""
    from stepsim.workloads.chips import stages_system

    sh, rows_in = Sharding(g, stages_system(pp, tp, system, "--tp")), {}
    for t in range(tp if first is not None else 0):
        before = len(g.ops)
        rows_in[t] = first(t)
        sh.place(before, t)
    tp_layers(sh, layers, tp=tp, pp=pp, algorithm=algorithm, bindings=bindings, rows_in=rows_in, stack=stack, **kw)
    r = sh.finish(bindings)
    if not stack:
        return {"tp": tp, "system": r["system"], "algorithm": algorithm, "links_used": r["links_used"],
                "link_bytes": r["link_bytes"]}
    return {"layers": layers, "micro_batches": 1, **({"pp": pp} if pp else {}), "tp": tp, "algorithm": algorithm,
            **r}


def expert_parallel(sh: Sharding, model, routings, ep: int, placement: str, *, stack: bool, pp: int | None = None,
                    micro_batches: int = 1, regions: int | None = None, hooks=None, algorithm: str | None = None,
                    tp: int | None = None, store=None, lanes: int = 1, **build) -> tuple[dict, dict, dict]:
    """``--ep E`` layers into ``sh.g``: each the sharded expert-parallel layer of
    :func:`~stepsim.workloads.moe.sharded.build_sharded` (the all-to-alls), the FFNs of
    :func:`~stepsim.workloads.moe.stage.expert_ffns`, its operators on the chips ``base ..`` of its stage.

    The one layer (not ``stack``): the experts placed by ``placement`` on the cost model of
    :mod:`stepsim.workloads.moe.ep_cost` (:func:`~stepsim.workloads.moe.parallel.place_experts`); ``regions``
    time-multiplexes each chip's experts on ``regions / E`` regions
    (:func:`~stepsim.workloads.moe.parallel.region_members`), their tiles then a chip's time (the tile-first
    greedy places them). A stack's layer i (``stack``): on the chips of stage ``i // (L / P)`` (``pp``), placed by
    the tile-first greedy, ``micro_batches``, its tensors and groups named ``layer<i>.`` (step 5).
    ``hooks(i, base)`` builds what comes before layer i (the decoder's attention) and gives build_sharded's
    ``(home_in, home_out)``; without hooks each layer loads ``x.<c>`` and stores ``y.<c>``. ``build``:
    build_sharded's keywords.

    ``tp`` N (``--tp N --ep E``, one layer; the system: :func:`tp_ep_system`): the experts placed on E groups of N
    chips (chips ``g N ..``: group g; the same cost model on the shard's F / N columns, :func:`columns`), the batch
    sharded over the groups and replicated over a group's chips. Rank t is one expert-parallel layer over chips
    ``g N + t`` of every group (weights ``expert<e>_<part>.<t>``, ``shared_<part>.<t>``; ``home_in(s, rows, t)``);
    every chip so ends with a partial sum of its group's rows, all-reduced over the group (``algorithm``), and chip
    ``p = g N + t`` stores reduced chunk k in ``y<p>.<k>`` (or ``store(g, t, k, stream)`` consumes it).

    ``lanes`` > 1 (one layer without ``tp``: a mapped chip's schedule, :mod:`stepsim.workloads.moe.mapped_ep`)
    spreads every routed expert, or every time-multiplexed region, over that many column stripes
    (:func:`~stepsim.workloads.moe.stage._expert_ffn`), as the one-chip layer's ``lanes`` does, and the shared
    experts over as many column stripes (:func:`_shared_lanes`).

    Returns ``(params, bindings, tile_rows)``, the params (with ``algorithm`` when given): placement, chips, shard
    bounds, the chip of every expert (with ``tp``: its group's first) and, for one layer, the token rows every
    chip's experts receive, the busiest chip, imbalance = max / mean (and ``region_experts``), then the links
    (:meth:`Sharding.finish`)."""
    from stepsim.workloads.chips import all_reduce_partials
    from stepsim.workloads.moe.parallel import chip_tokens, expert_cost, place_experts, region_members, shard_rows
    from stepsim.workloads.moe.sharded import build_sharded
    from stepsim.workloads.moe.stage import _expert_ffn, _timeshared_ffns, expert_ffns
    from stepsim.workloads.routing import expert_counts

    bindings, tile_rows, expert_chips, per_stage = {}, {}, [], len(routings) // (pp or 1)
    bw, tile_f, dynamic, width = dict(compute_bw=build["compute_bw"]), build["tile_f"], build["dynamic"], tp or 1
    shard, partials = model if tp is None else columns(model, tp), {}  # --tp: every chip's F / N columns
    for i, routing in enumerate(routings):
        base, counts = (i // per_stage) * ep, expert_counts(routing, model.experts)
        home_in, home_out = (None, None) if hooks is None else hooks(i, base)
        # one layer: the cost model (with --regions a chip's tiles are its time: the tile-first greedy) and, for a
        # load-balanced dynamic tiling, the rows each shard sends every expert
        tile_n = None if dynamic else build["tile_n"]
        chip_of = place_experts(counts, ep, placement, tile_n, None if stack or regions is not None else expert_cost(
            shard, tile_n, tile_f, build["compute_bw"], sh.system), shard_rows(routing, len(counts), ep)
            if not stack and tile_n is None and placement == "load-balanced" else None)
        members = None if regions is None else region_members(chip_of, ep, regions)
        for t in range(width):
            dedicated, shared = expert_ffns(shard, tile_n=build["tile_n"], tile_f=tile_f, dynamic=dynamic, bw=bw,
                                            packing_compute_bw=build["packing_compute_bw"],
                                            prefix=f"layer{i}." if stack else "", suffix="" if tp is None else f".{t}")

            def ffns(g, packed, counts=counts, members=members, dedicated=dedicated):  # regions: time-multiplexed
                if members is not None:
                    return _timeshared_ffns(g, packed, model, regions, tile_f, dynamic, counts, bw, members,
                                            lanes=lanes)
                if lanes == 1:
                    return dedicated(g, packed)
                return [_expert_ffn(g, packed[e], e, model, tile_f, dynamic, bw, lanes=lanes)
                        for e in range(model.experts)], {}, {}

            if shared is not None and lanes != 1:  # one layer without tp (a mapped chip's schedule)
                shared = _shared_lanes(model, lanes, build["tile_n"], tile_f, build["packing_compute_bw"], bw)
            before = len(sh.g.ops)
            layer_chip, layer_bindings, bounds, rows = build_sharded(
                sh.g, shard, routing, chip_of, ep, ffns=ffns, shared_ffn=shared, micro_batches=micro_batches,
                region_chip=None if members is None else [chip_of[m[0]] for m in members],
                home_in=home_in if tp is None or home_in is None else lambda s, n, t=t: home_in(s, n, t),
                home_out=home_out if tp is None else lambda grp, summed, t=t: partials.__setitem__((grp, t), summed),
                prefix=f"layer{i}." if stack else "", **build)
            sh.op_chip.update({op.id: base + layer_chip[op.id] * width + t for op in sh.g.ops[before:]})
            if stack:
                relabel(sh.g.ops[before:], i)
            bindings.update(layer_bindings)
            tile_rows.update(rows)
        expert_chips.append(chip_of)
    for grp in range(ep if tp is not None else 0):  # --tp: each group's partial sums all-reduced, then stored
        start, group = len(sh.g.ops), [grp * tp + t for t in range(tp)]
        reduced = all_reduce_partials(sh.g, GroupNetwork(sh.net, group), tp, lambda t, grp=grp: partials[(grp, t)],
                                      bounds[grp + 1] - bounds[grp], algorithm=algorithm,
                                      compute_bw=build["compute_bw"], prefix=f"allreduce.g{grp}.")
        for (t, k), stream in sorted(reduced.items()):
            before = len(sh.g.ops)
            if store is None:
                LinearOffChipStore(sh.g, stream, tensor_name=f"y{grp * tp + t}.{k}")
            else:
                store(grp, t, k, stream)
            for op in sh.g.ops[before:]:
                op.chip = t
        sh.place_ranked(start, group)  # the builders placed them by rank within the group (op.chip)
    if tp is not None:
        sh.delivered()
    named = {} if algorithm is None else {"algorithm": algorithm}
    if stack:
        r = sh.finish(bindings)
        params = {"layers": len(routings), "micro_batches": micro_batches, **({"pp": pp} if pp else {}), "ep": ep,
                  "placement": placement, **named, "system": r["system"], "shard_bounds": bounds,
                  "expert_chips": expert_chips, "links_used": r["links_used"], "link_bytes": r["link_bytes"]}
        return params, bindings, tile_rows
    r = sh.finish(bindings)
    tokens = chip_tokens(counts, chip_of, ep)  # the token rows every chip's experts receive
    busiest, mean = max(range(ep), key=lambda c: (tokens[c], -c)), sum(tokens) / ep
    r.update(tokens=tokens, busiest=busiest, imbalance=round(tokens[busiest] / mean, 6) if mean else 1.0)
    if tp is not None:
        params = {"ep": ep, "tp": tp, "placement": placement, "algorithm": algorithm, "system": r["system"],
                  "expert_chips": [grp * tp for grp in chip_of], "shard_bounds": bounds,
                  "chip_tokens": [r["tokens"][p // tp] for p in range(tp * ep)], "busiest_chip": r["busiest"] * tp,
                  "imbalance": r["imbalance"], "links_used": r["links_used"], "link_bytes": r["link_bytes"]}
        return params, bindings, tile_rows
    params = {"ep": ep, "placement": placement, "system": r["system"], "expert_chips": chip_of,
              "shard_bounds": bounds, "chip_tokens": r["tokens"], "busiest_chip": r["busiest"],
              "imbalance": r["imbalance"], "links_used": r["links_used"], "link_bytes": r["link_bytes"]}
    return {**params, **({} if members is None else {"region_experts": members}), **named}, bindings, tile_rows


def _shared_lanes(model, lanes: int, tile_n, tile_f: int, packing_compute_bw: int, bw: dict):
    """``shared(g, tokens, rows)`` of :func:`expert_parallel` with the shared experts over ``lanes`` column stripes:
    stripe ``j`` the shared FFN of columns ``[j Fs/lanes, (j+1) Fs/lanes)`` of the gate and up weights and those rows
    of the down weights (tensors ``shared_<part>.lane<j>``), on the chip's token rows, the stripes' partial outputs
    summed by a tree of Adds, as a routed expert's lanes are (:func:`~stepsim.workloads.moe.stage._expert_ffn`):
    each stripe's loads stream on their own, so the weights arrive ``lanes`` times as fast; the bytes are the same.
    A stripe is never narrower than ``tile_f`` (fewer stripes then)."""
    import dataclasses

    from stepsim.workloads.moe.stage import DEFAULT_TILE_N, shared_ffn, sum_tree

    width = model.shared_intermediate
    stripes = max(n for n in range(1, lanes + 1) if width % (n * tile_f) == 0)
    stripe = dataclasses.replace(model, shared_intermediate=width // stripes)

    def shared(g, tokens, rows):
        return sum_tree(g, [shared_ffn(g, tokens, stripe, rows, tile_n or DEFAULT_TILE_N, tile_f, packing_compute_bw,
                                       bw, suffix=f".lane{j}") for j in range(stripes)], bw)
    return shared


def check_tp_ep(tp: int, ep: int, batch: int, system) -> None:
    """One-line ArgumentError unless every chip's shard of the batch splits into ``tp`` all-reduce chunks and the
    system has ``tp x ep`` chips."""
    from stepsim.base.errors import ArgumentError

    check_chips("--tp", tp)
    check_chips("--ep", ep, " with --tp")
    if batch % (tp * ep):
        raise ArgumentError(f"--tp {tp} --ep {ep}: each of the {ep} expert groups' shards of the batch is cut into "
                            f"{tp} all-reduce chunks; the batch of {batch} tokens must be a multiple of {tp * ep}")
    if system is not None and system.chips != tp * ep:
        raise ArgumentError(f"--tp {tp} --ep {ep} needs a system of {tp * ep} chips (tp x ep); system "
                            f"{system.name!r} has {system.chips}")


def tp_ep_system(model, tp: int, ep: int, batch: int, system, tile_f: int):
    """The system of ``--tp N --ep M`` (``tp x ep`` chips: :func:`~stepsim.workloads.chips.chips_system`), after
    :func:`check_tp_ep` and the one-line check that every expert's columns split into whole ``tile_f`` tiles."""
    from stepsim.workloads.chips import chips_system

    check_tp_ep(tp, ep, batch, system)
    check_columns(tp, {"intermediate": model.intermediate, "shared intermediate": model.shared_intermediate}, tile_f)
    return chips_system(tp * ep, system, "--tp x --ep")


def expert_tensor_parallel(sh: Sharding, model, routing, tp: int, ep: int, placement: str, algorithm: str,
                           **kw) -> tuple[dict, dict, dict]:
    """``--tp N --ep M`` (one layer; the system: :func:`tp_ep_system`): :func:`expert_parallel` with ``tp``."""
    return expert_parallel(sh, model, [routing], ep, placement, stack=False, tp=tp, algorithm=algorithm, **kw)


def pipeline_graph(workload, pp: int, part_of, system=None):
    """``--pp P`` on a built workload (graph in, graph out): any kind's graph, an ONNX-lowered one too, placed in
    P stages on P chips with every cross-chip edge a transfer (module docstring, steps 2, 3 and 6).

    ``part_of(op)`` names the part an operator belongs to (a layer: an ONNX node name's prefix,
    :func:`stepsim.frontend.layers.part_of`), or None: the parts in graph order are cut into P stages of equal
    size, stage s on chip s. An operator of no part goes where its data is: a store (and whatever reads a stream)
    on its first input's chip, a load of a graph input on its first reader's. ``system``: P chips (default: fully
    connected, :func:`~stepsim.workloads.chips.chips_system`). The workload's graph is placed in place (it must
    not have been lowered); returns a workload of that graph whose params add ``pp`` and :meth:`Sharding.finish`'s
    report of the links. One-line ArgumentError for a bad ``pp`` or parts that do not split into P stages."""
    import copy

    from stepsim.base.errors import ArgumentError
    from stepsim.workloads.chips import chips_system

    g = workload.graph
    parts = list(dict.fromkeys(p for p in map(part_of, g.ops) if p is not None))
    check_chips("--pp", pp)
    if not parts or len(parts) % pp:
        raise ArgumentError(f"--pp {pp}: the graph's {len(parts)} parts (layers) must split into {pp} stages of "
                            f"equal size (a multiple of {pp})")
    sh = Sharding(g, chips_system(pp, system, "--pp"))
    stage_of = {p: i // (len(parts) // pp) for i, p in enumerate(parts)}
    for op in g.ops:  # a part's operators on its stage's chip; a store of no part after its producer
        part = part_of(op)
        if part is not None or op.inputs:
            sh.op_chip[op.id] = stage_of[part] if part is not None else sh.op_chip.get(op.inputs[0].op.id, 0)
    for (pid, _), uses in g.consumers().items():  # a load of no part (a graph input) on its first reader's chip
        sh.op_chip.setdefault(pid, sh.op_chip.get(uses[0][0].id, 0))
    for op in g.ops:
        sh.op_chip.setdefault(op.id, 0)
    out = copy.copy(workload)
    out.params = {**workload.params, "pp": pp, **sh.finish(workload.bindings)}
    return out
