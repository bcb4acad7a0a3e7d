"""A disaggregated replay stopped once its SLO is provably missed (stepsim/serve/disaggregated.py, "Early stop"): on
random traces, scheduler settings, step times and transfer times, under both first-token definitions, with SLO
limits drawn around each run's own latencies,

* a run that stops misses its SLO at the percentile when served to the end, and one that does not stop is the run
  without a rule, bit for bit;
* the compiled loops and the Python references stop at the same point, step, metric and time;
* each of the three points (the prefill pool, the transfers, the decode pool) stops some runs.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_replay_compiled import _random_run, assert_same_result
from test_replay_stop import _meets, _metrics, slo_near

import stepsim.serve.disaggregated as disaggregated
import stepsim.serve.replay_compiled as replay_compiled
from stepsim.base.errors import SimulationError
from stepsim.serve.latency import ConstantLatency
from stepsim.serve.replay_stop import ReplayStopped

POINTS = ("prefill pool", "transfers", "decode pool")


def _where(monkeypatch) -> list:
    """Record which of the three points raised :class:`ReplayStopped` (the last entry after a stopped run)."""
    seen = []

    def watching(point, fn):
        def run(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except ReplayStopped:
                seen.append(point)
                raise
        return run

    for point, name in zip(POINTS, ("replay", "_stop_after_transfers", "_decode_pool")):
        monkeypatch.setattr(disaggregated, name, watching(point, getattr(disaggregated, name)))
    return seen


def _disaggregated(arrival, prompt, output, kv_bytes, make, prefill_step, decode_step, per_byte, first_token,
                   stop=None):
    return disaggregated.replay_disaggregated(arrival, prompt, output, kv_bytes, make(), make(), prefill_step,
                                              decode_step, lambda b: 1e-4 + b * per_byte, first_token, stop)


def _run(*args):
    try:
        return _disaggregated(*args), None
    except ReplayStopped as stopped:
        return None, stopped


@pytest.mark.parametrize("first_token", ["decode", "prefill"])
@pytest.mark.parametrize("seed", range(2))
def test_a_stopped_disaggregated_replay_misses_its_slo_and_an_unstopped_one_is_unchanged(seed, first_token,
                                                                                         monkeypatch):
    rng = np.random.default_rng(300 + seed)
    where = _where(monkeypatch)
    outcomes = {point: 0 for point in POINTS} | {"kept": 0, "missed kept": 0}
    for _ in range(40):
        arrival, prompt, output, make, settings = _random_run(rng)
        kv_bytes = prompt * int(rng.integers(1, 5000))
        # either pool the slower by up to 20x, so that each point has SLOs it can prove missed
        prefill_s, decode_s = rng.uniform(1e-3, 0.1, 2) * rng.permutation([1.0, float(rng.uniform(1, 20))])
        steps = [ConstantLatency(float(prefill_s)), ConstantLatency(float(decode_s))]
        per_byte = float(rng.choice([1e-9, 1e-6, 1e-5]))
        args = (arrival, prompt, output, kv_bytes, make, *steps, per_byte, first_token)
        try:
            full = _disaggregated(*args)
        except SimulationError as e:  # a prompt the decode pool's cache cannot hold
            assert "cannot join the idle decode pool" in str(e), settings
            continue
        values = _metrics(arrival, output, full.result.first_token, full.result.finish)
        slo, percentile, rule = slo_near(rng, values, arrival, output)
        got, got_stop = _run(*args, rule)
        with monkeypatch.context() as python:  # both pools one Python step at a time
            python.setattr(replay_compiled, "compiled_replay", lambda *a, **k: None)
            python.setattr(replay_compiled, "compiled_decode_pool", lambda *a, **k: None)
            ref, ref_stop = _run(*args, rule)
        assert (ref_stop is None) == (got_stop is None), settings
        if got_stop is not None:
            assert where[-1] == where[-2], settings  # the same point in both
            outcomes[where[-1]] += 1
            assert (got_stop.metric, got_stop.steps, got_stop.now) == (ref_stop.metric, ref_stop.steps, ref_stop.now)
            assert not _meets(values, slo, percentile), settings
        else:
            outcomes["kept"] += 1
            outcomes["missed kept"] += not _meets(values, slo, percentile)  # missed, not provably before the end
            for run in (got, ref):
                assert_same_result(run.result, full.result)
                for name in ("prefill_end", "transfer_start", "transfer_end", "transfer_bytes"):
                    assert np.array_equal(getattr(run, name), getattr(full, name))
    assert tuple(outcomes.values()) == {("decode", 0): (3, 10, 16, 11, 1), ("decode", 1): (2, 6, 21, 11, 5),
                                        ("prefill", 0): (15, 5, 9, 11, 1), ("prefill", 1): (19, 1, 7, 13, 7)}[
        first_token, seed]
