"""Serving on several chips (``stepsim serve --system FILE``): the weights split over the chips, the KV cache in
what every chip's HBM has left.

A model that does not fit one chip's HBM is served on a system (docs/system.md: chips, their hardware, links).
The weights are split by the parallelism the serving engines use for it (docs/serving.md §13):

* an MoE model's routed experts by **expert parallelism** over all n chips, placed contiguously (chip c holds
  experts ``c k .. c k + k - 1``, ``k = ceil(E / n)``, as ``--placement contiguous``); everything else
  (attention projections, router, shared experts, norms, embedding, LM head) by **tensor parallelism** over
  the n chips;
* a dense model's weights by tensor parallelism over the n chips.

Tensor parallelism splits a matrix's bytes evenly; a byte count that n does not divide puts the remainder's
bytes on the first chips (one each), so the chips' weights add up exactly to the model's. Every chip must hold
its share: the busiest chip is checked against its HBM, one line saying by how much it is short.

The KV cache is sharded like the attention (by tensor parallelism: each chip holds its share of every token's
KV heads), so its capacity is the sum over the chips of the HBM left after their weights:
``num_blocks = (n x HBM - weights) // (block_size x KV bytes per token)``, the same blocks, block size and null
block as on one chip (:func:`stepsim.serve.kv_cache.kv_capacity`). MLA's latent is every head's, so each chip
caches all of it (vLLM replicates it over tensor-parallel ranks): ``n x`` the one-chip bytes per token. Sliding-window
layers get their own pool, as on one chip (:func:`stepsim.serve.kv_cache.pooled_capacity`).

Step latency: ``--iteration-latency SECONDS`` prices every step, or ``--fidelity exact`` simulates each layer
across the chips (:class:`SystemEngineLatency`: the MoE block with its experts on the chips and its tokens over
the links, on the engine; the attention's KV heads split over the chips, then an all-reduce), or ``--fidelity
fast`` (:class:`stepsim.serve.system_fast.SystemFastLatency`: the fast model calibrated on those exact pieces,
its cache key holding the system, :func:`system_key`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from stepsim.base.errors import ConfigError
from stepsim.serve.exact import EngineLatency, layer_weight_bytes, max_kv_rows
from stepsim.serve.kv_cache import KVCapacity, kv_capacity, pooled_capacity
from stepsim.serve.layer_use import LayerUse
from stepsim.serve.layers import LayerSpec
from stepsim.serve.memory import DTYPE_BYTES, KVPool, ModelMemory, kv_pools


def load_system(spec, hardware, fidelity, chip):
    """``(system, its chips' hardware)`` for ``--system spec``. Every chip is ``hardware`` when given (``--hardware``:
    a preset, a ``.toml`` file or a Hardware); else the hardware the system file names (its ``hardware`` key); else,
    for a system that names none (the presets, a file without the key), serving's own default, ``sn40l``, as on one
    chip: a serve run never changes chips because a system was given (:func:`system_names_hardware`). ``chip``: the
    serving hardware ``hardware`` resolves to (:func:`stepsim.serve.api.resolve_serving_hardware`: the default
    when None), which the caller resolved and checked."""
    import dataclasses

    from stepsim.base.errors import SystemConfigError
    from stepsim.base.system import System

    try:
        system = System.load(str(spec))
        named = system_names_hardware(spec)
    except SystemConfigError as exc:
        raise ConfigError(f"--system: {exc}") from None
    if hardware is None and named:
        return system, system.hardware
    if isinstance(hardware, (str, os.PathLike)) and str(hardware).endswith(".toml"):
        name = str(Path(hardware).resolve())  # as a system file's hardware_spec names a file: its absolute path
    else:
        name = chip.name if hardware is None or not isinstance(hardware, (str, os.PathLike)) else str(hardware)
    return dataclasses.replace(system, hardware=chip, hardware_spec=name), chip


def system_names_hardware(spec) -> bool:
    """Whether the system ``spec`` (a preset name or a TOML file) names its chips' hardware (a ``hardware`` key);
    the presets name none."""
    import tomllib

    from stepsim.base.system.config import PRESETS

    text = str(spec)
    if not text.endswith(".toml") and not Path(text).is_file():
        return "hardware" in PRESETS.get(text, {})
    with open(text, "rb") as f:  # read once already by System.load: a file it parsed
        return "hardware" in tomllib.load(f)


@dataclass(frozen=True)
class ChipWeights:
    """How a model's weights are split over a system's chips.

    Attributes
    ----------
    system : str
        The system's name.
    chips : int
        Chips (n).
    parallelism : str
        ``ep+tp`` (MoE: experts by expert parallelism, the rest by tensor parallelism) or ``tp`` (dense).
    hbm_bytes_per_chip : int
        Each chip's HBM capacity (bytes).
    chip_weight_bytes : tuple of int
        Weights on each chip (bytes); their sum is the model's weights.
    chip_experts : tuple of int
        Routed experts on each chip (MoE; empty for a dense model).
    """

    system: str
    chips: int
    parallelism: str
    hbm_bytes_per_chip: int
    chip_weight_bytes: tuple
    chip_experts: tuple

    def summary(self) -> dict:
        """The summary's ``system`` object (bytes)."""
        return {"name": self.system, "chips": self.chips, "parallelism": self.parallelism,
                "hbm_bytes_per_chip": self.hbm_bytes_per_chip, "chip_weight_bytes": list(self.chip_weight_bytes),
                "chip_experts": list(self.chip_experts)}


def _even(total: int, chips: int) -> list[int]:
    """``total`` bytes split evenly over ``chips``, the remainder one byte each on the first chips."""
    return [total // chips + (1 if c < total % chips else 0) for c in range(chips)]


def split_weights(model, memory: ModelMemory, chips: int) -> tuple[str, list[int], list[int]]:
    """``(parallelism, weights per chip, experts per chip)`` of ``model`` (a ModelConfig) on ``chips`` chips
    (module docstring)."""
    if not model.is_moe:
        return "tp", _even(memory.weight_bytes, chips), []
    if chips > model.experts:
        raise ConfigError(f"--system: {chips} chips for {model.experts} experts: expert parallelism leaves a chip "
                          f"without experts (use a system of {model.experts} chips or fewer)")
    # a chip holds its experts in every MoE layer (a layer-list model's dense layers have none): gate, up, down
    moe_layers = sum(model.layer_is_moe(i) for i in range(model.layers)) if model.unmodelled() else model.layers
    per_expert = moe_layers * 3 * model.hidden * model.expert_intermediate * DTYPE_BYTES
    per_chip = -(-model.experts // chips)
    experts = [max(0, min(model.experts - c * per_chip, per_chip)) for c in range(chips)]
    rest = memory.weight_bytes - model.experts * per_expert
    return "ep+tp", [r + e * per_expert for r, e in zip(_even(rest, chips), experts)], experts


def system_kv_pools(model, chips: int) -> tuple[KVPool, ...]:
    """The model's KV pools over ``chips`` chips (bytes per token summed over the chips; module docstring): KV
    heads as :func:`kv_heads_per_chip` shards them, MLA's latent on every chip."""
    if model.is_mla:
        return tuple(KVPool(p.kind, p.layers, p.bytes_per_token * chips, p.window) for p in kv_pools(model))
    held = kv_heads_per_chip(model, chips) * chips
    return tuple(KVPool(p.kind, p.layers, p.bytes_per_token // model.kv_heads * held, p.window)
                 for p in kv_pools(model))


def system_capacity(system, model, memory: ModelMemory, block_size: int,
                    hbm_bytes: int | None = None, max_num_seqs: int = 1) -> tuple[KVCapacity, ChipWeights]:
    """The KV cache of ``model`` served on ``system`` (a :class:`~stepsim.base.system.System`; module docstring)
    and how its weights are split. ``hbm_bytes`` overrides each chip's HBM capacity (bytes); ``max_num_seqs``
    sizes a sliding-window pool.

    Raises
    ------
    ConfigError
        A chip's weights do not fit its HBM (naming the busiest chip
        and by how much), more chips than experts, too few KV blocks.
    """
    hbm = system.hardware.hbm_capacity_bytes if hbm_bytes is None else hbm_bytes
    parallelism, weights, experts = split_weights(model, memory, system.chips)
    busiest = max(range(system.chips), key=lambda c: (weights[c], -c))
    if weights[busiest] > hbm:
        raise ConfigError(f"--system {system.name}: chip {busiest}'s share of the weights ({weights[busiest] / 1e9:.2f} "
                          f"GB, {parallelism} over {system.chips} chips) does not fit its HBM ({hbm / 1e9:.2f} GB): "
                          f"{(weights[busiest] - hbm) / 1e9:.2f} GB short; use more chips")
    pools = system_kv_pools(model, system.chips)
    if model.sliding_layers or model.chunked_layers:
        capacity = pooled_capacity(system.chips * hbm, memory.weight_bytes, pools, block_size, max_num_seqs)
    else:
        capacity = kv_capacity(system.chips * hbm, memory.weight_bytes, pools[0].bytes_per_token, block_size)
    return capacity, ChipWeights(system.name, system.chips, parallelism, hbm, tuple(weights), tuple(experts))


def tp_weight_cycles(model, hardware, vocab: int, chips: int, tokens: int, per_layer: int | None = None,
                     head: bool = True) -> int:
    """Cycles of a step's off-chip weights outside the layer graphs on ``chips`` chips (docs/serving.md §9.3,
    split by tensor parallelism): each chip reads ``ceil(bytes / chips)`` of every layer's q/k/v/o projections and
    router, of the LM head and of the step's ``tokens`` embedding rows, at its HBM's peak bytes/cycle.
    ``per_layer``: a layer's bytes instead of :func:`layer_weight_bytes` (a layer group's real attention weights,
    :mod:`stepsim.serve.layer_list`); ``head=False``: without the LM head and embedding rows (counted by another
    group)."""
    import math

    d, peak = model.hidden, hardware.hbm_peak_bytes_per_cycle
    per_layer = layer_weight_bytes(model) if per_layer is None else per_layer

    def cycles(nbytes: int) -> int:
        return math.ceil(-(-nbytes // chips) / peak)

    outside = cycles(vocab * d * DTYPE_BYTES) + cycles(tokens * d * DTYPE_BYTES) if head else 0
    return model.layers * cycles(per_layer) + outside


def allreduce_cycles(system, hidden: int, tokens: int) -> int:
    """Cycles of the tensor-parallel all-reduce after a layer's attention: the streamed ring all-reduce
    (:func:`stepsim.workloads.collective.closed_form.streamed_ring_cycles`, the closed-form estimate of the
    collective's default ``ring``, tiles of :func:`stepsim.workloads.collective.build.default_tile_bytes`; equal
    to the engine on an idle system whenever each link sends the steps in order, e.g. every chunk of one tile) of
    the step's fp32 activations, ``tokens x hidden x 4`` bytes rounded up to a multiple of ``4 n`` (the
    collective's chunking)."""
    from stepsim.workloads.collective.build import default_tile_bytes
    from stepsim.workloads.collective.closed_form import collective_cycles

    n, dim = system.chips, system.dimensions[0]
    nbytes = -(-tokens * hidden // n) * n * 4
    return collective_cycles("all-reduce", "ring", dim.topology, n, nbytes, dim.link_latency, dim.link_bandwidth,
                             system.hardware.pmu_bw, tile_bytes=default_tile_bytes(system.hardware))


def kv_heads_per_chip(model, chips: int) -> int:
    """KV heads each chip holds under tensor parallelism: ``ceil(kv_heads / chips)``; with more chips than KV
    heads every chip holds one, replicated (as vLLM replicates KV heads when the TP size exceeds them), so the
    system holds ``chips x ceil(kv_heads / chips)`` heads' caches."""
    return -(-model.kv_heads // chips)


def tp_shard(model, chips: int):
    """One chip's share of a dense model under tensor parallelism over ``chips`` (Megatron's split): ``heads /
    chips`` query heads with their :func:`kv_heads_per_chip` KV heads, ``F / chips`` FFN columns (the gate and up
    matrices' columns, the down matrix's rows); the other dimensions whole. Each chip's layer is the one-chip layer
    of this model, so it is built and mapped like one (:mod:`stepsim.serve.layers`).

    Raises
    ------
    ConfigError
        The query heads, the FFN columns or the KV heads do not split evenly over the chips.
    """
    import dataclasses

    heads, kv, f = model.heads, model.kv_heads, model.dense_intermediate
    if not f:
        raise ConfigError(f"model {model.name!r} has no FFN dimensions (intermediate_size)")
    if heads % chips or f % chips:
        raise ConfigError(f"--system: tensor parallelism over {chips} chips needs the query heads ({heads}) and the "
                          f"FFN columns ({f}) of {model.name!r} divisible by {chips}")
    if kv % chips and chips % kv:
        raise ConfigError(f"--system: {chips} chips neither split nor replicate the {kv} KV heads of "
                          f"{model.name!r} evenly (tensor parallelism needs one to divide the other)")
    per_chip = kv_heads_per_chip(model, chips)
    return dataclasses.replace(model, heads=heads // chips, kv_heads=per_chip, dense_intermediate=f // chips)


def mqa_shard(model, chips: int):
    """The attention one chip of an expert-parallel MoE model runs: with one KV head (multi-query attention, as
    MLA's absorbed form is: :mod:`stepsim.serve.layer_list`) its query heads split over the chips, ``heads /
    chips`` a chip, each chip reading the whole (replicated) cache, as vLLM's tensor parallelism splits MLA's
    heads; with more KV heads (or query heads the chips do not divide) ``model`` as it is, its KV heads split
    by :func:`kv_heads_per_chip`. The MoE block's dimensions are not touched. Tensor rather than data parallelism
    (DeepSeek's own deployment runs MLA data-parallel): it is what the dense groups and the other models' systems
    do, needs no placement of requests on chips, and MLA's latent is small enough to hold on every chip."""
    import dataclasses

    if model.kv_heads != 1 or chips == 1 or model.heads % chips:
        return model
    return dataclasses.replace(model, heads=model.heads // chips)


def head_shard(model, chips: int):
    """One chip's heads of an expert-parallel MoE model's attention, as one model (mapped layers hold every KV head
    of the model they are built for): with one KV head :func:`mqa_shard`'s; else :func:`kv_heads_per_chip` KV heads
    with their query heads."""
    import dataclasses

    if model.kv_heads == 1:
        return mqa_shard(model, chips)
    held = kv_heads_per_chip(model, chips)
    return dataclasses.replace(model, heads=model.heads // model.kv_heads * held, kv_heads=held)


def check_exact_system(system, model, fidelity: str = "exact") -> None:
    """The exact (or fast, calibrated on exact) fidelity on a system needs a system whose all-reduce has a closed
    form (one dimension: ring, fully connected or switch), and a dense model whose dimensions split by tensor
    parallelism (:func:`tp_shard`); one line otherwise."""
    if not model.is_moe:
        tp_shard(model, system.chips)
    if len(system.dimensions) != 1 or system.dimensions[0].topology not in ("ring", "fully-connected", "switch"):
        raise ConfigError(f"--fidelity {fidelity} with --system {system.name}: the system needs one dimension (ring, "
                          f"fully-connected or switch) for its all-reduce's closed form")


def system_engine_latency(model, system, routing, *, max_model_len: int, vocab: int, jobs=None,
                          schedule: str = "paper"):
    """The exact provider on ``system`` (:class:`SystemEngineLatency`), after :func:`check_exact_system`."""
    check_exact_system(system, model)
    return SystemEngineLatency(model, system, routing, max_model_len=max_model_len, vocab=vocab, jobs=jobs,
                               schedule=schedule)


def system_layer_spec(model, system, max_model_len: int, schedule: str = "paper") -> LayerSpec:
    """What each chip of ``system`` runs of a layer: an MoE model's block sharded over the chips (its experts by
    expert parallelism), or a dense model's tensor-parallel shard (:func:`tp_shard`), the one-chip layer of a
    narrower model, built with ``schedule`` (a mapped shard is mapped like any one-chip layer; a mapped MoE block
    each chip's share, :mod:`stepsim.mapping.expert_parallel`, beside one chip's heads, :func:`head_shard`)."""
    if model.is_moe:
        heads = head_shard(model, system.chips) if schedule == "auto" else mqa_shard(model, system.chips)
        return LayerSpec(heads, system.hardware, max_kv_rows(max_model_len), system=system, schedule=schedule)
    return LayerSpec(tp_shard(model, system.chips), system.hardware, max_kv_rows(max_model_len), schedule=schedule)


class SystemEngineLatency(EngineLatency):
    """The exact provider (:class:`stepsim.serve.exact.EngineLatency`) on a system's n chips.

    An MoE model:

    * each layer's MoE block runs on the engine with its experts on the n chips (expert parallelism, contiguous,
      the weight split of :func:`split_weights`) and the step's tokens sharded over them, dispatched and combined
      by all-to-alls over the system's links (:mod:`stepsim.workloads.moe.parallel`), one template per
      token count rebound to each step's routing chip by chip (:mod:`stepsim.serve.layers`: the sharded layer's
      FIFO depths follow the token count only); a step of fewer tokens than chips is sharded too
      (the last chips' shards empty: they run their experts for the other chips' tokens);
    * the attention's KV heads are split over the chips (tensor parallelism): ``ceil(kv_heads / n)`` heads a
      chip, one after another, the chips in parallel; then a ring all-reduce of the step's activations
      (:func:`allreduce_cycles`), counted in ``cycles_attention``.

    A dense model, by tensor parallelism (Megatron's): every chip runs the same layer of its shard
    (:func:`tp_shard`: its query and KV heads, its FFN columns) side by side, simulated once; after the
    attention's output projection and after the FFN's down projection the partial sums are all-reduced
    (two ring all-reduces a layer, counted in ``cycles_attention``). With ``schedule="auto"`` the shard's layers
    are mapped over each chip (:mod:`stepsim.mapping`).

    The weights outside the graphs are read ``1 / n`` a chip (:func:`tp_weight_cycles`), except on mapped chips
    (``schedule="auto"``): there each chip's q/k/v and o projections, its router (an MoE model's) and its rows of
    the LM head run on the engine and the weights stream ahead, also while the all-reduces hold the HBM idle, as on
    one chip (:mod:`stepsim.serve.projections`).
    """

    #: a layer's weight bytes outside the graphs instead of :func:`layer_weight_bytes` (a layer group's real
    #: attention weights and router; :func:`stepsim.serve.layer_list.count_weights_once`)
    layer_bytes: int | None = None

    def __init__(self, model, system, routing, *, max_model_len: int, vocab: int, jobs=None, schedule="paper"):
        self.chips = system.chips
        super().__init__(model, system.hardware, routing, max_model_len=max_model_len, vocab=vocab, jobs=jobs)
        self.system = system
        self.spec = system_layer_spec(model, system, max_model_len, schedule)
        #: the buckets the steps use (summary.json ``layers``) on mapped layers, of the chips' spec above (the base
        #: class, built on the paper's schedules, left it None)
        self.layer_use = LayerUse(self.spec) if schedule == "auto" else None

    def roles(self, tasks: list) -> list:
        if not self.model.is_moe:  # the shard's one-chip roles: its heads and every layer's FFN
            return EngineLatency.roles(self, tasks)
        # mapped: the attention holds the chip's every head (tasks tiles them); the paper's runs one at a time
        heads = 1 if self.spec.schedule == "auto" else kv_heads_per_chip(self.model, self.system.chips)
        return [("attention", heads * self.model.layers) if kind != "ffn" else ("ffn", 1) for kind, _ in tasks]

    def weight_cycles(self, batch) -> int:
        return tp_weight_cycles(self.model, self.hardware, self.vocab, self.system.chips, int(sum(batch.new_tokens)),
                                self.layer_bytes, self.counts_head)

    def allreduce_cycles(self, batch) -> int:
        """One all-reduce of the step's activations (:func:`allreduce_cycles`)."""
        return allreduce_cycles(self.system, self.model.hidden, int(sum(batch.new_tokens)))

    def collective_cycles(self, batch) -> int:
        """The all-reduces of the step's activations in every layer (counted in ``cycles_attention``): after the
        attention; a dense model's also after its FFN (an MoE block combines its tokens by all-to-all)."""
        per_layer = 1 if self.model.is_moe else 2
        return per_layer * self.model.layers * self.allreduce_cycles(batch)

    def describe(self) -> dict:
        return {**super().describe(), "system": self.system.name, "chips": self.system.chips}


def system_key(system) -> dict:
    """Every field of a system that determines its cycles: the chips, every chip's hardware values, the
    dimensions and every link (bandwidth bytes/cycle, latency cycles), the switches; for the fast fidelity's
    calibration cache key (:func:`stepsim.serve.calibration_cache.calibration_key`). Not its name nor where its hardware came
    from: the same system under another name reuses the calibration."""
    import dataclasses

    from stepsim.base.hardware import VALUE_FIELDS

    return {"chips": system.chips, "hardware": {f: getattr(system.hardware, f) for f in VALUE_FIELDS},
            "dimensions": [dataclasses.asdict(d) for d in system.dimensions],
            "links": [dataclasses.asdict(link) for link in system.links], "n_switches": system.n_switches}

