"""``stepsim optimize model.onnx --hierarchical`` (issue 33): tile_m and each MatMul's tile_n, then fusion per
value under each tiling, a branch and bound whose pruning is sound: its front equals the exhaustive front. On a
small MLP (3 tile_m x 3 x 2 per-MatMul tiles x 2^3 fusion choices = 144 schedules) with 8 simulations, every
schedule enumerated here; on the head-Transpose model (64 schedules) likewise; on a small Llama block (49,152
schedules) against a recorded exhaustive run (bench/onnx_exhaustive_front.py). Every bound the search prunes with
is checked against the engine on the whole space: a schedule's cycle bound, and its subtree's vector against
every schedule with more spills."""

import itertools
import json
import random
import sys
from pathlib import Path

import onnx
import pytest
from onnx import helper

from stepsim.base.errors import ConfigError, FrontendError, LayoutError
from stepsim.cli import main
from stepsim.frontend import from_onnx
from stepsim.optimize.onnx_hierarchy import bounded, matmul_options, search
from stepsim.optimize.pareto import pareto_front
from stepsim.simulation.simulate import simulate

sys.path.insert(0, str(Path(__file__).parent))
from ort_check import model, rand  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples"))
from onnx_blocks import BLOCKS  # noqa: E402

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


def exhaustive(m, values: tuple, tilings: list) -> list:
    """Every buildable schedule of ``m`` (``tilings``: (tile_m, per_node) pairs, each with every subset of
    ``values`` spilled), simulated, as ``(tiling, spill, Node)``; checks the search's bounds against the engine:
    each schedule's cycle bound, and each subtree's vector against every schedule below it in the search's tree
    (more spills, of later values)."""
    out = []
    for tm, per_node in tilings:
        nodes = {}
        for k in range(len(values) + 1):
            for spill in itertools.combinations(values, k):
                tiling = {"tile_m": tm, "per_node": per_node, "spill": list(spill)}
                try:
                    w = from_onnx(m, tiling={"tile_m": tm, "per_node": per_node}, spill=spill)
                except (FrontendError, LayoutError):
                    continue
                n = bounded(tiling, w)
                n.point.cycles = simulate(w).cycles
                assert n.point.cycle_bound <= n.point.cycles
                nodes[spill] = n
        for spill, n in nodes.items():
            first = max((values.index(v) + 1 for v in spill), default=0)  # its children add later values only
            sub = n.subtree(frozenset(values[:first]) - set(spill))
            for more, other in nodes.items():
                if set(spill) <= set(more) and all(values.index(v) >= first for v in set(more) - set(spill)):
                    assert all(a <= b for a, b in zip(sub, other.point.vector(other.point.cycles))), (
                        tm, per_node, spill, more)
        out += [(tm, per_node, spill, n) for spill, n in nodes.items()]
    return out


def front_vectors(points) -> list:
    vectors = [p.vector(p.cycles) for p in points]
    return sorted({vectors[i] for i in pareto_front(vectors)})


def test_the_front_is_the_exhaustive_front_of_the_whole_space():
    result = search(mlp())
    assert [(p.tiling, p.vector(p.cycles)) for p in result.front] == FRONT
    assert result.fusion == dict.fromkeys(("h1", "h2", "h3"), "fused: no front point at this tile_m spills it")
    # 144 schedules: 42 built (bounded), 8 of them simulated, 102 in subtrees dropped unbuilt
    assert (len(result.candidates), result.simulations, result.pruned, result.skipped) == (42, 8, 102, {})
    assert (result.built + result.pruned, result.unbuilt) == (144, 0)  # every schedule built or dropped
    assert result.recommended.tiling == FRONT[0][0]
    tilings = [(tm, {k: v for k, v in (("fc1", n1), ("fc2", n2)) if v is not None})
               for tm, n1, n2 in itertools.product((1, 2, 4), (None, 16, 32), (None, 16))]
    every = exhaustive(mlp(), ("h1", "h2", "h3"), tilings)
    assert len(every) == 144
    assert front_vectors([n.point for *_, n in every]) == [v for _, v in FRONT]
    # the exhaustive front's schedules are the search's (an equal vector: the fused one, as the search keeps)
    best = {v: [n.point.tiling for *_, n in every if n.point.vector(n.point.cycles) == v] for _, v in FRONT}
    assert all(t in best[v] for t, v in FRONT)


#: the exhaustive front of BLOCKS["llama"](1, 4, 16, 32): 3 tile_m x 2 x 2 x 1 per-MatMul tiles x 2^12 spill sets
#: = 49,152 schedules, 24,576 distinct lowerings, every one simulated, recorded by
#: ``bench/onnx_exhaustive_front.py llama 1 4 16 32`` (2026-11-24, 577 s on the loaded 2-core machine); with
#: ``--check-bounds`` (998 s) no bound of the search was above the engine's figures on any of the 49,152
LLAMA_EXHAUSTIVE = {"schedules": 49152, "lowerings": 24576,
                    "front": [(141, 4992, 14336), (203, 4096, 14336), (336, 3648, 14336)]}


def test_the_llama_block_front_is_the_recorded_exhaustive_front():
    result = search(BLOCKS["llama"](1, 4, 16, 32))
    assert [p.vector(p.cycles) for p in result.front] == LLAMA_EXHAUSTIVE["front"]
    assert (len(result.candidates), result.simulations, result.pruned) == (225, 28, 48900)
    # every schedule builds; 252 were built (27 sharing another's lowering), the others dropped unbuilt
    assert (result.built, result.skipped, result.unbuilt) == (252, {}, 0)
    assert result.built + result.pruned == LLAMA_EXHAUSTIVE["schedules"]
    assert all(p.cycle_bound <= p.cycles for p in result.candidates if p.cycles is not None)


def test_the_bounds_hold_on_sampled_schedules_of_the_attention_block():
    # its 2^22 spill sets per tiling are not enumerable: 100 seeded pairs (a spill set, and one below it in the
    # search's tree: more spills, of later values), each schedule simulated (2,000 pairs by hand: no violation)
    import test_onnx_attention as attn

    m = attn.attention_block(True)
    values = list(dict.fromkeys(e.value for e in from_onnx(m).frontend.edges))
    assert len(values) == 22
    rng, pairs, wrong = random.Random(0), 0, []
    while pairs < 100:
        tm, first = rng.choice([1, 2, 4, 8]), rng.randrange(len(values) + 1)
        spill = tuple(v for v in values[:first] if rng.random() < 0.3)
        more = spill + tuple(v for v in values[first:] if rng.random() < 0.3)
        try:
            ws = [from_onnx(m, tiling={"tile_m": tm}, spill=s) for s in (spill, more)]
        except (FrontendError, LayoutError):  # a spill the front end cannot build (2-D tiles only)
            continue
        n, below = (bounded({"tile_m": tm, "per_node": {}, "spill": list(s)}, w) for s, w in zip((spill, more), ws))
        cycles = [simulate(w).cycles for w in ws]
        sub = n.subtree(frozenset(values[:first]) - set(spill))
        if not (n.point.cycle_bound <= cycles[0] and below.point.cycle_bound <= cycles[1]
                and all(a <= b for a, b in zip(sub, below.point.vector(cycles[1])))):
            wrong.append((tm, spill, more))
        pairs += 1
    assert wrong == []


def test_cli(tmp_path, capsys):
    path = tmp_path / "mlp2.onnx"
    onnx.save(mlp(), path)
    out = tmp_path / "opt"
    assert main(["optimize", str(path), "--hierarchical", "--out", str(out), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc == json.loads((out / "optimize.json").read_text())
    assert (doc["candidates"], doc["simulations"], doc["pruned"], doc["unbuilt"]) == (42, 8, 102, 0)
    assert doc["recommended"] == FRONT[0][0]
    assert [(dict(tile_m=p["tile_m"], per_node=p["per_node"], spill=p["spill"]),
             (p["cycles"], p["on_chip_bytes"], p["allocated_flops_per_cycle"])) for p in doc["pareto"]] == FRONT
    assert doc["fusion"] == dict.fromkeys(("h1", "h2", "h3"), "fused: no front point at this tile_m spills it")
    assert doc["fusion_by_tile_m"] == {str(tm): doc["fusion"] for tm in (1, 2, 4)}


def test_hierarchical_is_for_onnx_models(capsys, tmp_path):
    assert main(["optimize", "swiglu", "--hierarchical", "--out", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err == ("stepsim: error: --hierarchical applies to an .onnx model (fusion and "
                                       "per-MatMul tiles), got workload 'swiglu'\n")


def test_an_on_chip_budget():
    # the front is the exhaustive front's part within the budget; nothing over it is simulated or a candidate
    result = search(mlp(), max_on_chip=5120)
    assert [(p.tiling, p.vector(p.cycles)) for p in result.front] == FRONT[2:]
    assert result.recommended.tiling == FRONT[2][0]
    assert all(p.on_chip_bytes <= 5120 for p in result.candidates)
    with pytest.raises(ConfigError) as err:
        search(mlp(), max_on_chip=100)
    assert str(err.value) == "no schedule of model 'mlp2' fits max_on_chip 100 B"
