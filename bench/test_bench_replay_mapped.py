"""Issue 42's faster replay on serve's default layers: ``--fidelity fast`` on mapped layers
(:class:`stepsim.serve.fast_mapped.MappedFastLatency`, what a plan prices one-chip replicas with) replayed by the
compiled loop (:mod:`stepsim.kernels.serve_mapped`) and by the Python reference side by side in one run, on the whole
Azure conversation trace (19,366 requests), vLLM's defaults, one ``sn40l`` chip.

The model is the plan tests' small MoE shape (tests/plan/test_plan.py's ``SMALL``: 2 layers, 16 experts; its
buckets' schedules are mapping seeds) with a context of 32,768 tokens so that every request of the trace fits: a
Qwen3-30B-A3B-sized model would first need its missing buckets mapped and a whole-trace calibration (37 min at
load 11-18 for the one-chip shape, bench/README.md "Full size"), which is not what is timed here. Its calibration
is made once on the trace's first 40 requests (fast mode's own, cached in ``$STEPSIM_SERVE_CACHE`` or the test's
folder); the replays are ``stepsim.serve(..., provider=..., arrival_scale=ARRIVAL_SCALE)`` with that calibration,
each with a fresh provider:

1. a first compiled run: fills the kernel's tables (each bucket's schedule, the projections simulated at every
   token count the run has; the process's memo keeps them, as the Python loop's does);
2. the compiled run, timed; 3. the Python loop (``api.replay`` = ``replay_reference``), timed.

Gate: every file 2 and 3 write is byte for byte the same (``summary.json`` but for its ``wall_s``, its ``layers``
included: the buckets noted). And :func:`test_plan_unit_case_compiled_vs_python`: tests/plan/test_plan.py's two
plans timed with the compiled mapped replay and without it. Not in the default benchmark run:
``STEPSIM_BENCH_MAPPED=1`` (with ``STEPSIM_MAPPING_CACHE`` a copy of tests/mapping_seeds, so that no bucket is mapped
from scratch).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

import stepsim
import stepsim.serve.api as api
from stepsim.serve import replay as replay_module

SMALL = {"model_type": "qwen3_moe", "hidden_size": 256, "intermediate_size": 512, "moe_intermediate_size": 128,
         "num_experts": 16, "num_experts_per_tok": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
         "head_dim": 32, "num_hidden_layers": 2, "vocab_size": 1000, "max_position_embeddings": 32768}
SECTION = "replay on mapped layers: the whole conversation trace (19,366 requests), a 2-layer 16-expert MoE, sn40l"
#: the trace's arrivals times this (its hour in 3.5 s): at the trace's own rate the small model's steps are a few
#: microseconds, mostly one decode each (4,041,846 steps, hours of the Python loop); compressed, they batch as a
#: large model's steps do at the trace's rate (Qwen3-30B-A3B: 67,354 steps, bench/README.md)
ARRIVAL_SCALE = 0.001


def _provider_factory(model_arg, cache, key: str, system: str | None = None):
    """A fresh provider of the calibration in ``cache`` (as stepsim.plan.pricing makes one): one chip's
    :class:`MappedFastLatency`, or on ``system``'s chips :class:`MappedSystemFastLatency` (a dense model's
    tensor-parallel shards) or :class:`MappedEPFastLatency` (an MoE model's expert-parallel chips)."""
    from stepsim.base.hardware import PRESETS
    from stepsim.base.system import System
    from stepsim.models.presets import resolve_model
    from stepsim.serve.fast import MetricForm
    from stepsim.serve.fast_mapped import MappedFastLatency
    from stepsim.serve.fast_mapped_ep import MappedEPFastLatency
    from stepsim.serve.memory import model_memory
    from stepsim.serve.routing import SyntheticRouting
    from stepsim.serve.system_fast import MappedSystemFastLatency

    record = json.loads((cache / f"{key}.json").read_text())
    model = resolve_model(str(model_arg))
    forms = {kind: MetricForm(tuple(v[0]), tuple(v[1])) for kind, v in record["forms"].items()}
    memory = model_memory(model)
    kw = dict(max_model_len=memory.max_position_embeddings, vocab=memory.vocab_size, forms=forms,
              theta=record["theta"], error=record["error"])

    def make():
        routing = SyntheticRouting(model.experts, model.top_k, model.layers, seed=0) if model.is_moe else None
        if system is None:
            return MappedFastLatency(model, PRESETS["sn40l"], routing, schedule="auto", **kw)
        kind = MappedEPFastLatency if model.is_moe else MappedSystemFastLatency
        return kind(model, System.preset(system), routing, **kw)
    return make


def _serve(monkeypatch, model_arg, trace, out, provider, loop, **serve_kw) -> tuple[float, float, float]:
    """``stepsim.serve`` with ``loop`` as its replay (``serve_kw``: its other arguments): (serve wall s, replay wall
    s, replay CPU s)."""
    spent = []

    def timed(*args, **kw):
        t0, c0 = time.perf_counter(), time.process_time()
        result = loop(*args, **kw)
        spent.append((time.perf_counter() - t0, time.process_time() - c0))
        return result

    monkeypatch.setattr(api, "replay", timed)
    t0 = time.perf_counter()
    stepsim.serve(str(model_arg), trace, out=out, provider=provider, **serve_kw)
    return time.perf_counter() - t0, *spent[-1]


def _same_files(a, b) -> None:
    names = sorted(p.name for p in a.iterdir())
    assert names == sorted(p.name for p in b.iterdir()) and "iterations.parquet" in names
    for name in names:
        if name == "summary.json":
            x, y = (json.loads((d / name).read_text()) for d in (a, b))
            x.pop("wall_s"), y.pop("wall_s")
            assert x == y
        else:
            assert (a / name).read_bytes() == (b / name).read_bytes(), name


@pytest.mark.skipif(os.environ.get("STEPSIM_BENCH_MAPPED") != "1",
                    reason="minutes of the Python loop on the 2-core machine: set STEPSIM_BENCH_MAPPED=1")
def test_mapped_replay_side_by_side(shared_traces, bench_summary, monkeypatch, tmp_path):
    trace = shared_traces / "azure" / "AzureLLMInferenceTrace_conv.csv"
    model_path = tmp_path / "small.json"
    model_path.write_text(json.dumps(SMALL))
    cache = Path(os.environ.get("STEPSIM_SERVE_CACHE", tmp_path / "cache"))
    t0 = time.perf_counter()
    result = stepsim.serve(str(model_path), trace, limit_requests=40, fidelity="fast", hardware="sn40l",
                           calibration_cache=cache)
    calibration_s = time.perf_counter() - t0
    make = _provider_factory(model_path, cache, result.summary["fidelity"]["calibration"])
    one_chip = {"hardware": "sn40l", "arrival_scale": ARRIVAL_SCALE}
    first = _serve(monkeypatch, model_path, trace, tmp_path / "first", make(), replay_module.replay, **one_chip)
    new = _serve(monkeypatch, model_path, trace, tmp_path / "new", make(), replay_module.replay, **one_chip)
    old = _serve(monkeypatch, model_path, trace, tmp_path / "old", make(), replay_module.replay_reference, **one_chip)
    _same_files(tmp_path / "old", tmp_path / "new")
    steps = json.loads((tmp_path / "new" / "summary.json").read_text())["iterations"]
    load = os.getloadavg()[0]
    bench_summary(SECTION, f"calibration on 40 requests {calibration_s:.1f} s; first compiled run (tables filled) "
                           f"replay {first[1]:.2f} s (CPU {first[2]:.2f} s)")
    bench_summary(SECTION, f"replay {new[1]:.2f} s compiled (CPU {new[2]:.2f} s) vs {old[1]:.2f} s Python loop "
                           f"(CPU {old[2]:.2f} s): {old[1] / new[1]:.1f}x; whole serve() {new[0]:.1f} s vs "
                           f"{old[0]:.1f} s; {steps:,} steps; files identical; load {load:.1f}")


@pytest.mark.skipif(os.environ.get("STEPSIM_BENCH_MAPPED") != "1",
                    reason="minutes of the Python loop on the 2-core machine: set STEPSIM_BENCH_MAPPED=1")
def test_plan_unit_case_compiled_vs_python(bench_summary, monkeypatch, tmp_path):
    """tests/plan/test_plan.py's case (12 requests, 12 deployments up to 4 chips; the one-chip replicas on mapped
    layers, the two-chip ones on the paper's by ``SystemFastLatency``): the plan and the brute force with the
    compiled replay and with it switched off for both providers (every replay in the Python loop), the calibrations
    made once before both. Gate: the same plan.json but for its wall
    time, the same deployments (every column of deployments.parquet)."""
    import numpy as np

    import stepsim.serve.replay_compiled as replay_compiled
    import stepsim.serve.replay_mapped as replay_mapped
    from stepsim.trace_io.requests import RequestTrace, write_requests

    sys_path = str(Path(__file__).resolve().parents[1] / "tests" / "plan")
    monkeypatch.syspath_prepend(sys_path)
    from test_plan import REQUESTS, SLO, SPACE
    from test_plan import SMALL as PLAN_SMALL

    model = tmp_path / "small.json"
    model.write_text(json.dumps(PLAN_SMALL))
    rng = np.random.default_rng(3)
    trace = write_requests(RequestTrace("t", np.arange(REQUESTS), np.sort(rng.uniform(0, 0.01, REQUESTS)),
                                        rng.integers(5, 400, REQUESTS), rng.integers(2, 30, REQUESTS)),
                           tmp_path / "t.parquet")
    kw = dict(slo=SLO, max_chips=4, space=SPACE, calibration_cache=tmp_path / "cache", verify=False)
    stepsim.plan(str(model), trace, **kw)  # the calibrations, outside the timings
    spent, summaries = {}, {}
    for name in ("compiled", "python"):
        if name == "python":  # every mapped or system provider to the Python loop
            monkeypatch.setattr(replay_mapped, "mapped_parameters", lambda provider, kr: None)
            monkeypatch.setattr(replay_compiled, "_fast_parameters", lambda provider, kr: None)
        t0 = time.perf_counter()
        plan = stepsim.plan(str(model), trace, out=tmp_path / "plan", **kw)  # one folder: the same paths
        brute = stepsim.plan(str(model), trace, prune=False, **kw)
        spent[name] = time.perf_counter() - t0
        summaries[name] = [{k: v for k, v in p.summary.items() if k not in ("wall_s", "outputs")}
                           for p in (plan, brute)] + [plan.deployments, brute.deployments]
    monkeypatch.undo()
    assert summaries["compiled"] == summaries["python"]
    plan_summary = summaries["compiled"][0]
    bench_summary(SECTION, f"plan unit case (plan + brute force, {plan_summary['replays']} + "
                           f"{summaries['compiled'][1]['replays']} full replays, calibrated): "
                           f"{spent['compiled']:.1f} s compiled vs {spent['python']:.1f} s Python loop "
                           f"({spent['python'] / spent['compiled']:.1f}x); the same plans; "
                           f"load {os.getloadavg()[0]:.1f}")


SECTION_SYSTEM = "replay on a system's mapped chips (compiled vs Python loop, the same run)"


def _system_side_by_side(monkeypatch, tmp_path, bench_summary, trace, model_arg, system: str, what: str, **serve_kw):
    """Calibrate ``model_arg`` on ``system`` on the trace's first 40 requests, then serve ``serve_kw``'s requests
    with fresh providers of that calibration: a compiled run that fills the tables, a compiled run and the Python
    loop, timed; every file of the last two byte for byte the same."""
    cache = Path(os.environ.get("STEPSIM_SERVE_CACHE", tmp_path / "cache"))
    t0 = time.perf_counter()
    result = stepsim.serve(str(model_arg), trace, limit_requests=40, fidelity="fast", system=system,
                           calibration_cache=cache)
    calibration_s = time.perf_counter() - t0
    make = _provider_factory(model_arg, cache, result.summary["fidelity"]["calibration"], system)
    runs = {name: _serve(monkeypatch, model_arg, trace, tmp_path / name, make(), loop, system=system, **serve_kw)[1:]
            for name, loop in (("first", replay_module.replay), ("new", replay_module.replay),
                               ("old", replay_module.replay_reference))}
    monkeypatch.undo()
    _same_files(tmp_path / "old", tmp_path / "new")
    steps = json.loads((tmp_path / "new" / "summary.json").read_text())["iterations"]
    (new, new_cpu), (old, old_cpu) = runs["new"], runs["old"]
    bench_summary(SECTION_SYSTEM, f"{what}: calibration on 40 requests {calibration_s:.1f} s; first compiled run "
                                  f"(tables filled) replay {runs['first'][0]:.2f} s; replay {new:.2f} s compiled "
                                  f"(CPU {new_cpu:.2f} s) vs {old:.2f} s Python loop (CPU {old_cpu:.2f} s): "
                                  f"{old / new:.1f}x; {steps:,} steps; files identical; load "
                                  f"{os.getloadavg()[0]:.1f}")


@pytest.mark.skipif(os.environ.get("STEPSIM_BENCH_MAPPED") != "1",
                    reason="minutes of the Python loop on the 2-core machine: set STEPSIM_BENCH_MAPPED=1")
def test_tensor_parallel_replay_side_by_side(shared_traces, bench_summary, monkeypatch, tmp_path):
    """:class:`MappedSystemFastLatency` (each chip's shard, two all-reduces a layer): Llama-3.1-8B on ``sn40l-8``,
    2,000 requests of the conversation trace at their own arrivals."""
    trace = shared_traces / "azure" / "AzureLLMInferenceTrace_conv.csv"
    _system_side_by_side(monkeypatch, tmp_path, bench_summary, trace, "llama-3.1-8b", "sn40l-8",
                         "Llama-3.1-8B on sn40l-8, 2,000 requests", limit_requests=2000)


@pytest.mark.skipif(os.environ.get("STEPSIM_BENCH_MAPPED") != "1",
                    reason="minutes of the Python loop on the 2-core machine: set STEPSIM_BENCH_MAPPED=1")
def test_expert_parallel_replay_side_by_side(shared_traces, bench_summary, monkeypatch, tmp_path):
    """:class:`MappedEPFastLatency` (the heads split, one all-reduce a layer, the block's regressors): the small MoE
    (:data:`SMALL`) on ``ring-2``, 2,000 requests of the conversation trace at 1 / 100 of their gaps (they batch)."""
    model_path = tmp_path / "small.json"
    model_path.write_text(json.dumps(SMALL))
    trace = shared_traces / "azure" / "AzureLLMInferenceTrace_conv.csv"
    _system_side_by_side(monkeypatch, tmp_path, bench_summary, trace, model_path, "ring-2",
                         "small MoE on ring-2, 2,000 requests at 100x", limit_requests=2000, arrival_scale=0.01)
