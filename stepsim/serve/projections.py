"""A mapped step's projections, router and LM head on the engine, and its weights streamed ahead (docs/serving.md §9).

With ``schedule="auto"`` (one chip, or each chip of a system: :func:`step_pieces`),
:class:`~stepsim.serve.exact.EngineLatency` prices every weight matrix of a
step on the cycle engine instead of in closed form at the HBM's peak: per layer the fused q/k/v projection
(``d x (h_q + 2 H) hd``), the o projection (``h_q hd x d``) and an MoE model's router (``d x E``) over the step's
tokens (an MLA layer's own matrices instead of q/k/v and o: :func:`stepsim.models.layers.mla_matrices`), and the LM
head (``d x vocab``) over one row per sequence (the logits of its last token; in a model served layer group by
layer group, by its first group only). Each is the
``projection`` kind (:mod:`stepsim.mapping.projection`), built with the schedule mapped at its bucket and simulated
at the step's exact token count (:func:`projection_cost`, memoised and stored in the mapping cache). The embedding rows stay a closed-form read.

**Weights streamed ahead** (the paper's configuration time-multiplexing): a step is the sequence of its pieces,
per layer ``qkv`` (MLA's ``qkv_a, q_b, kv_b``), ``attention, o, router, ffn``, then the LM head (:func:`step_pieces`). A piece leaves the HBM idle for
``t - ceil(reads / peak)`` of its ``t`` cycles (``reads``: the bytes it still reads itself); in that time the weights
of the pieces after it stream into the on-chip memory it leaves free (the capacity less its own on-chip bytes and
the bytes already streamed ahead and still held), in order, each piece up to its weights. A piece that finds ``b``
of its bytes on chip takes ``t = c - min(floor(b / peak), c - ceil(flops / peak FLOPs))`` cycles instead of its
engine cycles ``c``: the bytes no longer read, at the HBM's peak, never below its FLOPs at the chip's peak. Its
bytes held are freed when it starts. A prefill attention (mapped over every KV head, its on-chip bytes not taken
into account) neither streams ahead nor is streamed into. :func:`stream_ahead` is the whole model (a test checks it by hand).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from stepsim.base.files import stable_hash

#: bf16 bytes per weight
DTYPE_BYTES = 2


@dataclass(frozen=True)
class Piece:
    """One piece of a step in run order: its engine cycles ``cycles`` with its weights read from HBM, the bytes it
    reads from HBM (``hbm_bytes``, its weights among them), the weight bytes that may stream in ahead
    (``weight_bytes``), its on-chip bytes while it runs, its FLOPs, and whether it takes part in streaming ahead."""

    name: str
    cycles: int
    hbm_bytes: int
    weight_bytes: int
    on_chip_bytes: int
    flops: int
    streams: bool = True
    #: ``projection`` (a projection, router or LM head), ``attention``, ``ffn`` or ``collective`` (a system's
    #: all-reduce, counted with the attention)
    kind: str = "projection"


@dataclass(frozen=True)
class Streamed:
    """A piece's place in the step: cycles after streaming ahead, bytes it found on chip, cycles saved."""

    name: str
    start: int
    cycles: int
    prefetched_bytes: int
    saved: int


def stream_ahead(pieces: list[Piece], capacity_bytes: int, peak_bytes: int, peak_flops: int) -> list[Streamed]:
    """Each piece's cycles when the weights of later pieces stream in while earlier ones run (module docstring);
    integers throughout."""
    prefetched = [0] * len(pieces)
    held, now, out = 0, 0, []
    front = 0  # pieces stream ahead in order: every streaming piece before ``front`` (after the running one) is full
    for k, p in enumerate(pieces):
        b = prefetched[k]
        held -= b
        floor = -(-p.flops // peak_flops)
        saved = min(b // peak_bytes, max(0, p.cycles - floor)) if b else 0
        t = p.cycles - saved
        out.append(Streamed(p.name, now, t, b, saved))
        now += t
        if not p.streams:
            continue
        idle = t - -(-max(0, p.hbm_bytes - b) // peak_bytes)
        budget = min(max(0, idle) * peak_bytes, max(0, capacity_bytes - p.on_chip_bytes - held))
        front = max(front, k + 1)
        while budget > 0 and front < len(pieces):
            q = pieces[front]
            more = min(budget, q.weight_bytes - prefetched[front]) if q.streams else 0
            prefetched[front] += more
            held += more
            budget -= more
            if budget > 0:  # this piece is full (or takes none): the next
                front += 1
    return out


def projection_shapes(model, vocab: int) -> tuple[list[tuple[str, int, int]], tuple[str, int, int]]:
    """``(per layer [(name, d_in, d_out)], LM head (name, d_in, d_out))`` (module docstring)."""
    d, hd = model.hidden, model.head_dim
    layer = [("qkv", d, (model.heads + 2 * model.kv_heads) * hd), ("o", model.heads * hd, d)]
    if model.is_moe:
        layer.append(("router", d, model.experts))
    return layer, ("lm_head", d, vocab)


def provider_projections(provider) -> tuple[list[tuple[str, int, int]], tuple[str, int, int] | None]:
    """``(per layer [(name, d_in, d_out)], LM head or None)``: the matrices one chip of ``provider`` multiplies a
    step's tokens by. The layer its chip runs (``provider.spec.model``: a system's tensor-parallel shard), its
    attention's matrices replaced by ``provider.attention_matrices`` when they are not its q/k/v and o (an MLA
    layer group's, :func:`stepsim.models.layers.mla_matrices`, whose engine model is multi-query attention over the
    latent); the LM head's ``ceil(vocab / chips)`` rows, or None when another layer group counts it
    (``provider.counts_head``, :func:`stepsim.serve.layer_list.count_weights_once`)."""
    layer, head = projection_shapes(provider.spec.model, -(-provider.vocab // provider.chips))
    if provider.attention_matrices is not None:
        layer = [*provider.attention_matrices, *(m for m in layer if m[0] == "router")]
    return layer, head if provider.counts_head else None


def expert_parallel(provider) -> bool:
    """Whether ``provider`` runs an MoE model's expert-parallel chips (``provider.spec.system``: its attention's heads
    split, its MoE block over the chips; :class:`stepsim.serve.system.SystemEngineLatency`)."""
    return provider.spec.system is not None


def matrix_rows(provider, name: str, tokens: int) -> int:
    """The rows one chip of ``provider`` multiplies matrix ``name`` by in a step of ``tokens`` tokens: every token,
    but on an MoE model's expert-parallel chips (``provider.spec.system``) the router takes the chip's shard of the
    tokens, ``ceil(tokens / n)`` (:func:`step_pieces`)."""
    if name == "router" and expert_parallel(provider):
        return -(-tokens // provider.chips)
    return tokens


def padded_tokens(tokens: int, d_in: int, d_out: int, hardware) -> int:
    """The token count of the graph ``tokens`` tokens are built into: ``ceil(tokens / tile_m)`` tiles of the
    ``tile_m`` rows their bucket's schedule takes, the last one zero-padded
    (:func:`stepsim.mapping.projection.build_projection`). The graph depends on the count only through that schedule
    and those tiles (its name aside), so every count of the bucket with as many tiles has one cost: the padded count
    stays in the bucket (``tile_m`` is a power of two dividing it) and stands for all of them. A whole-trace replay
    meets thousands of counts and a few hundred padded ones (tests/serve/test_projection_costs.py checks the costs
    equal)."""
    return _padded(tokens, _bucket_schedule(tokens, d_in, d_out, _hardware_key(hardware), hardware)[1])


def _padded(tokens: int, tile_m: int) -> int:
    return -(-int(tokens) // tile_m) * tile_m


_BUCKETS: dict = {}


def _bucket_schedule(tokens: int, d_in: int, d_out: int, hardware_key: tuple, hardware) -> tuple[str, int]:
    """``(hash of its key material, tile_m)`` of the schedule mapped at ``tokens``' bucket, memoised per process: a
    whole-trace replay prices thousands of token counts in a few dozen buckets, and working both out again for each
    count (a schedule look-up and a hash) was a third of the one-chip Qwen3 replay's table fills (0.6 of 2.4 s)."""
    from stepsim.mapping.mapper import bucket
    from stepsim.mapping.projection import key_material, projection_schedule

    size = bucket(tokens)
    key = (size, d_in, d_out, hardware_key)
    if key not in _BUCKETS:
        _BUCKETS[key] = (stable_hash(key_material(size, d_in, d_out, hardware)),
                         projection_schedule(tokens, d_in, d_out, hardware).knobs["tile_m"])
    return _BUCKETS[key]


def _hardware_key(hardware) -> tuple:
    return tuple(sorted(hardware.values().items())), hardware.explicit


def cost_material(tokens: int, d_in: int, d_out: int, hardware) -> dict:
    """What a projection's cost at ``tokens`` tokens depends on: the key of the schedule mapped at their bucket (its
    projection code, timing model and hardware) and their :func:`padded_tokens` count (its hash names the cost's
    file)."""
    schedule_key, tile_m = _bucket_schedule(tokens, d_in, d_out, _hardware_key(hardware), hardware)
    return {"what": "projection cost", "schedule_key": schedule_key, "tokens": _padded(tokens, tile_m)}


_COSTS: dict = {}
#: the mapping cache's subfolder of projection costs (its top level holds schedules only: the seed tools read it)
COST_FOLDER = "projection-costs"


def projection_cost(tokens: int, d_in: int, d_out: int, hardware) -> tuple[int, int, int, int]:
    """``(cycles, HBM bytes, on-chip bytes, FLOPs)`` of the projection at exactly ``tokens`` tokens, built with the
    schedule mapped at their bucket (:func:`stepsim.mapping.projection.projection_schedule`) and simulated on the
    engine once for every count with the same :func:`padded_tokens`; memoised per process by that padded count (the
    counts of a padded count share its material, hence its stored file: reading it once for each count was half of
    the one-chip Qwen3 whole-trace replay's table fills, 1.2 of 2.4 s) and stored in the mapping cache's
    :data:`COST_FOLDER` (:mod:`stepsim.serve.stored_costs`), so worker processes and later runs do not simulate it
    again (a plan's replays price thousands of token counts: 42.6 of a 49.5 s plan were these simulations, paid
    again by every worker)."""
    from stepsim.serve.stored_costs import stored_cost

    hardware_key = _hardware_key(hardware)
    padded = _padded(tokens, _bucket_schedule(tokens, d_in, d_out, hardware_key, hardware)[1])
    memo_key = (padded, d_in, d_out, hardware_key)
    if memo_key not in _COSTS:
        material = cost_material(padded, d_in, d_out, hardware)
        _COSTS[memo_key] = stored_cost(COST_FOLDER, material, "projection cost", 4,
                                       lambda: _simulate_cost(material["tokens"], d_in, d_out, hardware))
    return _COSTS[memo_key]


def _simulate_cost(tokens: int, d_in: int, d_out: int, hardware) -> tuple[int, int, int, int]:
    from stepsim.mapping.mapper import _simulate
    from stepsim.mapping.projection import mapped_projection, projection_schedule
    from stepsim.mapping.units import usage

    schedule = projection_schedule(tokens, d_in, d_out, hardware)
    workload, units = mapped_projection(tokens, d_in, d_out, schedule.knobs, hardware)
    use = usage(workload, hardware, units)
    return (int(_simulate(workload, hardware)), int(use.off_chip_bytes), int(use.on_chip_bytes), int(use.flops))


def _projection_piece(name: str, tokens: int, d_in: int, d_out: int, hardware) -> Piece:
    cycles, hbm, on_chip, flops = projection_cost(tokens, d_in, d_out, hardware)
    return Piece(name, cycles, hbm, d_in * d_out * DTYPE_BYTES, on_chip, flops)


def astuple_fields(p: Piece) -> tuple:
    """A piece's fields after its name."""
    return (p.cycles, p.hbm_bytes, p.weight_bytes, p.on_chip_bytes, p.flops, p.streams, p.kind)


def ffn_traffic(model, tokens: int, tiles: int, active: int, tile_n: int) -> tuple[int, int, int]:
    """``(HBM bytes, weight bytes, FLOPs)`` of one layer's mapped FFN (static tiling at ``tile_n`` tokens a tile) with
    ``tiles`` expert tiles and ``active`` experts touched (a dense FFN: one expert, ``ceil(tokens / tile_n)`` tiles):
    each expert's three matrices once per tile of its tokens (the shared experts once per tile of every token), the
    token rows in (bf16) and out (fp32); weights that may stream ahead: each touched expert's and the shared ones once."""
    d = model.hidden
    if model.is_moe:
        moe = model.moe
        per_expert, shared = 3 * d * moe.intermediate * DTYPE_BYTES, 3 * d * moe.shared_intermediate * DTYPE_BYTES
        weights = active * per_expert + shared
        reads = tiles * per_expert + (-(-tokens // tile_n)) * shared
        flops = 2 * tokens * (model.top_k * 3 * d * moe.intermediate + 3 * d * moe.shared_intermediate)
    else:
        weights = 3 * d * model.dense_intermediate * DTYPE_BYTES
        reads = -(-tokens // tile_n) * weights
        flops = 2 * tokens * 3 * d * model.dense_intermediate
    return reads + tokens * d * (DTYPE_BYTES + 4), weights, flops


def ep_block_traffic(model, routing, chips: int, tile_n: int) -> tuple[int, int, int]:
    """``(HBM bytes, weight bytes, FLOPs)`` of the busiest chip's share of one layer's expert-parallel block
    (``model``: the MoE dimensions, :attr:`~stepsim.serve.layers.LayerSpec.ffn_model`; ``routing`` ``[tokens, top_k]``
    expert ids; static tiling at ``tile_n``, the knobs its bucket's search gave,
    :func:`stepsim.mapping.expert_parallel.ep_schedule`). The
    experts are contiguous on the ``chips`` (``E / n`` a chip) and the tokens sharded as
    :func:`stepsim.workloads.moe.sharded.shard_bounds` shards them (the first ``tokens mod n`` chips one more). The
    busiest chip is the one with the most expert tiles (the lowest on a tie): its experts' three matrices once per tile
    of the rows they receive, its shared experts once per tile of its shard, its shard's rows in (bf16) and out
    (fp32); weights that may stream ahead: each of its touched experts' and its shared ones once. Other chips read
    less, so the block waits for this one (the fast model's regressors carry its tiles too,
    :func:`stepsim.serve.fast_mapped_ep.ep_loads`)."""
    from stepsim.workloads.moe.sharded import shard_bounds

    d = model.hidden
    per_expert = 3 * d * model.intermediate * DTYPE_BYTES
    shared = 3 * d * model.shared_intermediate * DTYPE_BYTES
    counts = np.bincount(np.asarray(routing).ravel(), minlength=model.experts).reshape(chips, -1)
    tiles = (-(-counts // tile_n)).sum(axis=1)
    chip = int(np.argmax(tiles))
    bounds = shard_bounds(len(routing), chips)
    shard = bounds[chip + 1] - bounds[chip]
    rows, active = int(counts[chip].sum()), int((counts[chip] > 0).sum())
    reads = int(tiles[chip]) * per_expert + -(-shard // tile_n) * shared + shard * d * (DTYPE_BYTES + 4)
    weights = active * per_expert + (shared if shard else 0)
    flops = 2 * 3 * d * (rows * model.intermediate + shard * model.shared_intermediate)
    return reads, weights, flops


def ep_block_on_chip(spec, tokens: int) -> int:
    """On-chip bytes a chip holds while running the expert-parallel block of ``tokens`` tokens (``spec``: the layers of
    a system's chips, :class:`~stepsim.serve.layers.LayerSpec`): those of the one-chip schedule of the block a chip
    holds at their bucket (:func:`~stepsim.mapping.expert_parallel.chip_block`, the proxy the block's knobs come from,
    :func:`~stepsim.mapping.expert_parallel.ep_knobs`; the regions searched on the system change its buffers
    little beside the weights' tiles)."""
    from stepsim.mapping import schedule_for
    from stepsim.mapping.expert_parallel import chip_block
    from stepsim.mapping.mapper import bucket

    dims, proxy_tokens = chip_block(bucket(tokens), spec.ffn_model, spec.system.chips)
    return schedule_for("ffn", proxy_tokens, dims, spec.hardware).on_chip_bytes


def routing_loads(routing, experts: int, tile_n: int) -> tuple[int, int]:
    """``(expert tiles, active experts)`` of one layer's routing ``[tokens, top_k]`` at ``tile_n`` tokens a tile."""
    counts = np.bincount(np.asarray(routing).ravel(), minlength=experts)
    return int((-(-counts // tile_n)).sum()), int((counts > 0).sum())


def ffn_tile_n(provider, tokens: int) -> tuple[int, int]:
    """``(tile_n, on-chip bytes)`` of the FFN schedule mapped at ``tokens``' bucket."""
    from stepsim.mapping import schedule_for
    from stepsim.mapping.kinds import layer_dims

    schedule = schedule_for("ffn", tokens, layer_dims("ffn", provider.spec.model), provider.hardware)
    return schedule.knobs["tile_n"], schedule.on_chip_bytes


def step_pieces(provider, batch, decode: tuple | None, prefill: int | None, ffn: list) -> list[Piece]:
    """The pieces of a mapped step in run order on one chip (module docstring). ``decode``: ``(cycles a layer, KV
    lengths of the decoding requests, its schedule's on-chip bytes)``; ``prefill``: the prefill attention's cycles a
    layer (every KV head); ``ffn``: per layer ``(cycles, expert tiles, active experts)`` (a dense model: one entry for
    every layer).

    On a system's tensor-parallel chips (``provider.chips`` > 1) the pieces are one chip's: the layer its shard
    (``provider.spec.model``: its query and KV heads, its FFN columns), the LM head's ``ceil(vocab / n)`` rows (split
    by vocabulary, as Megatron's vocab-parallel head), and after the o projection and after the FFN the ring
    all-reduce of the step's activations (``provider.allreduce_cycles(batch)`` cycles, HBM idle: the next weights
    stream in meanwhile, as a dataflow compiler overlaps communication with the next layer's loads).

    An MoE model's chips (``provider.spec.system``: the attention's heads split, the MoE block by expert
    parallelism, :class:`stepsim.serve.system.SystemEngineLatency`) all-reduce after the o projection only (the
    block combines its tokens by all-to-all), each chip routes its shard of the tokens (``ceil(tokens / n)``
    rows through the whole router), and the block's ``ffn`` entries are ``(cycles, HBM bytes, weight bytes, FLOPs)``
    of its busiest chip (:func:`ep_block_traffic`): its experts' weights stream ahead into that chip as one chip's
    FFN's do, and the next pieces' weights stream in while the block leaves that chip's HBM idle. (Until 2026-11-27
    the block neither streamed ahead nor was streamed into.)"""
    model, hardware = provider.spec.model, provider.hardware
    tokens = int(sum(batch.new_tokens))
    on_ep_chips = expert_parallel(provider)
    layer_shapes, head = provider_projections(provider)
    allreduce = provider.allreduce_cycles(batch)
    collective = [Piece("all-reduce", allreduce, 0, 0, 0, 0, kind="collective")] if allreduce else []
    hd, kv_heads, heads = model.head_dim, model.kv_heads, model.heads
    attention = []
    if decode is not None:
        cycles, context, on_chip = decode
        context = np.asarray(context, dtype=np.int64)
        reads = int((-(-(context + 1) // 32) * 32).sum()) * 2 * kv_heads * hd * DTYPE_BYTES
        flops = 4 * heads * hd * int((context + 1).sum())
        attention.append(Piece("decode attention", int(cycles), reads, 0, on_chip, flops, kind="attention"))
    if prefill is not None:
        attention.append(Piece("prefill attention", int(prefill), 0, 0, 0, 0, streams=False, kind="attention"))
    if on_ep_chips:
        ffn_on_chip = ep_block_on_chip(provider.spec, tokens)
    else:
        tile_n, ffn_on_chip = ffn_tile_n(provider, tokens)
    base = {name: _projection_piece(name, matrix_rows(provider, name, tokens), d_in, d_out, hardware)
            for name, d_in, d_out in layer_shapes}
    pieces = []
    for layer in range(model.layers):
        named = {name: Piece(f"layer {layer} {name}", *astuple_fields(p)) for name, p in base.items()}
        pieces.extend(p for name, p in named.items() if name not in ("o", "router"))  # the attention's inputs
        pieces.extend(Piece(f"layer {layer} {p.name}", p.cycles, p.hbm_bytes, 0, p.on_chip_bytes, p.flops, p.streams,
                            "attention") for p in attention)
        pieces.append(named["o"])
        pieces.extend(Piece(f"layer {layer} {p.name}", *astuple_fields(p)) for p in collective)
        if "router" in named:
            pieces.append(named["router"])
        if on_ep_chips:
            cycles, reads, weights, flops = ffn[layer]
        else:
            cycles, tiles, active = ffn[layer] if model.is_moe else ffn[0]
            reads, weights, flops = ffn_traffic(model, tokens, tiles, active, tile_n)
        pieces.append(Piece(f"layer {layer} ffn", int(cycles), reads, weights, ffn_on_chip, flops, kind="ffn"))
        pieces.extend(Piece(f"layer {layer} {p.name}", *astuple_fields(p)) for p in collective)
    if head is not None:
        name, d_in, d_out = head
        pieces.append(_projection_piece(name, len(batch.new_tokens), d_in, d_out, hardware))
    return pieces


def engine_pieces(provider, batch, tasks: list, results: list) -> list[Piece]:
    """:func:`step_pieces` of the exact provider's layer tasks and their engine results
    (:meth:`stepsim.serve.exact.EngineLatency.tasks`)."""
    from stepsim.mapping import schedule_for
    from stepsim.mapping.kinds import layer_dims
    from stepsim.serve.layers import piece_dims

    model = provider.spec.model  # the layer one chip runs
    decode = prefill = None
    ffn = []
    on_ep_chips = expert_parallel(provider)  # the block's busiest chip's traffic (step_pieces)
    tokens = int(sum(batch.new_tokens))
    if on_ep_chips:  # the knobs the block was built with
        from stepsim.mapping.expert_parallel import ep_schedule

        spec = provider.spec
        tile_n = ep_schedule(tokens, spec.ffn_model, spec.system, spec.hardware)[0]["tile_n"]
    else:
        tile_n, _ = ffn_tile_n(provider, tokens)
        experts = layer_dims("ffn", model).experts
    for (kind, data), result in zip(tasks, results):
        cycles = int(result[0])
        if kind == "decode":
            on_chip = schedule_for("decode", len(data), piece_dims("decode", model), provider.hardware).on_chip_bytes
            decode = (cycles, data[: len(data) // model.kv_heads], on_chip)
        elif kind == "prefill":  # mapped: every KV head's chunks in one attention (EngineLatency.tasks)
            prefill = cycles
        else:
            ffn.append((cycles, *ep_block_traffic(provider.spec.ffn_model, data, provider.chips, tile_n)) if on_ep_chips
                       else (cycles, *routing_loads(data, experts, tile_n)))
    return step_pieces(provider, batch, decode, prefill, ffn)
