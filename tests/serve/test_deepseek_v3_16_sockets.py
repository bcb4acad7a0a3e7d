"""Issue 43's must-show: DeepSeek-V3 (61 layers, full width) served in fast mode on 16 sn40l sockets (each given
96 GiB, examples/hardware_sn40l_hbm96.toml: its 1.34 TB of bf16 weights do not fit 64 GiB sockets), 2,000 requests
of the Azure conversation trace, and ``stepsim plan`` pricing it (docs/serving.md §9.1, bench/README.md).

The run's two layer-group calibrations (the 3 dense layers, the 58 MoE layers calibrated on one of them) took
68 min of wall from a cold cache (exact simulations of the full-width expert-parallel block; made again on
2026-11-27 after an MLA layer's latent was read once, 1 h 8 min at load 2-4), far beyond the suite: stored
with the run's summary in tests/serve/data/deepseek_v3_sn40l16 (``calibration/``: the cache records as the run
wrote them, checksums included) and every test here prices with them, as ``stepsim plan`` does (a fresh provider
of the stored records, :class:`stepsim.plan.pricing.ShapePricer`). They are read by their own keys, not by today's
calibration key (which hashes the pricing sources and so changes with any of them): a change to how a calibrated
provider prices a step shows as a changed number here, not as a recalibration.

Fast against exact is measured on two windows a few minutes of exact simulation can afford: the stored exact run
of a 5-layer DeepSeek-V3 (its 3 dense layers and 2 of the MoE layers, full width) on the conversation trace's first
5 requests (221 steps, 1,109 layer simulations: 9.7 min of wall; 4.5 min when made again on 2026-11-27), and the
stored exact run of the whole 61-layer model on one request (tests/serve/data/deepseek_v3_sn40l16/
exact_one_request_paper: the serving validation's exact run on the paper's schedule, before its expert-parallel
block was mapped: 128 prompt tokens, 16 outputs; made again on 2026-11-27, 8 min 46 s).

Every stored run here was made again on 2026-11-27 with the code of that day (an MLA group's attention reading its
latent cache once, ``shared_kv``): the numbers moved in their fifth digit (the prompt steps' attention; the
2,000-request run's TTFT mean 1,108.655 -> 1,108.591 s, its held-out errors the same to 0.01 %)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

import stepsim
from stepsim.models.presets import resolve_model
from stepsim.plan.pricing import ShapePricer
from stepsim.serve.calibration_cache import load_calibration
from stepsim.serve.output import read_outputs
from stepsim.trace_io.requests import RequestTrace, read_requests, write_requests

DATA = Path(__file__).resolve().parent / "data"
STORED = DATA / "deepseek_v3_sn40l16"
FIVE_LAYERS = DATA / "deepseek-v3-5layers.json"
HBM96 = str(Path(__file__).resolve().parents[2] / "examples" / "hardware_sn40l_hbm96.toml")


def _window(tmp_path, n: int) -> Path:
    """The first ``n`` requests of the run's trace (conv2000.parquet: the conversation trace's first 2,000
    requests, arrivals from 0, as ``stepsim plan --limit-requests 2000`` writes its reference run)."""
    trace = read_requests(STORED / "conv2000.parquet").head(n)
    path = tmp_path / f"conv{n}.parquet"
    write_requests(RequestTrace(str(path), np.arange(n), trace.arrival_s, trace.prompt_tokens, trace.output_tokens),
                   path)
    return path


def _summary() -> dict:
    return json.loads((STORED / "conv2000_summary.json").read_text(encoding="utf-8"))


def _provider(model: str, max_model_len: int):
    """A fresh fast provider of the stored calibration for ``model`` on sn40l-16 (plan's pricer, read by the
    stored records' own keys)."""
    pricer = ShapePricer(model, resolve_model(model), HBM96, 16, "sn40l-16", STORED / "calibration")
    pricer.adopt({"fidelity": {"calibration": _summary()["fidelity"]["calibration"], "groups": True},
                  "kv_cache": {"max_model_len": max_model_len}}, "paper")
    return pricer.provider()


def _diff(fast: dict, exact: dict) -> dict:
    """fast's TTFT / TPOT mean and p99 against exact's (%, 2 decimals)."""
    return {f"{k[:-2]} {q}": round((fast[k][q] / exact[k][q] - 1) * 100, 2) for k in ("ttft_s", "tpot_s")
            for q in ("mean", "p99")}


def test_the_stored_calibration_is_the_must_show_runs():
    """The stored records are the run's two group calibrations, unedited (their checksums), and the run's
    ``fidelity.error`` is the largest of their held-out errors (the MoE group's, measured on one-layer steps)."""
    s = _summary()
    assert (s["requests"], s["completed"], s["model"], s["system"]["name"]) == (2000, 2000, "deepseek-v3", "sn40l-16")
    assert (s["system"]["chip_experts"], s["hardware"]["hbm_capacity_bytes"]) == ([16] * 16, 96 * 2**30)
    keys = s["fidelity"]["calibration"].split("+")
    records = [load_calibration(STORED / "calibration", k) for k in keys]
    assert None not in records and sorted(p.stem for p in (STORED / "calibration").glob("*.json")) == sorted(keys)
    errors = [r["error"] for r in records]
    assert [g["error"] for g in s["fidelity"]["groups"]] == errors
    assert s["fidelity"]["error"] == {k: (max if k.startswith("iteration_") else sum)(e[k] for e in errors)
                                      for k in errors[0]}
    got = [{k: round(v * 100, 2) if k.startswith("iteration_") else v for k, v in e.items()} for e in errors]
    assert (s["iterations"], got) == MEASURED_CALIBRATION


def test_the_stored_calibration_serves_the_traces_first_requests(tmp_path):
    """A fresh provider of the stored records (as ``stepsim plan`` prices) serves the run's first requests. On all
    2,000 it gives the run's summary back to the bit (every latency statistic, its 4,654 steps, the KV cache, the
    utilisations: checked once, 162 s of wall at load 5, too long for the suite; bench/README.md)."""
    s = _summary()
    got = stepsim.serve("deepseek-v3", _window(tmp_path, WINDOW),
                        provider=_provider("deepseek-v3", s["kv_cache"]["max_model_len"]), hardware=HBM96,
                        system="sn40l-16").summary
    assert got["kv_cache"] == {**s["kv_cache"], "max_blocks_used": got["kv_cache"]["max_blocks_used"]}
    assert (got["completed"], got["iterations"], round(got["ttft_s"]["mean"] * 1e3, 3),
            round(got["ttft_s"]["p99"] * 1e3, 3), round(got["tpot_s"]["mean"] * 1e3, 3),
            round(got["tpot_s"]["p99"] * 1e3, 3)) == MEASURED_WINDOW
    assert (s["iterations"], round(s["duration_s"], 3), round(s["ttft_s"]["mean"], 3), round(s["ttft_s"]["p99"], 3),
            round(s["tpot_s"]["mean"] * 1e3, 3), round(s["tpot_s"]["p99"] * 1e3, 3), s["preemptions"]) == (
        4654, 2894.294, 1108.591, 2399.025, 706.188, 1557.443, 0)


def test_fast_against_exact_on_the_stored_windows(tmp_path):
    """The stored calibration against exact: the 5-layer model on the conversation trace's first 5 requests
    (its MoE group priced on its 2 layers by the coefficients fitted on one layer of the 58), and the whole model
    on the validation's one request."""
    exact5 = json.loads((STORED / "exact_5layers_conv5" / "summary.json").read_text(encoding="utf-8"))
    five = _window(tmp_path, 5)
    fast5 = stepsim.serve(str(FIVE_LAYERS), five, provider=_provider(str(FIVE_LAYERS),
                                                                     exact5["kv_cache"]["max_model_len"]),
                          hardware=HBM96, system="sn40l-16").summary
    validation = json.loads((STORED / "exact_one_request_paper" / "summary.json").read_text(encoding="utf-8"))
    one = tmp_path / "one.parquet"
    write_requests(RequestTrace(str(one), np.arange(1), np.zeros(1), np.array([128]), np.array([16])), one)
    fast1 = stepsim.serve("deepseek-v3", one, provider=_provider("deepseek-v3", validation["kv_cache"]["max_model_len"]),
                          hardware=HBM96, system="sn40l-16").summary
    got = ((exact5["iterations"], fast5["iterations"], _diff(fast5, exact5)),
           (validation["iterations"], fast1["iterations"], _diff(fast1, validation)))
    assert got == MEASURED_AGAINST_EXACT


def test_the_stored_exact_window_is_todays(tmp_path):
    """The stored 5-layer exact run's step durations, replayed through today's scheduler, give its requests back
    (the window's trace: the conversation trace's first 5 requests, arrivals from 0)."""
    from test_fast_accuracy import _Recorded

    requests, iterations, summary = read_outputs(STORED / "exact_5layers_conv5")
    assert (summary["iterations"], summary["fidelity"]["simulations"], summary["completed"]) == (221, 1109, 5)
    five = _window(tmp_path, 5)
    recorded = _Recorded(iterations["duration_s"].to_numpy())
    replay = stepsim.serve(str(FIVE_LAYERS), five, provider=recorded, hardware=HBM96, system="sn40l-16")
    # the stored run read the CSV, whose requests are numbered from 1 (its rows); the window's from 0
    assert requests.column("request_id").to_pylist() == [1, 2, 3, 4, 5]
    assert len(recorded.batches) == 221 and replay.requests.drop(["request_id"]).equals(requests.drop(["request_id"]))
    assert replay.summary["kv_cache"] == summary["kv_cache"]


def test_a_lone_short_prefill_costs_at_least_its_roofline(tmp_path):
    """Three lone short prompts (16, 22 and 40 tokens, 100 s apart, 2 outputs each) priced by the stored
    calibration: its MoE group's ``ffn_prefill`` coefficients, fitted on prefill steps of hundreds to 2,048 tokens,
    price each of the 58 layers' FFN of such a step at the 1-cycle minimum (an exact 5-layer run of the 16-token
    prefill: 2,023,893 FFN cycles, fast 897,470, its 2 MoE layers 1 cycle each; bench/README.md), so the MoE group
    is floored at its roofline (stepsim.serve.fast.FastLatency._floored) and no step's utilisation exceeds 1.
    Before the floor these steps claimed 1.75x, 1.79x and 1.45x the 16 sockets' HBM bandwidth (main at 24365be;
    the plan of the 2,000-request run reported max_utilisation 1.78): what the recomputation below gives back."""
    path = tmp_path / "lone.parquet"
    write_requests(RequestTrace(str(path), np.arange(3), np.array([0.0, 100.0, 200.0]), np.array([16, 22, 40]),
                                np.array([2, 2, 2])), path)
    provider = _provider("deepseek-v3", _summary()["kv_cache"]["max_model_len"])
    peak = provider.groups[0][2].inner.roofline.peak_bytes  # the 16 sockets' HBM bytes a cycle
    it = stepsim.serve("deepseek-v3", path, provider=provider, hardware=HBM96, system="sn40l-16").iterations
    steps = it.to_pylist()
    got = [(s["tokens"], s["cycles_floor"], round(max(s["hbm_utilisation"], s["compute_utilisation"]), 4))
           for s in steps]
    assert got == [(16, 5_303_563, 0.9002), (1, 0, 0.0899), (22, 5_956_360, 0.9055), (1, 0, 0.0898),
                   (40, 6_160_559, 0.863), (1, 0, 0.0899)]
    unfloored = [s["hbm_bytes"] / ((s["cycles_attention"] + s["cycles_ffn"] + s["cycles_weights"]) * peak)
                 for s in steps[::2]]
    assert [round(u, 4) for u in unfloored] == UNFLOORED


#: the three prefill steps' HBM utilisation at their fitted cycles, without the floor: what main (24365be) reported
UNFLOORED = [1.7498, 1.787, 1.4538]


#: the plan's space: one replica of 16 sockets, vLLM's defaults (examples/plan_deepseek_v3_16.toml)
SPACE = Path(__file__).resolve().parents[2] / "examples" / "plan_deepseek_v3_16.toml"


def test_plan_prices_deepseek_v3_on_16_sockets_with_the_stored_calibration(tmp_path, monkeypatch):
    """``stepsim plan`` on the trace's first requests, its replica shape's calibration the stored one: the plan's
    reference run is not served (``ShapePricer.calibrate`` adopts the stored run, as a plan of the 2,000 requests
    reads it from the cache: bench/README.md); every candidate is priced by a fresh provider of it."""
    import shutil

    from stepsim.plan.pricing import ShapePricer as Pricer

    cache = tmp_path / "cache"
    shutil.copytree(STORED / "calibration", cache)
    shapes = []

    def stored(self, reference, slo):
        shapes.append((self.hardware_name, self.chips, self.system_name))
        return self.adopt(_summary(), "paper")

    monkeypatch.setattr(Pricer, "calibrate", stored)
    plan = stepsim.plan("deepseek-v3", _window(tmp_path, PLAN_REQUESTS), slo=PLAN_SLO, hardware=HBM96, max_chips=16,
                        space=str(SPACE), calibration_cache=cache, verify=False)
    s = plan.summary
    assert shapes == [(HBM96, 16, "sn40l-16")]
    assert [c["calibration"] for c in s["calibrations"].values()] == [_summary()["fidelity"]["calibration"]]
    front = [(f["deployment"].replace(HBM96, "hbm96"), f["system"], round(f["multiplier"], 4),
              round(f["goodput_requests_per_s"], 3)) for f in s["front"]]
    searched = [(d["deployment"].replace(HBM96, "hbm96"), d["decided"]) for d in plan.deployments]
    assert (front, searched, round(s["slo_margin"] * 100, 2)) == MEASURED_PLAN


#: measured 2026-11-26, again 2026-11-27 (tests/serve/data/deepseek_v3_sn40l16, sn40l-16 with 96 GiB a socket, paper schedules,
#: seed 0; bench/README.md): the run's steps and each group's held-out error (%: p50, p95, max)
MEASURED_CALIBRATION = (4654, [
    {"iteration_p50": 0.03, "iteration_p95": 0.1, "iteration_max": 0.13, "held_out_iterations": 12,
     "held_out_prefill_iterations": 6, "calibration_simulations": 196},
    {"iteration_p50": 2.81, "iteration_p95": 20.34, "iteration_max": 32.25, "held_out_iterations": 12,
     "held_out_prefill_iterations": 6, "calibration_simulations": 194}])
#: the run's first WINDOW requests served again: completed, steps, TTFT mean / p99 (ms), TPOT mean / p99 (ms)
WINDOW, MEASURED_WINDOW = 40, (40, 337, 5785.737, 13844.555, 282.292, 1861.789)
#: (exact steps, fast steps, fast against exact %) on the 5-layer conv 0-4 window, then on the validation request
MEASURED_AGAINST_EXACT = (
    (221, 221, {"ttft mean": -7.41, "ttft p99": 0.43, "tpot mean": -0.73, "tpot p99": -0.05}),
    (16, 16, {"ttft mean": -44.79, "ttft p99": -44.79, "tpot mean": -0.47, "tpot p99": -0.47}))
#: the plan's trace (the run's first requests) and SLO
PLAN_REQUESTS, PLAN_SLO = 30, "ttft=20s,tpot=2s"
#: the plan's front, its deployments and the SLO margin (the calibration's largest held-out step error, capped)
MEASURED_PLAN = ([("1x16ch hbm96 none vllm seqs 128 batch 2048", "sn40l-16", 1.6818, 0.843)],
                 [("1x16ch hbm96 none vllm seqs 128 batch 2048", "simulated")], 32.25)


def test_a_large_moe_group_is_calibrated_on_one_of_its_layers():
    """DeepSeek-V3's 58 MoE layers are calibrated on one (serve/layer_list.py: on two, the 16-socket calibration
    did not finish in an hour); its dense group, one simulation a step whatever its layers, is not reduced."""
    from stepsim.models.layers import layer_groups
    from stepsim.serve.layer_list import calibration_model, group_model

    ds = resolve_model("deepseek-v3")
    (dense_kind, dense), (moe_kind, moe) = layer_groups(ds)
    sub = group_model(ds, moe_kind, len(moe))
    assert (sub.layers, calibration_model(sub).layers, calibration_model(group_model(ds, dense_kind, len(dense)))) == (
        58, 1, None)
    one = group_model(ds, moe_kind, 1)
    assert calibration_model(one) is None  # a one-layer group is calibrated as it is
