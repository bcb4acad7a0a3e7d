"""dynamic-tiling (§5.3) on a reduced configuration: both models at B=64, static tiles 16 and 64, dynamic."""

import json
import math

import numpy as np
import pyarrow.parquet as pq
import pytest
from repro_traces import tiny_traces

from stepsim.models.presets import moe_model
from stepsim.reproduce import reproduce
from stepsim.reproduce.dynamic_tiling import compare, static_tiles
from stepsim.simulation.simulate import simulate
from stepsim.workloads.moe.build import build_moe

pytestmark = pytest.mark.traces

REDUCED = {"dynamic-tiling": {"tiles": {64: (16, 64)}}}
ROWS = [("mixtral-8x7b", "mixtral_b64/008_010.npz", "static", 16), ("mixtral-8x7b", "mixtral_b64/008_010.npz", "static", 64),
        ("mixtral-8x7b", "mixtral_b64/008_010.npz", "dynamic", None),
        ("qwen3-30b-a3b", "qwen_b64/032_012.npz", "static", 16), ("qwen3-30b-a3b", "qwen_b64/032_012.npz", "static", 64),
        ("qwen3-30b-a3b", "qwen_b64/032_012.npz", "dynamic", None)]
#: STEP_SEMANTICS §8.3: (off-chip, on-chip raw, on-chip without idle experts) in bytes
SPEC = {("mixtral-8x7b", 16): (4_229_431_552, 18_915_330, 18_915_330),
        ("mixtral-8x7b", 64): (2_820_145_408, 37_789_698, 37_789_698),
        ("mixtral-8x7b", None): (2_820_145_408, 18_915_330, 18_915_330),
        ("qwen3-30b-a3b", 16): (680_264_704, 151_015_426, 70_799_362),
        ("qwen3-30b-a3b", 64): (567_018_496, 302_010_370, 141_578_242),
        ("qwen3-30b-a3b", None): (567_018_496, 113_266_690, 59_789_314)}


@pytest.fixture(scope="module")
def run(shared_traces, tmp_path_factory):
    traces = tiny_traces(shared_traces, tmp_path_factory.mktemp("traces"))
    out = tmp_path_factory.mktemp("out")
    [result] = reproduce("dynamic-tiling", traces, out, options=REDUCED)
    return result, traces, out


def test_table_has_one_row_per_tile_and_model_with_the_experiment_settings(run):
    result, _, _ = run
    rows = result.table.to_pylist()
    assert [(r["model"], r["trace"], r["tiling"], r["tile_n"]) for r in rows] == ROWS
    assert [(r["batch"], r["tile_f"], r["channel_depth"]) for r in rows] == [(64, 64, 2)] * 6
    assert [r["compute_bw"] for r in rows] == [4096, 4096, 6400] * 2


def test_every_number_matches_an_independent_build_and_simulation(run, shared_traces):
    result, _, _ = run
    for r in result.table.to_pylist():
        routing = np.load(shared_traces / "expert_routing" / r["trace"])["data"]
        workload = build_moe(moe_model(r["model"]), routing, tiling=r["tiling"], tile_n=r["tile_n"])
        metrics, sim = workload.metrics(), simulate(workload)
        assert r["cycles"] == sim.cycles
        assert r["off_chip_bytes"] == sim.off_chip_bytes == metrics["off_chip_bytes"]
        assert (r["on_chip_bytes"], r["on_chip_bytes_active"], r["flops"]) == (
            metrics["on_chip_bytes"], metrics["on_chip_bytes_active"], metrics["flops"])
        assert (r["off_chip_bytes"], r["on_chip_bytes"], r["on_chip_bytes_active"]) == SPEC[(r["model"], r["tile_n"])]


def test_plotted_on_chip_is_raw_for_static_and_corrected_for_dynamic(run):
    result, _, _ = run
    for r in result.table.to_pylist():
        expected = r["on_chip_bytes"] if r["tiling"] == "static" else r["on_chip_bytes_active"]
        assert r["on_chip_bytes_plotted"] == expected
    assert result.table.column("on_chip_bytes_plotted").to_pylist() == [
        18_915_330, 37_789_698, 18_915_330, 151_015_426, 302_010_370, 59_789_314]


def test_headline_recomputed_from_the_table(run):
    result, _, _ = run
    c = {(r["model"], r["tile_n"]): r["cycles"] for r in result.table.to_pylist()}
    mix, qwen = "mixtral-8x7b", "qwen3-30b-a3b"
    # comparable performance: tile 64 is within 5% of dynamic's cycles for both models, tile 16 is not
    assert c[(mix, 64)] <= 1.05 * c[(mix, None)] < c[(mix, 16)]
    assert c[(qwen, 64)] <= 1.05 * c[(qwen, None)] < c[(qwen, 16)]
    memory = [37_789_698 / 18_915_330, 302_010_370 / 59_789_314]
    # comparable memory: Mixtral tile 16 has dynamic's footprint; no Qwen tile does, so the smallest (16)
    speed = [c[(mix, 16)] / c[(mix, None)], c[(qwen, 16)] / c[(qwen, None)]]
    assert result.headline == {
        "dynamic_tiling_onchip_reduction_geomean": pytest.approx(math.sqrt(memory[0] * memory[1]), rel=1e-12),
        "dynamic_tiling_speedup_geomean": pytest.approx(math.sqrt(speed[0] * speed[1]), rel=1e-12)}
    assert [(g["memory_reference_tile"], g["speed_reference_tile"], g["speed_reference_comparable"])
            for g in result.details["groups"]] == [(64, 16, True), (64, 16, False)]
    v1 = result.details["v1_pairs_b64"]
    assert v1["onchip_reduction_geomean"] == pytest.approx(
        math.sqrt(37_789_698 / 18_915_330 * 141_578_242 / 59_789_314), rel=1e-12)
    assert v1["speedup_geomean"] == pytest.approx(math.sqrt(speed[0] * speed[1]), rel=1e-12)


def test_outputs_written_parquet_csv_headline_and_figure(run):
    result, _, out = run
    assert sorted(p.name for p in out.iterdir()) == ["dynamic_tiling.csv", "dynamic_tiling.parquet",
                                                    "dynamic_tiling.png", "dynamic_tiling_headline.json"]
    table = pq.read_table(out / "dynamic_tiling.parquet")
    assert table.equals(result.table)
    assert table.schema.field("cycles").metadata == {b"unit": b"cycles"}
    provenance = json.loads(table.schema.metadata[b"stepsim.config"])
    assert provenance["experiment"] == "dynamic-tiling"
    assert sorted(provenance["traces"]) == ["mixtral_b64/008_010.npz", "qwen_b64/032_012.npz"]
    csv_lines = (out / "dynamic_tiling.csv").read_text().splitlines()
    assert len(csv_lines) == 7 and csv_lines[0].startswith('"model","batch","trace","tiling","tile_n"')
    saved = json.loads((out / "dynamic_tiling_headline.json").read_text())
    assert saved["headline"] == result.headline
    assert (out / "dynamic_tiling.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("batch, tiles", [(64, (8, 16, 32, 64)), (1024, (16, 32, 64, 128, 256, 512, 1024)),
                                          (100, (8, 16, 32, 64)), (4, (4,))])
def test_static_tile_lists_follow_the_spec_and_powers_of_two_elsewhere(batch, tiles):
    assert static_tiles(batch) == tiles


def test_compare_falls_back_to_the_fastest_and_the_smallest_static_tile():
    dynamic = {"cycles": 100, "on_chip_bytes_plotted": 10}
    static = [{"tile_n": 8, "cycles": 300, "on_chip_bytes_plotted": 40},
              {"tile_n": 32, "cycles": 120, "on_chip_bytes_plotted": 90}]
    assert compare(static, dynamic) == {"memory_reference_tile": 32, "memory_reference_comparable": False,
                                        "onchip_reduction": 9.0, "speed_reference_tile": 8,
                                        "speed_reference_comparable": False, "speedup": 3.0}
