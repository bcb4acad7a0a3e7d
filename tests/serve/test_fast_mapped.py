"""``--fidelity fast`` on mapped layers (``--schedule auto``, stepsim/serve/fast_mapped.py): a step's regressors are
its calibration samples' float for float, each piece's features follow its bucket's schedule, the first pass prices
a mapped FFN at the mapper's cycles scaled by its load, the calibration key holds the schedule and the mapper's
sources, and ``auto`` is serve's default on serving hardware only.

The schedules are injected (``stepsim.mapping.schedule_for`` replaced by :func:`_schedule_for`, a rule over the
bucket): the fast model must follow whatever schedule a bucket gets, and the mapper's search (minutes for a new
model on a cold cache, tests/mapping) is not what these tests check.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from serve_requests import requests_file

import stepsim
from stepsim.base.errors import ConfigError
from stepsim.base.hardware import PRESETS
from stepsim.mapping.schedule import Schedule
from stepsim.models.presets import resolve_model
from stepsim.serve import fast, fast_mapped
from stepsim.serve.fast import MetricForm
from stepsim.serve.fast_mapped import FFN_COLUMNS, MappedFastLatency, regressors
from stepsim.serve.latency import IterationBatch
from stepsim.serve.routing import SyntheticRouting

#: 8 experts, top-2, F = 64: lanes 1 or 2 at tile_f 32, regions 1, 2, 4 or 8
TINY = {"model_type": "qwen3_moe", "hidden_size": 128, "intermediate_size": 256, "moe_intermediate_size": 64,
        "num_experts": 8, "num_experts_per_tok": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 32, "num_hidden_layers": 2, "vocab_size": 1000, "max_position_embeddings": 2048}


#: the mapper's schedules of TINY on sn40l per bucket, knobs and cycles (``stepsim.mapping.map_layer``, measured
#: 2026-11-25): injected so that no test here runs the search (minutes on a cold cache; tests/mapping checks it)
MAPPED = {
    ("ffn", 1): ({"tile_n": 1, "tile_f": 32, "lanes": 2, "regions": 8}, 479),
    ("ffn", 2): ({"tile_n": 2, "tile_f": 32, "lanes": 2, "regions": 4}, 591),
    ("ffn", 4): ({"tile_n": 4, "tile_f": 32, "lanes": 1, "regions": 8}, 781),
    ("ffn", 8): ({"tile_n": 8, "tile_f": 32, "lanes": 2, "regions": 8}, 874),
    ("ffn", 16): ({"tile_n": 4, "tile_f": 32, "lanes": 2, "regions": 8}, 1244),
    ("ffn", 32): ({"tile_n": 8, "tile_f": 32, "lanes": 2, "regions": 8}, 1967),
    ("ffn", 64): ({"tile_n": 16, "tile_f": 32, "lanes": 2, "regions": 8}, 3360),
    **{("decode", 1 << i): ({"regions": 1 << i}, cycles) for i, cycles in enumerate((1754, 1757, 1794, 1874, 2362,
                                                                                     3629))},
    # the prefill attention of both KV heads: one query tile a region
    **{("prefill", 32 << i): ({"regions": 2 << i}, cycles) for i, cycles in enumerate((434, 533, 747, 1246, 2197,
                                                                                       4824, 13468))},
}


def _schedule_for(kind, size, dims, hardware, *, cache=True):
    """The injected :func:`stepsim.mapping.schedule_for`: :data:`MAPPED` at the bucket of ``size``."""
    from stepsim.mapping.mapper import bucket

    knobs, cycles = MAPPED[kind, bucket(size)]
    return Schedule(kind, dict(knobs), cycles=cycles)


@pytest.fixture
def tiny(tmp_path, monkeypatch):
    import stepsim.mapping
    import stepsim.serve.exact

    monkeypatch.setattr(stepsim.mapping, "schedule_for", _schedule_for)
    monkeypatch.setattr(fast_mapped, "_MEMO", {})  # schedules and templates made here stay here
    monkeypatch.setattr(stepsim.serve.exact, "_RUNNERS", {})
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(TINY))
    return path


def _provider(path):
    model = resolve_model(str(path))
    p = MappedFastLatency(model, PRESETS["sn40l"], SyntheticRouting(model.experts, model.top_k, model.layers, seed=0),
                          max_model_len=2048, vocab=1000, forms=None, schedule="auto")
    # any forms: the regressors' bounds are the forms' dot products, the same in both paths
    p.forms = {"decode": MetricForm((5.0, 1.0, 96.0, 3.0), (0.0, 2.0, 700.0, 1.0)),
               "prefill": MetricForm((7.0, 2.0, 50.0, 80.0), (1.0, 0.0, 300.0, 900.0))}
    return p


def test_the_mapped_providers_regressors_are_the_calibrations(tiny):
    p = _provider(tiny)
    rng = np.random.default_rng(1)
    for _ in range(30):
        n = int(rng.integers(1, 7))  # at most 12 decode requests (two KV heads) and 60 tokens: MAPPED's buckets
        new = [1 if rng.random() < 0.7 else int(rng.integers(2, 11)) for _ in range(n)]
        batch = IterationBatch(rng.integers(0, 1500, n).tolist(), new, 0, 0)
        decode, prefill = p.attention_regressors(batch)
        x, ffn = p.ffn_rows(sum(new))
        tasks, roles = p.tasks(batch, ffn())
        got = {"decode": decode, "prefill": prefill}
        for (kind, data), (_, count) in zip(tasks, roles):
            if kind == "decode":  # every KV head's requests in one mapped attention, counted once a layer
                assert len(data) == 2 * new.count(1) and count == 2
            if kind != "ffn":  # what the calibration fits on (the prefill's: the paper's regressors)
                assert np.array_equal(p.piece_regressors(kind, data), got.pop(kind))
        assert all(v is None for v in got.values())
        pieces = [data for kind, data in tasks if kind == "ffn"]
        assert np.array_equal(np.stack([p.piece_regressors("ffn", d) for d in pieces]), x)
    assert x.shape == (2, FFN_COLUMNS) and decode.shape == (10,)


def test_each_piece_is_described_with_its_buckets_schedule(tiny):
    """Expert tiles at the bucket's tile_n, the busiest of its regions (contiguous experts), the tile estimate (the
    mapper's cycles scaled by the piece's tiles against its representative routing's) and the estimate: the larger
    of the bucket's line in tokens through its top (the mapper's cycles) and its bottom (the layer simulated at
    b / 2 + 1 tokens under the bucket's schedule), and its top scaled by the piece's load against the top's."""
    from stepsim.mapping import kinds

    spec = _provider(tiny).spec
    routing = np.array([[0, 1], [0, 2], [0, 3], [5, 1], [0, 7], [6, 1]])  # 6 tokens: bucket 8, tile_n 8, 8 regions
    x = regressors("ffn", routing, None, spec)
    # expert tokens 4, 3, 1, 1, 0, 1, 1, 1 -> one tile each at 8: 7 tiles; regions of one expert each
    assert x[:6].tolist() == [1.0, 6.0, 7.0, 7.0, 1.0, 1.0]
    ref = fast_mapped.ffn_reference(6, spec)
    # the representative routings' (Zipf, 4 draws at 5 tokens, 2 at 8): mean tiles 6.5 and busiest region 1 at the
    # top; mean loads 6.625 / 6.5 and 6.75 / 6.5 (the mean of the two draws' ratios, its last bit below); the
    # engine's mean cycles at 5 tokens 754.5
    top = fast_mapped.Point(8, 1.0384615384615383, 874.0)
    assert ref == fast_mapped.Reference(fast_mapped.Point(5, 6.625 / 6.5, 754.5), top, 6.5, 1.0, MAPPED["ffn", 8][0])
    # the line in tokens at 6: 754.5 + 119.5 / 3 (794.3); the top scaled by the piece's load, 7 / 6.5 against the
    # top's: larger
    by_tokens = 754.5 + (874.0 - 754.5) * (6.0 - 5) / (8 - 5)
    by_load = 874.0 * (7 / 6.5) / top.load
    assert (x[6], x[7], by_load > by_tokens) == (874 * 7 / 6.5, by_load, True)
    dims = kinds.layer_dims("ffn", spec.model)
    for b in (16, 32):  # one representative routing at the top: the estimate is the mapper's cycles
        rep = kinds.ffn.ffn_routing(b, dims, 0)
        assert regressors("ffn", rep, None, spec)[7] == MAPPED["ffn", b][1]
    # 2 tokens: bucket 2, tile_n 2, four regions of two experts: the busiest region holds experts 0 and 1
    x = regressors("ffn", np.array([[0, 1], [1, 2]]), None, spec)
    assert x[2:6].tolist() == [3.0, 3.0, 1.0, 2.0]  # tiles, active, busiest expert, busiest region (1 + 1)
    # decode: 3 requests, 2 KV heads -> 6 requests (bucket 8: 8 regions, 6 used), dealt greedily
    kv = np.tile(np.array([40, 700, 5]), 2)  # tiles 2, 22, 1 each head
    d = regressors("decode", kv, _provider(tiny).forms["decode"], spec)
    assert d[1:6].tolist() == [6.0, 50.0, 22.0, 22.0, 1.0]  # one request a region: the busiest is the longest
    # the mapper's cycles of 8 requests of 1,024 tokens (33 tiles each), one a region, scaled by 22 / 33 tiles
    assert d[6] == 1874 * 22 / 33


def test_without_coefficients_a_mapped_ffn_is_priced_at_its_estimate(tiny):
    p = _provider(tiny)
    x, _ = p.ffn_rows(20)
    assert fast.predict_rows(x, None, "ffn").tolist() == np.ceil(x[:, 7]).astype(np.int64).tolist()
    assert fast.bound_column("ffn") == 7


@pytest.mark.slow  # 5 s at load 2, 16-29 s at load 12 on the 2-core machine (two calibrations and the exact run)
def test_fast_agrees_with_exact_on_mapped_layers(tiny, tmp_path):
    """A calibrated fast run against the exact run of the same 16 requests, both on mapped layers (the same numbers
    with the real mapper on a cold cache: 141 s, mapping 11 buckets). Deterministic."""
    rng = np.random.default_rng(3)
    trace = requests_file(tmp_path / "t.parquet", np.sort(rng.uniform(0, 0.002, 16)), rng.integers(5, 60, 16),
                          rng.integers(2, 12, 16))
    f = stepsim.serve(str(tiny), trace, fidelity="fast", schedule="auto", calibration_cache=tmp_path / "c")
    e = stepsim.serve(str(tiny), trace, fidelity="exact", schedule="auto")
    assert f.summary["fidelity"]["schedule"] == e.summary["fidelity"]["schedule"] == "auto"
    assert f.summary["iterations"] == e.summary["iterations"]
    error = {k: round(v * 100, 2) for k, v in f.summary["fidelity"]["error"].items() if k.startswith("iteration")}
    diff = {f"{k[:-2]} {q}": round((f.summary[k][q] / e.summary[k][q] - 1) * 100, 2) for k in ("ttft_s", "tpot_s")
            for q in ("p50", "p99")}
    # both price a step's projections on the engine and stream weights ahead (stepsim/serve/projections.py) and map
    # the prefill attention (every KV head in one attention). Before: closed-form weights and the paper's prefill
    # schedule, 81 steps, p50 0.03 / p95 2.99 / max 5.68 %, TTFT -0.15 / -0.07 %, TPOT 0.0 / -1.17 %; the
    # projections alone 79 steps, p95 0.74 %, TPOT p99 -2.25 %; the prefill alone p95 4.0 %, TPOT p99 -1.34 %; both,
    # before the projections split their reduction (k_parts): 80 steps, p95 4.18 %, TPOT p99 -0.07 %; until the FFN
    # estimate went through its bucket's bottom as well as its top (2026-11-26: fast_mapped.bucket_estimate): p50 0.04
    # / p95 4.0 / max 7.92 %, TTFT -0.23 / -0.17 %, TPOT 0.0 / -0.88 %
    assert (f.summary["iterations"], error, diff) == (81, {"iteration_p50": 0.56, "iteration_p95": 4.48,
                                                           "iteration_max": 6.26},
                                                      {"ttft p50": 2.72, "ttft p99": 1.22, "tpot p50": 0.0,
                                                       "tpot p99": -0.48})
    # issue 32's targets (TTFT / TPOT p50 and p99 within 2 %, held-out p95 within 5 %) are met but TTFT p50: the
    # median of 16 TTFTs is one request's, and fast's per-request TTFTs scatter -5.5 .. +5.5 % around exact's here
    # (its prefill steps of 20-56 tokens within 5.5 %); the targets hold on the 200-request windows
    # (test_fast_accuracy.py; on mapped layers test_fast_accuracy_mapped.py's measurement)
    missed = {k for k, v in diff.items() if abs(v) >= 2} | ({"iteration_p95"} if error["iteration_p95"] >= 5 else set())
    assert missed == {"ttft p50"}

def test_the_calibration_key_holds_the_schedule_and_the_mappers_sources(monkeypatch):
    from stepsim.mapping import mapper
    from stepsim.serve.calibration_cache import calibration_key, schedule_identity

    assert schedule_identity("paper") == {"mode": "paper"}
    auto = schedule_identity("auto")
    assert auto == {"mode": "auto", "mapping": {"mapper_version": mapper.MAPPER_VERSION,
                                                "source": mapper.source_hash()}}
    keys = {calibration_key({"model": "m", "schedule": schedule_identity(s)}) for s in ("paper", "auto")}
    monkeypatch.setattr(mapper, "source_hash", lambda: "0" * 64)  # other mapper or builder code: another one
    keys.add(calibration_key({"model": "m", "schedule": schedule_identity("auto")}))
    monkeypatch.setattr(mapper, "MAPPER_VERSION", mapper.MAPPER_VERSION + 1)
    keys.add(calibration_key({"model": "m", "schedule": schedule_identity("auto")}))
    assert len(keys) == 4


def test_auto_is_the_default_on_serving_hardware_only():
    from stepsim.base.hardware import Hardware
    from stepsim.serve.api import default_schedule

    sn40l, tweaked = PRESETS["sn40l"], Hardware.from_dict({"preset": "sn40l", "hbm_channels": 25})
    got = {(hw.name, fidelity): default_schedule(hw, fidelity)
           for hw in (sn40l, tweaked, PRESETS["step-eval"], PRESETS["step-hdl"]) for fidelity in ("exact", "fast", None)}
    # sn40l (overrides too), exact or fast, one chip or a system of it, a dense or an MoE model
    assert {k for k, v in got.items() if v == "auto"} == {(hw, fidelity) for hw in (sn40l.name, tweaked.name)
                                                          for fidelity in ("exact", "fast")}
    assert set(got.values()) == {"auto", "paper"}


def test_auto_where_it_is_not_built_is_one_line(tmp_path):
    trace = requests_file(tmp_path / "t.parquet", [0.0], [10], [2])
    with pytest.raises(ConfigError) as e:
        stepsim.serve("llama-3.1-8b", trace, iteration_latency=0.01, schedule="auto")
    assert str(e.value) == "--schedule auto maps the layers the engine prices: it needs --fidelity exact or fast"
    # without a fidelity no layer is built: the default is paper, and the summary says no schedule
    run = stepsim.serve("llama-3.1-8b", trace, iteration_latency=0.01)
    assert "schedule" not in run.summary["fidelity"]


def test_serve_maps_its_layers_by_default_on_sn40l_only(tiny, tmp_path):
    """Without ``schedule``: an exact run on sn40l is the ``auto`` run (mapped layers, step for step), on step-eval
    the ``paper`` run (its summary says no schedule, as before)."""
    trace = requests_file(tmp_path / "t.parquet", [0.0, 0.0001], [20, 9], [3, 2])
    default, auto = (stepsim.serve(str(tiny), trace, fidelity="exact", **kw) for kw in ({}, {"schedule": "auto"}))
    assert default.summary["fidelity"]["schedule"] == "auto" and default.iterations.equals(auto.iterations)
    paper = stepsim.serve(str(tiny), trace, fidelity="exact", schedule="paper")
    assert not paper.iterations.equals(auto.iterations)
    on_step_eval = stepsim.serve(str(tiny), trace, fidelity="exact", hardware="step-eval")
    assert "schedule" not in on_step_eval.summary["fidelity"]
    assert on_step_eval.iterations.equals(stepsim.serve(str(tiny), trace, fidelity="exact", hardware="step-eval",
                                                        schedule="paper").iterations)


@pytest.mark.parametrize("schedule", ["auto", "paper"])
def test_a_calibrations_pilot_replays_compiled_with_the_python_loops_samples(tiny, tmp_path, monkeypatch, schedule):
    """A calibration's two pilot replays run in the compiled loop, which offers its steps to the provider's
    reservoir each time it returns, as many calls of its ``__call__`` would (stepsim/serve/replay_compiled.py
    ``CompiledLoop._record``, ``Reservoir.offer_steps``): the calibration
    (coefficients, held-out errors, forms, simulations) is the Python loop's bit for bit, on mapped layers
    (MappedFastLatency) and on the paper's (FastLatency)."""
    from stepsim.serve import replay_compiled, replay_mapped
    from stepsim.serve.calibration_cache import load_calibration
    from stepsim.serve.fast import Reservoir

    rng = np.random.default_rng(5)
    trace = requests_file(tmp_path / "t.parquet", np.sort(rng.uniform(0, 0.003, 24)), rng.integers(5, 60, 24),
                          rng.integers(2, 16, 24))
    offered = []  # the steps of each offer_steps call
    real_offer = Reservoir.offer_steps
    monkeypatch.setattr(Reservoir, "offer_steps",
                        lambda self, prefill_step, *rest: (offered.append(len(prefill_step)),
                                                           real_offer(self, prefill_step, *rest)))

    def calibration(folder, **kw):
        run = stepsim.serve(str(tiny), trace, fidelity="fast", schedule=schedule, calibration_cache=folder, **kw)
        record = load_calibration(folder, run.summary["fidelity"]["calibration"])
        timing = ("build_s", "engine_s", "pass_wall_s")  # wall clocks: the only fields that differ
        record["stats"] = {k: v for k, v in record["stats"].items() if k not in timing}
        return record, run.summary["iterations"]

    compiled = calibration(tmp_path / "compiled")
    steps, calls = sum(offered), len(offered)
    real_recordable = replay_mapped.recordable
    monkeypatch.setattr(replay_mapped, "recordable", lambda provider: provider.recorder is None)
    monkeypatch.setattr(fast_mapped, "_MEMO", {})  # the templates made again, as the first calibration made them
    monkeypatch.setattr(stepsim.serve.exact, "_RUNNERS", {})
    python = calibration(tmp_path / "python")
    assert len(offered) == calls  # the second calibration's pilots all in the Python loop
    assert compiled == python
    # the record of the steps' batches full every few steps, and a progress bar's pauses: the same calibration
    monkeypatch.setattr(replay_mapped, "recordable", real_recordable)
    monkeypatch.setattr(replay_compiled, "RECORD_COLUMNS", 3)
    offered.clear()
    monkeypatch.setattr(fast_mapped, "_MEMO", {})
    monkeypatch.setattr(stepsim.serve.exact, "_RUNNERS", {})
    assert calibration(tmp_path / "small-record", progress=True) == compiled
    assert sum(offered) == steps and len(offered) > steps / 4
    # every step of both pilots offered (the first priced by the bounds, the second by its fit: their step counts
    # differ), as the Python loop offered them, many a call
    assert (steps, compiled[1]) == ({"auto": 331, "paper": 306}[schedule], {"auto": 165, "paper": 155}[schedule])
    assert calls < steps / 4
