"""Group-limited top-k routing (DeepSeek-V3's gate): the vectorised router picks the experts, with the weights, of
DeepSeek's code transcribed token by token, on random logits and biases (scaled-down and real dims)."""

from __future__ import annotations

import numpy as np
import pytest

from stepsim.base.errors import ArgumentError
from stepsim.models.presets import resolve_model
from stepsim.workloads.group_routing import GateConfig, deepseek_gate_reference, route


@pytest.mark.parametrize("gate", [
    GateConfig(32, 4, n_group=4, topk_group=2, scoring_func="sigmoid", routed_scaling_factor=2.5),
    GateConfig(24, 3, n_group=6, topk_group=1),
    GateConfig(16, 2, scoring_func="softmax"),
])
@pytest.mark.parametrize("with_bias", [True, False])
def test_router_picks_the_experts_of_deepseeks_gate(gate, with_bias):
    rng = np.random.default_rng(7)
    logits = rng.standard_normal((200, gate.experts))
    bias = rng.standard_normal(gate.experts) * 0.3 if with_bias else None
    ids, weights = route(logits, gate, bias)
    ref_ids, ref_weights = deepseek_gate_reference(logits, gate, bias)
    assert ids.shape == (200, gate.top_k) and ids.dtype == np.int64
    assert (ids == ref_ids).all()
    assert np.abs(weights - ref_weights).max() < 1e-15 * gate.routed_scaling_factor * 4
    size = gate.experts // gate.n_group
    groups = np.sort(ids // size, axis=1)
    assert all(len(set(row)) <= gate.topk_group for row in groups.tolist())  # within the kept groups
    if gate.scoring_func == "sigmoid":
        assert np.allclose(weights.sum(axis=1), gate.routed_scaling_factor, rtol=1e-14)


def test_the_bias_selects_but_does_not_weigh():
    """One expert's bias makes every token pick it; its weight is still its unbiased score's share."""
    gate = GateConfig(8, 2, n_group=2, topk_group=1, routed_scaling_factor=1.0)
    logits = np.zeros((3, 8))
    logits[:, 1] = 2.0  # expert 1 leads group 0 without the bias
    bias = np.zeros(8)
    bias[6] = 10.0  # expert 6 (group 1) wins the selection
    ids, weights = route(logits, gate, bias)
    assert ids.tolist() == [[6, 4]] * 3  # group 1 only; ties among its zeros go to the lower index
    assert np.allclose(weights, 0.5)  # sigmoid(0) twice, normalised


def test_deepseek_v3_gate_on_random_logits():
    model = resolve_model("deepseek-v3")
    gate = GateConfig.of_model(model)
    assert gate == GateConfig(256, 8, n_group=8, topk_group=4, scoring_func="sigmoid", routed_scaling_factor=2.5)
    rng = np.random.default_rng(11)
    logits, bias = rng.standard_normal((64, 256)), rng.standard_normal(256) * 0.1
    ids, weights = route(logits, gate, bias)
    ref_ids, ref_weights = deepseek_gate_reference(logits, gate, bias)
    assert (ids == ref_ids).all() and np.abs(weights - ref_weights).max() < 1e-14
    assert max(len(set(row)) for row in (ids // 32).tolist()) <= 4


@pytest.mark.parametrize("kwargs, message", [
    (dict(experts=30, top_k=2, n_group=4), "gate: n_group 4 does not divide the 30 experts"),
    (dict(experts=32, top_k=2, n_group=4, topk_group=5), "gate: topk_group 5 exceeds n_group 4"),
    (dict(experts=32, top_k=9, n_group=4, topk_group=1), "gate: top_k 9 exceeds the 8 experts of the 1 groups kept"),
    (dict(experts=8, top_k=2, scoring_func="relu"), "gate: scoring_func must be one of sigmoid, softmax, got 'relu'"),
])
def test_bad_gates_are_one_line(kwargs, message):
    with pytest.raises(ArgumentError) as err:
        GateConfig(**kwargs)
    assert str(err.value) == message
    with pytest.raises(ArgumentError, match=r"^gate: logits must be \[tokens, 8\] \(one per expert\), got shape \[3, 7\]$"):
        route(np.zeros((3, 7)), GateConfig(8, 2))
