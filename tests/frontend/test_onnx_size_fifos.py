"""``stepsim size-fifos model.onnx`` (issue 33: an .onnx file goes wherever a workload goes): the model is lowered
through the front end as ``run`` lowers it (its fusion flags included), its FIFOs sized, and the depths file read
back by ``run --fifo-depths``; a file sized for the fused graph is refused for the spilled one (another graph)."""

import json
import sys
from pathlib import Path

import onnx
import pytest

from stepsim.cli import main

sys.path.insert(0, str(Path(__file__).parent))
from test_spill import diamond  # noqa: E402


@pytest.fixture()
def model(tmp_path):
    p = tmp_path / "diamond.onnx"
    onnx.save(diamond(), p)
    return p


def _json(capsys, *args) -> dict:
    assert main([*args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("flags, sized, unbounded, changed", [
    ([], 289, 289, 12),  # fused: every FIFO one deep keeps the unbounded run's cycles
    (["--no-fuse"], 551, 547, 24),  # three edges spilled: within the 1 % slack of the unbounded run
])
def test_size_fifos_lowers_the_model_and_run_reads_the_file_back(model, tmp_path, capsys, flags, sized, unbounded,
                                                                 changed):
    depths = tmp_path / "depths.toml"
    report = _json(capsys, "size-fifos", str(model), "--out", str(depths), "--jobs", "1", *flags)
    assert (report["cycles"], report["unbounded_cycles"], report["uniform_depth"], report["channels_changed"]) == (
        sized, unbounded, 1, changed)
    assert (tmp_path / "depths.png").is_file()
    row = _json(capsys, "run", str(model), "--fifo-depths", str(depths), *flags)
    assert row["cycles"] == sized


def test_a_file_sized_for_the_fused_graph_is_refused_for_the_spilled_one(model, tmp_path, capsys):
    depths = tmp_path / "depths.toml"
    _json(capsys, "size-fifos", str(model), "--out", str(depths), "--jobs", "1")
    assert main(["run", str(model), "--fifo-depths", str(depths), "--no-fuse"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"stepsim: error: {depths}: FIFO depths made for another graph "
                                               f"(diamond, fingerprint ")
    assert err[0].endswith("; size this workload with stepsim size-fifos")
