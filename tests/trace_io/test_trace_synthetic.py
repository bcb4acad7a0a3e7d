"""Seeded synthetic generators: determinism, skew control, top-k without replacement, KV resampling."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stepsim.base.errors import ConfigError
from stepsim.trace_io import (
    expert_counts,
    read_trace,
    routing_matrix,
    sample_kv_lengths,
    synthetic_kv_batches,
    synthetic_routing,
    validate_table,
    write_trace,
)
from stepsim.trace_io.azure_quantiles import AZURE_CONV_CONTEXT_PERCENTILES
from stepsim.trace_io.make_bundled import BUNDLED, DATA_DIR, make_bundled
from stepsim.trace_io.synthetic import CHUNK_TOKENS, expert_popularity, sample_top_k


def test_same_seed_bit_identical(tmp_path):
    a = synthetic_routing(3000, 128, 8, seed=11, skew="zipf", alpha=1.2, gate_weights=True)
    b = synthetic_routing(3000, 128, 8, seed=11, skew="zipf", alpha=1.2, gate_weights=True)
    c = synthetic_routing(3000, 128, 8, seed=12, skew="zipf", alpha=1.2, gate_weights=True)
    assert a.equals(b) and a.schema.metadata == b.schema.metadata
    assert not a.equals(c)
    for suffix in (".arrow", ".parquet"):
        write_trace(a, tmp_path / f"a{suffix}")
        write_trace(b, tmp_path / f"b{suffix}")
        assert (tmp_path / f"a{suffix}").read_bytes() == (tmp_path / f"b{suffix}").read_bytes()
    k1 = synthetic_kv_batches(16, seed=5, num_batches=4)
    k2 = synthetic_kv_batches(16, seed=5, num_batches=4)
    assert k1.equals(k2)


def test_routing_is_valid_and_shaped():
    t = synthetic_routing(CHUNK_TOKENS + 10, 128, 8, seed=0, batch=64, layer=5, model="qwen")
    validate_table(t)
    m = routing_matrix(t)
    assert m.shape == (CHUNK_TOKENS + 10, 8)
    assert all(len(set(row)) == 8 for row in m[:2000].tolist())
    assert t.column("iteration").to_pylist()[63:65] == [0, 1]
    assert t.column("token").to_pylist()[63:65] == [63, 0]
    assert set(t.column("layer").to_pylist()) == {5}
    meta = t.schema.metadata
    assert (meta[b"model"], meta[b"num_experts"], meta[b"top_k"], meta[b"seed"]) == (b"qwen", b"128", b"8", b"0")


def test_chunking_does_not_change_values():
    """Tokens 0..n-1 of a longer trace equal the shorter trace with the same seed (streaming-invariant)."""
    short = routing_matrix(synthetic_routing(CHUNK_TOKENS - 5, 16, 2, seed=9))
    long = routing_matrix(synthetic_routing(CHUNK_TOKENS + 500, 16, 2, seed=9))
    assert np.array_equal(long[: CHUNK_TOKENS - 5], short)


def _max_share(t):
    c = expert_counts(t)
    return c.max() / c.sum()


def test_skew_is_controllable():
    n = 20_000
    uniform = synthetic_routing(n, 16, 2, seed=1, skew="uniform")
    zipf_lo = synthetic_routing(n, 16, 2, seed=1, skew="zipf", alpha=0.3)
    zipf_hi = synthetic_routing(n, 16, 2, seed=1, skew="zipf", alpha=2.0)
    dir_flat = synthetic_routing(n, 16, 2, seed=1, skew="dirichlet", alpha=1000.0)
    dir_skew = synthetic_routing(n, 16, 2, seed=1, skew="dirichlet", alpha=0.05)
    assert _max_share(uniform) < 0.07  # ideal 1/16 = 0.0625
    assert _max_share(uniform) < _max_share(zipf_lo) < _max_share(zipf_hi)
    assert _max_share(dir_flat) < 0.07 < _max_share(dir_skew)
    # with top-2 no expert can exceed half of the assignments: every token picks two different experts
    assert _max_share(zipf_hi) <= 0.5


def test_gumbel_top_k_matches_sequential_sampling():
    """First choice ~ p; second choice ~ p renormalized without the first (Plackett-Luce)."""
    p = np.array([0.5, 0.3, 0.2])
    ids, w = sample_top_k(p, 200_000, 2, np.random.default_rng(0))
    first = np.bincount(ids[:, 0], minlength=3) / len(ids)
    assert np.allclose(first, p, atol=0.005)
    # P(second = 1) = P(first=0) * 0.3/0.5 + P(first=2) * 0.3/0.8
    second = np.bincount(ids[:, 1], minlength=3) / len(ids)
    assert second[1] == pytest.approx(0.5 * 0.6 + 0.2 * 0.375, abs=0.005)
    assert np.allclose(w.sum(axis=1), 1.0, atol=1e-6)
    assert w.dtype == np.float32 and ids.dtype == np.int16


@given(
    num_experts=st.integers(1, 40),
    data=st.data(),
    skew=st.sampled_from(["uniform", "dirichlet", "zipf"]),
    seed=st.integers(0, 2**32 - 1),
)
@settings(max_examples=40, deadline=None)
def test_top_k_without_replacement(num_experts, data, skew, seed):
    top_k = data.draw(st.integers(1, num_experts))
    alpha = data.draw(st.floats(0.01, 5.0))
    t = synthetic_routing(50, num_experts, top_k, seed=seed, skew=skew, alpha=alpha, gate_weights=True)
    validate_table(t)  # ids in range, no duplicate within a token, finite non-negative weights
    m = routing_matrix(t)
    assert m.shape == (50, top_k)
    assert all(len(set(row)) == top_k for row in m.tolist())


def test_popularity_errors():
    rng = np.random.default_rng(0)
    with pytest.raises(ConfigError, match="skew must be one of"):
        expert_popularity(8, rng, "pareto")
    with pytest.raises(ConfigError, match="alpha must be a finite number > 0, got 0.0"):
        expert_popularity(8, rng, "dirichlet", 0.0)
    with pytest.raises(ConfigError, match="alpha must be a finite number > 0, got inf"):  # NaN probabilities
        expert_popularity(8, rng, "dirichlet", float("inf"))
    with pytest.raises(ConfigError, match="alpha must be a finite number >= 0, got inf"):
        expert_popularity(8, rng, "zipf", float("inf"))
    with pytest.raises(ConfigError, match="top_k must be in 1..num_experts"):
        synthetic_routing(10, 4, 5, seed=0)


def test_kv_resampling_from_distribution():
    dist = np.array([100, 200, 300, 5000])
    t = synthetic_kv_batches(64, seed=2, num_batches=2, distribution=dist)
    validate_table(t)
    kv = np.concatenate([np.array(r) for r in t.column("kv_lengths").to_pylist()])
    assert set(kv.tolist()) <= set(dist.tolist()) and len(set(kv.tolist())) == 4
    assert t.column("request_ids").to_pylist()[1][:2] == [65, 66]
    assert t.schema.metadata[b"distribution"] == b"array(n=4)"


def test_kv_resampling_from_azure_csv(conv_requests):
    dist = conv_requests.column("context_tokens").to_numpy().astype(np.int64)
    kv = sample_kv_lengths(10_000, np.random.default_rng(4), dist)
    assert np.isin(kv, dist).all()
    assert abs(np.median(kv) - np.median(dist)) < 60


def test_kv_from_bundled_percentiles():
    q = np.asarray(AZURE_CONV_CONTEXT_PERCENTILES)
    assert len(q) == 101 and q[0] == 2.0 and q[-1] == 14050.0 and (np.diff(q) >= 0).all()
    kv = sample_kv_lengths(50_000, np.random.default_rng(0))
    assert kv.dtype == np.int64 and kv.min() >= 2 and kv.max() <= 14050
    # sampled percentiles follow the table (inverse-CDF sampling)
    assert abs(np.percentile(kv, 50) - q[50]) < 25
    assert abs(np.percentile(kv, 90) - q[90]) < 150


def test_bundled_files_regenerate_identically(tmp_path):
    written = make_bundled(tmp_path)
    assert [p.name for p in written] == list(BUNDLED)
    for p in written:
        assert p.read_bytes() == (DATA_DIR / p.name).read_bytes(), p.name


def test_bundled_files_content():
    mix = read_trace(DATA_DIR / "synthetic_routing_mixtral_b64.arrow")
    qwen = read_trace(DATA_DIR / "synthetic_routing_qwen_b64.arrow")
    kv = read_trace(DATA_DIR / "synthetic_kv_b16.arrow")
    assert routing_matrix(mix).shape == (64, 2) and len(expert_counts(mix)) == 8
    assert routing_matrix(qwen).shape == (64, 8) and len(expert_counts(qwen)) == 128
    assert int(expert_counts(qwen).sum()) == 512
    assert kv.num_rows == 1 and len(kv.column("kv_lengths")[0].as_py()) == 16
    assert kv.schema.field("kv_lengths").type == pa.list_(pa.int64())
