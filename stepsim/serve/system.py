"""Serving on several chips (``stepsim serve --system FILE``): the weights split over the chips, the KV cache in
what every chip's HBM has left.

A model that does not fit one chip's HBM is served on a system (docs/system.md: chips, their hardware, links).
The weights are split by the parallelism the serving engines use for it (docs/serving.md §11):

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
block as on one chip (:func:`stepsim.serve.kv_cache.kv_capacity`).

Step latency: ``--iteration-latency SECONDS`` prices every step. The engine-backed fidelities on a system (each
layer's pieces simulated across the chips, with their links) are not built yet and refused with one line.
"""

from __future__ import annotations

from dataclasses import dataclass

from stepsim.base.errors import ConfigError
from stepsim.serve.kv_cache import KVCapacity, kv_capacity
from stepsim.serve.memory import DTYPE_BYTES, ModelMemory

#: refusal of an engine-backed fidelity with --system (not built yet)
FIDELITY_NOT_BUILT = ("--fidelity {fidelity} with --system is not built yet (the layers' pieces are simulated on one "
                      "chip); price the steps with --iteration-latency SECONDS")


def load_system(spec, hardware, fidelity):
    """``(system, its hardware)`` for ``--system spec``; one line when ``--hardware`` or an engine-backed
    ``--fidelity`` is also given (the system names the chips' hardware; multi-chip fidelity is not built)."""
    from stepsim.base.errors import SystemConfigError
    from stepsim.base.system import System

    if hardware is not None:
        raise ConfigError("--hardware does not apply with --system: the system file names the chips' hardware")
    if fidelity is not None:
        raise ConfigError(FIDELITY_NOT_BUILT.format(fidelity=fidelity))
    try:
        system = System.load(str(spec))
    except SystemConfigError as exc:
        raise ConfigError(f"--system: {exc}") from None
    return system, system.hardware


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
    # a chip holds its experts in every layer: gate, up and down matrices
    per_expert = model.layers * 3 * model.hidden * model.expert_intermediate * DTYPE_BYTES
    per_chip = -(-model.experts // chips)
    experts = [max(0, min(model.experts - c * per_chip, per_chip)) for c in range(chips)]
    rest = memory.weight_bytes - model.experts * per_expert
    return "ep+tp", [r + e * per_expert for r, e in zip(_even(rest, chips), experts)], experts


def system_capacity(system, model, memory: ModelMemory, block_size: int,
                    hbm_bytes: int | None = None) -> tuple[KVCapacity, ChipWeights]:
    """The KV cache of ``model`` served on ``system`` (a :class:`~stepsim.base.system.System`; module docstring)
    and how its weights are split. ``hbm_bytes`` overrides each chip's HBM capacity (bytes).

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
    capacity = kv_capacity(system.chips * hbm, memory.weight_bytes, memory.kv_bytes_per_token, block_size)
    return capacity, ChipWeights(system.name, system.chips, parallelism, hbm, tuple(weights), tuple(experts))
