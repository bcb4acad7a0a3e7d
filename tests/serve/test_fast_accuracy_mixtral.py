"""Issue 32's accuracy target for ``--fidelity fast`` on the Mixtral-8x7B preset with 4 layers
(``data/mixtral-8x7b-4layers.json``: 8 large experts, top-2), sn40l, seed 0, the first 30 requests of the Azure
conversation trace. Its exact run (190 s on two workers) is stored (``data/mixtral_conv30_exact``, as ``stepsim serve
--fidelity exact --jobs 2`` wrote it) and checked against today's scheduler and engine as ``test_fast_accuracy.py``
checks Qwen3's; fast (on its stored calibration, tests/calibration_seeding.py) is compared with it as ``test_fast_accuracy_models.py`` compares
the other presets (a file of its own: its calibration is the slowest of them, and the test runner spreads files
over its workers). The engine facts behind :func:`stepsim.serve.fast.expert_rounds` are pinned too.
"""

from __future__ import annotations

import numpy as np
import pytest
from calibration_seeding import check_seed_used, seeded_cache
from test_fast_accuracy_models import DATA, _compare, _model, check_stored_exact_run

import stepsim
from stepsim.base.hardware import PRESETS
from stepsim.models.presets import resolve_model
from stepsim.serve.exact import max_kv_rows
from stepsim.serve.fast import expert_rounds
from stepsim.serve.layers import LayerRunner, LayerSpec
from stepsim.serve.output import read_outputs

MIXTRAL_STORED = DATA / "mixtral_conv30_exact"
#: measured 2026-11-25 (calibration version 4), fast against the stored exact run: exact's and fast's steps,
#: TTFT / TPOT (%), held-out error (%), TTFT's parts (%)
#: TTFT p50 and the prompt's steps at p50 miss the 2 % target: a step of a few hundred prompt tokens varies by +-10 %
#: a layer with its routing (the least-loaded expert's tiles, expert_rounds) and 4 layers do not average it out; the
#: held-out error, on exact's own routing, is within 5 % (docs/serving.md §10.6)
MEASURED = (1102, 1109, {"ttft mean": -1.69, "ttft p50": -5.16, "ttft p99": 0.81, "tpot mean": -0.76, "tpot p50": -1.55,
                         "tpot p99": 1.97},
            {"iteration_p50": 0.4, "iteration_p95": 2.74, "iteration_max": 4.06},
            {"wait 50": -27.67, "wait 99": -2.92, "prefill 50": -6.32, "prefill 99": 0.85})


@pytest.fixture(scope="module")
def mixtral_stored():
    return read_outputs(MIXTRAL_STORED)


@pytest.mark.slow
@pytest.mark.traces
def test_the_stored_mixtral_run_is_todays_exact_run(mixtral_stored, conv_csv):
    """The stored run's schedule is the scheduler's and its cycles the engine's (check_stored_exact_run)."""
    assert check_stored_exact_run(mixtral_stored, "mixtral-8x7b", conv_csv, 30, 32000) == (6, 2048, 0, 431, 434)
    assert mixtral_stored[2]["iterations"] == 1102


@pytest.mark.slow
@pytest.mark.traces
def test_fast_against_the_stored_mixtral_run(mixtral_stored, conv_csv, tmp_path):
    requests, _, exact = mixtral_stored
    fast = stepsim.serve(_model("mixtral-8x7b"), conv_csv, limit_requests=30, fidelity="fast", schedule="paper",
                         calibration_cache=seeded_cache(tmp_path / "cache"))
    check_seed_used(tmp_path / "cache")
    got = (exact["iterations"], *_compare(requests, exact, fast))
    assert got == MEASURED


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
