"""``shared_kv``: one cache whose rows are the keys and the values (the decode and prefill attention builders), as
serving prices multi-head latent attention's absorbed form (stepsim/serve/layer_list.py): the latent row is read
once a step, not as a key and a value copy. Each case checks the values (the NumPy reference with the keys as the
values), the exact bytes (the symbolic metric equal to the engine's), and that sharing changes the traffic only."""

from __future__ import annotations

import numpy as np
import pytest

from stepsim.mapping.kinds.decode import build_decode
from stepsim.mapping.kinds.prefill import build_prefill, prefill_bound, prefill_data
from stepsim.mapping.units import assign_compute_units
from stepsim.models.layers import layer_groups
from stepsim.models.presets import resolve_model
from stepsim.serve.api import resolve_serving_hardware
from stepsim.serve.layer_list import group_model
from stepsim.serve.layers import piece_dims
from stepsim.simulation.simulate import simulate
from stepsim.workloads.attention.build import build_attention
from stepsim.workloads.prefill_attention.build import build_prefill_attention
from stepsim.workloads.reference import check_outputs, make_inputs

#: 5 requests; KV tiles of 32 rows: ceil((L + 1) / 32) = 4, 3, 2, 5, 1 (15 in all)
KV = np.array([100, 70, 33, 150, 5])
D, G = 48, 4


def _run(w):
    r = simulate(w, functional=True, inputs=make_inputs(w, seed=1))
    checks = check_outputs(w, r.inputs, r.outputs)
    assert all(c.passed for c in checks.values()), checks
    assert r.off_chip_bytes_read + r.off_chip_bytes_written == w.metrics()["off_chip_bytes"]
    return r, checks


@pytest.mark.parametrize("strategy, cycles", [("dynamic", (618, 618)), ("interleave", (564, 563)),
                                              ("coarse", (1828, 1828))])
def test_a_decode_with_shared_kv_reads_one_cache_and_attends_with_its_keys_as_values(strategy, cycles):
    regions = 5 if strategy == "interleave" else 4
    runs = {}
    for shared in (False, True):
        w = build_attention(KV, strategy, head_dim=D, query_per_kv_head=G, regions=regions, softmax="stable",
                            shared_kv=shared)
        runs[shared] = _run(w)
        assert w.params.get("shared_kv", False) is shared  # said only when set
    (separate, c_sep), (shared, c_sh) = runs[False], runs[True]
    assert set(c_sep) == {"out", "k_cache", "v_cache"} and set(c_sh) == {"out", "k_cache"}
    assert "v_cache" not in shared.inputs and "v_cache" in separate.inputs
    q, new_row, tiles, written_tiles = 5 * G * D * 2, 5 * D * 2, 15 * 32 * D * 2, 5 * 32 * D * 2
    assert (shared.off_chip_bytes_read, shared.off_chip_bytes_written) == (q + new_row + tiles, q + written_tiles)
    assert (separate.off_chip_bytes_read, separate.off_chip_bytes_written) == (
        q + 2 * (new_row + tiles), q + 2 * written_tiles)
    assert (separate.cycles, shared.cycles) == cycles


def test_a_prefill_with_shared_kv_reads_one_cache_and_keeps_its_cycles():
    """Query tiles 0-2, 1 and 3-4 of three requests: 17 KV tiles. The shared tiles wait as values in a FIFO of
    SHARED_KV_FIFO_DEPTH while their scores are computed, so the cycles stay those of separate loads (within 15)."""
    cached, chunk = [0, 40, 100], [70, 1, 30]
    for regions, cycles in ((1, (5256, 5241)), (3, (3038, 3031))):
        got = {}
        for shared in (False, True):
            w = build_prefill_attention(cached, chunk, head_dim=D, query_per_kv_head=G, regions=regions,
                                        shared_kv=shared)
            got[shared] = _run(w)[0]
        q, masks, tiles = 6 * G * 32 * D * 2, regions * G * 32 * 32 * 2, 17 * 32 * D * 2
        assert got[True].off_chip_bytes_read == q + masks + tiles
        assert got[False].off_chip_bytes_read == q + masks + 2 * tiles
        assert (got[False].cycles, got[True].cycles) == cycles


def test_the_prefill_bound_stays_below_a_shared_caches_cycles():
    """The mapper's prefill bound counts one cache's tiles with shared_kv (two would over-bound and prune wrongly)."""
    hw = resolve_serving_hardware("sn40l")
    dims = {"head_dim": 576, "query_per_kv_head": 16, "kv_heads": 1, "shared_kv": True}
    data = prefill_data(256, dims)
    for regions in (1, 2, 8):
        knobs = {"regions": regions}
        w = build_prefill(data, dims, knobs)
        assign_compute_units(w, hw)
        cycles = simulate(w, hw).cycles
        bound = prefill_bound(knobs, data, dims, hw)
        assert 0 < bound <= cycles, (regions, bound, cycles)


def test_an_mla_groups_decode_piece_reads_the_latent_cache_once():
    """DeepSeek-V3's MLA group is served as multi-query attention over its 576-wide latent row (serve.layer_list):
    the mapped decode piece reads each request's latent tiles once (the metric and the engine agree), half of what
    a key and a value copy read."""
    ds = resolve_model("deepseek-v3")
    kind, layers = layer_groups(ds)[0]
    model = group_model(ds, kind, layers)
    dims = piece_dims("decode", model)
    assert dims == {"head_dim": 576, "query_per_kv_head": 128, "shared_kv": True}
    assert "shared_kv" not in piece_dims("decode", resolve_model("qwen3-30b-a3b"))
    w = build_decode(KV, dims, {"regions": 4})
    tiles = 15 * 32 * 576 * 2
    metrics = w.metrics()
    assert metrics["off_chip_bytes"] == simulate(w).off_chip_bytes_read + simulate(w).off_chip_bytes_written
    q, new_row, written = 5 * 128 * 576 * 2, 5 * 576 * 2, 5 * 32 * 576 * 2
    assert metrics["off_chip_bytes"] == q + new_row + tiles + q + written
    separate = build_decode(KV, {k: v for k, v in dims.items() if k != "shared_kv"}, {"regions": 4})
    assert separate.metrics()["off_chip_bytes"] - metrics["off_chip_bytes"] == tiles + new_row + written
