"""The compiled replay with ``--fidelity fast`` on a system (:class:`stepsim.serve.system_fast.SystemFastLatency`,
what a plan prices a replica of 2-16 chips with) against the Python loop: random traces and scheduler settings,
random coefficients, an MoE model's block over 2 and 4 chips (the per-chip FFN columns, the shared experts' tiles
over the chips' shards) and a dense model's tensor-parallel shard: the same tables bit for bit (the all-reduces in
``cycles_attention``, the weights read ``1 / n`` a chip), the routing left in the same state; a disaggregated
deployment's decode pool of two chips likewise."""

from __future__ import annotations

import numpy as np
import pytest
from test_replay_compiled import _model, _random_coefficients, _random_run, assert_same_result

from stepsim.base.system import System
from stepsim.serve import replay_compiled
from stepsim.serve.replay import replay_reference
from stepsim.serve.replay_compiled import compiled_replay
from stepsim.serve.routing import SyntheticRouting
from stepsim.serve.system_fast import SystemFastLatency


def _system_fast(model, system, seed: int, forms: dict, theta) -> SystemFastLatency:
    routing = SyntheticRouting(model.experts, model.top_k, model.layers, seed=seed) if model.is_moe else None
    return SystemFastLatency(model, system, routing, max_model_len=4096, vocab=1000, forms=forms, theta=theta)


@pytest.mark.parametrize("variant, system", [("moe", "ring-2"), ("moe", "ring-4"), ("shared", "ring-4"),
                                             ("dense", "ring-2")])
def test_the_compiled_system_pricing_is_the_providers(tmp_path, variant, system):
    model = _model(tmp_path, variant)
    system = System.preset(system)
    rng = np.random.default_rng(61)
    probe = _system_fast(model, system, 0, None, None)
    forms, _ = _random_coefficients(rng, 1, variant == "shared")
    probe.forms = forms
    columns = probe.ffn_rows(3)[0].shape[1]  # the provider's own width: its FFN regressors of a 3-token step
    assert columns == {"moe": 20, "shared": 21, "dense": 17}[variant]
    collectives = 0
    for trial in range(5):
        arrival, prompt, output, make, settings = _random_run(rng)
        forms, theta = _random_coefficients(rng, columns, variant == "shared")
        theta = None if trial == 0 else theta
        seed = int(rng.integers(0, 1000))
        compiled, reference = (_system_fast(model, system, seed, forms, theta) for _ in range(2))
        got = compiled_replay(arrival, prompt, output, make(), compiled)
        assert got is not None, (settings, replay_compiled._fallback_reason)
        want = replay_reference(arrival, prompt, output, make(), reference)
        assert_same_result(got, want)
        collectives += int((want.iterations["cycles_attention"] > 0).all())
        if model.is_moe:
            a, b = compiled.routing, reference.routing
            assert a._used == b._used and np.array_equal(a._starts, b._starts)
            assert a._windows.bit_generator.state == b._windows.bit_generator.state
    assert collectives == 5


def test_a_compiled_decode_pool_of_several_chips_prices_as_the_system_provider(tmp_path):
    """A disaggregated deployment's decode pool of two chips (both first-token definitions): the compiled pool's
    tables and routing state are the Python pool's."""
    from test_disaggregated_compiled import _both, _pool_trace

    from stepsim.base.errors import SimulationError

    model, system = _model(tmp_path, "moe"), System.preset("ring-2")
    rng = np.random.default_rng(71)
    compiled = 0
    for trial in range(6):
        arrival, prompt, output, make, settings = _random_run(rng)
        first_token = ("decode", "prefill")[trial % 2]
        arrive, prefill_end, moves = _pool_trace(rng, arrival, output, first_token)
        forms, theta = _random_coefficients(rng, 20, False)
        a, b = (_system_fast(model, system, 9, forms, theta) for _ in range(2))
        try:
            got, want = _both(arrive, prompt, output, prefill_end, moves, make, a, b, first_token)
        except SimulationError:  # a request the idle pool cannot hold: the reference's error (tested elsewhere)
            continue
        assert got is not None, (settings, replay_compiled._fallback_reason)
        compiled += 1
        assert_same_result(got, want)
        assert a.routing._used == b.routing._used and np.array_equal(a.routing._starts, b.routing._starts)
    assert compiled >= 4
