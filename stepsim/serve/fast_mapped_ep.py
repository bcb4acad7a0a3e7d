"""``--fidelity fast`` on an MoE model's mapped expert-parallel chips (``serve --system S --schedule auto``;
docs/serving.md §13): :class:`MappedEPFastLatency`, calibrated on :class:`stepsim.serve.system.SystemEngineLatency`'s
exact pieces (the block over the chips with each chip's experts mapped, :mod:`stepsim.mapping.expert_parallel`).

The attention is one chip's share of the heads mapped as on one chip (:class:`~stepsim.serve.fast_mapped.
MappedFastLatency`'s decode and prefill regressors of the head shard). The FFN's regressors of a layer
(:func:`ep_ffn_regressors`, ``[layers, EP_COLUMNS]``): ``[1, tokens, expert tiles at the bucket's tile_n, active
experts, the busiest expert's tiles, the busiest region's tiles, the busiest chip's tiles, the estimate]``, then
:func:`~stepsim.serve.fast.few_tokens`, :func:`~stepsim.serve.fast.pair_parity` and the system's
:func:`~stepsim.serve.fast.chip_features` (rows crossing a link, the busiest chip's rows). The *estimate*
(:func:`ep_estimate`) comes from the bucket's layer simulated at its top and bottom token counts on the mapper's
representative routings (:func:`ep_reference`; stored, :mod:`stepsim.serve.ffn_points`): the larger of the line through those two points
in tokens (every token's rows pass the dispatch, the links and the combine) and the top scaled by the piece's
load, ``max(chip tiles / chip tiles_rep, region tiles / region tiles_rep)`` against the top's (the chips read their
experts' weights side by side, so the busiest chip's tiles carry the layer, and a time-multiplexed region reads its
experts' in turn). Without coefficients (the first calibration pass) a piece is priced at its estimate.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from stepsim.serve.fast import FEW_TOKENS, chip_features, few_tokens, layer_counts, pair_parity
from stepsim.serve.fast_mapped import Point, _memo, bucket_estimate, simulated_point
from stepsim.serve.layers import LayerSpec
from stepsim.serve.system_fast import MappedSystemFastLatency

#: the structural columns of :func:`ep_ffn_regressors` (the estimate last; active experts at 3, as the one-chip
#: mapped FFN's: :meth:`~stepsim.serve.fast_mapped.MappedFastLatency.__call__` reads them there)
EP_STRUCTURAL = 8
#: structural, few_tokens(), pair_parity(), chip_features()
EP_COLUMNS = EP_STRUCTURAL + FEW_TOKENS + 1 + 3


def ep_loads(routing: np.ndarray, experts: int, chips: int, knobs: dict) -> np.ndarray:
    """``[layers, 5]``: expert tiles at ``tile_n``, active experts, the busiest expert's tiles, the busiest region's
    tiles and the busiest chip's tiles (``routing`` ``[tokens, layers, top_k]``; the experts contiguous on the
    chips and in the regions, as :func:`stepsim.workloads.moe.parallel.region_members` groups them under the
    contiguous placement)."""
    counts = layer_counts(routing, experts)
    tiles = -(-counts // knobs["tile_n"])
    layers = len(tiles)
    region = tiles.reshape(layers, knobs["regions"], -1).sum(axis=2).max(axis=1)
    chip = tiles.reshape(layers, chips, -1).sum(axis=2).max(axis=1)
    return np.column_stack([tiles.sum(axis=1), (counts > 0).sum(axis=1), tiles.max(axis=1), region,
                            chip]).astype(np.float64)


def ep_load(loads: np.ndarray, chip_rep: float, region_rep: float) -> np.ndarray:
    """The layers' load against the bucket's representative routings (:func:`ep_loads` rows -> ``[layers]``):
    ``max(chip tiles / chip_rep, region tiles / region_rep)``."""
    return np.maximum(loads[:, 4] / chip_rep, loads[:, 3] / region_rep)


class Reference(NamedTuple):
    """What :func:`ep_estimate` needs of a bucket (:func:`ep_reference`)."""

    bottom: Point  # b / 2 + 1 tokens, the bucket's fewest (the top itself when b <= 2)
    top: Point  # b tokens
    chip_rep: float  # b tokens' mean busiest chip's tiles
    region_rep: float  # and busiest region's
    knobs: dict  # the bucket's (:func:`stepsim.mapping.expert_parallel.ep_schedule`)


def ep_reference(size: int, spec: LayerSpec) -> Reference:
    """The FFN bucket of ``size`` tokens (the next power of two, ``b``): the layer simulated on the system at ``b``
    and at ``b / 2 + 1`` tokens, both under the bucket's knobs (:func:`stepsim.serve.fast_mapped.simulated_point`).
    Memoised a process."""
    from stepsim.mapping import kinds
    from stepsim.mapping.expert_parallel import search_knobs
    from stepsim.mapping.mapper import bucket

    b = bucket(size)
    model, chips = spec.ffn_model, spec.system.chips

    def make():
        knobs = search_knobs(b, model, spec.system, spec.hardware)
        routings = [kinds.ffn.ffn_routing(b, model, s) for s in range(kinds.ffn.ffn_samples(b))]
        loads = np.array([ep_loads(r[:, None, :], model.experts, chips, knobs)[0] for r in routings])
        chip_rep, region_rep = float(loads[:, 4].mean()), float(loads[:, 3].mean())

        def load(routing) -> float:
            return float(ep_load(ep_loads(routing[:, None, :], model.experts, chips, knobs), chip_rep, region_rep)[0])
        top = simulated_point(b, spec, load)
        bottom = simulated_point(b // 2 + 1, spec, load) if b > 2 else top
        return Reference(bottom, top, chip_rep, region_rep, knobs)
    return _memo(("ep", b, repr(spec.model), spec.hardware, repr(spec.system)), make)


def ep_estimate(tokens: int, load: np.ndarray, ref: Reference) -> np.ndarray:
    """Cycles of layers of ``tokens`` tokens and ``load`` (:func:`ep_load`) by the bucket's two simulated points
    (:func:`stepsim.serve.fast_mapped.bucket_estimate`: the larger of the line in tokens and the top scaled by
    load). Not the top scaled by load alone (session 30's form): the weight reads and the graph's fill do not
    shrink with the tokens, and at a fixed token count an even routing is no faster than a skewed one with more
    tiles on its busiest chip (small MoE on ring-2, 91 tokens: 5,290 cycles at 9 busiest-chip tiles, Zipf
    4,999-5,191 at 10-11), since every row crosses the dispatch and the links: with it, the trace's 91-token pieces
    were 22-31 % under exact. Measured on tests/serve/test_serve_system_mapped_ep.py's fast run, held-out step p50 /
    p95 / max, the loads fitted beside the estimate as before: load scaled 0.11 / 13.61 / 16.38 %; a line in load
    through the two points 0.03 / 12.66 / 15.32 %; the line in tokens 0.13 / 8.24 / 12.54 %; the larger of the two
    lines 0.11 / 5.86 / 8.41 %; the loads not fitted (:meth:`MappedEPFastLatency.fitted_columns`), the last and
    this form: 2.29 / 2.70 and 2.30 / 2.63 % (p95 / max); 1.60 / 1.74 % since the exact pieces take their bucket's
    knobs (:func:`stepsim.mapping.expert_parallel.ep_schedule`), as the two points already did."""
    return bucket_estimate(tokens, load, ref.bottom, ref.top)


def ep_ffn_regressors(routing: np.ndarray, spec: LayerSpec) -> np.ndarray:
    """The FFN regressors of every layer (module docstring): ``routing`` ``[tokens, layers, top_k]`` ->
    ``[layers, EP_COLUMNS]``."""
    tokens, layers, _ = routing.shape
    chips, experts = spec.system.chips, spec.ffn_model.experts
    ref = ep_reference(tokens, spec)
    loads = ep_loads(routing, experts, chips, ref.knobs)
    out = np.zeros((layers, EP_COLUMNS))
    out[:, 0], out[:, 1] = 1.0, tokens
    out[:, 2:7] = loads
    out[:, 7] = ep_estimate(tokens, ep_load(loads, ref.chip_rep, ref.region_rep), ref)
    out[:, EP_STRUCTURAL:EP_STRUCTURAL + FEW_TOKENS] = few_tokens(tokens, layers)
    out[:, EP_STRUCTURAL + FEW_TOKENS] = pair_parity(routing)
    out[:, EP_STRUCTURAL + FEW_TOKENS + 1:] = chip_features(routing, chips, experts)
    return out


class MappedEPFastLatency(MappedSystemFastLatency):
    """``--fidelity fast`` on a system for an MoE model on mapped chips (module docstring): a system's mapped provider
    (the head shard's attention, the all-reduce and the weights read ``1 / n`` a chip priced exactly, as
    :class:`~stepsim.serve.system.SystemEngineLatency` with ``schedule="auto"`` prices a step) whose FFN regressors
    are the expert-parallel block's."""

    def ffn_regressors(self, routing: np.ndarray) -> np.ndarray:
        return ep_ffn_regressors(routing, self.spec)

    def ffn_entries(self, tokens: int, x: np.ndarray, ffn_cycles: np.ndarray, ffn_tasks) -> list:
        """Per layer ``(cycles, HBM bytes, weight bytes, FLOPs)`` of the block's busiest chip
        (:func:`stepsim.serve.projections.ep_block_traffic` of the layer's routing, at its bucket's ``tile_n``: the
        knobs its regressors' loads are at), as the exact provider's pieces hold them."""
        from stepsim.serve.projections import ep_block_traffic

        tile_n = ep_reference(tokens, self.spec).knobs["tile_n"]
        return [(int(c), *ep_block_traffic(self.spec.ffn_model, routing, self.chips, tile_n))
                for c, (_, routing) in zip(ffn_cycles, ffn_tasks())]

    def fitted_columns(self, model: str, width: int) -> np.ndarray:
        """The FFN's loads (columns 2-6) are data here, not fitted: the estimate carries them (:func:`ep_estimate`),
        and fitted beside it on a calibration's few hundred pieces they pulled the FFN under it (tiny DeepSeek-V3 on
        ``ring-2``, tests/plan/test_plan_layer_list.py's trace: held-out pieces 5-16 % under exact where the
        estimate was within 2-7 %). Measured, held-out step p95 / max: that trace served on ``ring-2`` 9.65 / 14.01 %
        fitted, 5.86 / 6.00 % not; tests/serve/test_serve_system_mapped_ep.py's run 5.86 / 8.41 %, 2.29 / 2.70 %
        (dropping the tokens column too: 6.35 / 6.40 % and 2.35 / 2.86 %)."""
        fitted = super().fitted_columns(model, width)
        if model in ("ffn", "ffn_prefill"):
            fitted[2:7] = False
        return fitted
