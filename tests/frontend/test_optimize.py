"""``stepsim optimize model.onnx`` (issue 33): the tile search's front equals the exhaustive front, found with
fewer simulations, every cycle bound below the simulated cycles."""

import json
import sys
from pathlib import Path

import onnx

from stepsim.cli import main
from stepsim.frontend import from_onnx
from stepsim.optimize.onnx_search import search, tile_space
from stepsim.optimize.pareto import pareto_front
from stepsim.simulation.simulate import simulate

sys.path.insert(0, str(Path(__file__).parent))
from test_metrics import mlp  # noqa: E402


def test_tile_space():
    assert tile_space([8, 4, 12], 48) == [{"tile_m": m, "tile_n": n} for m in (1, 2, 4) for n in (None, 16, 32)]


def test_the_front_is_the_exhaustive_front_with_fewer_simulations():
    result = search(mlp())
    assert len(result.candidates) == 6 and result.simulations == 4  # two pruned by their cycle bound
    every = []
    for p in result.candidates:
        cycles = simulate(from_onnx(mlp(), tiling=p.tiling)).cycles
        assert p.cycle_bound <= cycles and p.cycles in (None, cycles)
        every.append((p.tiling, (cycles, p.on_chip_bytes, p.allocated_flops_per_cycle)))
    exhaustive = sorted(every[i][1] for i in pareto_front([v for _, v in every]))
    assert [p.vector(p.cycles) for p in result.front] == exhaustive
    assert result.recommended.tiling == {"tile_m": 4, "tile_n": None} and result.recommended.cycles == exhaustive[0][0]


def test_cli(tmp_path, capsys):
    path = tmp_path / "mlp.onnx"
    onnx.save(mlp(), path)
    assert main(["optimize", str(path), "--out", str(tmp_path / "opt"), "--objective", "on-chip", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc == json.loads((tmp_path / "opt" / "optimize.json").read_text())
    assert (doc["candidates"], doc["simulations"]) == (6, 4)
    assert doc["recommended"] == {"tile_m": 1, "tile_n": 16}  # the least on-chip bytes
