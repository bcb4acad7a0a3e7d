"""``stepsim optimize`` over a stack of layers: the micro-batch axis (stepsim/optimize/stack.py).

The counts searched (divisors of the batch up to the bound, what the stack builds), the default spaces that gain
them, and the pruned search over pp x micro_batches on a 2-layer MoE stack: its front equals the exhaustive
front, every candidate's cycle bound is pinned and holds on its run, and the JSON and Parquet outputs record
``micro_batches`` per candidate (read back).
"""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest
from small_routing import write_small_routing

from stepsim.optimize import optimize
from stepsim.optimize.chips import parallel_grids
from stepsim.optimize.output import run_command
from stepsim.optimize.stack import MAX_MICRO_BATCHES, micro_batch_counts, micro_batch_grids, stack_space

#: the small MoE layer of test_optimize_parallel_axes.py: 8 experts, top-2, 24 tokens
SMALL = {"model": "custom", "hidden": 512, "intermediate": 512, "experts": 8, "top_k": 2}
DYNAMIC = {"tiling": ("dynamic",), "tile_f": (64, 128)}
STATIC = {"tiling": ("static",), "tile_n": (4, 8), "tile_f": (128,)}


@pytest.fixture
def trace(tmp_path):
    return write_small_routing(tmp_path)[0]


def test_counts_are_divisors_of_the_batch_up_to_the_bound():
    assert MAX_MICRO_BATCHES == 8
    assert micro_batch_counts(24) == [2, 3, 4, 6, 8]
    assert micro_batch_counts(64) == [2, 4, 8]
    assert micro_batch_counts(7) == [7] and micro_batch_counts(5, bound=4) == []
    assert micro_batch_counts(24, bound=4) == [2, 3, 4]


def test_a_stack_grid_gains_the_counts_it_builds():
    """Both tilings gain every count; with shared experts only the tile_n values that split a micro-batch (B / M a
    multiple of tile_n; dynamic tiling's shared tile is 32 tokens); one layer is no stack."""
    assert micro_batch_grids([DYNAMIC, STATIC], workload="moe", batch=24, layers=2) == [
        DYNAMIC, {**DYNAMIC, "micro_batches": (2, 3, 4, 6, 8)}, STATIC, {**STATIC, "micro_batches": (2, 3, 4, 6, 8)}]
    # 24 / M rows: 12 (tile_n 4), 8 (4, 8), 6 (none), 4 (4), 3 (none); never a multiple of 32 (dynamic)
    assert micro_batch_grids([DYNAMIC, STATIC], workload="moe", batch=24, layers=2, shared=64) == [
        DYNAMIC, STATIC, {**STATIC, "tile_n": (4,), "micro_batches": (2,)}, {**STATIC, "micro_batches": (3,)},
        {**STATIC, "tile_n": (4,), "micro_batches": (6,)}]
    assert micro_batch_grids([DYNAMIC], workload="moe", batch=128, layers=2, shared=64) == [
        DYNAMIC, {**DYNAMIC, "micro_batches": (2, 4)}]
    assert micro_batch_grids([DYNAMIC, STATIC], workload="decoder", batch=24, layers=2) == [
        DYNAMIC, {**DYNAMIC, "micro_batches": (2, 3, 4, 6, 8)}, STATIC, {**STATIC, "micro_batches": (2, 3, 4, 6, 8)}]
    # no tiling axis: the kind's default (static); no tile_n axis: the default tile of 32 tokens
    assert micro_batch_grids([{"tile_f": (64,)}], workload="moe", batch=64, layers=4, shared=64) == [
        {"tile_f": (64,)}, {"tile_f": (64,), "micro_batches": (2,)}]
    assert micro_batch_grids([STATIC], workload="moe", batch=24, layers=1) == [STATIC]
    assert stack_space([STATIC, {**STATIC, "regions": (4,)}], workload="moe", batch=24, layers=2, shared=64) == \
        micro_batch_grids([STATIC], workload="moe", batch=24, layers=2, shared=64)
    assert stack_space([STATIC, {**STATIC, "regions": (4,)}], workload="moe", batch=24, layers=1) == [
        STATIC, {**STATIC, "regions": (4,)}]
    # the decoder: a micro-batch of at most 32 requests or a multiple of 32 (the projection tile)
    assert micro_batch_grids([{"tile_f": (32,)}], workload="decoder", batch=96, layers=2) == [
        {"tile_f": (32,)}, {"tile_f": (32,), "micro_batches": (3, 4, 6, 8)}]


def test_the_default_space_of_a_stack_searches_micro_batches(trace):
    """The default MoE space of a 2-layer stack: the grids without time-multiplexed regions (a stack refuses
    them), each followed by its micro-batched copy; a given --micro-batches fixes the count (no axis)."""
    from stepsim.optimize import _default_stages
    from stepsim.workloads.config import normalize_config

    one = _default_stages(normalize_config({"workload": "moe", "trace": trace, **SMALL, "mode": "metrics"}))[0][1]
    stack = _default_stages(normalize_config({"workload": "moe", "trace": trace, **SMALL, "layers": 2,
                                              "mode": "metrics"}))[0][1]
    expected = []
    for grid in one:
        if "regions" not in grid:
            expected += [grid, {**grid, "micro_batches": (2, 3, 4, 6, 8)}]
    assert stack == expected and any("regions" in grid for grid in one)
    fixed = _default_stages(normalize_config({"workload": "moe", "trace": trace, **SMALL, "layers": 2,
                                              "micro_batches": 2, "mode": "metrics"}))[0][1]
    assert fixed == one


def test_pruned_search_over_pp_and_micro_batches_equals_exhaustive(trace, tmp_path, serial, exhaustive_front):
    """A 2-layer stack under a 2-chip budget, static tiles of 8 tokens or dynamic tiles: one chip or two stages,
    each with M = 1 .. 4 micro-batches. Static micro-batches on one chip only add bytes (each re-reads the weights
    of the experts its tokens visit) and are pruned by their bounds; on two stages M = 2 overlaps them enough to
    beat one chip. Dynamic micro-batches keep a place on the front by their on-chip bytes (smaller tiles)."""
    static = {"tiling": ("static",), "tile_n": (8,), "tile_f": (128,)}
    dynamic = {"tiling": ("dynamic",), "tile_f": (128,)}
    grids = micro_batch_grids(parallel_grids([static, dynamic], 2, axes=("tp", "ep", "pp"), experts=8,
                                             widths=(512,), batch=24, layers=2),
                              workload="moe", batch=24, layers=2, bound=4)
    assert grids == [static, {**static, "micro_batches": (2, 3, 4)}, dynamic, {**dynamic, "micro_batches": (2, 3, 4)},
                     {**static, "pp": (2,)}, {**static, "pp": (2,), "micro_batches": (2, 3, 4)},
                     {**dynamic, "pp": (2,)}, {**dynamic, "pp": (2,), "micro_batches": (2, 3, 4)}]
    out = tmp_path / "opt"
    r = optimize("moe", out=out, executor=serial, max_chips=2, space=grids, trace=trace, layers=2, **SMALL)
    front, cycles = exhaustive_front(r)
    assert sorted((c.run_id, *c.objectives) for c in r.front) == front
    # (tiling, pp, M, status, cycle bound, cycles, on-chip bytes, off-chip bytes): off-chip bytes and the bound grow
    # with M (module docstring of stepsim/optimize/stack.py); every bound holds
    assert [(c.config["tiling"], c.config.get("pp"), c.config.get("micro_batches"), c.status, c.lower_bound,
             cycles[c.run_id], c.on_chip_bytes, c.off_chip_bytes) for c in r.candidate_list] == [
        ("static", None, None, "simulated", 29720, 50334, 7085060, 28385472),
        ("static", None, 2, "pruned", 51222, 54416, 7347204, 50405568),
        ("static", None, 3, "pruned", 72726, 75638, 7609348, 72425664),
        ("static", None, 4, "pruned", 88086, 90829, 7871492, 88154304),
        ("dynamic", None, None, "simulated", 26648, 35282, 6888452, 25239744),
        ("dynamic", None, 2, "simulated", 51222, 54378, 6732804, 50405568),
        ("dynamic", None, 3, "simulated", 72726, 75588, 6691844, 72425664),
        ("dynamic", None, 4, "simulated", 88086, 91022, 6650884, 88154304),
        ("static", 2, None, "simulated", 21324, 50849, 7085060, 28385472),
        ("static", 2, 2, "simulated", 26646, 49656, 7347204, 50405568),
        ("static", 2, 3, "simulated", 37398, 60207, 7609348, 72425664),
        ("static", 2, 4, "simulated", 45078, 67900, 7871492, 88154304),
        ("dynamic", 2, None, "simulated", 15172, 35797, 6888452, 25239744),
        ("dynamic", 2, 2, "simulated", 26646, 49745, 6732804, 50405568),
        ("dynamic", 2, 3, "simulated", 37398, 60030, 6691844, 72425664),
        ("dynamic", 2, 4, "simulated", 45078, 67898, 6650884, 88154304)]
    assert [(c.cycles, c.chips, c.config["tiling"], c.config.get("pp"), c.config.get("micro_batches"))
            for c in r.front] == [
        (35282, 1, "dynamic", None, None), (49656, 2, "static", 2, 2), (49745, 2, "dynamic", 2, 2),
        (50334, 1, "static", None, None), (54378, 1, "dynamic", None, 2), (60030, 2, "dynamic", 2, 3),
        (67898, 2, "dynamic", 2, 4), (75588, 1, "dynamic", None, 3), (91022, 1, "dynamic", None, 4)]
    # JSON: every front point and the recommendation name their micro-batch count (1: unset)
    doc = json.loads((out / "optimize.json").read_text())
    assert [(p["pp"], p["micro_batches"], p["chips"]) for p in doc["pareto"]] == [
        (1, 1, 1), (2, 2, 2), (2, 2, 2), (1, 1, 1), (1, 2, 1), (2, 3, 2), (2, 4, 2), (1, 3, 1), (1, 4, 1)]
    assert (doc["recommended"]["micro_batches"], doc["recommended"]["cycles"]) == (1, 35282)
    by_m = {p["micro_batches"]: p for p in doc["pareto"] if p["pp"] == 2 and p["config"]["tiling"] == "static"}
    assert list(by_m) == [2] and by_m[2]["cycles"] == 49656
    assert run_command(r.front[1].config).endswith("--layers 2 --pp 2 --micro-batches 2")
    # Parquet: a micro_batches column for every candidate (null: unset), read back
    table = pq.read_table(out / "candidates.parquet")
    assert table.column("micro_batches").to_pylist() == [None, 2, 3, 4] * 4
    assert pq.read_table(out / "pareto.parquet").column("micro_batches").to_pylist() == [None, 2, 2, None, 2, 3, 4,
                                                                                          3, 4]


def test_the_decoder_stack_searches_micro_batches_in_its_ffn_stage(tmp_path):
    """A 2-layer decoder stack of 16 requests: stage 1 (the attention strategies) unchanged, every FFN grid without
    regions followed by its copy with M = 2, 4, 8 (a micro-batch of 8, 4 or 2 requests, within one projection
    tile)."""
    import numpy as np

    from stepsim.optimize import _default_stages
    from stepsim.workloads.config import normalize_config

    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "qwen3_moe", "hidden_size": 64, "intermediate_size": 128, "moe_intermediate_size": 64,
        "num_experts": 8, "num_experts_per_tok": 2, "num_attention_heads": 8, "num_key_value_heads": 2,
        "head_dim": 16, "num_hidden_layers": 2}))
    np.save(tmp_path / "kv.npy", np.arange(1, 17))
    base = {"workload": "decoder", "model": str(tmp_path / "config.json"), "kv_lengths": str(tmp_path / "kv.npy"),
            "mode": "metrics"}
    one = _default_stages(normalize_config(base))
    stack = _default_stages(normalize_config({**base, "layers": 2}))
    assert stack[0] == one[0] and len(stack) == 2
    expected = []
    for grid in one[1][1]:
        if "regions" not in grid:
            expected += [grid, {**grid, "micro_batches": (2, 4, 8)}]
    assert stack[1][1] == expected and any("regions" in grid for grid in one[1][1])
