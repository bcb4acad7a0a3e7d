"""``--fidelity fast`` on a system (docs/serving.md §13): the fast model (:mod:`stepsim.serve.fast`) calibrated
on :class:`stepsim.serve.system.SystemEngineLatency`'s exact pieces, on the paper's layers
(:class:`SystemFastLatency`) or on a dense model's mapped tensor-parallel shards (:class:`MappedSystemFastLatency`;
an MoE model's mapped expert-parallel chips: :class:`stepsim.serve.fast_mapped_ep.MappedEPFastLatency`;
:func:`stepsim.serve.api.system_fast_class` says which).
Its own module so that ``--system`` with ``--iteration-latency`` or ``--fidelity exact`` does not import the fast
model's kernels."""

from __future__ import annotations

from stepsim.serve.fast import FastLatency, chip_features
from stepsim.serve.fast_mapped import MappedFastLatency
from stepsim.serve.layer_use import LayerUse
from stepsim.serve.system import SystemEngineLatency, kv_heads_per_chip, system_layer_spec


class SystemFastLatency(FastLatency):
    """``--fidelity fast`` on a system: :class:`stepsim.serve.fast.FastLatency` calibrated on the exact pieces of
    :class:`SystemEngineLatency` (the sharded MoE block over the chips, ``ceil(kv_heads / n)`` KV heads a chip),
    with the all-reduces (:func:`allreduce_cycles`) and the weights read ``1 / n`` a chip priced exactly, as the
    exact provider prices them."""

    def __init__(self, model, system, routing, *, max_model_len: int, vocab: int, jobs=None, **kw):
        self.chips = system.chips
        super().__init__(model, system.hardware, routing, max_model_len=max_model_len, vocab=vocab, jobs=jobs, **kw)
        self.system = system
        self.spec = system_layer_spec(model, system, max_model_len)

    layer_bytes = SystemEngineLatency.layer_bytes
    roles = SystemEngineLatency.roles
    weight_cycles = SystemEngineLatency.weight_cycles

    def attention_heads(self) -> int:
        return kv_heads_per_chip(self.model, self.system.chips)

    def chip_columns(self, rows):
        if not self.model.is_moe:  # a dense model's tensor-parallel shard: no expert placement
            return None
        return chip_features(rows(), self.system.chips, self.model.experts)

    allreduce_cycles = SystemEngineLatency.allreduce_cycles
    collective_cycles = SystemEngineLatency.collective_cycles

    def describe(self) -> dict:
        return {**super().describe(), "system": self.system.name, "chips": self.system.chips}


class MappedSystemFastLatency(MappedFastLatency):
    """``--fidelity fast`` on a system's chips for a dense model on mapped layers (``schedule="auto"``): each chip's
    tensor-parallel shard (:func:`stepsim.serve.system.tp_shard`) priced as :class:`MappedFastLatency` prices a
    one-chip mapped layer (the bucket's schedule in every regressor; the projections, the chip's rows of the LM head
    and the weights streamed ahead as the exact provider runs them), with the two ring all-reduces a layer priced
    exactly, as :class:`stepsim.serve.system.SystemEngineLatency` with ``schedule="auto"`` prices a step; calibrated
    on that provider's exact pieces (the shard's)."""

    def __init__(self, model, system, routing, *, max_model_len: int, vocab: int, jobs=None, **kw):
        self.chips = system.chips
        super().__init__(model, system.hardware, routing, max_model_len=max_model_len, vocab=vocab, jobs=jobs,
                         schedule="auto", **kw)
        self.system = system
        self.spec = system_layer_spec(model, system, max_model_len, "auto")
        self.layer_use = LayerUse(self.spec)  # the shard's buckets (summary.json ``layers``)

    layer_bytes = SystemEngineLatency.layer_bytes
    roles = SystemEngineLatency.roles
    weight_cycles = SystemEngineLatency.weight_cycles
    allreduce_cycles = SystemEngineLatency.allreduce_cycles
    collective_cycles = SystemEngineLatency.collective_cycles

    def describe(self) -> dict:
        return {**super().describe(), "system": self.system.name, "chips": self.system.chips}
