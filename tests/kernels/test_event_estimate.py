"""The run-size estimate of engine events (stepsim.kernels.run_size.event_bound) against the engine's real count.

The estimate is computed before the engine starts, from the elements each channel carries (the graph's stream
shapes with the trace's values: stepsim.graph.channels.channel_elements); it must never be below the run's
events (an estimate the refusal can trust) and stay within a stated factor of them: FACTOR_ONE_HBM on a single
chip, FACTOR_MANY_HBMS with several chips' HBMs (whose interleaved events it bounds by the HBM's chunks). The
table holds every workload kind at small sizes, the paper's MoE layers, and the huge-input case that runs in
about a second (a 2^30-wide layer: few tiles, huge ones)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from ref_random_programs import random_program
from shared_traces_folder import require_shared_traces

from stepsim.base.errors import DeadlockError, SimulationError
from stepsim.graph.channels import channel_elements
from stepsim.kernels import abi as A
from stepsim.kernels import run_size
from stepsim.kernels.api import run
from stepsim.simulation.simulate import simulate
from stepsim.workloads.config import workload_from_config

FACTOR_ONE_HBM = 4
FACTOR_MANY_HBMS = 40
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "user_graph.py"


def _small(kind: str, tmp: Path) -> dict:
    """A small instance of every workload kind (well under a second each)."""
    rng = np.random.default_rng(0)
    if kind in ("moe", "moe-ep2", "huge"):
        np.savez(tmp / "r8.npz", data=np.stack([rng.choice(8, 2, replace=False) for _ in range(64)]))
        dims = {"hidden": 2**30, "intermediate": 64} if kind == "huge" else {"hidden": 256, "intermediate": 128}
        return {"workload": "moe", "model": "custom", **dims, "experts": 8, "top_k": 2, "trace": str(tmp / "r8.npz"),
                **({"ep": 2} if kind == "moe-ep2" else {})}
    if kind == "swiglu":
        return {"workload": "swiglu", "tile_m": 32, "tile_n": 64}
    if kind in ("attention", "prefill_attention"):
        np.save(tmp / "kv.npy", np.array([5, 40, 17, 64]))
        extra = {"strategy": "interleave"} if kind == "attention" else {"tile_m": 20, "tile_n": 16}
        return {"workload": kind, "trace": str(tmp / "kv.npy"), **extra}
    if kind == "collective":
        return {"workload": "collective", "op": "all-reduce", "bytes": 4 * 4 * 32, "system": "ring-4"}
    if kind == "program":
        return {"workload": "program", "program": f"{EXAMPLE}:small_moe_with_shared_expert"}
    (tmp / "config.json").write_text(json.dumps({  # decoder: a Qwen3-like layer with small dims
        "model_type": "qwen3_moe", "hidden_size": 64, "intermediate_size": 128, "moe_intermediate_size": 32,
        "num_experts": 8, "num_experts_per_tok": 2, "num_attention_heads": 8, "num_key_value_heads": 2,
        "head_dim": 16, "num_hidden_layers": 2}))
    np.savez(tmp / "routing.npz", data=np.stack([np.random.default_rng(e).choice(8, 2, replace=False)
                                                 for e in range(8)]))
    np.save(tmp / "kv.npy", np.array([5, 40, 17, 64, 3, 33, 100, 31]))
    return {"workload": "decoder", "model": str(tmp / "config.json"), "routing": str(tmp / "routing.npz"),
            "kv_lengths": str(tmp / "kv.npy"), "tile_f": 16}


def _estimate_and_run(workload):
    """(estimated events, real events, predicted elements summed, elements pushed) of one simulated workload."""
    from stepsim.base.hardware import Hardware
    from stepsim.graph.lower import lower

    result = simulate(workload)
    program = lower(workload.graph, Hardware.preset(workload.hardware), channel_depth=result.channel_depth,
                    channel_depths=workload.channel_depths)
    counts = channel_elements(workload.graph, workload.bindings)
    size = run_size.estimate(program, 0, [counts[name] for name in program.channel_names])
    return size.events, result.events, sum(counts.values()), int(result.channel_counters[:, A.CCNT_PUSHES].sum())


#: (kind, estimated events, real events): exact pins of the estimate, and the run it bounds (collective: the default
#: streamed ring, whose 4 send stages, one a chip, add 4 events and 16 estimated to the whole-chunk ring's 456 / 188)
SMALL = [("moe", 5077, 2556), ("moe-ep2", 8622, 2898), ("huge", 4821, 2397), ("swiglu", 512, 318),
         ("attention", 1280, 593), ("prefill_attention", 875, 450), ("collective", 472, 192),
         ("program", 3212, 1566), ("decoder", 8102, 3491)]


@pytest.mark.parametrize("kind, estimated, events", SMALL, ids=[k for k, _, _ in SMALL])
def test_the_estimate_bounds_every_kind(kind, estimated, events, tmp_path):
    workload = workload_from_config(_small(kind, tmp_path))
    est, real, predicted, pushed = _estimate_and_run(workload)
    assert predicted == pushed  # the elements are known exactly before the run
    assert (est, real) == (estimated, events)
    factor = FACTOR_MANY_HBMS if kind in ("moe-ep2", "collective") else FACTOR_ONE_HBM
    assert real <= est <= factor * real


@pytest.mark.parametrize("config, factor", [
    ({"model": "mixtral-8x7b", "trace": "mixtral_b64/008_010.npz"}, FACTOR_ONE_HBM),
    ({"model": "qwen3-30b-a3b", "trace": "qwen_b64/032_012.npz", "tiling": "static", "tile_n": 16}, FACTOR_ONE_HBM),
    ({"model": "mixtral-8x7b", "trace": "mixtral_b64/008_010.npz", "ep": 4}, FACTOR_MANY_HBMS),
], ids=["mixtral B=64", "qwen3 B=64 tile 16", "mixtral B=64 on 4 chips"])
def test_the_estimate_bounds_the_papers_layers(config, factor):
    routing = require_shared_traces() / "expert_routing" / config["trace"]
    est, real, predicted, pushed = _estimate_and_run(workload_from_config({**config, "workload": "moe",
                                                                           "trace": str(routing)}))
    assert predicted == pushed
    assert real <= est <= factor * real


@pytest.mark.parametrize("links", [False, True], ids=["one chip", "three chips with links"])
def test_the_bound_holds_on_random_programs(links):
    # the bound itself, from the elements the run pushed (random programs have no graph): 60 programs that finish
    ratios = []
    for seed in range(200):
        program = random_program(seed, links=links)
        try:
            result = run(program)
        except (DeadlockError, SimulationError):  # deadlocks on purpose-free FIFO limits, bad selectors
            continue
        bound = run_size.event_bound(program, result.channel_counters[:, A.CCNT_PUSHES])
        assert result.events <= bound, seed
        ratios.append(bound / result.events)
        if len(ratios) == 60:
            break
    assert len(ratios) == 60 and max(ratios) <= (FACTOR_MANY_HBMS if links else FACTOR_ONE_HBM)


def test_an_unbound_shape_gives_no_estimate_and_no_refusal(tmp_path):
    # a MoE layer's expert streams are as long as the trace says: without its bindings nothing is guessed
    workload = workload_from_config(_small("moe", tmp_path))
    assert channel_elements(workload.graph, workload.bindings) is not None
    assert channel_elements(workload.graph, None) is None
    size = run_size.RunSize(memory_bytes=1, fifo_slots=1, events=None)
    run_size.check(size, available=10**9)  # memory fits, events unknown: it runs


@pytest.mark.parametrize("events, force, message", [
    (10**9, False, None),
    (10**9 + 1, True, None),
    (10**9 + 1, False, "this run needs up to 1.00e+09 engine events, about 17 minutes at 1e+06 events/s; the limit "
                       "is 1e+09 (check the model dimensions), --force runs it anyway"),
    (4294971861, False, "this run needs up to 4.29e+09 engine events, about 72 minutes at 1e+06 events/s; the limit "
                        "is 1e+09 (check the model dimensions), --force runs it anyway"),
    (17179873749, False, "this run needs up to 1.72e+10 engine events, about 5 hours at 1e+06 events/s; the limit "
                         "is 1e+09 (check the model dimensions), --force runs it anyway"),
])
def test_the_refusal_names_the_events_their_time_and_force(events, force, message):
    from stepsim.base.errors import ConfigError

    size = run_size.RunSize(memory_bytes=1, fifo_slots=1, events=events)
    if message is None:
        run_size.check(size, force=force, available=10**9)
        return
    with pytest.raises(ConfigError) as info:
        run_size.check(size, force=force, available=10**9)
    assert str(info.value) == message


def test_the_elements_are_counted_once_per_graph_and_trace(tmp_path, monkeypatch):
    # FIFO sizing simulates one graph dozens of times with other depths: its element counts are kept
    import stepsim.graph.channels as channels

    calls = []
    real = channels.channel_elements
    monkeypatch.setattr(channels, "channel_elements", lambda *a: calls.append(1) or real(*a))
    workload = workload_from_config(_small("swiglu", tmp_path))
    first = simulate(workload)
    again = simulate(workload, channel_depth=8)
    other = simulate(workload_from_config(_small("swiglu", tmp_path)))  # another graph: counted again
    assert len(calls) == 2
    assert (first.events, again.events, other.events) == (318, 288, 318)  # depth 8: fewer wake-ups
