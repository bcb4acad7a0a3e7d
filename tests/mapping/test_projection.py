"""The ``projection`` kind (stepsim/mapping/projection.py): its space, the lanes' stripes, its graph's traffic, and a
search whose pruned choice is the exhaustive enumeration's best with every bound below its engine cycles."""

from __future__ import annotations

from stepsim.base.hardware import PRESETS
from stepsim.mapping.projection import (
    build_projection,
    evaluate_projection,
    lane_tiles,
    projection_bound,
    projection_space,
)
from stepsim.mapping.schedule import Schedule

SN40L = PRESETS["sn40l"]


def test_the_space_is_token_tiles_by_column_tiles_by_power_of_two_lanes_and_k_splits():
    # 5 tokens: bucket 8, token tiles 1..8; d_out 96: 3 stripes of 32 (lanes 1, 2), 2 of 64 (the second
    # zero-padded; lanes 1, 2), 1 of 128; d_in 64 split 1, 2, 4, 8 or 16 ways (powers of two dividing it, at most 16)
    assert projection_space(5, 64, 96) == [{"tile_m": m, "tile_f": f, "lanes": lanes, "k_parts": k}
                                           for f, most in ((32, 2), (64, 2), (128, 1))
                                           for lanes in (1, 2)[:most] for k in (1, 2, 4, 8, 16)
                                           for m in (1, 2, 4, 8)]
    # 2,048 tokens: token tiles capped at 256, down to an eighth of it
    assert sorted({k["tile_m"] for k in projection_space(2048, 64, 128)}) == [32, 64, 128, 256]
    # d_in 40 splits 1, 2, 4 or 8 ways; 32 lanes at most 4 (lanes x k_parts within MAX_LANES)
    assert sorted({k["k_parts"] for k in projection_space(1, 40, 32)}) == [1, 2, 4, 8]
    assert sorted({k["k_parts"] for k in projection_space(1, 64, 4096) if k["lanes"] == 32}) == [1, 2, 4]


def test_lanes_deal_the_stripes_evenly_the_first_lanes_one_more():
    assert lane_tiles(10, 4) == [3, 3, 2, 2]
    # Llama-3.1-8B's LM head at tile_f 32: 4,008 stripes over 128 lanes (no power of two divides it)
    tiles = lane_tiles(4008, 128)
    assert (tiles[0], tiles[-1], tiles.count(32), sum(tiles)) == (32, 31, 40, 4008)


def test_the_graph_reads_each_weight_once_per_token_tile_and_its_tokens_once():
    workload = build_projection(5, 64, 256, {"tile_m": 2, "tile_f": 32, "lanes": 3})
    metrics = workload.metrics()
    # x: 3 tiles of 2 x 64 bf16 rows (768 B); weights 3 x 64 x 256 x 2 (98,304 B); y: 3 tiles x 2 x 256 fp32 (6,144 B)
    assert int(metrics["off_chip_bytes"]) == 768 + 98_304 + 6_144
    assert workload.algorithmic_flops == 2 * 6 * 64 * 256
    assert projection_bound({"tile_m": 2, "tile_f": 32, "lanes": 3}, 5, 64, 256, SN40L) == 3 * 3 * 64
    # a vocabulary no tile divides: its last stripe zero-padded (1,000 columns: 32 tiles of 32, 1,024 columns)
    padded = build_projection(1, 64, 1000, {"tile_m": 1, "tile_f": 32, "lanes": 4}).metrics()
    assert int(padded["off_chip_bytes"]) == 1 * 64 * 2 + 64 * 1024 * 2 + 1024 * 4


def test_a_split_reduction_moves_the_same_bytes_and_adds_each_lanes_partial_sums():
    """d_in split 4 ways: the same traffic and Matmul FLOPs, each lane's 4 partial sums added by 3 Adds (a tree), a
    quarter of each weight tile's requests on a lane."""
    knobs = {"tile_m": 2, "tile_f": 32, "lanes": 3, "k_parts": 4}
    workload = build_projection(5, 64, 256, knobs)
    assert int(workload.metrics()["off_chip_bytes"]) == 768 + 98_304 + 6_144
    assert workload.algorithmic_flops == 2 * 6 * 64 * 256
    kinds = [op.kind for op in workload.graph.ops]
    assert (kinds.count("LinearOffChipLoad"), kinds.count("Map"), kinds.count("LinearOffChipStore")) == \
        (4 + 3 * 4, 3 * 4 + 3 * 3, 3)
    loaded = {op.tensor.name for op in workload.graph.ops if op.kind == "LinearOffChipLoad"}
    assert {name for name in loaded if name.startswith("x")} == {"x.k0", "x.k1", "x.k2", "x.k3"}
    assert projection_bound(knobs, 5, 64, 256, SN40L) == 3 * 3 * 16


def test_the_pruned_search_finds_the_exhaustive_best_and_every_bound_holds():
    chosen, rows = evaluate_projection(5, 64, 256, SN40L)
    best, every = evaluate_projection(5, 64, 256, SN40L, exhaustive=True)
    assert chosen == Schedule("projection", {"tile_m": 8, "tile_f": 32, "lanes": 8, "k_parts": 4}, cycles=126,
                              bound_cycles=88, off_chip_bytes=41_984, flops=268_288, compute_units=1040,
                              memory_units=76, on_chip_bytes=58_368,
                              candidates={"simulated": 29, "pruned": 151, "infeasible": 0})
    assert best.knobs == chosen.knobs and best.cycles == chosen.cycles == min(r["cycles"] for r in every)
    assert all(r["status"] == "simulated" and r["bound_cycles"] <= r["cycles"] for r in every)
    assert len(every) == len(rows) == 180


def test_a_schedule_file_takes_no_projection_schedule(tmp_path):
    import json

    import pytest

    from stepsim.base.errors import ConfigError
    from stepsim.mapping.schedule import read_schedules

    path = tmp_path / "s.json"
    path.write_text(json.dumps({"kind": "projection", "knobs": {"tile_m": 1, "tile_f": 32, "lanes": 4, "k_parts": 1}}))
    with pytest.raises(ConfigError) as e:
        read_schedules(path)
    assert str(e.value) == f"{path}: schedule 0: schedule kind must be one of ffn, decode, prefill, got 'projection'"
