"""The experts a step's tokens touch at the least, in stepsim plan's step floor (stepsim/plan/pricing.py
least_touched, StepFloor; stepsim/kernels/routing_windows.py): the fewest distinct experts of any window of the
routing pool, against a NumPy count of every window; the floor's decode term, a chord below those counts, stated.
Its soundness on served runs: tests/plan/test_plan.py (every step and every run at least its floor)."""

from __future__ import annotations

import json
from fractions import Fraction

import numpy as np
import pytest

from stepsim.kernels.routing_windows import least_distinct
from stepsim.mapping.roofline import StepWork
from stepsim.models.presets import resolve_model
from stepsim.plan.pricing import StepFloor, least_touched
from stepsim.serve.api import resolve_serving_hardware
from stepsim.serve.routing import SyntheticRouting

SMALL_MOE = {"model_type": "qwen3_moe", "hidden_size": 256, "intermediate_size": 512, "moe_intermediate_size": 128,
             "num_experts": 16, "num_experts_per_tok": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
             "head_dim": 32, "num_hidden_layers": 2, "vocab_size": 1000, "max_position_embeddings": 4096}


def _every_window(rows: np.ndarray, longest: int) -> list[int]:
    n = len(rows)
    return [0] + [min(len(set(rows[(s + np.arange(t)) % n].ravel().tolist())) for s in range(n))
                  for t in range(1, longest + 1)]


@pytest.mark.parametrize("seed", range(4))
def test_the_least_distinct_experts_of_a_window_are_every_windows_fewest(seed):
    rng = np.random.default_rng(seed)
    n, k, values = int(rng.integers(5, 60)), int(rng.integers(1, 4)), int(rng.integers(3, 12))
    rows = rng.integers(0, values, size=(n, k)).astype(np.int64)  # repeats in a row too: counted once
    out = np.zeros(n + 1, dtype=np.int64)
    counts = np.zeros(values, dtype=np.int64)
    least_distinct(rows, n, counts, out)
    assert out.tolist() == _every_window(rows, n)  # windows that wrap around the end included
    assert not counts.any()  # left zero for the next call


def test_a_synthetic_routings_least_touched_is_its_pools_for_every_layer(tmp_path):
    routing = SyntheticRouting(16, 2, 3, seed=0)
    touched = least_touched(routing, 3, 40)
    pool = routing._pool[0]
    short = np.ascontiguousarray(pool[:500])  # the NumPy count on a prefix of the pool: a window of the pool too
    assert (touched[:41] <= 3 * np.array(_every_window(short, 40))).all()
    assert touched[0] == 0 and touched[1] == 3 * 2  # a token's two experts are distinct
    assert (np.diff(touched) >= 0).all() and touched[40] <= 3 * 16
    # the pool as every provider of the shape draws it: a fresh routing of the same seed gives the same counts
    assert least_touched(SyntheticRouting(16, 2, 3, seed=0), 3, 40).tolist() == touched.tolist()
    assert least_touched(None, 3, 40) is None


def test_the_floors_decode_term_is_the_least_chord_below_the_counts(tmp_path):
    path = tmp_path / "small.json"
    path.write_text(json.dumps(SMALL_MOE))
    model, hw = resolve_model(str(path)), resolve_serving_hardware("sn40l")
    touched = np.array([0, 4, 6, 9, 10, 12, 13], dtype=np.int64)  # the least slope up to 5: (10 - 4) / 3 = 2
    floor = StepFloor(model, hw, 1, touched, max_seqs=5)
    work = StepWork(model, hw, 1000)
    expert = work.expert_bytes
    assert floor.decode_bytes == 2 * expert
    assert floor.terms == StepFloor(model, hw, 1).terms == [  # touched[1]: the layers' top_k, as without counts
        (work.fixed_bytes + 4 * expert, work.kv_bytes_per_token + work.embedding_bytes,
         work.flops_per_token + work.attention_flops, work.head_flops)]
    (step_bytes, token_bytes, token_flops, step_flops), = floor.terms
    # 3 steps of 20 tokens, 11 of them decode tokens: 8 beyond each step's first, 2 experts each
    hbm = 3 * step_bytes + 20 * token_bytes + Fraction(8 * 2 * expert) + 500 * work.kv_bytes_per_token
    flops = 20 * token_flops + 3 * step_flops + 500 * work.attention_flops
    assert floor(3, 20, 11, 500) == float(max(hbm / floor.peak_bytes, flops / floor.peak_flops) / hw.clock_hz)
    assert floor(3, 20, 3, 500) == floor(3, 20, 0, 500) < floor(3, 20, 4, 500)  # no decode token beyond the first
    with pytest.raises(ValueError, match=r"^touched covers 6 tokens, fewer than max_seqs 7$"):
        StepFloor(model, hw, 1, touched, max_seqs=7)
