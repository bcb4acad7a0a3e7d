"""``--fidelity fast`` on an MoE model's mapped expert-parallel chips (``serve --system S --schedule auto``;
docs/serving.md §13): :class:`MappedEPFastLatency`, calibrated on :class:`stepsim.serve.system.SystemEngineLatency`'s
exact pieces (the block over the chips with each chip's experts mapped, :mod:`stepsim.mapping.expert_parallel`).

The attention is one chip's share of the heads mapped as on one chip (:class:`~stepsim.serve.fast_mapped.
MappedFastLatency`'s decode and prefill regressors of the head shard). The FFN's regressors of a layer
(:func:`ep_ffn_regressors`, ``[layers, EP_COLUMNS]``): ``[1, tokens, expert tiles at the bucket's tile_n, active
experts, the busiest expert's tiles, the busiest region's tiles, the busiest chip's tiles, the estimate]``, then
:func:`~stepsim.serve.fast.few_tokens`, :func:`~stepsim.serve.fast.pair_parity` and the system's
:func:`~stepsim.serve.fast.chip_features` (rows crossing a link, the busiest chip's rows). The *estimate* is the
bucket's layer simulated on the mapper's representative routings (:func:`ep_reference`: the mean cycles over
:func:`stepsim.mapping.kinds.ffn.ffn_samples` routings, once a process) scaled by the piece's load against
theirs, ``max(chip tiles / chip tiles_rep, region tiles / region tiles_rep)``: the chips read their experts'
weights side by side, so the busiest chip's tiles carry the layer, and a time-multiplexed region reads its experts'
in turn. Without coefficients (the first calibration pass) a piece is priced at its estimate.
"""

from __future__ import annotations

import numpy as np

from stepsim.serve.fast import FEW_TOKENS, chip_features, few_tokens, layer_counts, pair_parity
from stepsim.serve.fast_mapped import _memo
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


def ep_reference(size: int, spec: LayerSpec) -> tuple[float, float, float, dict]:
    """``(cycles, chip tiles, region tiles, knobs)`` of the FFN bucket of ``size`` tokens (the next power of two):
    the layer on the system simulated on the mapper's representative routings (the mean of their cycles), their
    mean busiest chip's and region's tiles, and the layer's knobs (:func:`stepsim.mapping.expert_parallel.ep_schedule`).
    Memoised a process."""
    from stepsim.mapping import kinds
    from stepsim.mapping.expert_parallel import ep_schedule
    from stepsim.mapping.mapper import bucket
    from stepsim.serve.layers import LayerRunner

    b = bucket(size)
    model, chips = spec.ffn_model, spec.system.chips

    def make():
        knobs, _ = ep_schedule(b, model, spec.system, spec.hardware)
        routings = [kinds.ffn.ffn_routing(b, model, s) for s in range(kinds.ffn.ffn_samples(b))]
        runner = LayerRunner(spec)
        cycles = np.mean([runner.fresh_cycles("ffn", r) for r in routings])
        loads = np.array([ep_loads(r[:, None, :], model.experts, chips, knobs)[0] for r in routings])
        return float(cycles), float(loads[:, 4].mean()), float(loads[:, 3].mean()), knobs
    return _memo(("ep", b, repr(spec.model), spec.hardware, repr(spec.system)), make)


def ep_ffn_regressors(routing: np.ndarray, spec: LayerSpec) -> np.ndarray:
    """The FFN regressors of every layer (module docstring): ``routing`` ``[tokens, layers, top_k]`` ->
    ``[layers, EP_COLUMNS]``."""
    tokens, layers, _ = routing.shape
    chips, experts = spec.system.chips, spec.ffn_model.experts
    cycles, chip_rep, region_rep, knobs = ep_reference(tokens, spec)
    loads = ep_loads(routing, experts, chips, knobs)
    out = np.zeros((layers, EP_COLUMNS))
    out[:, 0], out[:, 1] = 1.0, tokens
    out[:, 2:7] = loads
    out[:, 7] = cycles * np.maximum(loads[:, 4] / chip_rep, loads[:, 3] / region_rep)
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
