"""Expert-routing arrays: validation and the selector tensors the MoE graphs need."""

from __future__ import annotations

import numpy as np

from stepsim.base.errors import ArgumentError


def check_routing(routing, experts: int, top_k: int, source: str = "routing") -> np.ndarray:
    """Validate a ``[tokens, top_k]`` array of expert ids and return it as int64.

    Raises :class:`ArgumentError` naming the row and value for out-of-range or duplicated expert ids.
    """
    arr = np.asarray(routing)
    if arr.ndim != 2 or arr.shape[0] < 1:
        raise ArgumentError(f"{source}: expected a [tokens, top_k] array of expert ids, got shape {arr.shape}")
    if arr.shape[1] != top_k:
        raise ArgumentError(f"{source}: each token must pick top_k={top_k} experts, got {arr.shape[1]} per row")
    if not np.issubdtype(arr.dtype, np.integer):
        raise ArgumentError(f"{source}: expert ids must be integers, got dtype {arr.dtype}")
    arr = arr.astype(np.int64)
    bad = np.argwhere((arr < 0) | (arr >= experts))
    if len(bad):
        r, c = bad[0]
        raise ArgumentError(f"{source}: row {r} column {c}: expert id {arr[r, c]} outside 0..{experts - 1}")
    srt = np.sort(arr, axis=1)
    dup = np.argwhere(srt[:, 1:] == srt[:, :-1])
    if len(dup):
        r = dup[0][0]
        raise ArgumentError(f"{source}: row {r} names expert {srt[r, dup[0][1]]} twice: {arr[r].tolist()}")
    return arr


def expert_counts(routing: np.ndarray, experts: int) -> np.ndarray:
    """Tokens routed to each expert (int64, length ``experts``)."""
    return np.bincount(routing.ravel(), minlength=experts).astype(np.int64)


def multihot(routing: np.ndarray, experts: int) -> np.ndarray:
    """``[tokens, experts]`` 0/1 array: which experts each token goes to."""
    out = np.zeros((routing.shape[0], experts), np.int8)
    np.put_along_axis(out, routing, 1, axis=1)
    return out


def onehot_per_slot(routing: np.ndarray, experts: int) -> np.ndarray:
    """``[tokens, top_k, experts]`` 0/1 array: the expert of each (token, slot)."""
    tokens, k = routing.shape
    out = np.zeros((tokens, k, experts), np.int8)
    out[np.arange(tokens)[:, None], np.arange(k)[None, :], routing] = 1
    return out
