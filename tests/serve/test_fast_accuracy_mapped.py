"""Issue 41's target for ``--fidelity fast`` on mapped layers (``--schedule auto``, serve's default on ``sn40l``):
on requests 200-399 of the Azure conversation trace with the 4-layer Qwen3-30B-A3B shape
(``examples/qwen3-30b-a3b-4layers.json``, seed 0), TTFT and TPOT p50 and p99 within 2 % of ``--fidelity exact`` and
the per-step error within 5 % at p95.

Measured 2026-11-26 (bench/README.md, "Issue 41's fast-vs-exact target on mapped layers, sixth attempt"), since the
FFN estimate goes through its bucket's bottom as well as its top (:func:`stepsim.serve.fast_mapped.bucket_estimate`):
fast calibrating from scratch against the stored exact run (bench/test_bench_fast_mapped_target.py, which asserts the
targets) gives TTFT p50 / p99 +0.54 / +0.19 %, TPOT p50 / p99 +0.02 / +1.09 % and a held-out step error of p50
1.02 %, p95 2.16 %, max 3.01 % (12 steps): **every target met**.
Before (the fifth attempt, the top scaled by load): TTFT p50 / p99 -0.94 / -2.16 % (p99 missed 2 % by 0.16
points), TPOT +0.11 / +1.04 %, held-out p95 2.49 %; the decode steps' error p95 over the 830 steps fast and exact
shared was 5.54 %, fast's FFN pieces of 3-5 tokens erring by up to 18 %. The fourth attempt (on ``gcd(knob, query
tiles)`` regions): TTFT p50 / p99 +1.64 / -0.97 %, held-out p95 5.25 %; before the prefill regressors saw the
regions (the third): TTFT p99 -66.93 %. The exact run (3,587 s on two workers at load 4) is stored
(``data/qwen_mapped_conv400_exact``) and checked against today's scheduler, mapper and engine
(:func:`test_stored_mapped_run.check_stored_mapped_run`); fast's own run is not a suite test (5-10 minutes
calibrating). Pinned here are the engine facts behind both: the prefill attention runs on ``min(knob, query
tiles)`` regions, which its regressors hold; the FFN's cycles follow its expert tiles, and the FFN *estimate*
(:func:`stepsim.serve.fast_mapped.ffn_regressors`) against the engine at a few token counts.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from serve_requests import azure_window
from test_stored_mapped_run import check_stored_mapped_run

from stepsim.base.hardware import PRESETS
from stepsim.models.presets import resolve_model
from stepsim.serve.exact import max_kv_rows
from stepsim.serve.fast_mapped import ffn_regressors, prefill_reference, prefill_regressors
from stepsim.serve.layers import LayerRunner, LayerSpec
from stepsim.serve.output import read_outputs
from stepsim.serve.routing import SyntheticRouting

MODEL = Path(__file__).resolve().parents[2] / "examples" / "qwen3-30b-a3b-4layers.json"
#: Qwen3's vocabulary (the LM head prices every step)
VOCAB = 151936
#: tokens -> (engine cycles, estimate, expert tiles, busiest region's tiles), measured 2026-11-26
PINNED = {8: (195298, 255140, 31, 10), 16: (302929, 373817, 49, 14), 48: (512455, 695335, 66, 4),
          64: (459909, 695335, 65, 4)}


def test_the_mapped_ffn_estimate_against_the_engine():
    """Layer 0 of the exact provider's routing draws of 1, 2, .., 64 tokens (drawn in that order, as a run would):
    engine cycles, the estimate, expert tiles and the busiest region's tiles. The estimate
    (:func:`stepsim.serve.fast_mapped.bucket_estimate`) is at least its bucket's line in tokens through the top (the
    mapper's cycles on Zipf routings) and the bottom: 8 and 16 tokens are their buckets' tops, and the run's routing
    is lighter than the Zipf draws there (the engine 23-31 % below the estimate; the top scaled by load alone was
    within 2 %, and the fit still has it: the tile estimate column), 48 and 64 tokens (bucket 64: 32 regions of 4
    experts, tile_n 64) 36 and 51 % over, as with the top scaled by load (the busiest region's ratio), while the
    cycles stay at 6,200-7,800 a tile throughout (HBM-bound: an expert's weights read once a tile). With the two
    points fast meets issue 41's targets on this shape (module docstring), which it missed with the top scaled."""
    model = resolve_model(str(MODEL))
    spec = LayerSpec(model, PRESETS["sn40l"], max_kv_rows(40960), schedule="auto")
    runner = LayerRunner(spec)
    routing = SyntheticRouting(model.experts, model.top_k, model.layers, seed=0)
    got = {}
    for tokens in (1, 2, 3, 5, 8, 12, 16, 24, 32, 48, 64):
        rows = np.ascontiguousarray(routing.route(tokens)[:, 0, :])
        if tokens in (8, 16, 48, 64):
            x = ffn_regressors(rows[:, None, :], spec)[0]
            got[tokens] = (runner.cycles("ffn", rows), round(float(x[7])), int(x[2]), int(x[5]))
    assert got == PINNED
    ratio = {t: round(est / cycles, 3) for t, (cycles, est, _, _) in got.items()}
    assert ratio == {8: 1.306, 16: 1.234, 48: 1.357, 64: 1.512}


def test_the_prefill_regressors_see_the_regions_a_chunk_is_built_with():
    """The mapped prefill attention has ``min(knob, query tiles)`` regions: the 1,028-token prompt of the stored
    run's first step (every KV head: 132 query tiles, bucket 2,048 mapped with 128 regions) runs on 128, at 53,772
    cycles a layer, where 1,024 tokens take 48,521 (measured 2026-11-26 on the engine: 2,000 tokens 174,753; 2,026
    after 2,048 cached 531,226). The regressors hold the busiest region's KV tiles (37 of 2,244) and the estimate,
    the bucket's cycles scaled by the larger of the busiest region's and every region's KV tiles against the
    representative data's: 47,724 (0.89x), 48,521, 160,020 (0.92x), 490,220 (0.92x). With ``gcd(knob, query
    tiles)`` regions (until 2026-11-26) the first prompt ran on 4 at 654,057 cycles a layer, and the paper
    regressors alone had fast price it at 88,486 (TTFT p99 -66.9 % against exact). The stored run, recorded again
    on the uneven shares, has the step at 4 x 53,772 (every layer's attention)."""
    model = resolve_model(str(MODEL))
    spec = LayerSpec(model, PRESETS["sn40l"], max_kv_rows(40960), schedule="auto")
    heads = model.kv_heads
    assert prefill_reference(1056, spec) == (165100.0, 128, 128, 8320)
    x = {(c, n): [round(v) for v in prefill_regressors(np.full(heads, c), np.full(heads, n), spec)]
         for c, n in ((0, 1024), (0, 1028), (0, 2000), (2048, 2026))}
    # a chunk after cached tokens repeats KV tiles, busiest region and estimate in its own columns (after a 1)
    assert x == {(0, 1024): [1, 128, 2112, 32, 0, 0, 0, 0, 48521], (0, 1028): [1, 132, 2244, 37, 0, 0, 0, 0, 47724],
                 (0, 2000): [1, 252, 8064, 124, 0, 0, 0, 0, 160020],
                 (2048, 2026): [1, 256, 24704, 256, 1, 24704, 256, 490220, 490220]}
    first = read_outputs(STORED)[1].slice(0, 1).to_pylist()[0]
    assert (first["prefill_tokens"], first["sequences"], first["cycles_attention"]) == (1028, 1, 4 * 53772)


#: the stored exact run of the window (``stepsim serve --fidelity exact --schedule auto --jobs 2``, bench/README.md)
STORED = Path(__file__).resolve().parent / "data" / "qwen_mapped_conv400_exact"
#: its steps, and the steps check_stored_mapped_run prices again (the first, the decode-only step with the most
#: sequences, the first with the most tokens)
STORED_STEPS, CHECKED = 37327, [0, 3046, 3161]


@pytest.mark.traces
def test_the_stored_mapped_run_is_todays_mapped_exact_run(conv_csv, tmp_path):
    """Replayed with its step durations, the stored run gives its requests back; three of its steps priced again by
    the mapped exact provider give their cycles (``hidden`` included), work columns and durations."""
    stored = read_outputs(STORED)
    assert stored[2]["requests"] == stored[2]["completed"] == 200 and stored[2]["iterations"] == STORED_STEPS
    window = azure_window(conv_csv, 200, 200, tmp_path / "conv400.csv")
    assert check_stored_mapped_run(stored, str(MODEL), window, VOCAB) == CHECKED
