"""The SwiGLU, MoE and GQA-decode references against hand-computed cases and independent formulations.

Exact cases use gate pre-activations of 32 or more: ``silu(t) = t / (1 + exp(-t))`` equals ``t`` in float32 for
``t >= 32`` (``exp(-32) = 1.3e-14`` is far below half an ulp), so SwiGLU with ``w_gate = 32 I``, ``w_up = I``,
``w_down = I / 32`` maps a non-negative integer row ``x`` to ``x**2`` exactly.
"""

import math

import numpy as np
import pytest

from stepsim.base.errors import ArgumentError, ShapeError
from stepsim.workloads.reference import (
    gqa_decode_reference,
    max_rel_error,
    moe_expert_outputs,
    moe_reference,
    silu,
    swiglu_reference,
)

EYE2 = np.eye(2)


def sigmoid_silu(t):
    """Independent SiLU: t * 1 / (1 + exp(-t)) in float64 (fine for the moderate values used here)."""
    return t / (1.0 + np.exp(-t))


# --- SwiGLU -----------------------------------------------------------------------------------------------
def test_swiglu_squares_rows_with_identity_like_weights():
    x = np.array([[1.0, 2.0], [3.0, 0.0]])
    y = swiglu_reference(x, 32 * EYE2, EYE2, EYE2 / 32)
    assert y.dtype == np.float32
    assert y.tolist() == [[1.0, 4.0], [9.0, 0.0]]


def test_swiglu_orients_rectangular_weights_as_x_at_w():
    x = np.array([[1.0, 2.0]])  # B=1, D=2, F=3
    w_gate = 32 * np.array([[1.0, 0.0, 1.0], [0.0, 1.0, 1.0]])  # gate = 32 * [1, 2, 3]
    w_up = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])  # up = [1, 2, 0]: the third feature is switched off
    w_down = np.array([[1.0, 0.0], [0.0, 1.0], [5.0, 5.0]]) / 32
    assert swiglu_reference(x, w_gate, w_up, w_down).tolist() == [[1.0, 4.0]]


def test_swiglu_matches_an_independent_float64_formulation():
    rng = np.random.default_rng(0)
    b, d, f = 16, 24, 40
    x = rng.standard_normal((b, d)).astype(np.float32)
    wg, wu = (rng.standard_normal((d, f)).astype(np.float32) / np.sqrt(d) for _ in range(2))
    wd = rng.standard_normal((f, d)).astype(np.float32) / np.sqrt(f)
    g = x.astype(np.float64) @ wg
    expected = (sigmoid_silu(g) * (x.astype(np.float64) @ wu)) @ wd
    assert max_rel_error(swiglu_reference(x, wg, wu, wd), expected) < 1e-6


@pytest.mark.parametrize("args,match", [
    ((np.ones(4), EYE2, EYE2, EYE2), r"x must be 2-D, got shape \[4\]"),
    ((np.ones((1, 3)), EYE2, EYE2, EYE2), r"w_gate has shape \[2, 2\]; its rows must equal x's D = 3"),
    ((np.ones((1, 2)), EYE2, np.ones((2, 3)), EYE2), r"w_up has shape \[2, 3\], expected \[D, F\].* = \[2, 2\]"),
    ((np.ones((1, 2)), EYE2, EYE2, np.ones((3, 2))), r"w_down has shape \[3, 2\], expected \[F, D\] = \[2, 2\]"),
])
def test_swiglu_shape_errors_name_the_argument_and_shapes(args, match):
    with pytest.raises(ShapeError, match=match):
        swiglu_reference(*args)


def test_silu_is_x_sigmoid_x_and_finite_for_large_magnitudes():
    t = np.array([-30.0, -5.0, -0.5, 0.0, 0.5, 5.0, 30.0])
    assert np.allclose(silu(t), sigmoid_silu(t), rtol=4e-16, atol=0)  # full relative accuracy, tiny values too
    with np.errstate(over="raise", invalid="raise", divide="raise"):  # underflow to 0 is fine
        assert silu(np.array([-1000.0, 1000.0])).tolist() == [-0.0, 1000.0]


# --- MoE --------------------------------------------------------------------------------------------------
def square_experts(scales):
    """Experts mapping x -> scale * x**2 (non-negative integer x), stacked [E, ...]."""
    e = len(scales)
    return (np.stack([32 * EYE2] * e), np.stack([EYE2] * e), np.stack([EYE2 / 32 * s for s in scales]))


def test_moe_two_tokens_two_experts_weighted_sum_is_exact():
    x = np.array([[1.0, 2.0], [3.0, 1.0]])
    routing = np.array([[0, 1], [1, 0]])
    weights = np.array([[0.25, 0.75], [0.5, 0.5]])
    y = moe_reference(x, routing, weights, *square_experts([1, 2]))
    # token 0: 0.25 * 1 * [1, 4] + 0.75 * 2 * [1, 4]; token 1: 0.5 * 2 * [9, 1] + 0.5 * 1 * [9, 1]
    assert y.dtype == np.float32
    assert y.tolist() == [[1.75, 7.0], [13.5, 1.5]]


def test_moe_without_gate_weights_sums_the_top_k_outputs():
    x = np.array([[1.0, 2.0], [3.0, 1.0]])
    y = moe_reference(x, [[0, 1], [1, 0]], None, *square_experts([1, 2]))
    assert y.tolist() == [[3.0, 12.0], [27.0, 3.0]]


def test_moe_top1_picks_one_expert_per_token():
    x = np.array([[1.0, 2.0], [3.0, 1.0], [2.0, 2.0]])
    y = moe_reference(x, [[1], [0], [2]], [[1.0], [0.5], [2.0]], *square_experts([1, 2, 3]))
    assert y.tolist() == [[2.0, 8.0], [4.5, 0.5], [24.0, 24.0]]


def test_moe_expert_outputs_are_unweighted_rows_in_token_order():
    x = np.array([[1.0, 2.0], [3.0, 1.0], [2.0, 0.0]])
    outs = moe_expert_outputs(x, [[0, 1], [1, 0], [1, 2]], *square_experts([1, 2, 3, 4]))
    assert [o.tokens.tolist() for o in outs] == [[0, 1], [0, 1, 2], [2], []]
    assert outs[0].rows.tolist() == [[1.0, 4.0], [9.0, 1.0]]
    assert outs[1].rows.tolist() == [[2.0, 8.0], [18.0, 2.0], [8.0, 0.0]]
    assert outs[2].rows.tolist() == [[12.0, 0.0]]
    assert outs[3].rows.shape == (0, 2) and outs[3].rows.dtype == np.float32


def random_moe(rng, b=12, d=8, f=16, e=4, k=2):
    x = rng.standard_normal((b, d)).astype(np.float32)
    routing = np.stack([rng.choice(e, k, replace=False) for _ in range(b)])
    weights = rng.random((b, k)).astype(np.float32)
    wg, wu = (rng.standard_normal((e, d, f)).astype(np.float32) / np.sqrt(d) for _ in range(2))
    wd = rng.standard_normal((e, f, d)).astype(np.float32) / np.sqrt(f)
    return x, routing, weights, wg, wu, wd


def test_moe_matches_a_dense_per_token_formulation():
    x, routing, weights, wg, wu, wd = random_moe(np.random.default_rng(3))
    expected = np.zeros(x.shape)
    for t in range(x.shape[0]):
        v = x[t].astype(np.float64)
        for s, e in enumerate(routing[t]):
            expected[t] += weights[t, s] * ((sigmoid_silu(v @ wg[e]) * (v @ wu[e])) @ wd[e])
    assert max_rel_error(moe_reference(x, routing, weights, wg, wu, wd), expected) < 1e-6


def test_moe_does_not_depend_on_the_slot_order():
    x, routing, weights, wg, wu, wd = random_moe(np.random.default_rng(4), k=3)
    flipped = moe_reference(x, routing[:, ::-1], weights[:, ::-1], wg, wu, wd)
    assert np.array_equal(moe_reference(x, routing, weights, wg, wu, wd), flipped)


def test_moe_rejects_bad_routing():
    x = np.ones((2, 2))
    experts = square_experts([1, 2])
    with pytest.raises(ArgumentError, match="expert id 2 outside 0..1"):
        moe_reference(x, [[0, 2], [0, 1]], None, *experts)
    with pytest.raises(ArgumentError, match="names expert 1 twice"):
        moe_reference(x, [[0, 1], [1, 1]], None, *experts)
    with pytest.raises(ShapeError, match=r"routing has shape \[3, 2\], expected \[B, top_k\] with B = 2"):
        moe_reference(x, [[0, 1]] * 3, None, *experts)


def test_moe_shape_errors_name_the_argument_and_shapes():
    x = np.ones((2, 2))
    wg, wu, wd = square_experts([1, 2])
    with pytest.raises(ShapeError, match=r"gate_weights has shape \[2, 1\], expected \[B, top_k\] like routing"):
        moe_reference(x, [[0, 1], [1, 0]], np.ones((2, 1)), wg, wu, wd)
    with pytest.raises(ShapeError, match=r"w_down has shape \[2, 2, 3\], expected \[E, F, D\] = \[2, 2, 2\]"):
        moe_reference(x, [[0, 1], [1, 0]], None, wg, wu, np.ones((2, 2, 3)))
    with pytest.raises(ShapeError, match=r"w_gate has shape \[2, 3, 2\]; expected \[E, D, F\] with D = 2"):
        moe_reference(x, [[0, 1], [1, 0]], None, np.ones((2, 3, 2)), wu, wd)
    with pytest.raises(ShapeError, match=r"w_up must be 3-D, got shape \[2, 2\]"):
        moe_reference(x, [[0, 1], [1, 0]], None, wg, EYE2, wd)


# --- GQA decode attention ----------------------------------------------------------------------------------
V_ROWS = np.array([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0], [9.0, 10.0, 11.0, 12.0]])
NEW_V = np.array([3.0, 0.0, 1.0, -4.0])


def one_request(n_rows=8, length=3, d=4, g=2):
    """One request, ``length`` cached rows of V_ROWS, zero keys, zeros after the cached rows."""
    k_cache = np.zeros((1, n_rows, d))
    v_cache = np.zeros((1, n_rows, d))
    v_cache[0, :length] = V_ROWS[:length]
    return np.zeros((1, g, d)), k_cache, v_cache, np.array([length]), np.zeros((1, d)), NEW_V[None]


@pytest.mark.parametrize("softmax", ["stable", "plain"])
@pytest.mark.parametrize("order", ["tiled", "direct"])
def test_zero_scores_average_the_values_up_to_the_new_token(softmax, order):
    res = gqa_decode_reference(*one_request(), softmax=softmax, order=order, tile_n=2)
    # (V rows 0..2 + new_v) / 4 = [18, 18, 22, 20] / 4
    assert res.out.tolist() == [[[4.5, 4.5, 5.5, 5.0]] * 2]


@pytest.mark.parametrize("softmax", ["stable", "plain"])
def test_tile_padding_rows_join_the_softmax_like_the_graph(softmax):
    """L = 3 with tiles of 8: the graph reads 8 rows; the 4 zero rows after the new token add exp(0) = 1
    each to the denominator and 0 to the numerator."""
    res = gqa_decode_reference(*one_request(), softmax=softmax, tile_n=8, include_tile_padding=True)
    assert res.out.tolist() == [[[2.25, 2.25, 2.75, 2.5]] * 2]


def test_kv_append_places_the_new_row_at_kv_len_and_leaves_the_inputs_alone():
    rng = np.random.default_rng(5)
    b, n, d = 3, 8, 4
    k_cache = rng.standard_normal((b * n, d)).astype(np.float32)
    v_cache = rng.standard_normal((b * n, d)).astype(np.float32)
    k_before, v_before = k_cache.copy(), v_cache.copy()
    new_k = rng.standard_normal((b, d)).astype(np.float32)
    new_v = rng.standard_normal((b, d)).astype(np.float32)
    lengths = np.array([3, 0, 7])
    res = gqa_decode_reference(rng.standard_normal((b * 2, d)), k_cache, v_cache, lengths, new_k, new_v, tile_n=4)
    assert res.k_cache.shape == (b * n, d) and res.out.shape == (b * 2, d)  # flat in, flat out
    expected_k, expected_v = k_before.copy(), v_before.copy()
    rows = np.arange(b) * n + lengths  # request b's block starts at row b*n
    expected_k[rows], expected_v[rows] = new_k, new_v
    assert np.array_equal(res.k_cache, expected_k) and np.array_equal(res.v_cache, expected_v)
    assert np.array_equal(k_cache, k_before) and np.array_equal(v_cache, v_before)


def test_attention_reads_the_appended_row():
    q, k_cache, v_cache, lengths, new_k, new_v = one_request(length=3)
    q[0] = [[8.0, 0.0, 0.0, 0.0]] * 2
    new_k[0] = [40.0, 0.0, 0.0, 0.0]  # score 320 vs 0: stable softmax puts all weight on the new row
    res = gqa_decode_reference(q, k_cache, v_cache, lengths, new_k, new_v, softmax="stable", tile_n=2)
    assert res.out.tolist() == [[NEW_V.tolist()] * 2]


def random_attention(rng, b=4, g=3, d=16, n=96, max_len=90):
    lengths = rng.integers(0, max_len, b)
    q = rng.standard_normal((b, g, d)) * d ** -0.25
    k_cache = rng.standard_normal((b, n, d)) * d ** -0.25
    v_cache = rng.standard_normal((b, n, d))
    return q, k_cache, v_cache, lengths, rng.standard_normal((b, d)) * d ** -0.25, rng.standard_normal((b, d))


@pytest.mark.parametrize("softmax", ["stable", "plain"])
@pytest.mark.parametrize("padding", [False, True])
def test_tiled_and_one_shot_orders_agree(softmax, padding):
    args = random_attention(np.random.default_rng(6))
    tiled = gqa_decode_reference(*args, softmax=softmax, order="tiled", tile_n=8, include_tile_padding=padding)
    direct = gqa_decode_reference(*args, softmax=softmax, order="direct", tile_n=8, include_tile_padding=padding)
    assert max_rel_error(tiled.out, direct.out) < 1e-6


def test_stable_and_plain_differ_only_by_the_scale():
    q, *rest = random_attention(np.random.default_rng(7), d=16)
    stable = gqa_decode_reference(q, *rest, softmax="stable", tile_n=8).out
    plain_scaled = gqa_decode_reference(q / 4.0, *rest, softmax="plain", tile_n=8).out  # 1/sqrt(16), exact
    plain = gqa_decode_reference(q, *rest, softmax="plain", tile_n=8).out
    assert max_rel_error(plain_scaled, stable) < 1e-6
    assert max_rel_error(plain, stable) > 1e-2


def test_stable_matches_an_independent_masked_softmax():
    q, k_cache, v_cache, lengths, new_k, new_v = random_attention(np.random.default_rng(8))
    out = gqa_decode_reference(q, k_cache, v_cache, lengths, new_k, new_v, softmax="stable", tile_n=8).out
    d = q.shape[2]
    for b, length in enumerate(lengths):
        keys = np.vstack([k_cache[b, :length], new_k[b]])
        vals = np.vstack([v_cache[b, :length], new_v[b]])
        s = q[b] @ keys.T / math.sqrt(d)
        p = np.exp(s - s.max(axis=1, keepdims=True))
        assert max_rel_error(out[b], (p / p.sum(axis=1, keepdims=True)) @ vals) < 1e-6


def test_stable_running_max_survives_scores_that_overflow_the_plain_form():
    """Scores grow along the sequence (10..170), so every tile raises the running max and rescales."""
    d, n = 4, 17
    q = np.zeros((1, 1, d))
    q[0, 0, 0] = 1.0
    k_cache = np.zeros((1, 20, d))
    k_cache[0, :n - 1, 0] = 10.0 * np.arange(1, n)  # scores 10, 20, ..., 160
    v_cache = np.zeros((1, 20, d))
    v_cache[0, :n - 1, 1] = 1.0
    new_k = np.array([[170.0, 0, 0, 0]])
    new_v = np.array([[0.0, 0, 2.0, 0]])
    args = (q, k_cache, v_cache, np.array([n - 1]), new_k, new_v)
    for order in ("tiled", "direct"):
        out = gqa_decode_reference(*args, softmax="stable", order=order, tile_n=4).out[0, 0] * 2  # scale 1/2
        # weights exp(5*i) / sum_j exp(5*j), i = 1..17: the new row gets 1 / sum_{j<=17} exp(5*(j-17))
        w_new = 1.0 / np.sum(np.exp(5.0 * (np.arange(1, n + 1) - n)))
        assert out[2] == pytest.approx(4.0 * w_new, rel=1e-6) and out[1] == pytest.approx(2 * (1 - w_new), rel=1e-5)
    plain = gqa_decode_reference(*args, softmax="plain", tile_n=4).out
    assert np.isnan(plain).any()  # exp(170) overflows fp32 in the artifact's form, as in the graph


def test_three_d_and_flat_layouts_give_the_same_values():
    q, k_cache, v_cache, lengths, new_k, new_v = random_attention(np.random.default_rng(9))
    b, g, d = q.shape
    r3 = gqa_decode_reference(q, k_cache, v_cache, lengths, new_k, new_v)
    flat = gqa_decode_reference(q.reshape(b * g, d), k_cache.reshape(-1, d), v_cache.reshape(-1, d), lengths,
                                new_k, new_v)
    assert r3.out.shape == (b, g, d) and r3.k_cache.shape == k_cache.shape
    assert np.array_equal(flat.out, r3.out.reshape(b * g, d))
    assert np.array_equal(flat.v_cache, r3.v_cache.reshape(-1, d))


def test_attention_argument_errors():
    q, k_cache, v_cache, lengths, new_k, new_v = one_request(n_rows=8, length=3)
    with pytest.raises(ShapeError, match=r"q has shape \[3, 4\]; a flat q needs B\*G rows with B = 2"):
        gqa_decode_reference(np.zeros((3, 4)), np.zeros((16, 4)), np.zeros((16, 4)), [1, 1], np.zeros((2, 4)),
                             np.zeros((2, 4)))
    with pytest.raises(ShapeError, match=r"new_v has shape \[1, 3\], expected \[B, D\] = \[1, 4\]"):
        gqa_decode_reference(q, k_cache, v_cache, lengths, new_k, np.zeros((1, 3)))
    with pytest.raises(ShapeError, match=r"v_cache has shape \[1, 8, 5\], expected \[B, N, D\]"):
        gqa_decode_reference(q, k_cache, np.zeros((1, 8, 5)), lengths, new_k, new_v)
    with pytest.raises(ArgumentError, match="request 0 has kv_length 8 and needs row 8 for the new token"):
        gqa_decode_reference(q, k_cache, v_cache, [8], new_k, new_v)
    with pytest.raises(ArgumentError, match=r"needs 12 rows \(whole tiles of 6\).*N = 8"):
        gqa_decode_reference(q, k_cache, v_cache, [6], new_k, new_v, tile_n=6, include_tile_padding=True)
    with pytest.raises(ArgumentError, match="negative"):
        gqa_decode_reference(q, k_cache, v_cache, [-1], new_k, new_v)
    with pytest.raises(ArgumentError, match="softmax must be one of"):
        gqa_decode_reference(q, k_cache, v_cache, lengths, new_k, new_v, softmax="online")
    with pytest.raises(ArgumentError, match="order must be one of"):
        gqa_decode_reference(q, k_cache, v_cache, lengths, new_k, new_v, order="random")
