"""Issue 32's accuracy target for ``--fidelity fast``: on a 200-request window of the Azure conversation trace with a
Qwen3-30B-A3B-shaped model of 4 layers (``examples/qwen3-30b-a3b-4layers.json``, sn40l, seed 0), TTFT and TPOT p50
and p99 within 2 % of ``--fidelity exact`` and the per-step error within 5 % at p95.

An exact run of 200 requests takes 17-35 minutes on two workers, so three windows' exact runs are stored
(``tests/serve/data/<name>``: ``summary.json``, ``requests.parquet`` and ``iterations.parquet``, as ``stepsim serve
--fidelity exact --jobs 2`` wrote them; each window is cut from the shared trace at run time,
``serve_requests.azure_window``) and checked against today's engine instead of rerun:

* its schedule is the scheduler's: replaying the window with the stored step durations gives the stored
  ``requests.parquet`` back, value for value;
* its step cycles are the engine's: steps rebuilt from that replay (batches, and the routing the exact provider
  draws step by step from the seed) and simulated again give the stored ``cycles_*`` of each.

The fast run is then compared with the stored summary (``bench/test_bench_serve.py`` reruns the exact runs and
records both wall times). The windows: requests 0-199 (the model was worked on it) and 200-399 (not; it replaced
requests 200-279, its first 80, stored before: bench/README.md).
On requests 0-199 fast misses TTFT p50 (+3.89 %): its TTFT is split into the wait for the step in flight at
arrival and the prompt's own steps, and the exact run's own TTFT p50 is redrawn over arrival phases
(docs/serving.md §10.6): that window's median sits where its TTFTs are sparse. Requests 200-399 meet every target.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from calibration_seeding import check_seed_used, seeded_cache
from serve_requests import azure_window

import stepsim
from stepsim.serve.latency import IterationCost
from stepsim.serve.output import read_outputs

MODEL = Path(__file__).resolve().parents[2] / "examples" / "qwen3-30b-a3b-4layers.json"
DATA = Path(__file__).resolve().parent / "data"
#: stored exact run -> (first request, requests) of the conversation trace
WINDOWS = {"conv200_exact": (0, 200), "conv400_exact": (200, 200)}
#: the steps re-simulated per stored run: the first, the first decode-only step with the most sequences, the first
#: with the most tokens (a 2,048-token budget filled by prefill chunks)
CHECKED_STEPS = {"conv200_exact": [0, 12145, 1060], "conv400_exact": [0, 2595, 2591]}
#: fast against each stored run (calibration version 3, measured 2026-11-24/25, also with --jobs 2: the same
#: bytes; version 4 gives the same numbers: its new columns are not made for 128 experts without shared ones): its
#: steps; TTFT / TPOT p50 and p99 against exact (%); the held-out step error (%); the TTFT's parts at
#: p50 / p99 against exact's (%): the wait from arrival to the first step, and the prompt's steps (first step to
#: first token). Calibration version 2 (no two-token column, stepsim.serve.fast.pair_parity) gave on requests
#: 0-199 23,486 steps, +2.88 / -0.48 / -1.04 / -0.40 %, held-out p95 4.36 %, max 5.28 %.
MEASURED = {
    "conv200_exact": (23450, {"ttft p50": 3.89, "ttft p99": -0.68, "tpot p50": -0.67, "tpot p99": -0.18},
                      {"iteration_p50": 0.27, "iteration_p95": 1.82, "iteration_max": 1.83},
                      {"wait 50": -1.23, "wait 99": -0.22, "prefill 50": 0.26, "prefill 99": -0.22}),
    "conv400_exact": (28716, {"ttft p50": -0.24, "ttft p99": -0.25, "tpot p50": -0.82, "tpot p99": -1.75},
                      {"iteration_p50": 0.32, "iteration_p95": 1.46, "iteration_max": 1.61},
                      {"wait 50": 25.57, "wait 99": -0.95, "prefill 50": 0.53, "prefill 99": -0.24}),
}

pytestmark = [pytest.mark.slow, pytest.mark.traces]


def window(conv_csv, tmp_path, name: str) -> Path:
    """The requests of stored run ``name``'s window, cut from the shared conversation trace into ``tmp_path``."""
    return azure_window(conv_csv, *WINDOWS[name], tmp_path / f"{name}.csv")


class _Recorded:
    """Prices step ``i`` with the stored run's ``duration_s[i]`` and keeps every batch."""

    mode = "recorded"
    error = None

    def __init__(self, durations: np.ndarray):
        self.durations = durations.tolist()
        self.batches = []

    def __call__(self, batch):
        self.batches.append(batch)
        return IterationCost(self.durations[len(self.batches) - 1], {})

    def describe(self) -> dict:
        return {}


@pytest.fixture(scope="module")
def fast_run(shared_traces, tmp_path_factory):
    """``fast_run(name)``: ``(stored exact run, fast run)`` of window ``name``; fast on the stored calibration
    (tests/calibration_seeding.py)."""
    runs = {}

    def run(name: str):
        if name not in runs:
            tmp = tmp_path_factory.mktemp(name)
            conv_csv = shared_traces / "azure" / "AzureLLMInferenceTrace_conv.csv"
            fast = stepsim.serve(str(MODEL), window(conv_csv, tmp, name), fidelity="fast", schedule="paper",
                                 calibration_cache=seeded_cache(tmp / "cache"))
            check_seed_used(tmp / "cache")
            runs[name] = (read_outputs(DATA / name), fast)
        return runs[name]

    return run


@pytest.mark.parametrize("name", WINDOWS)
def test_the_stored_exact_run_is_todays_exact_run(name, conv_csv, tmp_path):
    from stepsim.base.hardware import PRESETS
    from stepsim.models.presets import resolve_model
    from stepsim.serve.exact import EngineLatency
    from stepsim.serve.routing import SyntheticRouting

    requests, iterations, summary = read_outputs(DATA / name)
    assert summary["fidelity"]["mode"] == "exact" and summary["requests"] == summary["completed"] == WINDOWS[name][1]
    recorded = _Recorded(iterations["duration_s"].to_numpy())
    replay = stepsim.serve(str(MODEL), window(conv_csv, tmp_path, name), provider=recorded)
    assert len(recorded.batches) == summary["iterations"] == len(iterations)
    assert replay.requests.equals(requests)
    assert [sum(b.new_tokens) for b in recorded.batches] == iterations["tokens"].to_pylist()

    model = resolve_model(str(MODEL))
    routing = SyntheticRouting(model.experts, model.top_k, model.layers, seed=0)
    engine = EngineLatency(model, PRESETS["sn40l"], routing, max_model_len=summary["kv_cache"]["max_model_len"],
                           vocab=151936)
    decode = np.where(iterations["prefill_tokens"].to_numpy() == 0, iterations["sequences"].to_numpy(), 0)
    check = [0, int(np.argmax(decode)), int(np.argmax(iterations["tokens"].to_numpy()))]
    assert check == CHECKED_STEPS[name]
    for i, batch in enumerate(recorded.batches[: max(check) + 1]):
        if i not in check:
            routing.route(sum(batch.new_tokens))  # the exact provider's draws, step by step
            continue
        cost = engine(batch)
        assert cost.cycles == {k: iterations[f"cycles_{k}"][i].as_py() for k in ("attention", "ffn", "weights")}, i


@pytest.mark.parametrize("name", WINDOWS)
def test_fast_against_the_stored_exact_run(name, fast_run):
    """``--fidelity fast`` (calibrating) against the stored exact run of each window: issue 32 asks for TTFT and
    TPOT p50 / p99 within 2 % and the per-step error within 5 % at p95. Every target is met on requests
    200-399; on requests 0-199 all but TTFT p50 (test_why_ttft_p50_misses_on_requests_0_to_199)."""
    (requests, _, exact), fast = fast_run(name)
    s = fast.summary
    diff = {f"{k[:-2]} {q}": round((s[k][q] / exact[k][q] - 1) * 100, 2) for k in ("ttft_s", "tpot_s")
            for q in ("p50", "p99")}
    error = {k: round(v * 100, 2) for k, v in s["fidelity"]["error"].items() if k.startswith("iteration")}
    # TTFT = the wait for the step in flight at arrival (or the queue) + the steps that compute the prompt
    parts = {name: [_ttft_parts(r)[i] for r in (requests, fast.requests)] for i, name in enumerate(("wait", "prefill"))}
    quantiles = {f"{part} {q}": round((np.percentile(f, q) / np.percentile(e, q) - 1) * 100, 2)
                 for part, (e, f) in parts.items() for q in (50, 99)}
    assert (s["iterations"], diff, error, quantiles) == MEASURED[name]
    missed = {k for k, v in diff.items() if abs(v) >= 2} | {k for k in ("iteration_p95",) if error[k] >= 5}
    assert missed == ({"ttft p50"} if name == "conv200_exact" else set())


def test_why_ttft_p50_misses_on_requests_0_to_199(fast_run):
    """On requests 0-199 fast's TTFT p50 is +3.89 %, while the prompt's steps are within 0.3 % of exact's at p50
    and p99 (test_fast_against_the_stored_exact_run): the median of these 200 TTFTs sits where they are sparse
    (exact: 18.146, 18.203 ms, then 19.038), so two requests' waits move it; per request fast is within a fraction
    of a percent of exact."""
    (requests, _, exact), fast = fast_run("conv200_exact")
    s = fast.summary
    ratio = fast.requests["ttft_s"].to_numpy() / requests["ttft_s"].to_numpy() - 1
    assert round(float(np.median(ratio)) * 100, 3) == -0.254  # and the mean TTFT -0.28 %:
    assert round((s["ttft_s"]["mean"] / exact["ttft_s"]["mean"] - 1) * 100, 2) == -0.28
    # the wait is the arrival's phase within a step (a request arriving during a step waits for its end), which
    # no per-step model reproduces (docs/serving.md §10.6; test_the_exact_runs_own_ttft_p50_moves_with_the_arrival_phase).
    # The two requests fast's p50 lies between: their prompts' steps within 1.3 % of exact's, their waits 0.5 and
    # 1.3 ms longer (ms: exact wait, fast wait, exact prompt steps, fast prompt steps)
    (wait_e, steps_e), (wait_f, steps_f) = _ttft_parts(requests), _ttft_parts(fast.requests)
    middle = np.argsort(fast.requests["ttft_s"].to_numpy(), kind="stable")[99:101]
    assert [(int(i), *(round(v[i] * 1e3, 3) for v in (wait_e, wait_f, steps_e, steps_f))) for i in middle] == [
        (152, 0.588, 1.088, 17.558, 17.623), (102, 0.064, 1.364, 17.92, 17.687)]
    assert np.sort(requests["ttft_s"].to_numpy())[99:102].round(6).tolist() == [0.018146, 0.018203, 0.019038]


def _ttft_parts(requests) -> tuple[np.ndarray, np.ndarray]:
    """Per request (s): the wait from arrival to the start of its first step, and from there to its first token."""
    arrival, first = requests["arrival_s"].to_numpy(), requests["first_scheduled_s"].to_numpy()
    return first - arrival, requests["first_token_s"].to_numpy() - first


#: phase redraws of test_the_exact_runs_own_ttft_p50_moves_with_the_arrival_phase
PHASE_DRAWS = 4000


def test_the_exact_runs_own_ttft_p50_moves_with_the_arrival_phase():
    """The 2 % target on TTFT p50 is below this window's own noise. A request arriving during a step waits for
    that step's end; where in the step it arrives is the phase of the step boundaries at that instant, which
    follows from every earlier step's duration (in exact mode, from every few-token step's routing, which moves an
    MoE layer's cycles by 10-20 %). Redrawing only those phases (uniformly in the step in flight; everything
    else of the exact run kept) moves the exact run's own TTFT p50 by more than 2 % in 85 % of draws: the stored
    run sits at the 5th percentile of its own phase distribution; fast's +3.89 % (+2.88 % before the two-token
    column) is a typical draw."""
    requests, iterations, _ = read_outputs(DATA / "conv200_exact")
    start, duration = iterations["start_s"].to_numpy(), iterations["duration_s"].to_numpy()
    arrival, first = requests["arrival_s"].to_numpy(), requests["first_scheduled_s"].to_numpy()
    ttft = requests["ttft_s"].to_numpy()
    step = np.searchsorted(start, arrival, side="left") - 1  # the last step started strictly before the arrival
    during = (first > arrival) & (step >= 0) & (start[np.maximum(step, 0)] + duration[np.maximum(step, 0)] >= arrival)
    in_flight = duration[np.maximum(step, 0)]
    remaining = np.where(during, start[np.maximum(step, 0)] + in_flight - arrival, 0.0)
    assert int(during.sum()) == 127
    # such a request waits exactly for the end of the step in flight (never longer: the window never queues)
    assert np.array_equal(first[during], (start + duration)[step[during]])
    rng = np.random.default_rng(0)
    shift = np.array([np.percentile(ttft - remaining + during * rng.random(len(ttft)) * in_flight, 50)
                      for _ in range(PHASE_DRAWS)]) / np.percentile(ttft, 50) - 1
    assert [round(float(v) * 100, 2) for v in (np.percentile(shift, 5), np.median(shift), np.percentile(shift, 95))] \
        == [0.95, 3.78, 5.99]
    assert round(float((np.abs(shift) > 0.02).mean()), 3) == 0.851
