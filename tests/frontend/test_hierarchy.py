"""``stepsim optimize model.onnx --hierarchical`` (issue 33): fusion per value, then tile_m and each MatMul's
tile_n, searched level by level with the symbolic pruning; on a small MLP its front equals the exhaustive front
over the whole space (3 tile_m x 3 x 2 per-MatMul tiles x 2^3 fusion choices = 144 schedules), with 21
simulations."""

import itertools
import json
import sys
from pathlib import Path

import onnx
import pytest
from onnx import helper

from stepsim.base.errors import ConfigError
from stepsim.cli import main
from stepsim.frontend import from_onnx
from stepsim.optimize.onnx_hierarchy import matmul_options, search
from stepsim.optimize.onnx_search import symbolic_point
from stepsim.optimize.pareto import pareto_front
from stepsim.simulation.simulate import simulate

sys.path.insert(0, str(Path(__file__).parent))
from ort_check import model, rand  # noqa: E402

B, S, K, F, D = 2, 4, 16, 64, 32


def mlp():
    """x [B, S, K] -> MatMul w1 [K, F] -> Relu -> MatMul w2 [F, D] -> Add b [D] -> y: two MatMuls with 3 and 2
    tile_n choices, three values to fuse or spill."""
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h1"], name="fc1"),
             helper.make_node("Relu", ["h1"], ["h2"], name="act"),
             helper.make_node("MatMul", ["h2", "w2"], ["h3"], name="fc2"),
             helper.make_node("Add", ["h3", "b"], ["y"], name="bias")]
    init = {"w1": rand((K, F), 1, K ** -0.5), "w2": rand((F, D), 2, F ** -0.5), "b": rand((D,), 3)}
    return model(nodes, {"x": [B, S, K]}, {"y": [B, S, D]}, init, name="mlp2")


FRONT = [({"tile_m": 4, "per_node": {"fc1": 32, "fc2": 16}, "spill": []}, (426, 10304, 4096)),
         ({"tile_m": 4, "per_node": {"fc1": 32}, "spill": []}, (435, 8448, 4096)),
         ({"tile_m": 4, "per_node": {"fc1": 16}, "spill": []}, (475, 5120, 4096)),
         ({"tile_m": 2, "per_node": {"fc1": 16}, "spill": []}, (867, 4224, 4096)),
         ({"tile_m": 1, "per_node": {"fc1": 16}, "spill": []}, (1663, 3776, 4096))]


def test_the_space():
    assert matmul_options(from_onnx(mlp()).frontend) == {"fc1": [None, 16, 32], "fc2": [None, 16]}


def test_the_front_is_the_exhaustive_front_of_the_whole_space():
    result = search(mlp())
    assert [(p.tiling, p.vector(p.cycles)) for p in result.front] == FRONT
    assert result.fusion == {v: "fused: a simulated point dominates its spill" for v in ("h1", "h2", "h3")}
    # fusion at each of the 3 tile_m (1 + 3 spills each), then 4 tile points per tile_m, less the 3 already seen
    assert (len(result.candidates), result.simulations, result.skipped) == (21, 21, {})
    assert result.recommended.tiling == FRONT[0][0]
    every = []
    for tm, n1, n2 in itertools.product((1, 2, 4), (None, 16, 32), (None, 16)):
        per_node = {k: v for k, v in (("fc1", n1), ("fc2", n2)) if v is not None}
        for k in range(4):
            for spill in itertools.combinations(("h1", "h2", "h3"), k):
                w = from_onnx(mlp(), tiling={"tile_m": tm, "per_node": per_node}, spill=spill)
                p = symbolic_point({"tile_m": tm, "per_node": per_node, "spill": list(spill)}, w)
                p.cycles = simulate(w).cycles
                assert p.cycle_bound <= p.cycles
                every.append(p)
    assert len(every) == 144
    exhaustive = sorted((every[i].vector(every[i].cycles) for i in pareto_front([p.vector(p.cycles) for p in every])))
    assert exhaustive == [v for _, v in FRONT]
    # the exhaustive front's schedules are the search's (an equal vector: the fused one, as the search keeps)
    best = {v: [p.tiling for p in every if p.vector(p.cycles) == v] for v in exhaustive}
    assert all(t in best[v] for t, v in FRONT)


def test_cli(tmp_path, capsys):
    path = tmp_path / "mlp2.onnx"
    onnx.save(mlp(), path)
    out = tmp_path / "opt"
    assert main(["optimize", str(path), "--hierarchical", "--out", str(out), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc == json.loads((out / "optimize.json").read_text())
    assert (doc["candidates"], doc["simulations"]) == (21, 21)
    assert doc["recommended"] == FRONT[0][0]
    assert [(dict(tile_m=p["tile_m"], per_node=p["per_node"], spill=p["spill"]),
             (p["cycles"], p["on_chip_bytes"], p["allocated_flops_per_cycle"])) for p in doc["pareto"]] == FRONT
    assert doc["fusion"] == {"h1": "fused: a simulated point dominates its spill",
                             "h2": "fused: a simulated point dominates its spill",
                             "h3": "fused: a simulated point dominates its spill"}


def test_hierarchical_is_for_onnx_models(capsys, tmp_path):
    assert main(["optimize", "swiglu", "--hierarchical", "--out", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err == ("stepsim: error: --hierarchical applies to an .onnx model (fusion and "
                                       "per-MatMul tiles), got workload 'swiglu'\n")


def test_an_on_chip_budget():
    # the default tiling (tile_m 4, whole rows: 8,768 B) does not fit 5,120 B: fusion is not searched, and the
    # front is the exhaustive front's part within the budget
    result = search(mlp(), max_on_chip=5120)
    assert set(result.fusion.values()) == {"fused: the default tiling exceeds max_on_chip; fusion not searched"}
    assert [(p.tiling, p.vector(p.cycles)) for p in result.front] == FRONT[2:]
    assert result.recommended.tiling == FRONT[2][0]
    assert all(p.on_chip_bytes <= 5120 for p in result.candidates)
    with pytest.raises(ConfigError) as err:
        search(mlp(), max_on_chip=100)
    assert str(err.value) == "no schedule of model 'mlp2' visited fits max_on_chip 100 B"
