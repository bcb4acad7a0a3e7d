"""MLA prefill in the expanded form (stepsim/workloads/mla_prefill, issue 43): the latent cache expanded into per-head
keys and values once per request, a barrier, then causal attention over them. Checked against the graph's data path
(expanded caches included), DeepSeek-V3's naive formula and the absorbed form position by position, with exact
bytes and FLOPs; the barrier is what keeps the attention from reading the caches before they are written."""

from __future__ import annotations

import numpy as np
import pytest

import stepsim.workloads.mla_prefill.build as mla_prefill
from stepsim.base.errors import ArgumentError, ConfigError
from stepsim.simulation.simulate import simulate
from stepsim.workloads.mla_attention.reference import mla_absorbed, wkv_b
from stepsim.workloads.mla_prefill.build import build_mla_prefill, from_config
from stepsim.workloads.mla_prefill.reference import mla_prefill_expanded
from stepsim.workloads.prefill_attention.build import query_tiles
from stepsim.workloads.reference import check_outputs, make_inputs

#: three requests (0, 20 and 5 cached rows; chunks of 30, 1 and 40 tokens) in 16-row tiles: 2, 2 and 3 KV tiles
#: (7), query tiles 0-1, 1 and 0-2 (6), each head attending to 1 + 2, 2 and 1 + 2 + 3 KV tiles (11)
CACHED, CHUNK = [0, 20, 5], [30, 1, 40]
DIMS = dict(heads=4, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, tile_n=16)


def _run(w):
    r = simulate(w, functional=True, inputs=make_inputs(w, seed=1))
    return r, check_outputs(w, r.inputs, r.outputs)


def test_the_expanded_prefill_against_its_data_path_with_exact_bytes_and_flops():
    w = build_mla_prefill(CACHED, CHUNK, **DIMS)
    p = w.params
    assert (p["kv_tiles"], p["query_tiles"], p["attended_tiles"], p["max_n"]) == (7, 6, 44, 48)
    r, checks = _run(w)
    assert {k: c.passed for k, c in checks.items()} == {"out": True, "k_exp": True, "v_exp": True}
    t, h, r_, dn, dr, dv = 16, 4, 32, 16, 8, 16
    expansion_read = 7 * t * r_ * 2 + 2 * h * dn * r_ * 2  # the latent tiles once, W_UK and W_UV once
    queries = 24 * t * (dn + dr) * 2  # 6 query tiles x 4 heads
    attention_read = 44 * t * (dn + dv + dr) * 2 + t * t * 2  # k, v and the rope keys per tile attended; the mask
    written = 7 * h * t * (dn + dv) * 2 + 24 * t * dv * 2  # the expanded caches, the output
    assert (r.off_chip_bytes_read, r.off_chip_bytes_written) == (expansion_read + queries + attention_read, written)
    assert w.metrics()["off_chip_bytes"] == expansion_read + queries + attention_read + written == 131_584
    # the expansion 2 t r (dn + dv) per KV tile and head; per tile attended the score products, their sum and the
    # online softmax; per (query tile, head) the diagonal mask and the normalization
    per_tile = 2 * t * t * (dn + dr) + t * t + 2 * t * t * dv + 8 * t * t + 2 * t * dv + 6 * t
    flops = 7 * h * 2 * t * r_ * (dn + dv) + 44 * per_tile + 24 * (t * t + t * dv)
    assert w.metrics()["flops"] == w.algorithmic_flops == flops == 1_959_040
    assert r.cycles == simulate(w).cycles == 2100


def test_the_chunks_rows_are_deepseeks_expanded_formula_and_the_absorbed_form():
    """Every chunk position of every request and head, from the engine's ``out``: DeepSeek-V3's naive form
    (expanded keys and values, float64) and its absorbed form (the decode's, one query at a time over the rows up to
    it) agree with it to bf16 storage."""
    w = build_mla_prefill(CACHED, CHUNK, **DIMS)
    r, _ = _run(w)
    x = {k: np.asarray(v, np.float64) for k, v in r.inputs.items()}
    out = np.asarray(r.outputs["out"], np.float64).reshape(-1, 4, 16, 16)  # [query tile, head, position, dv]
    w_uk, w_uv = x["w_uk"].reshape(4, 16, 32), x["w_uv"].reshape(4, 16, 32)
    q_nope, q_pe = x["q_nope"].reshape(-1, 4, 16, 16), x["q_pe"].reshape(-1, 4, 16, 8)
    request, group = query_tiles(np.array(CACHED), np.array(CHUNK), 16)
    checked = 0
    for b, (cached, chunk) in enumerate(zip(CACHED, CHUNK)):
        n = cached + chunk
        kv, pe = x["kv_cache"][b * 48:b * 48 + n], x["pe_cache"][b * 48:b * 48 + n]
        for j in np.flatnonzero(request == b):
            positions = int(group[j]) * 16 + np.arange(16)
            keep = (positions >= cached) & (positions < n)  # the chunk's rows of this query tile
            got = out[j][:, keep]
            want = mla_prefill_expanded(q_nope[j][:, keep], q_pe[j][:, keep], kv, pe, w_uk, w_uv, positions[keep])
            assert np.abs(got - want).max() < 0.01, (b, j)
            for i, pos in enumerate(positions[keep]):
                absorbed = mla_absorbed(q_nope[j][:, keep][:, i], q_pe[j][:, keep][:, i], kv[:pos + 1],
                                        pe[:pos + 1], wkv_b(w_uk, w_uv), 16)
                assert np.abs(absorbed - want[:, i]).max() < 1e-9
                checked += 1
    assert checked == sum(CHUNK) == 71


def test_without_its_barrier_the_attention_reads_the_caches_before_they_are_written(monkeypatch):
    """The expanded caches start as noise (reference.inputs): with each request's first address not held for its
    expansion's last acknowledgements, the attention reads noise and its output fails the check, in fewer cycles."""
    monkeypatch.setattr(mla_prefill, "_released", lambda g, stream, first, barrier: stream)
    w = build_mla_prefill(CACHED, CHUNK, **DIMS)
    r, checks = _run(w)
    assert {k: c.passed for k, c in checks.items()} == {"out": False, "k_exp": True, "v_exp": True}
    assert r.cycles == 1591


def test_bad_inputs_are_one_line(tmp_path):
    with pytest.raises(ArgumentError, match=r"chunk\[1\] = 0 must be at least 1"):
        build_mla_prefill([0, 3], [4, 0], **DIMS)
    with pytest.raises(ArgumentError, match="one value per request"):
        build_mla_prefill([0, 3], [4], **DIMS)
    np.save(tmp_path / "kv.npy", np.array([5, 40]))
    with pytest.raises(ConfigError, match="no multi-head latent attention .* the mla_prefill workload needs an MLA"):
        from_config({"model": "qwen3-30b-a3b", "trace": str(tmp_path / "kv.npy"), "batch_id": 0, "tile_n": 16,
                     "tile_m": 8})
