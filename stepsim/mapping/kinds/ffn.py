"""The ``ffn`` kind: the MoE block over ``tokens`` tokens (a dense FFN is one expert every token goes to), static
tiling (docs/mapping.md).

Representative routing: skewed as real routing is (:func:`ffn_routing`). Space: ``tile_n`` (tokens per tile:
powers of two from half the tokens an expert gets on average, ``ceil(tokens k / E)``, up to every token),
``tile_f`` (32, 64, 128 F columns per weight tile), ``lanes`` (column stripes per expert or region: every divisor
of the expert's ``F / tile_f`` weight tiles up to :data:`MAX_LANES`, so a tensor-parallel shard's 56 or 28 tiles
split 7 or 14 ways, not only in powers of two: a Llama-3.1-8B FFN shard over 8 chips, F = 1,792, takes 36,252
cycles at 56 lanes against 66,262 at the best power of two) and ``regions`` (one per expert, or the paper's
time-multiplexed regions of several experts that fetch the chosen expert's weights: ``E / 4``, ``E / 16``,
``E / 64``). A layer whose experts are mostly idle in a step (a decode of few tokens over 128 experts) needs
regions: one region an expert leaves no units for lanes. The weights of a bf16 model stream as the paper's do (bf16
in HBM, fp32 on chip); every compute operator's ``compute_bw`` follows from its units (:mod:`stepsim.mapping.units`).
"""

from __future__ import annotations

import warnings

import numpy as np

from stepsim.mapping.kinds.common import PLACEHOLDER_BW
from stepsim.mapping.kinds.common import powers_of_two as _powers_of_two
from stepsim.models.presets import MoEModel

#: the builders this kind's schedules depend on (part of its cache key: :func:`stepsim.mapping.mapper.source_files`)
BUILDERS = ("stepsim.workloads.moe.build", "stepsim.workloads.moe.stage")
#: seed of the representative routing
ROUTING_SEED = 0
#: F columns per weight tile the FFN search tries
TILE_F_CHOICES = (32, 64, 128)
#: time-multiplexed regions: the experts divided by 1, 4, 16, ... up to 2**this (configuration time-multiplexing)
REGION_HALVINGS = 6
#: at most this many representative routings (:func:`ffn_samples`)
MAX_SAMPLES = 8
#: the representative routing's Zipf exponent (:func:`ffn_routing`)
ZIPF_EXPONENT = 1.0
#: at most this many lanes per expert (a 128-expert layer at 64 lanes needs far more units than a chip has)
MAX_LANES = 64


def tokens_per_expert(tokens: int, model: MoEModel) -> int:
    """Tokens an expert gets on average, rounded up: ``ceil(tokens top_k / experts)``."""
    return -(-tokens * model.top_k // model.experts)


def ffn_space(tokens: int, model: MoEModel) -> list[dict]:
    """Every ``ffn`` candidate's knobs for ``tokens`` tokens (module docstring)."""
    per_expert = tokens_per_expert(tokens, model)
    tile_ns = sorted({n for n in _powers_of_two(tokens) if 2 * n >= per_expert} | {tokens})
    regions = sorted({max(1, model.experts >> k) for k in range(REGION_HALVINGS + 1)}, reverse=True)
    space = []
    for tile_f in TILE_F_CHOICES:
        if model.intermediate % tile_f or model.shared_intermediate % tile_f:
            continue
        stripes = model.intermediate // tile_f
        for lanes in (n for n in range(1, min(MAX_LANES, stripes) + 1) if stripes % n == 0):
            space.extend({"tile_n": tile_n, "tile_f": tile_f, "lanes": lanes, "regions": r}
                         for r in regions for tile_n in tile_ns)
    return space


def ffn_samples(tokens: int) -> int:
    """Routings the mapper averages over at ``tokens`` tokens: a few tokens' experts collide on a time-multiplexed
    region by chance (8 of 128 experts on 32 regions: a region with two in most draws), so one draw would choose
    by luck; ``ceil(16 / tokens)`` draws, at most 8, one from 16 tokens on."""
    return min(MAX_SAMPLES, -(-16 // tokens))


def ffn_routing(tokens: int, model: MoEModel, sample: int = 0) -> np.ndarray:
    """The representative routing ``[tokens, top_k]``: each token's ``top_k`` distinct experts drawn without
    replacement with Zipf popularity ``1 / rank`` over a seeded permutation of the experts (Gumbel top-k), so
    the mapping is deterministic and sees the skew of real routing: at 64 tokens its busiest expert gets 56 tokens
    on Qwen3's shape (the shared B=64 traces: 42) and 36 on Mixtral's (24). A uniform draw under-sizes the token
    tiles: the busy experts of a real step then re-read their weights once per extra tile. ``sample``: the draw
    (:func:`ffn_samples`)."""
    rng = np.random.default_rng([ROUTING_SEED, sample])
    log_popularity = -ZIPF_EXPONENT * np.log(np.arange(1, model.experts + 1))
    experts = rng.permutation(model.experts)
    keys = log_popularity[None, :] + rng.gumbel(size=(tokens, model.experts))
    return experts[np.argsort(-keys, axis=1, kind="stable")[:, :model.top_k]].astype(np.int64)


def ffn_bound(knobs: dict, routing: np.ndarray, model: MoEModel, hardware) -> int:
    """A lower bound on the ``ffn`` candidate's cycles from its knobs and the routing alone (no build), so the
    search builds only the candidates that can still win: the expert weights read (each expert once per tile of
    its tokens) at the HBM's peak, and the busiest weight load issuing its requests one per cycle (a load keeps
    one tile in flight and issues ``par_dispatch`` = 1 request a cycle: docs/timing_model.md §4.1)."""
    counts = np.bincount(routing.ravel(), minlength=model.experts)
    tiles = -(-counts // knobs["tile_n"])
    d, f, tile_f, lanes = model.hidden, model.intermediate, knobs["tile_f"], knobs["lanes"]
    weight_bytes = int(tiles.sum()) * 3 * d * f * 2
    per_region = model.experts // knobs["regions"]
    region_tiles = tiles.reshape(knobs["regions"], per_region).sum(axis=1)
    # a lane's gate load: (f / lanes / tile_f) tiles of d rows, each row ceil(2 tile_f / addr_offset) requests
    requests_per_expert_tile = (f // lanes // tile_f) * d * -(-2 * tile_f // hardware.addr_offset)
    return max(-(-weight_bytes // hardware.hbm_peak_bytes_per_cycle),
               int(region_tiles.max()) * requests_per_expert_tile)


def build_ffn(routing: np.ndarray, model: MoEModel, knobs: dict):
    """The FFN workload of ``routing`` with ``knobs`` (its compute units not yet assigned)."""
    from stepsim.workloads.moe.build import build_moe

    with warnings.catch_warnings():  # tile_n above a small layer's tokens: padding, chosen knowingly
        warnings.simplefilter("ignore")
        regions = None if knobs["regions"] == model.experts else knobs["regions"]  # one region an expert
        return build_moe(model, routing, tiling="static", tile_n=knobs["tile_n"], tile_f=knobs["tile_f"],
                         lanes=knobs["lanes"], regions=regions, compute_bw=PLACEHOLDER_BW,
                         packing_compute_bw=PLACEHOLDER_BW)
