"""Functional mode of the compiled engine: real values through every shipped workload, checked against NumPy.

For each workload (scaled-down dims, real routing / KV-length traces where available):

* the stored tensors match :func:`stepsim.workloads.reference.workload_reference` within the dtype-derived
  tolerance (:func:`~stepsim.workloads.reference.check_outputs`);
* every timing result (cycles, unit and channel counters, bytes, events) is identical to timing mode;
* no tile is leaked (every arena block is back on the free stack at the end).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from stepsim.base.errors import ArenaError, ArgumentError
from stepsim.cli import main
from stepsim.models.presets import moe_model
from stepsim.simulation.simulate import simulate
from stepsim.trace_io.load import load_kv_lengths, load_routing
from stepsim.workloads.attention.build import build_attention
from stepsim.workloads.config import bundled_trace
from stepsim.workloads.moe.build import build_moe
from stepsim.workloads.reference import (
    check_outputs,
    gqa_decode_reference,
    make_inputs,
    max_rel_error,
    small_moe_model,
)
from stepsim.workloads.swiglu.build import build_swiglu

SMALL_MOE = moe_model("custom", hidden=32, intermediate=64, experts=4, top_k=2)
#: 8 tokens, top-2 over 4 experts; expert 3 gets no token (an idle expert)
SMALL_ROUTING = np.array([[0, 1], [1, 2], [0, 2], [1, 0], [2, 1], [0, 1], [2, 0], [1, 2]])


def _run_and_check(workload, **kw):
    """Timing run, functional run; assert identical timing, no leak, outputs within tolerance."""
    timing = simulate(workload)
    func = simulate(workload, functional=True, **kw)
    assert func.cycles == timing.cycles
    assert (func.off_chip_bytes_read, func.off_chip_bytes_written, func.events, func.fires) == (
        timing.off_chip_bytes_read, timing.off_chip_bytes_written, timing.events, timing.fires)
    np.testing.assert_array_equal(func.unit_counters, timing.unit_counters)
    np.testing.assert_array_equal(func.channel_counters, timing.channel_counters)
    assert func.functional.live_at_end == 0
    assert 0 < func.functional.peak_tiles <= func.functional.arena_tiles
    checks = check_outputs(workload, func.inputs, func.outputs)
    failed = {name: c for name, c in checks.items() if not c.passed}
    assert not failed, failed
    return func, checks


# ------------------------------------------------------------------------------------- bundled / synthetic
@pytest.mark.parametrize("tiling,tile_n,regions", [("static", 4, None), ("static", 16, None),
                                                   ("dynamic", None, None), ("static", 4, 2),
                                                   ("dynamic", None, 2)])
def test_small_moe_matches_numpy(tiling, tile_n, regions):
    kw = {"tile_f": 32} if regions else {}
    _run_and_check(build_moe(SMALL_MOE, SMALL_ROUTING, tiling=tiling, tile_n=tile_n, regions=regions, **kw))


def test_swiglu_matches_numpy():
    func, checks = _run_and_check(build_swiglu(batch=32, hidden=64, intermediate=128, tile_m=16, tile_n=32))
    assert checks["y"].error < 1e-5


@pytest.mark.parametrize("softmax", ["plain", "stable"])
@pytest.mark.parametrize("strategy", ["coarse", "interleave", "dynamic"])
def test_small_attention_matches_numpy(strategy, softmax):
    kv = [70, 3, 31, 32, 100, 0, 64, 5]
    func, checks = _run_and_check(build_attention(kv, strategy, head_dim=16, query_per_kv_head=2, tile_n=16,
                                                  softmax=softmax))
    # the KV append is a copy: the caches come back exactly (rows appended at each request's length)
    assert checks["k_cache"].error == 0.0 and checks["v_cache"].error == 0.0


def test_stable_softmax_survives_scores_that_overflow_the_plain_form():
    """Queries scaled by 128 (exact in bf16) push scores far past exp's fp32 range (~88.7): the plain form
    stores inf / nan, the stable form stays finite and equals a one-shot float64 softmax within tolerance."""
    kv = [70, 3, 31, 32, 100, 0, 64, 5]
    plain, stable = (build_attention(kv, "dynamic", head_dim=16, query_per_kv_head=2, tile_n=16, softmax=f)
                     for f in ("plain", "stable"))
    inputs = make_inputs(stable, seed=1)
    inputs["q"] = inputs["q"] * np.float32(128)
    assert not np.isfinite(simulate(plain, functional=True, inputs=inputs).outputs["out"]).all()
    result = simulate(stable, functional=True, inputs=inputs)
    assert np.isfinite(result.outputs["out"]).all()
    checks = check_outputs(stable, inputs, result.outputs)  # the tile-by-tile float64 reference
    assert checks["out"].passed, checks["out"]
    direct = gqa_decode_reference(inputs["q"], inputs["k_cache"], inputs["v_cache"], kv, inputs["k"], inputs["v"],
                                  softmax="stable", order="direct", tile_n=16, include_tile_padding=True).out
    assert max_rel_error(result.outputs["out"], direct) <= checks["out"].tolerance


def test_functional_runs_are_bit_identical():
    w = build_moe(SMALL_MOE, SMALL_ROUTING, tiling="dynamic")
    a = simulate(w, functional=True)
    b = simulate(w, functional=True)
    assert a.outputs["y"].tobytes() == b.outputs["y"].tobytes()


def test_user_inputs_are_used_and_seed_changes_defaults():
    w = build_moe(SMALL_MOE, SMALL_ROUTING, tiling="static", tile_n=4)
    inputs = make_inputs(w, seed=3)
    given = simulate(w, functional=True, inputs=inputs)
    seeded = simulate(w, functional=True, seed=3)
    other = simulate(w, functional=True, seed=4)
    np.testing.assert_array_equal(given.outputs["y"], seeded.outputs["y"])
    assert not np.array_equal(seeded.outputs["y"], other.outputs["y"])


# ---------------------------------------------------------------------------------------------- errors
def test_too_small_arena_says_how_many_tiles_the_run_needs():
    w = build_moe(SMALL_MOE, SMALL_ROUTING, tiling="static", tile_n=4)
    need = simulate(w, functional=True).functional.peak_tiles
    with pytest.raises(ArenaError) as err:
        simulate(w, functional=True, arena_tiles=need - 1)
    assert f"beyond arena_tiles={need - 1}" in str(err.value)
    assert f"this run needs {need} tiles" in str(err.value)
    exact = simulate(w, functional=True, arena_tiles=need)  # exactly enough is enough
    assert exact.functional.arena_tiles == need and exact.functional.peak_tiles == need


def test_a_run_larger_than_the_available_memory_is_refused_before_it_starts(monkeypatch):
    from stepsim.kernels import arena

    w = build_moe(SMALL_MOE, SMALL_ROUTING, tiling="static", tile_n=4)
    stats = simulate(w, functional=True).functional
    tensor_bytes = 4 * sum(a.size for a in make_inputs(w).values()) + 4 * 8 * 32  # inputs + the stored y
    mib = lambda n: f"{n / 2**20:,.2f} MiB"  # noqa: E731
    # the tensors fit, the arena does not: refused when the value arena is sized
    monkeypatch.setattr(arena, "available_memory_bytes", lambda: tensor_bytes + 1)
    with pytest.raises(ArenaError) as err:
        simulate(w, functional=True)
    assert str(err.value) == (
        f"functional mode needs {mib(stats.arena_bytes + tensor_bytes)} for tile values and tensors "
        f"(arena {mib(stats.arena_bytes)}, tensors {mib(tensor_bytes)}) but only {mib(tensor_bytes + 1)} of memory "
        "is available; use smaller model dimensions (e.g. stepsim.workloads.reference.small_moe_model) or a "
        "smaller arena_tiles")
    # not even the tensors fit: refused before any input is generated
    monkeypatch.setattr(arena, "available_memory_bytes", lambda: 1_000)
    with pytest.raises(ArenaError) as err:
        simulate(w, functional=True)
    assert str(err.value) == (
        f"functional mode needs {mib(tensor_bytes)} for its tensors alone (fp32) but only 0.00 MiB of memory is "
        "available to this process (free memory and ulimit -v); use smaller model dimensions (e.g. "
        "stepsim.workloads.reference.small_moe_model)")


@pytest.mark.parametrize("bad", [0, -3, 2.5, True])
def test_arena_tiles_must_be_a_positive_int(bad):
    w = build_moe(SMALL_MOE, SMALL_ROUTING, tiling="static", tile_n=4)
    with pytest.raises(ArgumentError, match=f"arena_tiles must be a positive int, got {bad!r}"):
        simulate(w, functional=True, arena_tiles=bad)


def test_missing_wrong_size_and_unknown_inputs_are_named():
    w = build_moe(SMALL_MOE, SMALL_ROUTING, tiling="static", tile_n=4)
    inputs = make_inputs(w)
    with pytest.raises(ArgumentError, match=r"no input for tensor 'x' \[8, 32\], which the program loads"):
        simulate(w, functional=True, inputs={k: v for k, v in inputs.items() if k != "x"})
    with pytest.raises(ArgumentError, match=r"input 'x' has shape \[4, 32\] \(128 elements\); the program uses "
                                            r"it as \[8, 32\]"):
        simulate(w, functional=True, inputs={**inputs, "x": inputs["x"][:4]})
    with pytest.raises(ArgumentError, match=r"name tensors the program does not use: \['nope'\]"):
        simulate(w, functional=True, inputs={**inputs, "nope": np.zeros(3)})


# ------------------------------------------------------------------------------------------ real traces
def _first(folder, pattern):
    files = sorted(folder.glob(pattern))
    assert files, f"no {pattern} in {folder}"
    return files[0]


@pytest.mark.parametrize("model,folder", [("mixtral-8x7b", "mixtral_b64"), ("qwen3-30b-a3b", "qwen_b64")])
@pytest.mark.parametrize("kw", [dict(tiling="static", tile_n=16, tile_f=32), dict(tiling="dynamic", tile_f=32),
                                dict(tiling="static", tile_n=32, regions=4), dict(tiling="dynamic", regions=2)],
                         ids=["static16", "dynamic", "static32-regions4", "dynamic-regions2"])
def test_moe_on_real_routing_matches_numpy(shared_traces, model, folder, kw):
    small = small_moe_model(model, hidden=64, intermediate=96)
    routing = load_routing(_first(shared_traces / "expert_routing" / folder, "*.npz"), small.experts)
    _run_and_check(build_moe(small, routing, **kw))


@pytest.mark.parametrize("softmax", ["plain", "stable"])
@pytest.mark.parametrize("batch", [16, 64])
@pytest.mark.parametrize("strategy", ["coarse", "interleave", "dynamic"])
def test_attention_on_real_kv_lengths_matches_numpy(shared_traces, batch, strategy, softmax):
    kv = load_kv_lengths(_first(shared_traces / "kv_lengths" / f"b{batch}", "*.npy"))
    _run_and_check(build_attention(kv, strategy, head_dim=16, query_per_kv_head=4, softmax=softmax))


# ------------------------------------------------------------------------------------------------- CLI
def test_cli_run_functional_check_reports_the_error(capsys):
    assert main(["run", "swiglu", "--functional", "--check", "--json"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["mode"] == "check"
    assert row["check_passed"] is True
    assert 0 < row["check_max_rel_error"] <= row["check_tolerance"] < 1e-3
    timing = simulate(build_swiglu())
    assert row["cycles"] == timing.cycles and row["off_chip_bytes"] == timing.off_chip_bytes


def test_cli_functional_attention_defaults_to_the_stable_softmax(capsys):
    assert main(["run", "attention", "--functional", "--check", "--json"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert (row["softmax"], row["check_passed"]) == ("stable", True)
    kv = load_kv_lengths(bundled_trace("attention"))
    assert row["cycles"] == simulate(build_attention(kv, "dynamic", softmax="stable")).cycles
    assert main(["run", "attention", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["softmax"] == "plain"


def test_cli_check_needs_functional(capsys):
    assert main(["run", "swiglu", "--check"]) == 2
    assert "--check needs --functional" in capsys.readouterr().err
