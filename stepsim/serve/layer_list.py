"""Serving a heterogeneous model layer by layer at ``--fidelity exact|fast`` (issue 43).

A model whose layers differ (:func:`stepsim.models.layers.layer_groups`: DeepSeek-V3's 3 dense and 58 MoE layers
with MLA, gpt-oss's sliding and full layers, Llama 4's chunked and global layers, Maverick's dense and MoE layers)
is priced as the sum of its layer groups. Each group is one homogeneous model (:func:`group_model`) priced by the
exact or the fast provider of :mod:`stepsim.serve.exact` / :mod:`stepsim.serve.fast` for its layers, through a
:class:`GroupLatency` that gives it the step as that group's layers see it:

* ``sliding`` (window ``W``): a request's cached tokens seen are at most ``W - 1`` (the new token makes ``W``), so a
  decode step's attention reads stop growing at the window;
* ``chunked`` (chunk ``C``, Llama 4): a token at position ``p`` attends to the tokens of its chunk, ``p mod C``
  cached ones; a prefill chunk keeps its length and sees the cached tokens of the chunk it starts in (its tokens
  past the next chunk boundary are priced as if they saw them too: an upper bound);
* ``mla``: the absorbed form of decode, as DeepSeek's inference code (and FlashMLA) compute it: one shared latent
  "KV head" of ``kv_lora_rank + qk_rope_head_dim`` values per token read by every query head, i.e. multi-query
  attention with ``heads`` query heads and ``head_dim = kv_lora_rank + qk_rope_head_dim`` whose one cache is the
  keys and the values (``shared_kv``: the latent row read once a step, as the kernel reads it, not a key and a
  value copy, which priced a DeepSeek-V3 decode's attention reads at twice the latent cache until 2026-11-27);
  prefill likewise (the expanded form's per-head keys are not modelled);
* attention sinks (one logit per head) are not priced: a head's few extra FLOPs.

Every group's off-chip weights outside the graphs are its layers' real attention weights
(:func:`stepsim.serve.memory.attention_parameters`: MLA's q_a / q_b / kv_a / kv_b / o, biases and sinks) and router;
the LM head and the embedding rows are counted once, by the first group. On mapped layers, where the weights run on
the engine (:mod:`stepsim.serve.projections`), an MLA group multiplies by MLA's own matrices
(:func:`stepsim.models.layers.mla_matrices`), not by its engine model's q/k/v and o. A step's roofline (iterations.parquet's
``hbm_bytes``, ``flops`` and utilisations; ``stepsim plan``'s floor) likewise counts each group's layers as they
are (:func:`group_work`: MLA's own weights and latent cache, each FFN kind), not as its engine model. Routing is synthetic, one seeded stream
per MoE group, through DeepSeek-V3's gate when the model keeps a few of several expert groups
(:func:`group_gate`, :mod:`stepsim.serve.group_synthetic`). ``--routing FILE`` (a dump ``[tokens, layers, top_k]``
over the model's layers) is replayed in exact mode: each MoE group takes the dump's columns of its layers, every
group the same token rows, and the dense layers' columns are not read (:func:`routing_columns`); fast mode refuses
it (its groups draw their calibration's routing windows from their own synthetic pools).

On a system (``--system``) every group's provider runs on the system's chips
(:class:`stepsim.serve.system.SystemEngineLatency`): a dense group by tensor parallelism, an MoE group by expert
parallelism with its one-KV-head attention's query heads split over the chips (:func:`stepsim.serve.system.mqa_shard`);
its attention weights and router are read ``1 / n`` a chip (:func:`count_weights_once`). A group that does not
shard over the chips is refused in one line before any work (:func:`check_layer_list`).

Fast mode calibrates each group on its own (its cache key names the group): its pilot replays price every step by
the group's cycles scaled to the whole model's layers, so the sampled steps look like the final run's. The
summary's ``fidelity.error`` is the largest of the groups' held-out errors, each group's under ``groups``. Each
group's fast step is floored at that group's roofline (:meth:`stepsim.serve.fast.FastLatency._floored`, its
``floor`` cycles), so the list's step, their sum, is at least the sum of their rooflines: no step's utilisation
exceeds 1.
"""

from __future__ import annotations

import math
from dataclasses import replace

from stepsim.base.errors import ConfigError
from stepsim.mapping.roofline import StepWork
from stepsim.models.layers import LayerKind, layer_groups, mla_matrices
from stepsim.models.presets import ModelConfig
from stepsim.serve.latency import IterationBatch, IterationCost
from stepsim.serve.memory import DTYPE_BYTES, attention_parameters


def takes_layer_list(model: ModelConfig) -> bool:
    """Whether serving prices ``model`` layer group by layer group: it has a feature the one-kind executors do
    not model (:meth:`ModelConfig.unmodelled`). Other models keep the one-kind path, cycle for cycle."""
    return bool(model.unmodelled())


def group_model(model: ModelConfig, kind: LayerKind, layers: int) -> ModelConfig:
    """The homogeneous model one group's executors run: ``layers`` layers of ``kind`` (module docstring)."""
    m = replace(model, layers=layers, layer_types=(), sliding_window=None, attention_chunk_size=None,
                attention_sinks=False, first_k_dense_replace=0, moe_layer_freq=1, interleave_moe_layer_step=0,
                n_group=1, topk_group=1, scoring_func="softmax", routed_scaling_factor=1.0)
    if kind.attention == "mla":  # the absorbed form: one latent "KV head" every query head reads
        m = replace(m, kv_heads=1, head_dim=model.kv_lora_rank + model.qk_rope_head_dim, q_lora_rank=None,
                    kv_lora_rank=None, qk_nope_head_dim=None, qk_rope_head_dim=None, v_head_dim=None, shared_kv=True)
    if kind.ffn == "dense":
        if model.dense_intermediate is None:
            raise ConfigError(f"model {model.name!r}: its dense layers need 'intermediate_size' (the dense FFN)")
        m = replace(m, experts=0, top_k=0, expert_intermediate=None, shared_experts=0, shared_intermediate=0)
    return m


def seen_batch(kind: LayerKind, batch: IterationBatch) -> IterationBatch:
    """``batch`` as a layer of ``kind`` sees it: the cached tokens it attends to (module docstring)."""
    if kind.attention == "sliding":
        context = [min(c, kind.window - 1) for c in batch.context_tokens]
    elif kind.attention == "chunked":
        context = [c % kind.window for c in batch.context_tokens]
    else:
        return batch
    return IterationBatch(context, list(batch.new_tokens), batch.prefill_tokens, batch.decode_tokens)


class GroupLatency:
    """One layer group's provider (exact or fast on :func:`group_model`) fed the steps as its layers see them;
    ``scale``: a factor on its seconds (the pilot replays of a fast calibration: the whole model's layers over
    the group's)."""

    def __init__(self, kind: LayerKind, inner, scale: float = 1.0):
        self.kind, self.inner, self.scale = kind, inner, scale
        self.mode, self.error = inner.mode, getattr(inner, "error", None)

    def __call__(self, batch: IterationBatch) -> IterationCost:
        cost = self.inner(seen_batch(self.kind, batch))
        if self.scale == 1.0:
            return cost
        return IterationCost(cost.seconds * self.scale, cost.cycles, cost.work)

    def __getattr__(self, name):  # the calibration reads the inner provider's forms, recorder, spec, ...
        return getattr(self.inner, name)


def count_weights_once(model: ModelConfig, kind: LayerKind, provider, first: bool) -> None:
    """Give a group's provider its layers' real weights outside the graphs (module docstring): the attention's
    and the router's per layer; the LM head and embedding rows only for the ``first`` group. Its roofline (the
    step's ``hbm_bytes`` and ``flops``) counts its layers as they are (:func:`group_work`), not as the
    homogeneous model its engine runs (MLA's absorbed form is MQA of ``kv_lora_rank + qk_rope_head_dim``-wide
    heads there: priced as GQA, its q / k / v / o and a separate K and V, a DeepSeek-V3 layer read 2.13 GB
    against MLA's 374 MB)."""
    peak = provider.hardware.hbm_peak_bytes_per_cycle
    router = provider.model.hidden * provider.model.experts if provider.model.is_moe else 0
    provider.layer_weights = math.ceil((attention_parameters(model) + router) * DTYPE_BYTES / peak)
    if getattr(provider, "system", None) is not None:  # read 1 / n a chip (stepsim.serve.system.tp_weight_cycles)
        provider.layer_bytes = (attention_parameters(model) + router) * DTYPE_BYTES
    provider.counts_head = first
    if kind.attention == "mla":  # on the engine (mapped layers): MLA's matrices, not its engine model's q/k/v and o
        provider.attention_matrices = mla_matrices(model, provider.chips)
    if not first:
        provider.head_cycles, provider.embedding_bytes = 0, 0
    provider.roofline = group_work(model, kind, provider.model.layers, provider.hardware,
                                   provider.vocab if first else 0, provider.chips, first)


def group_work(model: ModelConfig, kind: LayerKind, layers: int, hardware, vocab: int, chips: int,
               first: bool) -> StepWork:
    """The roofline of ``layers`` layers of ``kind`` of ``model`` on ``chips`` chips
    (:meth:`stepsim.mapping.roofline.StepWork.of_layers`); the ``first`` group counts the LM head's ``vocab`` rows
    and the new tokens' embedding rows."""
    return StepWork.of_layers(model, kind.attention, kind.ffn == "moe", layers, hardware, vocab, chips,
                              embedding=first)


class LayerListLatency:
    """The sum of a heterogeneous model's layer groups (module docstring).

    Parameters
    ----------
    model : ModelConfig
    groups : list of (LayerKind, layer indices, provider)
        Each group's exact or fast provider on :func:`group_model`.
    """

    def __init__(self, model: ModelConfig, groups: list):
        self.model = model
        self.groups = [(kind, indices, GroupLatency(kind, provider)) for kind, indices, provider in groups]
        self.mode = self.groups[0][2].mode
        errors = [g.error for _, _, g in self.groups]
        # the groups' held-out errors: the largest of each relative error, the counts (steps, simulations) added
        self.error = None if any(e is None for e in errors) else {
            k: (max if k.startswith("iteration_") else sum)(e[k] for e in errors) for k in errors[0]}
        self.hardware = self.groups[0][2].inner.hardware

    def __call__(self, batch: IterationBatch) -> IterationCost:
        cycles: dict[str, int] = {}
        hbm = flops = 0
        for _, _, group in self.groups:
            cost = group(batch)
            for k, v in cost.cycles.items():
                cycles[k] = cycles.get(k, 0) + v
            hbm += cost.work.get("hbm_bytes", 0)
            flops += cost.work.get("flops", 0)
        # a mapped group's ``hidden`` cycles (weights streamed ahead) are subtracted, its ``floor`` added
        total = sum(v for k, v in cycles.items() if k != "hidden") - cycles.get("hidden", 0)
        hbm_use, compute_use = self.groups[0][2].inner.roofline.utilisation(hbm, flops, total)
        work = {"hbm_bytes": hbm, "flops": flops, "hbm_utilisation": hbm_use, "compute_utilisation": compute_use}
        return IterationCost(total / self.hardware.clock_hz, cycles, work)

    def describe(self) -> dict:
        """Each group's layers, kind and provider description (with its held-out error in fast mode); exact mode's
        layer simulations of all groups."""
        groups = [{"layers": list(indices), "kind": kind.describe(), **g.inner.describe(),
                   **({"error": g.error} if g.error is not None else {})} for kind, indices, g in self.groups]
        out = {"groups": groups}
        if self.mode == "exact":
            out["simulations"] = sum(g["simulations"] for g in groups)
        return out

    def stats(self) -> dict:
        """The groups' engine statistics, added (the largest ``jobs``)."""
        out: dict = {}
        for _, _, g in self.groups:
            for k, v in g.inner.stats().items() if hasattr(g.inner, "stats") else ():
                out[k] = max(out.get(k, 0), v) if k == "jobs" else out.get(k, 0) + v
        return out

    def close(self) -> None:
        for _, _, g in self.groups:
            if hasattr(g.inner, "close"):
                g.inner.close()


def group_seed(seed: int, group: int) -> int:
    """The routing seed of layer group ``group`` of a run seeded ``seed``: each group its own stream (the same
    stream would route two groups' layers alike)."""
    return seed + 1_000_003 * group


#: an MoE group of more layers is calibrated on this many (:func:`calibration_model`): 1 since DeepSeek-V3's
#: 16-socket calibration on 2 did not finish in an hour (each layer a full-width expert-parallel simulation)
CALIBRATION_LAYERS = 1


def calibration_model(sub: ModelConfig) -> ModelConfig | None:
    """The model an MoE group's fast calibration simulates when it has more than :data:`CALIBRATION_LAYERS`
    layers: the same layer, that many times (None otherwise: the group itself). Every MoE layer of a step is its
    own engine simulation (its own routing, no state shared with the other layers), so DeepSeek-V3's 58 would make
    each calibration step 58 of them; the fast model's pieces are per layer (an FFN piece per layer, the attention
    per head and layer), so the coefficients fitted on one layer price all 58, and the pilot replays scale the
    layer's cycles to the model's. The held-out error is then measured on one-layer steps (docs/serving.md §9.1).
    A dense group's FFN and attention are one simulation a step whatever its layers: not reduced."""
    if not sub.is_moe or sub.layers <= CALIBRATION_LAYERS:
        return None
    return replace(sub, layers=CALIBRATION_LAYERS)


def group_gate(model: ModelConfig, sub: ModelConfig):
    """The gate a layer group's synthetic routing goes through (:mod:`stepsim.serve.group_synthetic`): ``model``'s
    when it keeps a few of several expert groups (DeepSeek-V3: 4 of 8) and the group ``sub`` has routed experts;
    else None (plain synthetic routing)."""
    if model.n_group <= 1 or not sub.is_moe:
        return None
    from stepsim.workloads.group_routing import GateConfig

    return GateConfig.of_model(model)


def check_layer_list(model: ModelConfig, routing, system, fidelity: str) -> None:
    """Refuse, in one line, what the layer-list path does not take: a routed-experts file in fast mode (its groups'
    calibrations draw synthetic routing windows; exact mode replays the file, :func:`routing_columns`). On a
    system every group must shard (:func:`stepsim.serve.system.check_exact_system` on each group's model)."""
    if routing is not None and routing != "synthetic" and fidelity == "fast":
        raise ConfigError(f"--routing {routing} with --fidelity fast: model {model.name!r} is served layer group by "
                          "layer group, whose fast calibrations draw synthetic routing only (issue 43); use "
                          "--fidelity exact to replay the file")
    if hasattr(system, "chips"):  # a loaded system (the arguments' check sees its name only)
        from stepsim.serve.system import check_exact_system

        for kind, indices in layer_groups(model):
            check_exact_system(system, group_model(model, kind, len(indices)))


def routing_columns(model: ModelConfig, group: int) -> tuple[int, ...] | None:
    """The layers of ``model`` whose columns of a routed-experts dump layer group ``group`` replays (the dump's
    layer axis is the model's layers), or None for a dense group (it reads none)."""
    kind, indices = layer_groups(model)[group]
    return indices if kind.ffn == "moe" else None


def exact_layer_list(model: ModelConfig, make_engine, *, routing=None, system=None) -> LayerListLatency:
    """The exact provider of a heterogeneous model: ``make_engine(group model, group index)`` gives each group's
    :class:`~stepsim.serve.exact.EngineLatency` (its routing seeded by :func:`group_seed`, or ``routing``'s file
    at :func:`routing_columns`)."""
    check_layer_list(model, routing, system, "exact")
    groups = []
    for g, (kind, indices) in enumerate(layer_groups(model)):
        provider = make_engine(group_model(model, kind, len(indices)), g)
        count_weights_once(model, kind, provider, g == 0)
        groups.append((kind, indices, provider))
    return LayerListLatency(model, groups)


def fast_layer_list(model: ModelConfig, make_fast, key_parts: dict, pilot, *, routing=None,
                    system=None) -> tuple[LayerListLatency, dict]:
    """The fast provider of a heterogeneous model and its calibration record (``{"groups": [...], "error": ...,
    "cached": ...}``). ``make_fast(group model, key parts, pilot, group index)`` gives a group's calibrated provider and record
    (:func:`stepsim.serve.api.fast_provider`); each group's pilot replays are priced by its cycles scaled to the
    model's layers (module docstring)."""
    check_layer_list(model, routing, system, "fast")
    groups, records = [], []
    for g, (kind, indices) in enumerate(layer_groups(model)):
        sub = group_model(model, kind, len(indices))

        def group_pilot(provider, on_step, kind=kind, first=g == 0):
            count_weights_once(model, kind, provider, first)  # the whole model's layers over the provider's (module doc)
            return pilot(GroupLatency(kind, provider, model.layers / provider.model.layers), on_step)

        # the group's dimensions without its labels (as fast_key_parts keys the model): a model file's name is its
        # path, so with it a calibration was keyed by where the file lay (a test's temporary copy, a CI clone)
        parts = {**key_parts, "layer_group": {"index": g, "layers": list(indices), "kind": kind.describe(),
                                              "model": repr(replace(sub, name="", source=""))}}
        gate = group_gate(model, sub)
        if gate is not None:  # the group-limited routing (a key without it stays as it was)
            parts["layer_group"]["gate"] = [gate.n_group, gate.topk_group, gate.scoring_func]
        if calibration_model(sub) is not None:  # calibrated on fewer of its layers
            parts["layer_group"]["calibrated_on_layers"] = calibration_model(sub).layers
        provider, record = make_fast(sub, parts, group_pilot, g)
        count_weights_once(model, kind, provider, g == 0)
        groups.append((kind, indices, provider))
        records.append({"layers": list(indices), "kind": kind.describe(), **record})
    latency = LayerListLatency(model, groups)
    record = {"key": "+".join(r["key"] for r in records), "groups": records, "error": latency.error,
              "cached": all(r.get("cached") for r in records)}
    return latency, record


def calibrated_layer_list(model: ModelConfig, records: list, make_group, seed: int) -> LayerListLatency:
    """A fresh fast provider of a heterogeneous model from its groups' stored calibration ``records`` (in
    :func:`~stepsim.models.layers.layer_groups` order; ``stepsim plan`` prices its candidates so):
    ``make_group(group model, record, routing seed, gate)`` gives a group's provider (:func:`group_seed`,
    :func:`group_gate`), its weights outside the graphs counted as :func:`fast_layer_list` counts them."""
    groups = []
    for g, ((kind, indices), record) in enumerate(zip(layer_groups(model), records, strict=True)):
        sub = group_model(model, kind, len(indices))
        provider = make_group(sub, record, group_seed(seed, g), group_gate(model, sub))
        count_weights_once(model, kind, provider, g == 0)
        groups.append((kind, indices, provider))
    return LayerListLatency(model, groups)


def layer_list_works(model: ModelConfig, hardware, vocab: int, chips: int) -> list[tuple[StepWork, int]]:
    """Each layer group's roofline (:func:`group_work`, the first with the LM head of ``vocab`` rows) and the
    experts a step computing any token touches in its layers at least (``top_k`` a MoE layer, 0 a dense one):
    ``stepsim plan``'s floor of a heterogeneous model adds them (:func:`stepsim.plan.pricing.floor_s`)."""
    return [(group_work(model, kind, len(indices), hardware, vocab if g == 0 else 0, chips, g == 0),
             len(indices) * model.top_k if kind.ffn == "moe" else 0)
            for g, (kind, indices) in enumerate(layer_groups(model))]


def describe_groups(model: ModelConfig) -> list[str]:
    """One line per layer group: ``layers 0-2 (3): mla + dense``, ``layers 1, 3, .., 47 (24): full + moe``."""
    out = []
    for kind, indices in layer_groups(model):
        steps = {b - a for a, b in zip(indices, indices[1:])}
        if len(indices) == 1:
            span = f"{indices[0]}"
        elif steps == {1}:
            span = f"{indices[0]}-{indices[-1]}"
        elif len(steps) == 1 and len(indices) > 2:
            span = f"{indices[0]}, {indices[1]}, .., {indices[-1]}"
        else:
            span = ", ".join(map(str, indices))
        out.append(f"layers {span} ({len(indices)}): {kind.describe()}")
    return out


__all__ = ["LayerListLatency", "GroupLatency", "exact_layer_list", "fast_layer_list", "group_model", "seen_batch",
           "takes_layer_list", "describe_groups", "check_layer_list", "routing_columns", "group_seed", "group_gate",
           "calibrated_layer_list", "layer_list_works", "group_work", "calibration_model", "CALIBRATION_LAYERS"]
