"""A stored exact run on mapped layers (``--schedule auto``) is today's exact run: :func:`check_stored_mapped_run`,
the mapped counterpart of tests/serve/test_fast_accuracy_models.py's ``check_stored_exact_run`` (which prices with
the paper's schedules), for stored mapped runs such as issue 41's requests 200-399 on the 4-layer Qwen3 shape.

Checked here on a small one: ``data/qwen_tiny_mapped_exact``, the 8-expert top-2 model of
tests/serve/test_fast_mapped.py (``data/qwen3-tiny-2layers.json``) serving four requests, as ``stepsim.serve(...,
fidelity="exact", schedule="auto", jobs=2)`` wrote it (22 steps) with the real mapper (its buckets are in
tests/mapping_seeds, so nothing is mapped here). Every step is simulated again.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from serve_requests import requests_file
from test_fast_accuracy import _Recorded

import stepsim
from stepsim.base.hardware import PRESETS
from stepsim.models.presets import resolve_model
from stepsim.serve.exact import EngineLatency
from stepsim.serve.output import read_outputs
from stepsim.serve.routing import SyntheticRouting

DATA = Path(__file__).resolve().parent / "data"
#: a mapped step's cycle columns (iterations.parquet ``cycles_*``): ``hidden`` is what streaming weights ahead saved
MAPPED_CYCLES = ("attention", "ffn", "hidden", "weights")


def check_stored_mapped_run(stored, model: str, trace, vocab: int, steps=None) -> list[int]:
    """Check that a stored mapped exact run (``read_outputs``' triple) of ``model`` on request trace ``trace`` is
    today's: its step durations replayed give its requests back (today's scheduler), and its steps ``steps``
    (default: the first, the decode-only step with the most sequences, the first with the most tokens), rebuilt
    with the exact provider's routing draws and priced again by the mapped exact provider (schedules from the
    mapping cache, projections and weights streamed ahead on the engine), have its ``cycles_*``, utilisation
    columns and durations. Returns the steps checked, for the caller to pin."""
    requests, iterations, summary = stored
    assert summary["fidelity"]["mode"] == "exact" and summary["fidelity"]["schedule"] == "auto"
    assert summary["requests"] == summary["completed"]
    recorded = _Recorded(iterations["duration_s"].to_numpy())
    replay = stepsim.serve(model, trace, provider=recorded)
    assert len(recorded.batches) == summary["iterations"] == len(iterations)
    assert replay.requests.equals(requests)
    config = resolve_model(model)
    routing = SyntheticRouting(config.experts, config.top_k, config.layers, seed=0) if config.is_moe else None
    engine = EngineLatency(config, PRESETS["sn40l"], routing, max_model_len=summary["kv_cache"]["max_model_len"],
                           vocab=vocab, schedule="auto")
    if steps is None:
        decode = np.where(iterations["prefill_tokens"].to_numpy() == 0, iterations["sequences"].to_numpy(), 0)
        steps = sorted({0, int(np.argmax(decode)), int(np.argmax(iterations["tokens"].to_numpy()))})
    rows = iterations.to_pylist()
    for i, batch in enumerate(recorded.batches[: max(steps) + 1]):
        if i not in steps:
            if routing is not None:
                routing.route(sum(batch.new_tokens))  # the exact provider's draws, step by step
            continue
        cost = engine(batch)
        assert cost.cycles == {k: rows[i][f"cycles_{k}"] for k in MAPPED_CYCLES}, i
        assert cost.seconds == rows[i]["duration_s"], i
        assert cost.work == {k: rows[i][k] for k in cost.work}, i
    return list(steps)


def test_a_stored_mapped_run_is_todays_mapped_exact_run(tmp_path):
    trace = requests_file(tmp_path / "t.parquet", [0.0, 0.0005, 0.001, 0.02], [40, 300, 7, 90], [6, 3, 9, 4])
    stored = read_outputs(DATA / "qwen_tiny_mapped_exact")
    model = str(DATA / "qwen3-tiny-2layers.json")
    assert stored[2]["iterations"] == 22
    assert check_stored_mapped_run(stored, model, trace, 1000, steps=range(22)) == list(range(22))
    assert check_stored_mapped_run(stored, model, trace, 1000) == [0, 1, 6]


def test_the_check_finds_a_changed_step(tmp_path):
    """One stored step's FFN cycles off by one: the check fails on that step (it compares, it does not trust)."""
    import pyarrow as pa

    trace = requests_file(tmp_path / "t.parquet", [0.0, 0.0005, 0.001, 0.02], [40, 300, 7, 90], [6, 3, 9, 4])
    requests, iterations, summary = read_outputs(DATA / "qwen_tiny_mapped_exact")
    ffn = iterations["cycles_ffn"].to_pylist()
    ffn[3] += 1
    changed = iterations.set_column(iterations.column_names.index("cycles_ffn"), "cycles_ffn", pa.array(ffn))
    model = str(DATA / "qwen3-tiny-2layers.json")
    try:
        check_stored_mapped_run((requests, changed, summary), model, trace, 1000, steps=[3])
    except AssertionError as exc:
        assert str(exc).startswith("3")
    else:
        raise AssertionError("a changed step passed the check")
