"""--fidelity fast: exact metric forms, a held-out error in the summary (refused without one), a calibration cache
keyed by what determines it and read back, and the fast run against the exact one on the same requests."""

from __future__ import annotations

import json

import numpy as np
import pytest
from serve_requests import requests_file
from test_exact import SMALL

import stepsim
from stepsim.base.errors import ConfigError, TraceError
from stepsim.base.hardware import PRESETS
from stepsim.models.presets import resolve_model
from stepsim.serve.fast import extra_features, features, metric_forms
from stepsim.serve.layers import LayerSpec, build
from stepsim.serve.output import read_outputs


@pytest.fixture
def small_model(tmp_path):
    path = tmp_path / "small.json"
    path.write_text(json.dumps(SMALL))
    return path


@pytest.mark.parametrize("shared", [0, 2])
def test_metric_forms_reproduce_every_workloads_metrics(tmp_path, shared):
    """With and without shared experts (their tiles a feature: without it DeepSeek-MoE's forms were refused)."""
    path = tmp_path / "m.json"
    path.write_text(json.dumps({**SMALL, "n_shared_experts": shared}))
    spec = LayerSpec(resolve_model(str(path)), PRESETS["sn40l"], 4128)
    rng = np.random.default_rng(11)
    cases = {"decode": [rng.integers(0, 4000, b) for b in (4, 30)],
             "prefill": [(rng.integers(0, 900, 3), rng.integers(2, 700, 3))],
             "ffn": [np.stack([rng.choice(16, 2, replace=False) for _ in range(t)]) for t in (9, 100)]}
    for kind, datas in cases.items():
        form = metric_forms(kind, spec)
        for data in datas:
            x = np.array([1.0, *features(kind, data, kind == "ffn" and shared > 0)])
            m = build(kind, data, spec).metrics()
            assert (x @ np.array(form.off_chip), x @ np.array(form.flops)) == (m["off_chip_bytes"], m["graph_flops"])
    assert extra_features("decode", np.array([40, 100, 5, 31, 64])).tolist() == [4.0, 2.0]  # tiles 2,4,1,1,3
    assert features("ffn", np.array([[0, 3], [3, 5], [3, 1]])).tolist() == [3.0, 4.0, 4.0, 1.0]
    assert features("ffn", np.zeros((33, 2), dtype=np.int64) + [0, 1], shared=True).tolist() == [33, 4, 2, 2, 2]
    if shared:  # the two shared experts: tiles of the step's tokens, at the experts' weight bytes per tile
        assert metric_forms("ffn", spec).off_chip[-1] == 2 * 3 * 256 * 128 * 2


def _trace(tmp_path):
    rng = np.random.default_rng(3)
    return requests_file(tmp_path / "t.parquet", np.sort(rng.uniform(0, 0.05, 24)), rng.integers(5, 400, 24),
                         rng.integers(2, 30, 24))


def test_fast_run_reports_its_error_and_caches_its_calibration(small_model, tmp_path):
    trace = _trace(tmp_path)
    cache = tmp_path / "cache"
    a = stepsim.serve(str(small_model), trace, out=tmp_path / "a", fidelity="fast", schedule="paper", calibration_cache=cache)
    f = a.summary["fidelity"]
    assert f["mode"] == "fast" and set(f["error"]) == {"iteration_p50", "iteration_p95", "iteration_max",
                                                       "held_out_iterations", "held_out_prefill_iterations",
                                                       "calibration_simulations"}
    assert f["error"]["held_out_iterations"] == 12 and f["error"]["held_out_prefill_iterations"] == 6
    # measured (calibration version 4: this 16-expert model has expert_rounds()): p50 0.01 %, p95 1.40 %, max
    # 1.56 % of a step's cycles (version 3: 0.05 / 2.75 / 3.02 %)
    assert 0 < f["error"]["iteration_p50"] < 0.01 and 0.01 < f["error"]["iteration_p95"] < 0.02
    record = json.loads((cache / f"{f['calibration']}.json").read_text())
    assert record["theta"] == f["theta"] and record["error"] == f["error"] and record["key"] == f["calibration"]
    assert sorted(p.name for p in cache.iterdir()) == [f"{f['calibration']}.json"]
    # the second run reads the cache (no simulation) and writes the same bytes
    b = stepsim.serve(str(small_model), trace, out=tmp_path / "b", fidelity="fast", schedule="paper", calibration_cache=cache)
    assert b.summary["fidelity"] == f and b.summary["wall_s"] < a.summary["wall_s"]
    for name in ("requests.parquet", "iterations.parquet", "latency_cdf.png"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    first, again = (json.loads((tmp_path / d / "summary.json").read_text()) for d in "ab")
    assert first.pop("wall_s") > again.pop("wall_s") and json.dumps(first) == json.dumps(again)  # keys in order too
    req, it, summary = read_outputs(tmp_path / "b")
    assert summary["fidelity"] == f and req.equals(b.requests)
    assert np.array_equal(it["duration_s"].to_numpy(), sum(it[f"cycles_{k}"].to_numpy()
                                                           for k in ("attention", "ffn", "weights")) / 1e9)
    # another seed is another calibration
    c = stepsim.serve(str(small_model), trace, fidelity="fast", schedule="paper", calibration_cache=cache, seed=1)
    assert c.summary["fidelity"]["calibration"] != f["calibration"] and len(list(cache.iterdir())) == 2

    # against the exact run of the same requests (measured with calibration version 4: TTFT p50 -0.50 %, p99
    # -0.07 %, TPOT p50 0.00 %, p99 +0.12 %; version 3: -0.91 / +1.99 / 0.00 / +0.27 % (24 requests: p99 is about
    # the slowest one's, arrival phase included, docs/serving.md §10.6); version 2: -0.20 / +0.55 / -0.38 / +0.77 %)
    exact = stepsim.serve(str(small_model), trace, fidelity="exact", schedule="paper")
    assert exact.summary["iterations"] == a.summary["iterations"] == 384
    diff = {f"{k[:-2]} {q}": round((a.summary[k][q] / exact.summary[k][q] - 1) * 100, 2) for k in ("ttft_s", "tpot_s")
            for q in ("p50", "p99")}
    assert diff == {"ttft p50": -0.5, "ttft p99": -0.07, "tpot p50": 0.0, "tpot p99": 0.12}  # deterministic
    assert all(abs(v) < 2 for v in diff.values())  # the target


def test_calibration_requests_price_a_run_with_another_runs_calibration(small_model, tmp_path):
    """``--calibration-requests``: the run of B is priced with the calibration of A's run (cached under A's key, so
    A's run and B's share one), which a fresh cache makes again to the bit; the summary names A."""
    a_file = _trace(tmp_path)
    rng = np.random.default_rng(4)
    b_file = requests_file(tmp_path / "b.parquet", np.sort(rng.uniform(0, 0.05, 24)), rng.integers(5, 400, 24),
                           rng.integers(2, 30, 24))
    cache = tmp_path / "cache"
    a = stepsim.serve(str(small_model), a_file, fidelity="fast", schedule="paper", calibration_cache=cache)
    b = stepsim.serve(str(small_model), b_file, fidelity="fast", schedule="paper", calibration_cache=cache,
                      calibration_requests=a_file, out=tmp_path / "b")
    fa, fb = a.summary["fidelity"], b.summary["fidelity"]
    assert fb.pop("calibration_requests") == str(a_file) and "calibration_requests" not in fa
    assert fb == fa and len(list(cache.iterdir())) == 1  # no second calibration
    own = stepsim.serve(str(small_model), b_file, fidelity="fast", schedule="paper", calibration_cache=cache)
    assert own.summary["fidelity"]["calibration"] != fa["calibration"]  # B's own run calibrates on itself
    assert not own.requests.equals(b.requests)
    fresh = stepsim.serve(str(small_model), b_file, fidelity="fast", schedule="paper",
                          calibration_cache=tmp_path / "fresh", calibration_requests=a_file)
    assert fresh.requests.equals(b.requests) and fresh.iterations.equals(b.iterations)
    assert json.loads((tmp_path / "b" / "summary.json").read_text())["fidelity"]["calibration_requests"] == str(a_file)
    with pytest.raises(ConfigError) as e:
        stepsim.serve(str(small_model), b_file, fidelity="exact", calibration_requests=a_file)
    assert str(e.value) == ("--calibration-requests is for --fidelity fast (the requests it calibrates on); "
                            "--fidelity exact calibrates nothing")
    with pytest.raises(TraceError) as e:  # which file is wrong, before any calibration
        stepsim.serve(str(small_model), b_file, fidelity="fast", schedule="paper", calibration_cache=tmp_path / "c3",
                      calibration_requests=tmp_path / "none.parquet")
    assert str(e.value) == f"--calibration-requests {tmp_path / 'none.parquet'}: no such file"
    assert not (tmp_path / "c3").exists()


def test_fast_refuses_a_run_too_short_to_hold_a_step_out(small_model, tmp_path):
    trace = requests_file(tmp_path / "t.parquet", [0.0], [10], [2])
    with pytest.raises(ConfigError) as e:
        stepsim.serve(str(small_model), trace, fidelity="fast", schedule="paper", calibration_cache=tmp_path / "cache")
    assert str(e.value) == ("--fidelity fast: the run has 2 steps, too few to hold any out for measuring the "
                            "model's error; use --fidelity exact")
    assert not (tmp_path / "cache").exists()
