"""The compiled decode pool (stepsim.serve.replay_compiled.compiled_decode_pool on the replay kernel) against the
Python reference (stepsim.serve.disaggregated._decode_pool_reference): random traces of requests arriving with
their KV cache, under random scheduler settings, priced by a constant and by the fast model, give the same
per-step and per-request tables bit for bit, under both first-token definitions; what the compiled pool does not
take goes to the reference, errors included; a disaggregated serve writes the same files either way."""

from __future__ import annotations

import json

import numpy as np
import pytest
from serve_requests import requests_file
from test_exact import SMALL
from test_replay_compiled import _fast, _model, _random_coefficients, _random_run, assert_same_result

import stepsim.serve.disaggregated as disaggregated
from stepsim.base.errors import SimulationError
from stepsim.serve.kv_cache import kv_capacity
from stepsim.serve.latency import ConstantLatency
from stepsim.serve.replay_compiled import compiled_decode_pool
from stepsim.serve.replay_result import ReplayResult
from stepsim.serve.scheduler import Scheduler, SchedulerConfig


def _pool_trace(rng, arrival, output, first_token):
    """A decode pool's inputs from a random trace: each request's prefill end after its arrival, its transfer's
    end after that (bursts of equal ends included), and which requests move (all for ``decode``; outputs of more
    than one token for ``prefill``)."""
    n = len(arrival)
    prefill_end = arrival + rng.exponential(0.02, n) * (rng.random(n) < 0.7)
    arrive = prefill_end + rng.exponential(0.01, n) * (rng.random(n) < 0.6)
    moves = np.ones(n, dtype=bool) if first_token == "decode" else output > 1
    return arrive, prefill_end, moves


def _both(arrive, prompt, output, prefill_end, moves, make, compiled_provider, reference_provider, first_token):
    """``(compiled, reference)`` decode pools as ReplayResults over the whole trace (``None`` for the compiled one
    when it steps aside); the reference's error propagates."""
    n = len(arrive)
    order = [i for i in np.lexsort((np.arange(n), arrive)).tolist() if moves[i]]
    pick = np.array(order, dtype=np.int64)
    got = compiled_decode_pool(arrive[pick], prompt[pick], output[pick], make(), compiled_provider, first_token,
                               prefill_end[pick]) if order else None
    steps, first, finish, preempted, gaps = disaggregated._decode_pool_reference(
        arrive, prompt, output, prefill_end, order, make(), reference_provider, first_token, prefill_end.copy(),
        prefill_end.copy(), np.zeros(n, dtype=np.int64))
    want = ReplayResult(first_scheduled=np.zeros(0), first_token=first, finish=finish, preemptions=preempted,
                        itl=gaps, iterations=steps["iterations"], max_blocks_used=steps["max_blocks_used"])
    if got is not None:
        f, e, p = prefill_end.copy(), prefill_end.copy(), np.zeros(n, dtype=np.int64)
        f[pick], e[pick], p[pick] = got.first_token, got.finish, got.preemptions
        got = ReplayResult(first_scheduled=np.zeros(0), first_token=f, finish=e, preemptions=p, itl=got.itl,
                           iterations=got.iterations, max_blocks_used=got.max_blocks_used)
    return got, want


@pytest.mark.parametrize("first_token", ["decode", "prefill"])
@pytest.mark.parametrize("seed", range(4))
def test_the_compiled_pool_is_the_reference_under_a_constant_step(seed, first_token):
    """30 random pools per seed (the three policies, chunking, preemption in the pool, bursts of arrivals, pools
    too small for a request: the reference's error); at least 25 of them compiled."""
    rng = np.random.default_rng(100 + seed)
    compiled = 0
    for _ in range(30):
        arrival, prompt, output, make, settings = _random_run(rng)
        arrive, prefill_end, moves = _pool_trace(rng, arrival, output, first_token)
        step = ConstantLatency(float(rng.choice([2.0**-6, 0.0173, rng.uniform(1e-4, 0.3)])))
        try:
            got, want = _both(arrive, prompt, output, prefill_end, moves, make, step, step, first_token)
        except SimulationError as e:  # the compiled pool stepped aside for the reference to raise this
            assert str(e).endswith("cannot join the idle decode pool: its KV cache does not fit"), settings
            n = len(arrive)
            pick = np.array([i for i in np.lexsort((np.arange(n), arrive)).tolist() if moves[i]], dtype=np.int64)
            assert compiled_decode_pool(arrive[pick], prompt[pick], output[pick], make(), step, first_token,
                                        prefill_end[pick]) is None
            continue
        if got is None:
            assert not moves.any(), settings
            continue
        compiled += 1
        assert_same_result(got, want)
    assert compiled >= 25


@pytest.mark.parametrize("variant, columns", [("moe", 17 + 16), ("dense", 17), ("shared", 18 + 16)])
def test_the_compiled_pool_prices_as_the_fast_provider(tmp_path, variant, columns):
    """The fast model's steps in the decode pool (random coefficients): the same tables as the provider called
    step by step, and the routing's window generator left where the provider leaves it."""
    model = _model(tmp_path, variant)
    rng = np.random.default_rng(21)
    compiled = 0
    for trial in range(6):
        arrival, prompt, output, make, settings = _random_run(rng)
        first_token = ("decode", "prefill")[trial % 2]
        arrive, prefill_end, moves = _pool_trace(rng, arrival, output, first_token)
        forms, theta = _random_coefficients(rng, columns, variant == "shared")
        seed = int(rng.integers(0, 1000))
        a, b = _fast(model, seed, forms, theta), _fast(model, seed, forms, theta)
        try:
            got, want = _both(arrive, prompt, output, prefill_end, moves, make, a, b, first_token)
        except SimulationError:
            continue
        assert got is not None, settings
        compiled += 1
        assert_same_result(got, want)
        if model.is_moe:
            assert a.routing._used == b.routing._used and np.array_equal(a.routing._starts, b.routing._starts)
            assert a.routing._windows.bit_generator.state == b.routing._windows.bit_generator.state
    assert compiled >= 4


def test_a_request_the_idle_pool_cannot_hold_is_the_references_error():
    """A prompt of more blocks than the pool's cache: the compiled pool steps aside, the reference raises."""
    capacity = kv_capacity(20 * 16, 0, 1, 16)
    config = SchedulerConfig.make("vllm")
    arrive, prompt, output = np.array([0.0, 0.1]), np.array([10, 400]), np.array([3, 2])
    assert compiled_decode_pool(arrive, prompt, output, Scheduler(config, capacity, 4000), ConstantLatency(0.01),
                                "decode", arrive) is None
    with pytest.raises(SimulationError) as e:
        disaggregated._decode_pool(arrive, prompt, output, arrive, np.ones(2, dtype=bool),
                                   Scheduler(config, capacity, 4000), ConstantLatency(0.01), "decode")
    assert str(e.value) == "request 1 (400 prompt tokens) cannot join the idle decode pool: its KV cache does not fit"


@pytest.mark.parametrize("scheduler, first_token", [("vllm", "decode"), ("sarathi", "prefill"), ("orca", "decode")])
def test_every_file_a_disaggregated_serve_writes_is_the_reference_pools(tmp_path, monkeypatch, scheduler,
                                                                        first_token):
    """``serve_disaggregated(..., out=DIR)`` on a random request file with the compiled pool and with the
    reference (the compiled one replaced): the same bytes in every file, summary.json but for its wall time."""
    from stepsim.serve.disaggregated_serve import serve_disaggregated
    from stepsim.serve.replay import replay_reference

    (tmp_path / "m.json").write_text(json.dumps(SMALL))
    rng = np.random.default_rng(9)
    n = 300
    trace = requests_file(tmp_path / "t.parquet", np.sort(rng.uniform(0, 2, n)), rng.integers(1, 900, n),
                          rng.integers(1, 80, n))
    reference = disaggregated._decode_pool_reference

    def not_here(*args, **kwargs):
        raise AssertionError("the compiled pool handed this run to the reference")

    for name in ("new", "old"):
        monkeypatch.setattr(disaggregated, "_decode_pool_reference", not_here if name == "new" else reference)
        if name == "old":
            monkeypatch.setattr("stepsim.serve.replay_compiled.compiled_decode_pool", lambda *a, **k: None)
            monkeypatch.setattr(disaggregated, "replay", replay_reference)
        serve_disaggregated(str(tmp_path / "m.json"), trace, disaggregate="1:1", system="ring-2",
                            hardware="sn40l", out=tmp_path / name, iteration_latency=0.0123, scheduler=scheduler,
                            max_seqs=24, hbm_bytes=2_000_000_000, first_token=first_token)
    names = sorted(p.name for p in (tmp_path / "old").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "new").iterdir()) and "iterations.parquet" in names
    for name in names:
        old, new = (tmp_path / "old" / name).read_bytes(), (tmp_path / "new" / name).read_bytes()
        if name == "summary.json":
            old, new = ({k: v for k, v in json.loads(b).items() if k != "wall_s"} for b in (old, new))
        assert old == new, name
