"""Issue 32's accuracy target for ``--fidelity fast`` beyond the Qwen3 shape it was worked out on: the other presets
with 4 layers (``data/<preset>-4layers.json``: Llama-3.1-8B's dense FFN, DeepSeek-MoE-16B's 64 experts top-6 with
two shared experts, Mixtral-8x7B's 8 large experts top-2), sn40l, seed 0, on the Azure conversation trace.

Llama's and DeepSeek's exact runs take under a minute on two workers and are rerun here; Mixtral's (190 s) is
stored (``data/mixtral_conv30_exact``, as ``stepsim serve --fidelity exact --jobs 2`` wrote it) and checked
against today's scheduler and engine as ``test_fast_accuracy.py`` checks Qwen3's. Each fast run (calibrating in
this process) is compared with its exact run: TTFT and TPOT p50 / p99 and mean, the held-out step error, and the
TTFT split into the wait for the step in flight at arrival and the prompt's own steps (docs/serving.md §10.6).
The engine facts behind :func:`stepsim.serve.fast.expert_rounds` are pinned too.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from test_fast_accuracy import _Recorded, _ttft_parts

import stepsim
from stepsim.base.hardware import PRESETS
from stepsim.models.presets import resolve_model
from stepsim.serve.exact import EngineLatency, max_kv_rows
from stepsim.serve.fast import expert_rounds
from stepsim.serve.layers import LayerRunner, LayerSpec
from stepsim.serve.output import read_outputs
from stepsim.serve.routing import SyntheticRouting

DATA = Path(__file__).resolve().parent / "data"
MIXTRAL_STORED = DATA / "mixtral_conv30_exact"


def _model(name: str) -> str:
    return str(DATA / f"{name}-4layers.json")


def test_expert_rounds_count_the_rounds_by_busy_experts():
    # one layer, 4 experts: counts 70, 68, 2, 0 -> tiles 3, 3, 1, 0: two rounds with 2 busy, one with 3
    routing = np.array([[0, 1]] * 68 + [[0, 2]] * 2, dtype=np.int64)[:, None, :]
    assert np.bincount(routing.ravel(), minlength=4).tolist() == [70, 68, 2, 0]
    assert expert_rounds(routing, 4).tolist() == [[0.0, 2.0, 1.0, 0.0]]
    # a decode step's experts have one tile each: a 1 at its active experts; two layers at once
    two = np.stack([np.array([[0, 1], [2, 3], [0, 2]]), np.array([[1, 2], [1, 2], [2, 1]])], axis=1)
    assert expert_rounds(two, 4).tolist() == [[0.0, 0.0, 0.0, 1.0], [0.0, 1.0, 0.0, 0.0]]


def _compare(exact_requests, exact: dict, fast) -> tuple:
    """``(steps, TTFT / TPOT mean, p50, p99 against exact (%), held-out error (%), wait and prompt's steps p50 /
    p99 against exact's (%))``."""
    s = fast.summary
    diff = {f"{k[:-2]} {q}": round((s[k][q] / exact[k][q] - 1) * 100, 2) for k in ("ttft_s", "tpot_s")
            for q in ("mean", "p50", "p99")}
    error = {k: round(v * 100, 2) for k, v in s["fidelity"]["error"].items() if k.startswith("iteration")}
    parts = {name: [_ttft_parts(r)[i] for r in (exact_requests, fast.requests)] for i, name in enumerate(("wait", "prefill"))}
    split = {f"{name} {q}": round((np.percentile(f, q) / np.percentile(e, q) - 1) * 100, 2)
             for name, (e, f) in parts.items() for q in (50, 99) if np.percentile(e, q) > 0}
    return s["iterations"], diff, error, split


#: measured 2026-11-25 (calibration version 4), fast against exact: steps, TTFT / TPOT (%), held-out error (%),
#: TTFT's parts (%); a wait p50 of 0 (most requests arrive at an idle engine) has no ratio
MEASURED = {
    "llama-3.1-8b": (2544, 2544, {"ttft mean": 0.02, "ttft p50": 0.03, "ttft p99": 0.02, "tpot mean": 0.0,
                                  "tpot p50": 0.0, "tpot p99": 0.01},
                     {"iteration_p50": 0.01, "iteration_p95": 0.07, "iteration_max": 0.1},
                     {"wait 50": 1.52, "wait 99": 0.03, "prefill 50": 0.0, "prefill 99": 0.01}),
    "deepseek-moe-16b": (1607, 1607, {"ttft mean": -0.58, "ttft p50": -0.15, "ttft p99": -0.71, "tpot mean": -0.04,
                                      "tpot p50": 0.0, "tpot p99": -0.33},
                         {"iteration_p50": 0.21, "iteration_p95": 2.12, "iteration_max": 3.89},
                         {"wait 99": -13.4, "prefill 50": -0.15, "prefill 99": -0.68}),
    # TTFT p50 and the prompt's steps at p50 miss the 2 % target: a step of a few hundred prompt tokens varies
    # by +-10 % a layer with its routing (the least-loaded expert's tiles, expert_rounds) and 4 layers do not
    # average it out; the held-out error, on exact's own routing, is within 5 % (docs/serving.md §10.6)
    "mixtral-8x7b": (1102, 1109, {"ttft mean": -1.69, "ttft p50": -5.16, "ttft p99": 0.81, "tpot mean": -0.76,
                                  "tpot p50": -1.55, "tpot p99": 1.97},
                     {"iteration_p50": 0.4, "iteration_p95": 2.74, "iteration_max": 4.06},
                     {"wait 50": -27.67, "wait 99": -2.92, "prefill 50": -6.32, "prefill 99": 0.85}),
}
#: the windows: the first N requests of the conversation trace (DeepSeek-MoE's 4,096-token context refuses request
#: 23, whose prompt and output exceed it)
WINDOWS = {"llama-3.1-8b": 100, "deepseek-moe-16b": 20, "mixtral-8x7b": 30}

@pytest.mark.slow
@pytest.mark.traces
@pytest.mark.parametrize("name", ["llama-3.1-8b", "deepseek-moe-16b"])
def test_fast_against_exact_on_another_preset(name, conv_csv, tmp_path):
    """Exact (rerun, under a minute on two workers) and fast on the same window: issue 32's targets."""
    exact = stepsim.serve(_model(name), conv_csv, limit_requests=WINDOWS[name], fidelity="exact", jobs=2)
    fast = stepsim.serve(_model(name), conv_csv, limit_requests=WINDOWS[name], fidelity="fast",
                         calibration_cache=tmp_path / "cache")
    got = _compare(exact.requests, exact.summary, fast)
    assert (exact.summary["iterations"], *got) == MEASURED[name]


@pytest.fixture(scope="module")
def mixtral_stored():
    return read_outputs(MIXTRAL_STORED)


@pytest.mark.slow
@pytest.mark.traces
def test_the_stored_mixtral_run_is_todays_exact_run(mixtral_stored, conv_csv):
    """The stored run's schedule is the scheduler's (its step durations replayed give its requests back) and its
    cycles the engine's (the first step, the decode-only step with the most sequences, the first with the most
    tokens, rebuilt with the exact provider's routing draws and simulated again)."""
    requests, iterations, summary = mixtral_stored
    assert summary["fidelity"]["mode"] == "exact" and summary["requests"] == summary["completed"] == 30
    recorded = _Recorded(iterations["duration_s"].to_numpy())
    replay = stepsim.serve(_model("mixtral-8x7b"), conv_csv, limit_requests=30, provider=recorded)
    assert len(recorded.batches) == summary["iterations"] == len(iterations) == 1102
    assert replay.requests.equals(requests)
    model = resolve_model(_model("mixtral-8x7b"))
    routing = SyntheticRouting(model.experts, model.top_k, model.layers, seed=0)
    engine = EngineLatency(model, PRESETS["sn40l"], routing, max_model_len=summary["kv_cache"]["max_model_len"],
                           vocab=32000)
    prefill = iterations["prefill_tokens"].to_numpy()
    decode = np.where(prefill == 0, iterations["sequences"].to_numpy(), 0)
    tokens = iterations["tokens"].to_numpy()
    check = sorted({0, int(np.argmax(decode)), int(np.argmax(tokens))})
    assert (decode.max(), tokens.max(), *check) == (6, 2048, 0, 431, 434)
    for i, batch in enumerate(recorded.batches[: check[-1] + 1]):
        if i not in check:
            routing.route(sum(batch.new_tokens))  # the exact provider's draws, step by step
            continue
        cost = engine(batch)
        assert cost.cycles == {k: iterations[f"cycles_{k}"][i].as_py() for k in ("attention", "ffn", "weights")}, i


@pytest.mark.slow
@pytest.mark.traces
def test_fast_against_the_stored_mixtral_run(mixtral_stored, conv_csv, tmp_path):
    requests, _, exact = mixtral_stored
    fast = stepsim.serve(_model("mixtral-8x7b"), conv_csv, limit_requests=30, fidelity="fast",
                         calibration_cache=tmp_path / "cache")
    got = (exact["iterations"], *_compare(requests, exact, fast))
    assert got == MEASURED["mixtral-8x7b"]


@pytest.mark.slow
def test_mixtral_moe_cycles_follow_the_busy_experts():
    """The engine facts behind expert_rounds (its docstring): on the Mixtral shape, 16 tokens on 4 .. 8 experts
    (one tile each) and 256 tokens on 4 .. 8 experts; with all 8 busy a round takes about 3x as long."""
    model = resolve_model(_model("mixtral-8x7b"))
    runner = LayerRunner(LayerSpec(model, PRESETS["sn40l"], max_kv_rows(4096)))
    rng = np.random.default_rng(5)
    got = {}
    for tokens in (16, 256):
        for pool in (4, 5, 6, 7, 8):
            rows = np.stack([rng.choice(pool, 2, replace=False) for _ in range(tokens)])
            got[tokens, pool] = (runner.cycles("ffn", rows), expert_rounds(rows[:, None, :], 8)[0].tolist())
    assert got == {(16, 4): (1860253, [0, 0, 0, 1, 0, 0, 0, 0]), (16, 5): (2338371, [0, 0, 0, 0, 1, 0, 0, 0]),
                   (16, 6): (1860259, [0, 0, 0, 0, 0, 1, 0, 0]), (16, 7): (1860266, [0, 0, 0, 0, 0, 0, 1, 0]),
                   (16, 8): (6052500, [0, 0, 0, 0, 0, 0, 0, 1]), (256, 4): (9223277, [0, 1, 0, 4, 0, 0, 0, 0]),
                   (256, 5): (8935088, [0, 0, 0, 1, 3, 0, 0, 0]), (256, 6): (5564433, [0, 0, 0, 0, 0, 3, 0, 0]),
                   (256, 7): (6060048, [0, 0, 0, 0, 1, 0, 2, 0]), (256, 8): (14629086, [0, 0, 0, 0, 1, 0, 0, 2])}
