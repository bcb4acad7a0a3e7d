"""What a replay gives back (:func:`stepsim.serve.replay.replay`): a module of its own, so the Python loop
(:mod:`stepsim.serve.replay`) and the compiled one (:mod:`stepsim.serve.replay_compiled`) both make it without
importing each other."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class ReplayResult:
    """Raw outcome of a replay (all times in seconds).

    Attributes
    ----------
    first_scheduled, first_token, finish : ndarray of float64
        Per request (trace order).
    preemptions : ndarray of int64
        Per request.
    itl : ndarray of float64
        Every inter-token gap of every request, pooled (s).
    iterations : dict of str to ndarray
        Per step: ``start_s``, ``duration_s``, ``tokens``, ``sequences``, ``prefill_tokens``, ``decode_tokens``,
        ``kv_blocks_used`` (after scheduling), ``preemptions``, ``waiting`` (after scheduling), and
        ``cycles_<kind>`` when the provider reports cycles.
    max_blocks_used : int
        Largest ``kv_blocks_used`` of any step.
    """

    first_scheduled: np.ndarray
    first_token: np.ndarray
    finish: np.ndarray
    preemptions: np.ndarray
    itl: np.ndarray
    iterations: dict[str, np.ndarray]
    max_blocks_used: int
