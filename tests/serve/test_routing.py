"""Serving routing: the synthetic model's skew re-fitted from the real routing traces and its statistics against
them; seeded determinism, locality, per-layer differences; replay of a routed-experts dump."""

from __future__ import annotations

import numpy as np
import pytest

from stepsim.base.errors import ConfigError
from stepsim.serve.routing import FITTED_SKEW, ReplayRouting, SyntheticRouting, fit_skew, sorted_counts


@pytest.fixture
def qwen_trace(shared_traces):
    return np.load(shared_traces / "expert_routing" / "qwen_b64" / "032_012.npz")["data"]


@pytest.fixture
def mixtral_trace(shared_traces):
    return np.load(shared_traces / "expert_routing" / "mixtral_b64" / "008_010.npz")["data"]


def test_fitted_skew_is_the_fit_of_the_real_traces(qwen_trace, mixtral_trace):
    assert fit_skew(qwen_trace, 128) == FITTED_SKEW[128] == (0.3, 0.05)
    assert fit_skew(mixtral_trace, 8) == FITTED_SKEW[8] == (0.1, 0.09)


def test_fitted_statistics_against_the_trace(qwen_trace, mixtral_trace):
    trace = sorted_counts(qwen_trace, 128)
    assert (int((trace == 0).sum()), int(trace[0]), int(trace[:8].sum())) == (68, 42, 214)
    model = SyntheticRouting(128, 8, 1, seed=0)
    batches = np.stack([sorted_counts(model.route(64)[:, 0, :], 128) for _ in range(500)])
    idle, busiest, top8 = (batches == 0).sum(1).mean(), batches[:, 0].mean(), batches[:, :8].sum(1).mean()
    assert (idle, busiest, top8) == (60.03, 39.338, 218.35)
    # within 12 % (idle experts), 7 % (busiest expert) and 2 % (the eight busiest) of the trace
    assert abs(idle / 68 - 1) < 0.12 and abs(busiest / 42 - 1) < 0.07 and abs(top8 / 214 - 1) < 0.03
    uniform = SyntheticRouting(128, 8, 1, seed=0, skew=(0.0, 0.0))  # what the fit improves on
    flat = np.stack([sorted_counts(uniform.route(64)[:, 0, :], 128) for _ in range(100)])
    assert flat[:, 0].mean() < 12 and (flat == 0).sum(1).mean() < 2

    mixtral = SyntheticRouting(8, 2, 1, seed=0)
    m = np.stack([sorted_counts(mixtral.route(64)[:, 0, :], 8) for _ in range(500)]).mean(0)
    assert np.abs(m - sorted_counts(mixtral_trace, 8)).max() < 2.7  # trace 24, 23, 17, 17, 14, 13, 10, 10


def test_synthetic_routing_is_seeded_and_valid():
    a = SyntheticRouting(128, 8, 4, seed=3).route(50)
    b = SyntheticRouting(128, 8, 4, seed=3)
    assert np.array_equal(a, b.route(50)) and not np.array_equal(a, b.route(50))
    assert a.shape == (50, 4, 8) and a.min() >= 0 and a.max() < 128
    assert all(len(set(row)) == 8 for row in a.reshape(-1, 8))
    # layers differ in which experts are popular
    many = SyntheticRouting(128, 8, 2, seed=3).route(4000)
    assert sorted_counts(many[:, 0], 128)[0] > 900
    assert np.argmax(np.bincount(many[:, 0].ravel())) != np.argmax(np.bincount(many[:, 1].ravel()))
    sticky = SyntheticRouting(128, 8, 1, seed=1, locality=1.0).route(10)
    assert (sticky == sticky[0]).all()
    with pytest.raises(ConfigError) as e:
        SyntheticRouting(8, 2, 1, locality=2.0)
    assert str(e.value) == "routing locality must be between 0 and 1, got 2.0"


def test_replay_routing_takes_dump_rows_in_order_and_wraps(tmp_path):
    dump = np.stack([[[t % 128, (t + 1) % 128] * 4 for _ in range(3)] for t in range(5)])  # [5, 3, 8]
    dump[:, :, 1::2] = (dump[:, :, 1::2] + 64) % 128  # distinct ids within a token
    dump[:, :, 2:] = (dump[:, :, :1] + np.arange(2, 8)) % 128
    dump[:, :, 1] = (dump[:, :, 0] + 100) % 128
    np.save(tmp_path / "r.npy", dump)
    r = ReplayRouting(tmp_path / "r.npy", "qwen3-30b-a3b", 2)
    first, second = r.route(4), r.route(3)
    assert np.array_equal(first, dump[:4, :2]) and np.array_equal(second, dump[[4, 0, 1], :2])
    with pytest.raises(ConfigError) as e:
        ReplayRouting(tmp_path / "r.npy", "qwen3-30b-a3b", 4)
    assert str(e.value) == f"--routing {tmp_path / 'r.npy'}: the dump has 3 layers; the model has 4"


def test_routings_of_one_law_and_seed_share_one_pool_drawn_as_a_fresh_one():
    """The fast path's pool is drawn once a process for each law and seed (stepsim/serve/routing.py
    ``_pool_in_ranks``): routings that draw it share its arrays, and what they give is what a pool drawn afresh
    gives; another seed, top_k or skew is another pool."""
    from stepsim.serve import routing

    routing._pool_in_ranks.cache_clear()
    first, second = (SyntheticRouting(16, 2, 3, seed=5) for _ in range(2))
    first._draw_pool()
    second._draw_pool()
    assert first._pool[0] is second._pool[0] and first._pool[1] is second._pool[1]
    shared = [second.window(tokens, 4)[0] for tokens in (1, 7, 300, 40_000)]
    routing._pool_in_ranks.cache_clear()
    fresh = SyntheticRouting(16, 2, 3, seed=5)
    fresh._draw_pool()
    assert fresh._pool[1] is not second._pool[1]
    assert all(np.array_equal(a, fresh._pool[i]) for i, a in enumerate(second._pool))
    assert all(np.array_equal(a, fresh.window(tokens, 4)[0]) for a, tokens in zip(shared, (1, 7, 300, 40_000)))
    for other in (SyntheticRouting(16, 2, 3, seed=6), SyntheticRouting(16, 3, 3, seed=5),
                  SyntheticRouting(16, 2, 3, seed=5, skew=(0.5, 0.0))):
        other._draw_pool()
        assert not np.array_equal(other._pool[1], fresh._pool[1])
    assert routing._pool_in_ranks.cache_info().currsize <= routing.POOLS_KEPT
