"""A replay stopped once its SLO is provably missed (stepsim/serve/replay_stop.py; the compiled loop's
_stop_check): on random traces and scheduler settings, with SLO limits drawn around each run's own latencies,

* a run that stops misses its SLO at the percentile when served to the end (numpy's percentile, as plan computes
  it), and one that does not stop is the run without a rule, bit for bit;
* the compiled loop and the Python reference stop at the same step, on the same metric, at the same time;
* more misses than :func:`allowed_misses` always put numpy's linear percentile over the limit.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from test_replay_compiled import _random_run, assert_same_result

from stepsim.serve.latency import ConstantLatency
from stepsim.serve.replay import replay_reference
from stepsim.serve.replay_compiled import compiled_replay
from stepsim.serve.replay_stop import ReplayStopped, StopRule, allowed_misses


def test_more_misses_than_allowed_put_the_percentile_over_the_limit():
    rng = np.random.default_rng(5)
    for _ in range(3000):
        n = int(rng.integers(1, 400))
        p = float(rng.choice([50.0, 90.0, 95.0, 99.0, 99.9, 100.0, rng.uniform(0.1, 100)]))
        a = allowed_misses(n, p)
        assert 0 <= a <= n - 1
        limit = 1.0
        if a + 1 <= n:  # a + 1 values over the limit, by a hair or by far, the rest anywhere at or below it
            v = np.concatenate([rng.uniform(0, limit, n - a - 1), limit + rng.choice([1e-12, 1.0], a + 1)])
            assert np.percentile(v, p) > limit
        # a misses: the sorted value at the percentile's index is at most the limit
        v = np.sort(np.concatenate([np.full(n - a, limit), np.full(a, 2.0)]))
        assert v[int(np.floor((n - 1) * (p / 100)))] <= limit
    assert [allowed_misses(300, p) for p in (50, 90, 99, 100)] == [150, 30, 3, 0]
    assert allowed_misses(0, 99) == 0


def _metrics(arrival, output, first, finish):
    ttft = first - arrival
    e2e = finish - arrival
    many = output > 1
    tpot = np.where(many, (e2e - ttft) / np.maximum(output - 1, 1), 0.0)
    return {"ttft": ttft, "tpot": tpot[many], "e2e": e2e}


def _meets(values: dict, slo: dict, percentile: float) -> bool:
    return all(not len(values[k]) or float(np.percentile(values[k], percentile)) <= limit for k, limit in slo.items())


def slo_near(rng, values: dict, arrival, output) -> tuple:
    """``(slo, percentile, rule)``: a random percentile and limits on one to three metrics near the run's own
    percentiles of ``values`` (:func:`_metrics`), so that some runs meet them and some miss by a little or by much."""
    percentile = float(rng.choice([50.0, 90.0, 99.0, 100.0]))
    slo = {}
    for key in rng.permutation(["ttft", "tpot", "e2e"])[:int(rng.integers(1, 4))]:
        if len(values[key]):
            slo[str(key)] = float(np.percentile(values[key], percentile) * rng.choice([0.3, 0.9, 0.999, 1.0, 1.2]))
    return slo, percentile, StopRule.of_slo(slo, percentile, len(arrival), int((output > 1).sum()))


def _run(fn, *args):
    try:
        return fn(*args), None
    except ReplayStopped as stopped:
        return None, stopped


@pytest.mark.parametrize("seed", range(3))
def test_a_stopped_replay_misses_its_slo_and_an_unstopped_one_is_unchanged(seed):
    rng = np.random.default_rng(100 + seed)
    stopped_runs = kept = missed_kept = 0
    for _ in range(40):
        arrival, prompt, output, make, settings = _random_run(rng)
        step = ConstantLatency(float(rng.uniform(1e-3, 0.2)))
        full = replay_reference(arrival, prompt, output, make(), step)
        values = _metrics(arrival, output, full.first_token, full.finish)
        slo, percentile, rule = slo_near(rng, values, arrival, output)
        assert all(math.isinf(getattr(rule, k)) for k in ("ttft", "tpot", "e2e") if k not in slo)
        ref, ref_stop = _run(replay_reference, arrival, prompt, output, make(), step, None, rule)
        got, got_stop = _run(compiled_replay, arrival, prompt, output, make(), step, None, rule)
        assert (ref_stop is None) == (got_stop is None), settings
        if ref_stop is not None:
            stopped_runs += 1
            assert (got_stop.metric, got_stop.steps, got_stop.now) == (ref_stop.metric, ref_stop.steps, ref_stop.now)
            assert not _meets(values, slo, percentile), settings
            assert ref_stop.steps <= len(full.iterations["start_s"])
        else:
            kept += 1
            missed_kept += not _meets(values, slo, percentile)  # missed, but not provably before the end
            assert_same_result(ref, full)
            assert_same_result(got, full)
    print("stopped", stopped_runs, "kept", kept, "missed_kept", missed_kept)
    assert (stopped_runs, kept, missed_kept) == {0: (29, 11, 2), 1: (25, 15, 2), 2: (30, 10, 1)}[seed]
