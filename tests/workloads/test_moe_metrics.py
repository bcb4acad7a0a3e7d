"""Spec §8.3: MoE symbolic metrics from the real routing traces, through the public API."""

import json

import numpy as np
import pytest
import sympy as sp

from stepsim.base.errors import ArgumentError, ConfigError
from stepsim.cli import main
from stepsim.models.presets import moe_model
from stepsim.workloads.moe.build import build_moe

MIXTRAL = {  # tile: (off-chip, on-chip)
    8: (7_048_003_840, 15_769_602),
    16: (4_229_431_552, 18_915_330),
    32: (2_820_145_408, 25_206_786),
    64: (2_820_145_408, 37_789_698),
    "dynamic": (2_820_145_408, 18_915_330),
}
QWEN = {  # tile: (off-chip, on raw, on minus idle experts)
    8: (897_319_936, 125_849_602, 59_002_882),
    16: (680_264_704, 151_015_426, 70_799_362),
    32: (576_455_680, 201_347_074, 94_392_322),
    64: (567_018_496, 302_010_370, 141_578_242),
    "dynamic": (567_018_496, 113_266_690, 59_789_314),
}


@pytest.fixture(scope="module")
def routing(shared_traces):
    load = lambda rel: np.load(shared_traces / "expert_routing" / rel)["data"]  # noqa: E731
    return {"mixtral-8x7b": load("mixtral_b64/008_010.npz"), "qwen3-30b-a3b": load("qwen_b64/032_012.npz")}


def _expert_symbols(workload):
    """Per-expert token-count symbols: the count symbols of the partition that routes tokens to experts."""
    return list(next(op for op in workload.graph if op.kind == "Partition").count_symbols)


def _build(routing, model, tile):
    tiling = "dynamic" if tile == "dynamic" else "static"
    return build_moe(moe_model(model), routing[model], tiling=tiling, tile_n=None if tile == "dynamic" else tile)


@pytest.mark.parametrize("tile", list(MIXTRAL))
def test_mixtral_b64_metrics_match_the_published_table(routing, tile):
    m = _build(routing, "mixtral-8x7b", tile).metrics()
    assert (m["off_chip_bytes"], m["on_chip_bytes"]) == MIXTRAL[tile]
    assert m["on_chip_bytes_active"] == m["on_chip_bytes"]  # no idle expert in this batch


@pytest.mark.parametrize("tile", list(QWEN))
def test_qwen_b64_metrics_match_the_published_table_with_idle_expert_correction(routing, tile):
    m = _build(routing, "qwen3-30b-a3b", tile).metrics()
    assert (m["off_chip_bytes"], m["on_chip_bytes"], m["on_chip_bytes_active"]) == QWEN[tile]


@pytest.mark.parametrize("tile,unit", [(8, 983_040), (16, 1_179_648), (32, 1_572_864), (64, 2_359_296),
                                       ("dynamic", 786_432)])
def test_qwen_per_expert_on_chip_unit_is_the_footprint_of_one_idle_expert(routing, tile, unit):
    w = _build(routing, "qwen3-30b-a3b", tile)
    idle = sorted(w.idle_groups)
    assert len(idle) == 68
    assert all(w.group_on_chip_bytes(g) == unit for g in idle[:3])


def test_mixtral_static_graph_has_the_artifacts_node_and_edge_counts(routing):
    g = _build(routing, "mixtral-8x7b", 16).graph.finalize()
    assert (len(g), g.num_edges()) == (164, 209)
    assert g.count_by_kind() == {
        "Flatten": 33, "Map": 40, "LinearOffChipLoad": 26, "Broadcast": 16, "Reshape": 9, "Accum": 9,
        "RepeatStatic": 8, "MapAccum": 8, "RetileStreamify": 8, "SelectorSource": 3, "Partition": 2,
        "Reassemble": 1, "LinearOffChipStore": 1}


def test_mixtral_tile16_symbolic_off_chip_has_nine_terms_over_per_expert_counts(routing):
    w = _build(routing, "mixtral-8x7b", 16)
    expr = sp.expand(w.graph.off_chip_bytes())
    symbols = _expert_symbols(w)
    expected = 1_573_120 + sum(352_321_536 * sp.Piecewise((1, s >= 1), (0, True)) * sp.floor(s / 16 + sp.Rational(15, 16))
                               for s in symbols)
    assert len(sp.Add.make_args(expr)) == 9
    for counts in ([13, 10, 17, 14, 17, 10, 24, 23], [0, 1, 16, 17, 32, 33, 0, 5]):
        values = dict(zip(symbols, counts))
        assert expr.xreplace(values) == expected.xreplace(values)


def test_mixtral_dynamic_on_chip_is_affine_in_the_token_counts(routing):
    w = _build(routing, "mixtral-8x7b", "dynamic")
    expr = sp.expand(w.graph.on_chip_bytes())
    symbols = _expert_symbols(w)
    assert sp.simplify(expr - (12_623_874 + sum(49_152 * s for s in symbols))) == 0


def test_two_builds_give_identical_expressions(routing):
    a = _build(routing, "qwen3-30b-a3b", 16).graph.off_chip_bytes()
    b = _build(routing, "qwen3-30b-a3b", 16).graph.off_chip_bytes()
    assert a == b and str(a) == str(b)


def test_algorithmic_flops_match_the_time_multiplexing_section(routing):
    static = _build(routing, "qwen3-30b-a3b", 32).metrics()["flops"]
    dynamic = _build(routing, "qwen3-30b-a3b", "dynamic").metrics()["flops"]
    assert (static, dynamic) == (42_984_726_528, 11_274_682_368)
    assert static / dynamic == 3.8125


@pytest.mark.parametrize("regions", [64, 32, 16, 8, 4])
@pytest.mark.parametrize("tiling", ["static", "dynamic"])
def test_time_multiplexing_keeps_off_chip_traffic_for_every_region_count(routing, regions, tiling):
    w = build_moe(moe_model("qwen3-30b-a3b"), routing["qwen3-30b-a3b"], tiling=tiling, tile_n=32,
                  regions=regions)
    expected = 576_455_680 if tiling == "static" else 567_018_496
    assert w.metrics()["off_chip_bytes"] == expected
    assert w.params["tile_f"] == 48 and w.params["compute_bw"] == 1024


@pytest.mark.parametrize("regions", [4, 128])
def test_memory_operators_are_registered_in_the_artifacts_order(routing, regions):
    # same-cycle HBM requests are served in graph order (STEP_TIMING §2 step 2, §4.2): the time-multiplexing
    # script builds every region's up load, then every gate load, then every down load, then the routing weights;
    # the per-expert script loads the routing weights first and the weights expert by expert
    w = build_moe(moe_model("qwen3-30b-a3b"), routing["qwen3-30b-a3b"], tile_n=32, regions=regions)
    names = [op.tensor.name if hasattr(op, "tensor") else op.kind for op in w.graph.ops if op.is_memory]
    if regions == 4:
        weights = [f"region{r:03d}_{kind}" for kind in ("up", "gate", "down") for r in range(4)]
        assert names == ["x", *weights, "routing_weights", "LinearOffChipStore"]
    else:
        weights = [f"expert{e:03d}_{kind}" for e in range(128) for kind in ("up", "gate", "down")]
        assert names == ["x", "routing_weights", *weights, "LinearOffChipStore"]
    if regions == 4:  # every region's operators stay attributed to it
        loads = [op for op in w.graph.ops if op.kind == "RandomOffChipLoad"]
        assert [op.group for op in loads] == [("region", r) for _ in range(3) for r in range(4)]


def test_metrics_cli_prints_the_published_numbers_as_json(shared_traces, capsys):
    trace = shared_traces / "expert_routing" / "qwen_b64" / "032_012.npz"
    assert main(["metrics", "moe", "--model", "qwen3-30b-a3b", "--trace", str(trace), "--tiling", "static",
                 "--tile-n", "8", "--json"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert (row["off_chip_bytes"], row["on_chip_bytes"], row["on_chip_bytes_active"]) == QWEN[8]
    assert row["flops"] == 16_735_856_640


def test_bad_routing_and_regions_are_rejected_with_the_place_named():
    model = moe_model("mixtral-8x7b")
    with pytest.raises(ArgumentError, match=r"row 1 column 0: expert id 9 outside 0\.\.7"):
        build_moe(model, [[0, 1], [9, 2]])
    with pytest.raises(ArgumentError, match=r"row 0 names expert 3 twice"):
        build_moe(model, [[3, 3]])
    with pytest.raises(ArgumentError, match="regions must divide the number of experts 8, got 3"):
        build_moe(model, [[0, 1]], regions=3)
    with pytest.raises(ArgumentError, match="tile_f must be a positive divisor of the intermediate size 14336"):
        build_moe(model, [[0, 1]], tile_f=100)
    with pytest.raises(ConfigError, match="unknown model 'gpt'"):
        moe_model("gpt")


def test_cli_reports_config_errors_without_traceback(capsys):
    assert main(["metrics", "moe", "--model", "custom", "--hidden", "8"]) == 2
    assert capsys.readouterr().err.strip() == (
        "stepsim: error: model 'custom' needs --intermediate, --experts, --top-k")
