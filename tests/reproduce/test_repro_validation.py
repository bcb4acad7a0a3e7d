"""validation (§5.6): the 15-point SwiGLU tile sweep, roofline bounds, correlation, deterministic files; stats."""

import numpy as np
import pytest

from stepsim.base.errors import MetricError
from stepsim.reproduce import reproduce
from stepsim.reproduce.stats import geomean, pearson
from stepsim.simulation.simulate import simulate
from stepsim.workloads.swiglu.build import build_swiglu

#: STEP_SEMANTICS §8.2: (tile_m, tile_n) -> (off-chip bytes, on-chip bytes), in the sweep's order
SPEC = {(16, 16): (8_454_144, 100_352), (16, 32): (7_405_568, 151_552), (16, 64): (6_881_280, 253_952),
        (16, 128): (6_619_136, 458_752), (16, 256): (6_488_064, 868_352), (32, 16): (5_308_416, 151_552),
        (32, 32): (4_259_840, 204_800), (32, 64): (3_735_552, 311_296), (32, 128): (3_473_408, 524_288),
        (32, 256): (3_342_336, 950_272), (64, 16): (3_735_552, 253_952), (64, 32): (2_686_976, 311_296),
        (64, 64): (2_162_688, 425_984), (64, 128): (1_900_544, 655_360), (64, 256): (1_769_472, 1_114_112)}
FLOPS = 117_473_280


@pytest.fixture(scope="module")
def outs(tmp_path_factory):
    """Two runs of the experiment into two folders (traces are not needed: an empty folder will do)."""
    traces = tmp_path_factory.mktemp("no-traces")
    first, second = tmp_path_factory.mktemp("out1"), tmp_path_factory.mktemp("out2")
    return reproduce("validation", traces, first)[0], first, second, reproduce("validation", traces, second)[0]


def test_fifteen_points_with_the_spec_traffic_footprint_and_flops(outs):
    rows = outs[0].table.to_pylist()
    assert [(r["tile_m"], r["tile_n"]) for r in rows] == list(SPEC)
    assert [(r["off_chip_bytes"], r["on_chip_bytes"]) for r in rows] == list(SPEC.values())
    assert {r["flops"] for r in rows} == {FLOPS}
    assert [r["off_chip_mb"] for r in rows] == [off / 1e6 for off, _ in SPEC.values()]


def test_cycles_match_independent_simulations_and_bounds_follow_the_roofline(outs):
    for r in outs[0].table.to_pylist():
        sim = simulate(build_swiglu(tile_m=r["tile_m"], tile_n=r["tile_n"]))
        assert r["cycles"] == sim.cycles and r["off_chip_bytes"] == sim.off_chip_bytes
        memory, compute = r["off_chip_bytes"] / 256, FLOPS / (4 * 4096)
        assert (r["memory_bound_cycles"], r["compute_bound_cycles"]) == (memory, compute)
        assert r["roofline_bound_cycles"] == max(memory, compute)
        assert r["cycles_over_roofline"] == r["cycles"] / max(memory, compute)
        assert r["operational_intensity"] == FLOPS / r["off_chip_bytes"]
    # only the largest tiles reach the compute roof (ridge point 64 FLOPs/byte)
    assert [(r["tile_m"], r["tile_n"]) for r in outs[0].table.to_pylist()
            if r["compute_bound_cycles"] > r["memory_bound_cycles"]] == [(64, 256)]


def test_pearson_correlation_recomputed_with_numpy(outs):
    table = outs[0].table
    cycles = np.array(table.column("cycles").to_pylist(), dtype=float)
    for key, column in (("pearson_cycles_vs_roofline", "roofline_bound_cycles"),
                        ("pearson_cycles_vs_memory_bound", "memory_bound_cycles")):
        expected = np.corrcoef(cycles, np.array(table.column(column).to_pylist()))[0, 1]
        assert outs[0].details[key] == pytest.approx(expected, rel=1e-12)
    # the five HDL points of the paper's validation artifact (dse_results.csv): tile_m 16, D 256
    hdl = [36_259, 30_432, 27_859, 29_112, 25_998]
    simulated = [r["cycles"] for r in table.to_pylist() if r["tile_m"] == 16]
    assert simulated == [33_288, 29_399, 27_502, 26_992, 27_508]
    assert outs[0].details["hdl_points"] == [
        {"tile_m": 16, "tile_n": n, "cycles": c, "hdl_cycles": h, "cycles_over_hdl": c / h}
        for n, c, h in zip((16, 32, 64, 128, 256), simulated, hdl, strict=True)]
    assert outs[0].details["pearson_cycles_vs_hdl"] == pytest.approx(np.corrcoef(simulated, hdl)[0, 1], rel=1e-12)
    assert outs[0].headline == {"validation_pearson_cycles_vs_roofline": outs[0].details["pearson_cycles_vs_roofline"],
                                "validation_pearson_cycles_vs_hdl": outs[0].details["pearson_cycles_vs_hdl"]}
    assert round(outs[0].headline["validation_pearson_cycles_vs_hdl"], 4) == 0.9367


def test_outputs_are_byte_identical_across_runs(outs):
    first, out1, out2, second = outs
    assert second.table.equals(first.table)
    for name in ("validation.csv", "validation_headline.json", "validation.parquet", "validation.png"):
        assert (out1 / name).read_bytes() == (out2 / name).read_bytes(), name


def test_geomean_and_pearson_exact_cases_and_errors():
    assert geomean([2.8705094143467718]) == 2.8705094143467718
    assert geomean([2.0, 8.0]) == pytest.approx(4.0, rel=1e-15)
    assert pearson([1, 2, 3], [2, 4, 6]) == pytest.approx(1.0, rel=1e-15)
    assert pearson([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0, rel=1e-15)
    for bad in ([], [1.0, 0.0]):
        with pytest.raises(MetricError):
            geomean(bad)
    with pytest.raises(MetricError, match="constant sample"):
        pearson([1, 1], [1, 2])
    with pytest.raises(MetricError, match="equal length >= 2"):
        pearson([1], [1])
