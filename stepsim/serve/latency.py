"""Iteration-latency providers: how long one scheduler step (one forward pass over a batch) takes.

The scheduler hands a provider an :class:`IterationBatch` (every scheduled request's context length and new
tokens) and gets an :class:`IterationCost` back; it never knows which provider it has. Implementations:

* :class:`ConstantLatency` -- ``--iteration-latency SECONDS``: every step takes the same time (what-if studies,
  and testing the scheduler against queueing theory);
* :class:`stepsim.serve.exact.EngineLatency` (``--fidelity exact``: every layer on the cycle engine) and
  :class:`stepsim.serve.fast.FastLatency` (``--fidelity fast``: calibrated on exact simulations of the run).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from stepsim.base.ranges import positive_seconds


@dataclass(frozen=True)
class IterationBatch:
    """One step's work, in the scheduler's batch order.

    Attributes
    ----------
    context_tokens : list of int
        Per scheduled request: tokens already in its KV cache before the step (tokens).
    new_tokens : list of int
        Per scheduled request: tokens computed in the step (a decode: 1; a prefill chunk: its length).
    prefill_tokens, decode_tokens : int
        Sum of ``new_tokens`` over prefilling and decoding requests.
    """

    context_tokens: list[int]
    new_tokens: list[int]
    prefill_tokens: int
    decode_tokens: int


#: a step's roofline columns (:class:`IterationCost`'s ``work``) and their units, in iterations.parquet order
WORK_COLUMNS = {"hbm_bytes": "bytes", "flops": "FLOPs", "hbm_utilisation": "fraction",
                "compute_utilisation": "fraction"}


@dataclass(frozen=True)
class IterationCost:
    """What a provider says about one step.

    Attributes
    ----------
    seconds : float
        Duration of the step (s), > 0.
    cycles : dict of str to int
        Cycles per layer kind (``attention``, ``moe``, ...), when the provider simulates them; empty otherwise.
    work : dict of str to number
        The step's roofline when the provider prices layers (:class:`stepsim.mapping.roofline.StepWork`):
        ``hbm_bytes`` and ``flops`` it must read and do, and the ``hbm_utilisation`` and ``compute_utilisation``
        its cycles achieve (0..1); empty otherwise. Each becomes an iterations.parquet column.
    """

    seconds: float
    cycles: dict[str, int] = field(default_factory=dict)
    work: dict = field(default_factory=dict)


class LatencyProvider(Protocol):
    """Anything that prices a step. ``mode`` names it in the summary's ``fidelity``; ``error`` is its measured
    relative error (None when not measured, e.g. a constant)."""

    mode: str
    error: float | None

    def __call__(self, batch: IterationBatch) -> IterationCost: ...


class ConstantLatency:
    """Every step takes ``seconds`` (s), whatever its batch."""

    mode = "iteration-latency"
    error = None

    def __init__(self, seconds: float):
        self.seconds = positive_seconds("--iteration-latency", seconds)  # at most 2**32 s: stepsim.base.ranges
        self._cost = IterationCost(self.seconds)  # one object for every step: the scheduler's hot loop allocates none

    def __call__(self, batch: IterationBatch) -> IterationCost:
        return self._cost
