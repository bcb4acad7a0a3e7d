"""The prefill attention kind: causal attention of prompt chunks against the KV cache, tiled; checked against
NumPy (the graph's tiled order and an independent one-shot causal softmax), with exact metrics and cycles."""

from __future__ import annotations

import math

import numpy as np
import pytest

from stepsim.base.errors import ArgumentError
from stepsim.simulation.simulate import simulate
from stepsim.workloads.config import workload_from_config
from stepsim.workloads.prefill_attention.build import build_prefill_attention, causal_mask, query_tiles
from stepsim.workloads.reference import check_outputs, make_inputs

CASE = dict(cached=[0, 40, 7], chunk=[50, 30, 1])
DIMS = dict(head_dim=16, query_per_kv_head=2, tile_n=16)


def _causal(q, k, v, positions, scale):
    """One-shot causal attention: query at position p over keys 0..p (float64)."""
    s = (q @ k.T) * scale
    s[np.arange(len(k))[None, :] > positions[:, None]] = -np.inf
    p = np.exp(s - s.max(axis=1, keepdims=True))
    return (p @ v) / p.sum(axis=1, keepdims=True)


def test_query_tiles_are_aligned_to_the_kv_tiles():
    request, group = query_tiles(np.array([0, 40, 7]), np.array([50, 30, 1]), 16)
    assert request.tolist() == [0, 0, 0, 0, 1, 1, 1, 2]
    assert group.tolist() == [0, 1, 2, 3, 2, 3, 4, 0]
    mask = causal_mask(2, 4)
    assert mask.shape == (8, 4) and (mask[:4] == mask[4:]).all()
    assert (mask[:4] == 0).tolist() == [[True, False, False, False], [True, True, False, False],
                                        [True, True, True, False], [True, True, True, True]]


@pytest.mark.parametrize("softmax, cycles, off_chip, flops", [
    ("stable", 935, 40960, 884032),
    ("plain", 935, 40960, 824832),
])
def test_functional_against_numpy_with_exact_metrics(softmax, cycles, off_chip, flops):
    w = build_prefill_attention(CASE["cached"], CASE["chunk"], softmax=softmax, **DIMS)
    # q: 8 query tiles x (32 x 16) bf16; K and V: 23 tiles of 16 x 16 each; mask once; out as q
    assert off_chip == 8 * 32 * 16 * 2 * 2 + 2 * 23 * 16 * 16 * 2 + 32 * 16 * 2
    m = w.metrics()
    assert (m["off_chip_bytes"], m["flops"], m["graph_flops"]) == (off_chip, flops, flops)
    r = simulate(w, functional=True, inputs=make_inputs(w, seed=1))
    assert r.cycles == cycles == simulate(w).cycles
    checks = check_outputs(w, r.inputs, r.outputs)
    assert checks["out"].passed and checks["out"].error < 0.003

    if softmax == "stable":  # the chunk's rows are causal attention, whatever the tiling
        out = np.asarray(r.outputs["out"], np.float64)
        q, kc, vc = (np.asarray(r.inputs[n], np.float64) for n in ("q", "k_cache", "v_cache"))
        request, group = query_tiles(np.array(CASE["cached"]), np.array(CASE["chunk"]), 16)
        max_n = w.params["max_n"]
        checked = 0
        for tile, (b, g) in enumerate(zip(request, group)):
            total = CASE["cached"][b] + CASE["chunk"][b]
            for h in range(2):
                for i in range(16):
                    pos = g * 16 + i
                    if not CASE["cached"][b] <= pos < total:
                        continue  # padding rows of an aligned tile
                    row = tile * 32 + h * 16 + i
                    keys = kc[b * max_n:b * max_n + total]
                    vals = vc[b * max_n:b * max_n + total]
                    want = _causal(q[row:row + 1], keys, vals, np.array([pos]), 1 / math.sqrt(16))
                    assert np.abs(out[row] - want[0]).max() <= 0.02 * np.abs(want).max()
                    checked += 1
        assert checked == 2 * sum(CASE["chunk"]) == 162


def test_from_config_reads_a_kv_batch_and_the_model(tmp_path):
    np.save(tmp_path / "kv.npy", np.array([300, 64, 1]))
    w = workload_from_config({"workload": "prefill_attention", "trace": str(tmp_path / "kv.npy")})
    # qwen3-30b-a3b: head_dim 128, 32 query heads over 4 KV heads; chunks of min(128, L) tokens
    assert w.trace["cached"].tolist() == [172, 0, 0] and w.trace["chunk"].tolist() == [128, 64, 1]
    assert (w.params["head_dim"], w.params["query_per_kv_head"], w.params["tile_n"]) == (128, 8, 32)
    assert (w.params["query_tiles"], w.params["kv_tiles"]) == (5 + 2 + 1, (6 + 7 + 8 + 9 + 10) + (1 + 2) + 1)


@pytest.mark.parametrize("kwargs, message", [
    (dict(cached=[0], chunk=[0]), "chunk[0] = 0 must be at least 1"),
    (dict(cached=[-1], chunk=[3]), "cached[0] = -1 must be at least 0"),
    (dict(cached=[0, 1], chunk=[3]), "cached and chunk must give one value per request, got 2 and 1"),
    (dict(cached=[0], chunk=[40], max_n=32), "max_n must be a multiple of tile_n=16 holding the longest request "
                                             "(40 tokens, 48 rows), got 32"),
    (dict(cached=[0], chunk=[4], softmax="exact"), "softmax must be one of 'plain', 'stable'; got 'exact'"),
])
def test_bad_arguments_are_one_line(kwargs, message):
    with pytest.raises(ArgumentError) as e:
        build_prefill_attention(**{"head_dim": 16, "tile_n": 16, **kwargs})
    assert str(e.value) == message
