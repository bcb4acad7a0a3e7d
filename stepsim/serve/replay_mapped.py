"""The compiled replay's pricing on mapped layers (the kernel :mod:`stepsim.kernels.serve_mapped`) of
:class:`~stepsim.serve.fast_mapped.MappedFastLatency` once calibrated (one chip) and of a system's mapped chips
(:class:`~stepsim.serve.system_fast.MappedSystemFastLatency`, a dense model's tensor-parallel shards;
:class:`~stepsim.serve.fast_mapped_ep.MappedEPFastLatency`, an MoE model's expert-parallel chips): its constants as
flat arrays, and the tables of what the mapper and the engine give (each bucket's schedule, the projections' and the
all-reduce's cycles at each token count), filled from the provider's own functions when the kernel asks
(:func:`fill`), so every number is the one the provider would use. :func:`note_buckets` counts the run's buckets as
the provider's ``layer_use.note`` does.

:func:`mapped_parameters` returns None (the Python loop replays) for a provider this does not reproduce: another
subclass, a recorder other than a calibration's reservoir, a routing dump, experts that do not split evenly over the
chips, coefficients of other widths; :func:`fill` raises :class:`Unsupported` where a table entry is not what the
kernel can use exactly (then the Python loop replays too, and raises the provider's own error where it has one).
"""

from __future__ import annotations

import numbers
from collections.abc import Callable

import numpy as np

#: widest decode region count the kernel's scratch holds (a bucket mapped with more: the Python loop)
MAX_REGIONS = 4096
#: token counts the projection table holds at first (it grows to the largest step)
FIRST_TOKENS = 1024


class Unsupported(Exception):
    """A table entry the kernel cannot use exactly (its message says which)."""


def _integer(value, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (numbers.Integral, np.integer)) or not 0 <= value < 1 << 53:
        raise Unsupported(f"{what} is {value!r}, not an integer in 0..2^53")
    return int(value)


def recordable(provider) -> bool:
    """Whether the compiled replay can feed ``provider``'s calibration recorder: none, or a
    :class:`~stepsim.serve.fast.Reservoir` (:meth:`stepsim.serve.replay_compiled.CompiledLoop._record` offers it
    every step as the provider's own ``__call__`` does). Here, not in the pricing's modules: the calibrations'
    cache keys hash those (stepsim/serve/calibration_cache.py), and feeding the recorder changes no price."""
    from stepsim.serve.fast import Reservoir

    return provider.recorder is None or type(provider.recorder) is Reservoir


def mapped_parameters(provider, kr) -> dict | None:
    """The mapped provider's constants and (empty) tables as the kernel takes them, or None."""
    from stepsim.kernels import serve_mapped as sm
    from stepsim.serve import fast as model_of_steps
    from stepsim.serve import projections
    from stepsim.serve.fast_mapped import FFN_COLUMNS, MappedFastLatency
    from stepsim.serve.fast_mapped_ep import EP_COLUMNS, MappedEPFastLatency
    from stepsim.serve.projections import DTYPE_BYTES, provider_projections
    from stepsim.serve.routing import SyntheticRouting
    from stepsim.serve.system_fast import MappedSystemFastLatency
    from stepsim.workloads.moe.parallel import place_experts

    provider_type = type(provider)
    if provider_type not in (MappedFastLatency, MappedSystemFastLatency, MappedEPFastLatency) \
            or not recordable(provider):
        return None
    model, hardware, spec = provider.model, provider.hardware, provider.spec
    # one chip's layer is the model's; a system's chips each run a shard of the attention (spec.model): a dense
    # model's tensor-parallel chips all-reduce twice a layer, an MoE model's expert-parallel ones once (its block
    # combines its tokens by all-to-all)
    expert_parallel = provider_type is MappedEPFastLatency
    one_chip = provider_type is MappedFastLatency
    if one_chip == (provider.chips > 1) or (one_chip and spec.model != model):
        return None
    if expert_parallel != projections.expert_parallel(provider):
        return None
    if expert_parallel and (not model.is_moe or model.experts % provider.chips
                            or place_experts([0] * model.experts, provider.chips, "contiguous")
                            != [e // (model.experts // provider.chips) for e in range(model.experts)]):
        return None  # the kernel places the experts contiguously, an equal share a chip (ep_loads)
    if (not provider.streams_weights or spec.hardware != hardware or provider.layer_use is None
            or spec.schedule != "auto"):
        return None
    if provider.attention_matrices is not None or not provider.counts_head:  # a layer group's: its own matrices
        return None
    if model.is_moe and type(provider.routing) is not SyntheticRouting:
        return None
    roofline = provider.roofline
    if roofline.embedding_bytes != provider.embedding_bytes:
        return None
    forms = provider.forms or {}  # the decode attention's bounds; the mapped prefill's regressors use none
    if "decode" not in forms or len(forms["decode"].off_chip) != 4 or len(forms["decode"].flops) != 4:
        return None
    ffn_width = EP_COLUMNS if expert_parallel else FFN_COLUMNS
    widths = {"decode": 10, "prefill": sm.PREFILL_COLUMNS, "ffn": ffn_width, "ffn_prefill": ffn_width}
    theta = provider.theta or {}
    if not isinstance(theta, dict) or not set(theta) <= set(widths):
        return None
    rows = [theta.get(kind) for kind in model_of_steps.MODELS]  # decode, prefill, ffn, ffn_prefill
    if any(r is not None and not (isinstance(r, (list, tuple)) and len(r) == widths[kind]
                                  and all(isinstance(v, (int, float)) for v in r))
           for kind, r in zip(model_of_steps.MODELS, rows)):
        return None
    values = [hardware.hbm_peak_bytes_per_cycle, hardware.peak_flops_per_cycle, hardware.on_chip_capacity_bytes,
              hardware.clock_hz, provider.vocab]
    if any(isinstance(v, bool) or not isinstance(v, numbers.Integral) or v <= 0 for v in values):
        return None
    theta_rows = np.zeros((4, max(FFN_COLUMNS, EP_COLUMNS)))
    form_rows = np.zeros((6, 6))
    form_rows[0, :4], form_rows[1, :4] = forms["decode"].off_chip, forms["decode"].flops
    pm = np.zeros(sm.M_ROWS, dtype=np.int64)
    for i, r in enumerate(rows):
        if r is not None:
            theta_rows[i, :len(r)] = np.asarray(r, dtype=np.float64)
        pm[sm.M_THETA_LENGTH + i] = -1 if r is None else len(r)
    shard = spec.model  # the layer one chip runs (its heads and FFN columns)
    d, hd = shard.hidden, shard.head_dim
    layer_shapes, head = provider_projections(provider)
    weight = {name: d_in * d_out * DTYPE_BYTES for name, d_in, d_out in [*layer_shapes, head]}
    if model.is_moe:
        moe = model.moe
        per_expert, shared = 3 * d * moe.intermediate * DTYPE_BYTES, 3 * d * moe.shared_intermediate * DTYPE_BYTES
        ffn_flops = 2 * (model.top_k * 3 * d * moe.intermediate + 3 * d * moe.shared_intermediate)
    else:
        per_expert, shared = 0, 3 * d * shard.dense_intermediate * DTYPE_BYTES
        ffn_flops = 2 * 3 * d * shard.dense_intermediate
    experts = spec.ffn_model.experts
    pm[sm.M_LAYERS] = model.layers
    pm[sm.M_KV_HEADS] = shard.kv_heads
    pm[sm.M_HEADS] = shard.heads
    pm[sm.M_MOE] = int(model.is_moe)
    pm[sm.M_EXPERTS] = experts
    pm[sm.M_TILE_SHIFT] = model_of_steps._TILE_SHIFT
    pm[sm.M_FEW] = model_of_steps.FEW_TOKENS
    pm[sm.M_HBM_PEAK] = hardware.hbm_peak_bytes_per_cycle
    pm[sm.M_CAPACITY] = hardware.on_chip_capacity_bytes
    pm[sm.M_PEAK_FLOPS] = hardware.peak_flops_per_cycle
    pm[sm.M_COMPUTE_BW] = model_of_steps.BOUND_COMPUTE_BW
    pm[sm.M_PER_EXPERT] = per_expert
    pm[sm.M_SHARED_W] = shared
    pm[sm.M_FFN_FLOPS] = ffn_flops
    pm[sm.M_ROW_BYTES] = d * (DTYPE_BYTES + 4)
    pm[sm.M_EMBEDDING_BYTES] = provider.embedding_bytes
    pm[sm.M_W_QKV], pm[sm.M_W_O] = weight["qkv"], weight["o"]
    pm[sm.M_W_ROUTER], pm[sm.M_W_HEAD] = weight.get("router", 0), weight["lm_head"]
    pm[sm.M_KV_READ] = 2 * shard.kv_heads * hd * DTYPE_BYTES
    pm[sm.M_DECODE_FLOPS] = 4 * shard.heads * hd
    pm[sm.M_READ_TILE] = 32  # projections.step_pieces reads whole 32-row tiles of the KV cache
    pm[sm.M_CHIPS] = provider.chips  # the embedding rows: a chip's share (exact.streamed_weight_cycles)
    pm[sm.M_ALLREDUCES] = {MappedFastLatency: 0, MappedSystemFastLatency: 2, MappedEPFastLatency: 1}[provider_type]
    pm[sm.M_EP] = int(expert_parallel)
    if model.is_moe:  # projections.ep_block_traffic: a token row through a routed and the shared experts
        pm[sm.M_EXPERT_ROW_FLOPS] = 2 * 3 * d * model.moe.intermediate
        pm[sm.M_SHARED_ROW_FLOPS] = 2 * 3 * d * model.moe.shared_intermediate
    pi = np.zeros(kr.P_ROWS, dtype=np.int64)
    pi[kr.P_MODE] = kr.MAPPED
    pi[kr.P_MOE] = int(model.is_moe)
    pi[kr.P_CLOCK] = hardware.clock_hz
    pi[kr.P_EMBEDDING_BYTES] = roofline.embedding_bytes
    pi[kr.P_FIXED_BYTES] = roofline.fixed_bytes
    pi[kr.P_EXPERT_BYTES] = roofline.expert_bytes
    pi[kr.P_KV_BYTES] = roofline.kv_bytes_per_token
    pi[kr.P_FLOPS_PER_TOKEN] = roofline.flops_per_token
    pi[kr.P_HEAD_FLOPS] = roofline.head_flops
    pi[kr.P_ATTENTION_FLOPS] = roofline.attention_flops
    pi[kr.P_PEAK_BYTES] = roofline.peak_bytes
    pi[kr.P_PEAK_FLOPS] = roofline.peak_flops
    if max(abs(int(v)) for v in (*pi, *pm)) >= kr.EXACT:
        return None
    routing = provider.routing if model.is_moe else None
    if routing is not None:
        if routing._pool is None:
            routing._draw_pool()  # what the first window() does
        ranks, prefix, expert_of_rank = routing._pool
        pool_rows, expert_of_rank = np.ascontiguousarray(ranks), np.ascontiguousarray(expert_of_rank)
        rank_of_expert = routing._perms  # expert_of_rank's inverse, each layer's (SyntheticRouting._draw_pool)
    else:
        pool_rows, prefix = np.zeros((1, 1), dtype=np.int64), np.zeros((1, 2, 1), dtype=np.uint16)
        expert_of_rank = rank_of_expert = np.zeros((1, 1), dtype=np.int64)

    def empty_tables() -> dict:
        return {"proj": np.full((5, 4, FIRST_TOKENS), -1, dtype=np.int64),
                "buckets_i": np.zeros((sm.B_ROWS, 64), dtype=np.int64), "buckets_f": np.zeros((sm.BF_ROWS, 64))}

    memo = price_memo(provider, "mapped", empty_tables)
    pieces = model.layers * 8 + 1
    return {"pi": pi, "forms": form_rows, "theta": theta_rows, "routing": routing, "pool_rows": pool_rows,
            "prefix": prefix, "x": np.zeros((3, max(FFN_COLUMNS, EP_COLUMNS))), "tiles": np.zeros(2, dtype=np.int64),
            "cycles": ("attention", "ffn", "floor", "hidden", "weights"), "hardware": hardware, "roofline": roofline,
            "mapped": {"pm": pm, "buckets_i": memo["buckets_i"], "buckets_f": memo["buckets_f"],
                       "proj": memo["proj"], "memo": memo, "expert_of_rank": expert_of_rank,
                       "rank_of_expert": rank_of_expert,
                       "need": np.zeros(4, dtype=np.int64), "res": np.zeros(sm.R_ROWS, dtype=np.int64),
                       "mloads": np.zeros(2 * MAX_REGIONS, dtype=np.int64),  # loads, then their heap
                       "counts": np.zeros(max(2 * experts, 1), dtype=np.int64),  # counts, then tiles
                       "regions": np.zeros(max(experts, 1), dtype=np.int64),
                       "pc": np.zeros((sm.PC_ROWS, pieces), dtype=np.int64)},
            "provider": provider}


def price_memo(provider, kind: str, make: Callable[[], dict]) -> dict:
    """The tables a compiled replay fills with ``provider``'s step prices of ``kind`` (``"mapped"``: projections
    and buckets; ``"collectives"``: a system's) at each size a step needs, -1 or 0 where not yet priced:
    ``make()``'s, or the ones the providers of one calibration share (``provider.price_memo``, a dict, empty until a
    replay fills it: a plan's :class:`~stepsim.plan.pricing.ShapePricer` makes a fresh provider for each of its
    hundreds of replays, and pricing each step size again cost most of a small replay). The prices depend on the
    provider's model, chips and calibration alone, never on its routing's state, so sharing them changes no
    number (tests/plan/test_plan.py::test_a_shape_pricers_providers_share_their_step_prices)."""
    shared = getattr(provider, "price_memo", None)
    if shared is None:
        return make()
    if kind not in shared:
        shared[kind] = make()
    return shared[kind]


def fill(params: dict) -> None:
    """Fill the tables with what ``params["mapped"]["need"]`` says a step needs: the projections at its tokens
    and the LM head at its sequences (:func:`stepsim.serve.projections.projection_cost`), the FFN bucket of its
    tokens (:func:`~stepsim.serve.fast_mapped.ffn_reference`, :func:`~stepsim.serve.projections.ffn_tile_n`) and
    the decode bucket of its requests (:func:`~stepsim.serve.fast_mapped.schedule_of`, ``schedule_for``'s on-chip
    bytes), each as the provider computes it. Raises :class:`Unsupported` (or the mapper's error)."""
    from stepsim.kernels import serve_mapped as sm
    from stepsim.mapping import schedule_for
    from stepsim.mapping.kinds.decode import DECODE_KV_LENGTH
    from stepsim.mapping.mapper import bucket
    from stepsim.serve import projections
    from stepsim.serve.fast_mapped import prefill_reference, schedule_of
    from stepsim.serve.layers import KV_TILE, piece_dims

    provider, tables = params["provider"], params["mapped"]
    tokens, seqs, decode, prefill_size = (int(v) for v in tables["need"])
    model, hardware, spec = provider.model, provider.hardware, provider.spec
    # the shared table as it is now (a loop replayed alongside this one may have grown it since this one's began)
    proj = tables["proj"] = tables["memo"]["proj"]
    if max(tokens, seqs) >= proj.shape[2]:
        grown = np.full((5, 4, max(2 * proj.shape[2], tokens + 1, seqs + 1)), -1, dtype=np.int64)
        grown[:, :, :proj.shape[2]] = proj
        proj = tables["proj"] = tables["memo"]["proj"] = grown
    layer_shapes, head = projections.provider_projections(provider)
    rows = {"qkv": sm.PJ_QKV, "o": sm.PJ_O, "router": sm.PJ_ROUTER}
    # a row of the table per step's tokens; the router on expert-parallel chips takes a chip's shard of them
    wanted = [(rows[name], tokens, projections.matrix_rows(provider, name, tokens), d_in, d_out)
              for name, d_in, d_out in layer_shapes]
    wanted.append((sm.PJ_HEAD, seqs, seqs, head[1], head[2]))
    for row, size, matrix_rows, d_in, d_out in wanted:
        if proj[row, 0, size] < 0:
            cost = projections.projection_cost(matrix_rows, d_in, d_out, hardware)
            proj[row, :, size] = [_integer(v, f"projection ({d_in} x {d_out} at {size} tokens) {field}")
                                  for v, field in zip(cost, ("cycles", "HBM bytes", "on-chip bytes", "FLOPs"))]
    if tables["pm"][sm.M_ALLREDUCES] and proj[sm.PJ_ALLREDUCE, 0, tokens] < 0:  # the provider's allreduce_cycles
        from stepsim.serve.system import allreduce_cycles

        cycles = allreduce_cycles(provider.system, model.hidden, tokens)
        proj[sm.PJ_ALLREDUCE, :, tokens] = [_integer(cycles, f"the all-reduce at {tokens} tokens"), 0, 0, 0]
    bi, bf = tables["buckets_i"], tables["buckets_f"]
    b = sm.log2_bucket(tokens)
    if not bi[sm.B_FFN, b]:
        _fill_ffn_bucket(provider, tokens, bi, bf, b, expert_parallel=bool(tables["pm"][sm.M_EP]))
    if prefill_size:
        b = sm.log2_bucket(prefill_size)
        if not bi[sm.B_PREFILL, b]:
            cycles, knob, rep_load, rep_kv = prefill_reference(prefill_size, spec)
            bi[sm.B_PREFILL_REGIONS, b] = _integer(knob, "the prefill attention's regions")
            bi[sm.B_PREFILL_REP_LOAD, b] = _integer(rep_load, "the prefill attention's representative load")
            bi[sm.B_PREFILL_REP_KV, b] = _integer(rep_kv, "the prefill attention's representative KV tiles")
            if not (knob > 0 and rep_load > 0 and rep_kv > 0):
                raise Unsupported(f"the prefill attention's regions {knob}, representative load {rep_load} or KV "
                                  f"tiles {rep_kv} is 0")
            bf[sm.BF_PREFILL_CYCLES, b] = cycles
            bi[sm.B_PREFILL, b] = 1
    if decode:
        b = sm.log2_bucket(decode)
        if not bi[sm.B_DECODE, b]:
            schedule = schedule_of("decode", decode, spec)
            knob = _integer(schedule.knobs["regions"], "the decode attention's regions")
            if not 0 < knob <= MAX_REGIONS:
                raise Unsupported(f"the decode attention's regions {knob} are not in 1..{MAX_REGIONS}")
            size = bucket(decode)
            on_chip = schedule_for("decode", decode, piece_dims("decode", spec.model), hardware).on_chip_bytes
            bi[sm.B_DECODE_REGIONS, b] = knob
            bi[sm.B_DECODE_ON_CHIP, b] = _integer(on_chip, "the decode attention's on-chip bytes")
            bi[sm.B_DECODE_REP_LOAD, b] = -(-(DECODE_KV_LENGTH + 1) // KV_TILE) * -(-size // min(knob, size))
            bf[sm.BF_DECODE_CYCLES, b] = float(schedule.cycles)
            bi[sm.B_DECODE, b] = 1


def _fill_ffn_bucket(provider, tokens: int, bi, bf, b: int, expert_parallel: bool) -> None:
    """The FFN bucket ``b`` of ``tokens``' steps: its knobs, its two simulated points and the representative loads its
    estimate scales by: one chip's (:func:`stepsim.serve.fast_mapped.ffn_reference`: expert tiles and busiest
    region; and the FFN's traffic, :func:`stepsim.serve.projections.ffn_tile_n`) or an MoE model's expert-parallel
    chips' (:func:`stepsim.serve.fast_mapped_ep.ep_reference`: busiest region and busiest chip; the block's traffic
    at its bucket's tile_n and its on-chip bytes, :func:`stepsim.serve.projections.ep_block_on_chip`). Raises
    :class:`Unsupported`."""
    from stepsim.kernels import serve_mapped as sm
    from stepsim.mapping.mapper import bucket
    from stepsim.serve import fast_mapped_ep, projections
    from stepsim.serve.fast_mapped import ffn_reference

    spec = provider.spec
    experts = spec.ffn_model.experts
    if expert_parallel:
        ref = fast_mapped_ep.ep_reference(tokens, spec)
        regions = ref.knobs["regions"]
        bf[sm.BF_FFN_TILES, b] = 1.0  # no tile estimate on these chips
        bf[sm.BF_FFN_REGIONS, b], bf[sm.BF_FFN_CHIPS, b] = ref.region_rep, ref.chip_rep
        traffic_tile_n, on_chip = ref.knobs["tile_n"], projections.ep_block_on_chip(spec, tokens)
    else:
        ref = ffn_reference(tokens, spec)
        regions = ref.knobs["regions"] if experts > 1 else 1
        traffic_tile_n, on_chip = projections.ffn_tile_n(provider, tokens)
        bf[sm.BF_FFN_TILES, b], bf[sm.BF_FFN_REGIONS, b] = ref.tiles_rep, ref.regions_rep
    traffic_tile_n = _integer(traffic_tile_n, "the FFN's traffic tile_n")
    if traffic_tile_n == 0:
        raise Unsupported("the FFN's traffic tile_n is 0")
    bi[sm.B_FFN_TRAFFIC_TILE_N, b] = traffic_tile_n
    bi[sm.B_FFN_ON_CHIP, b] = _integer(on_chip, "the FFN's on-chip bytes")
    tile_n = _integer(ref.knobs["tile_n"], "the FFN's tile_n")
    if not (isinstance(regions, numbers.Integral) and 0 < regions and experts % regions == 0 and tile_n > 0):
        raise Unsupported(f"the FFN bucket {bucket(tokens)}'s regions {regions!r} do not divide its {experts} experts")
    bi[sm.B_FFN_TILE_N, b], bi[sm.B_FFN_REGIONS, b] = tile_n, int(regions)
    bf[sm.BF_FFN_CYCLES, b] = ref.top.cycles
    bi[sm.B_FFN_TOP_TOKENS, b] = _integer(ref.top.tokens, "the FFN bucket's top")
    bi[sm.B_FFN_BOTTOM_TOKENS, b] = _integer(ref.bottom.tokens, "the FFN bucket's bottom")
    bf[sm.BF_FFN_TOP_LOAD, b] = ref.top.load
    bf[sm.BF_FFN_BOTTOM_CYCLES, b] = ref.bottom.cycles
    bi[sm.B_FFN, b] = 1


def note_buckets(params: dict, steps_i, n: int, kr) -> None:
    """Count the (kind, bucket) of the ``n`` steps' pieces in the provider's ``layer_use``, as its
    :meth:`~stepsim.serve.layer_use.LayerUse.note` does step by step."""
    from stepsim.mapping.mapper import bucket
    from stepsim.serve.layers import KV_TILE

    steps = params["provider"].layer_use.steps
    columns = (("prefill", steps_i[kr.I_QUERY_TILES, :n] * KV_TILE), ("decode", steps_i[kr.I_DECODE_REQUESTS, :n]),
               ("ffn", steps_i[kr.I_TOKENS, :n]))
    for kind, sizes in columns:
        values, counts = np.unique(sizes[sizes > 0], return_counts=True)
        for size, count in zip(values.tolist(), counts.tolist()):
            key = (kind, bucket(size))
            steps[key] = steps.get(key, 0) + count
