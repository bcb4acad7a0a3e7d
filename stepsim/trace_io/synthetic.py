"""Seeded synthetic traces: MoE routing with controllable skew, and decode-batch KV lengths.

Determinism: every generator takes a ``seed`` and draws from ``numpy.random.default_rng(seed)`` (PCG64) in a
fixed order, using only ``Generator.random``, ``integers``, ``permutation`` and ``dirichlet``, so the same
arguments give bit-identical tables. Routing is generated in fixed chunks of :data:`CHUNK_TOKENS` tokens and
uniform draws are consumed row by row, so the output does not depend on how it is streamed.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np
import pyarrow as pa

from stepsim.base.errors import ConfigError
from stepsim.trace_io.azure_quantiles import AZURE_CONV_CONTEXT_PERCENTILES
from stepsim.trace_io.schemas import DECODE_BATCHES, ROUTING, make_schema

#: tokens generated per step (memory per step: CHUNK_TOKENS x num_experts float64)
CHUNK_TOKENS = 1 << 16
SKEWS = ("uniform", "dirichlet", "zipf")


def expert_popularity(
    num_experts: int, rng: np.random.Generator, skew: str = "dirichlet", alpha: float = 1.0
) -> np.ndarray:
    """Probability of each expert being a token's first choice.

    Parameters
    ----------
    num_experts : int
        Experts per layer.
    rng : numpy.random.Generator
        Random source (consumed: Dirichlet draw, or a permutation for Zipf).
    skew : {"uniform", "dirichlet", "zipf"}
        ``dirichlet``: p ~ Dirichlet(alpha, ..., alpha); small alpha (e.g. 0.1) is very skewed, large alpha
        (e.g. 100) nearly uniform. ``zipf``: p_i proportional to rank_i ** -alpha over a random ranking of the
        experts; alpha = 0 is uniform, 1-2 is strongly skewed. ``uniform`` ignores alpha.
    alpha : float
        Concentration (Dirichlet) or exponent (Zipf).

    Returns
    -------
    ndarray of float64, shape (num_experts,), summing to 1.
    """
    if num_experts <= 0:
        raise ConfigError(f"num_experts must be positive, got {num_experts}")
    if skew == "uniform":
        return np.full(num_experts, 1.0 / num_experts)
    if skew == "dirichlet":
        if not 0 < alpha < math.inf:  # inf: numpy's Dirichlet draws NaN probabilities
            raise ConfigError(f"Dirichlet concentration alpha must be a finite number > 0, got {alpha}")
        return rng.dirichlet(np.full(num_experts, float(alpha)))
    if skew == "zipf":
        if not 0 <= alpha < math.inf:  # inf: one expert has every probability, a top-k > 1 draw fails in NumPy
            raise ConfigError(f"Zipf exponent alpha must be a finite number >= 0, got {alpha}")
        ranks = rng.permutation(num_experts) + 1.0
        p = ranks ** -float(alpha)
        return p / p.sum()
    raise ConfigError(f"skew must be one of {', '.join(SKEWS)}, got {skew!r}")


def sample_top_k(p: np.ndarray, n: int, top_k: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Draw ``top_k`` distinct experts for each of ``n`` tokens, without replacement, proportional to ``p``.

    Uses the Gumbel-top-k trick (equivalent to drawing one expert at a time from ``p`` renormalized over the
    experts not yet chosen), vectorized over tokens. Experts come out in draw order (most preferred first).

    Returns
    -------
    ids : ndarray of int16, shape (n, top_k)
    weights : ndarray of float32, shape (n, top_k)
        ``p`` of the chosen experts renormalized per token (a router's normalized gate weights).
    """
    e = len(p)
    u = rng.random((n, e))
    with np.errstate(divide="ignore", invalid="ignore"):
        keys = np.log(p)[None, :] - np.log(-np.log1p(-u))  # 1-u in (0, 1]: log never sees 0 from u
    part = np.argpartition(-keys, top_k - 1, axis=1)[:, :top_k]
    order = np.argsort(-np.take_along_axis(keys, part, axis=1), axis=1, kind="stable")
    ids = np.take_along_axis(part, order, axis=1)
    w = p[ids]
    total = w.sum(axis=1, keepdims=True)
    # a very skewed Dirichlet can leave fewer than top_k experts with p > 0; give those tokens equal weights
    w = np.where(total > 0, w / np.where(total > 0, total, 1.0), 1.0 / top_k).astype(np.float32)
    return ids.astype(np.int16), w


def routing_schema_for(
    num_experts: int, top_k: int, *, model: str | None, seed: int, skew: str, alpha: float, gate_weights: bool
) -> pa.Schema:
    """Normalized routing schema with the synthetic generator's parameters as metadata."""
    return make_schema(
        ROUTING,
        top_k=top_k,
        gate_weights=gate_weights,
        model=model or "synthetic",
        num_experts=num_experts,
        source="synthetic",
        seed=seed,
        skew=skew,
        alpha=repr(float(alpha)),
    )


def iter_synthetic_routing(
    num_tokens: int,
    num_experts: int,
    top_k: int,
    seed: int,
    *,
    skew: str = "dirichlet",
    alpha: float = 1.0,
    batch: int | None = None,
    layer: int = 0,
    model: str | None = None,
    gate_weights: bool = False,
) -> Iterator[pa.RecordBatch]:
    """Stream a synthetic routing trace as record batches of at most :data:`CHUNK_TOKENS` rows.

    Parameters
    ----------
    num_tokens : int
        Token rows in total.
    num_experts, top_k : int
        Experts per layer and experts per token (``top_k <= num_experts``).
    seed : int
        Random seed.
    skew, alpha
        Expert popularity, see :func:`expert_popularity` (drawn once for the whole trace).
    batch : int, optional
        Tokens per iteration: row r is token ``r % batch`` of iteration ``r // batch``. Default: all tokens
        in iteration 0.
    layer : int
        Layer number stored in every row.
    model : str, optional
        Model name for the metadata (default ``"synthetic"``).
    gate_weights : bool
        Also emit ``gate_weights``.
    """
    if not 0 < top_k <= num_experts:
        raise ConfigError(f"top_k must be in 1..num_experts ({num_experts}), got {top_k}")
    if num_tokens < 0:
        raise ConfigError(f"num_tokens must be >= 0, got {num_tokens}")
    if num_experts > np.iinfo(np.int16).max + 1:
        raise ConfigError(f"num_experts {num_experts} does not fit int16 expert ids")
    batch = batch or max(num_tokens, 1)
    if batch > np.iinfo(np.int32).max:
        raise ConfigError(f"batch {batch} does not fit int32 token ids; pass a smaller batch=")
    rng = np.random.default_rng(seed)
    p = expert_popularity(num_experts, rng, skew, alpha)
    schema = routing_schema_for(
        num_experts, top_k, model=model, seed=seed, skew=skew, alpha=alpha, gate_weights=gate_weights
    )
    for start in range(0, num_tokens, CHUNK_TOKENS):
        n = min(CHUNK_TOKENS, num_tokens - start)
        rows = np.arange(start, start + n, dtype=np.int64)
        ids, w = sample_top_k(p, n, top_k, rng)
        arrays = [
            pa.array((rows // batch).astype(np.int32)),
            pa.array(np.full(n, layer, dtype=np.int32)),
            pa.array((rows % batch).astype(np.int32)),
            pa.FixedSizeListArray.from_arrays(pa.array(ids.ravel()), top_k),
        ]
        if gate_weights:
            arrays.append(pa.FixedSizeListArray.from_arrays(pa.array(w.ravel()), top_k))
        yield pa.RecordBatch.from_arrays(arrays, schema=schema)


def synthetic_routing(num_tokens: int, num_experts: int, top_k: int, seed: int, **kwargs) -> pa.Table:
    """A synthetic routing trace as one table; see :func:`iter_synthetic_routing` for the parameters."""
    batches = list(iter_synthetic_routing(num_tokens, num_experts, top_k, seed, **kwargs))
    schema = routing_schema_for(
        num_experts,
        top_k,
        model=kwargs.get("model"),
        seed=seed,
        skew=kwargs.get("skew", "dirichlet"),
        alpha=kwargs.get("alpha", 1.0),
        gate_weights=kwargs.get("gate_weights", False),
    )
    return pa.Table.from_batches(batches, schema=schema)


def sample_kv_lengths(n: int, rng: np.random.Generator, distribution: np.ndarray | None = None) -> np.ndarray:
    """Draw ``n`` KV lengths (int64 tokens).

    Parameters
    ----------
    n : int
        Values to draw.
    rng : numpy.random.Generator
        Random source.
    distribution : array_like of int, optional
        Observed lengths (e.g. the Azure CSV's ``context_tokens``), resampled uniformly with replacement.
        Default: inverse-CDF sampling from the bundled Azure percentile table
        (:data:`~stepsim.trace_io.azure_quantiles.AZURE_CONV_CONTEXT_PERCENTILES`), rounded to integers.
    """
    if distribution is None:
        q = np.asarray(AZURE_CONV_CONTEXT_PERCENTILES, dtype=np.float64)
        u = rng.random(n)
        return np.rint(np.interp(u, np.linspace(0.0, 1.0, len(q)), q)).astype(np.int64)
    d = np.asarray(distribution)
    if d.ndim != 1 or len(d) == 0 or not np.issubdtype(d.dtype, np.integer):
        raise ConfigError("distribution must be a non-empty 1-D integer array of KV lengths")
    if d.min() < 0:
        raise ConfigError(f"distribution holds a negative length {d.min()}")
    return d[rng.integers(0, len(d), size=n)].astype(np.int64)


def synthetic_kv_batches(
    batch: int, seed: int, *, num_batches: int = 1, distribution: np.ndarray | None = None, source: str | None = None
) -> pa.Table:
    """A decode-batches trace of ``num_batches`` batches of ``batch`` requests with sampled KV lengths.

    Request ids are 1-based and consecutive across batches (batch b holds ``b*batch+1 .. (b+1)*batch``).
    ``source`` names the distribution in the metadata (default ``azure-conv-percentiles`` or ``array``).
    """
    if batch <= 0 or num_batches <= 0:
        raise ConfigError(f"batch and num_batches must be positive, got {batch} and {num_batches}")
    rng = np.random.default_rng(seed)
    kv = sample_kv_lengths(batch * num_batches, rng, distribution).reshape(num_batches, batch)
    ids = np.arange(1, batch * num_batches + 1, dtype=np.int64).reshape(num_batches, batch)
    if source is None:
        source = "azure-conv-percentiles" if distribution is None else f"array(n={len(distribution)})"
    schema = make_schema(DECODE_BATCHES, source="synthetic", seed=seed, distribution=source)
    return pa.table(
        [
            pa.array(np.arange(num_batches, dtype=np.int32)),
            pa.array(list(ids), pa.list_(pa.int64())),
            pa.array(list(kv), pa.list_(pa.int64())),
        ],
        schema=schema,
    )
