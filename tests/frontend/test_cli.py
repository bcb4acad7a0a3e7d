"""``stepsim metrics model.onnx`` and ``stepsim run model.onnx [--functional --check]`` (issue 33)."""

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import onnx

from stepsim.cli import main
from stepsim.frontend import from_onnx
from stepsim.results.records import run_identity
from stepsim.simulation.simulate import simulate

sys.path.insert(0, str(Path(__file__).parent))
from test_blocks import gpt2_block, llama_block  # noqa: E402


def _json(capsys, *args) -> dict:
    assert main([*args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_metrics_and_run_of_an_onnx_file_equal_the_python_api(tmp_path, capsys):
    path = tmp_path / "llama_block.onnx"
    onnx.save(llama_block(), path)
    w = from_onnx(path)
    metrics = _json(capsys, "metrics", str(path))
    assert (metrics["workload"], metrics["program"]) == ("program", str(path))
    assert metrics["off_chip_bytes"] == w.metrics()["off_chip_bytes"]
    assert metrics["on_chip_bytes"] == w.metrics()["on_chip_bytes"]
    row = _json(capsys, "run", str(path))
    assert row["cycles"] == simulate(from_onnx(path)).cycles
    checked = _json(capsys, "run", str(path), "--functional", "--check")
    assert checked["cycles"] == row["cycles"] and checked["check_passed"] is True
    assert checked["check_max_rel_error"] < 1e-6


def test_the_run_id_follows_the_models_content_not_its_path(tmp_path):
    a, b = tmp_path / "a.onnx", tmp_path / "b.onnx"
    onnx.save(llama_block(), a)
    shutil.copy(a, b)
    ident = run_identity({"workload": "program", "program": str(a)})[0]
    assert run_identity({"workload": "program", "program": str(b)})[0] == ident
    onnx.save(gpt2_block(), b)
    assert run_identity({"workload": "program", "program": str(b)})[0] != ident


def test_a_bad_file_is_one_line_and_status_2(tmp_path, capsys):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    assert main(["metrics", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"stepsim: error: {bad}: not a readable ONNX model (") and err.count("\n") == 1
    assert main(["run", str(tmp_path / "none.onnx")]) == 2
    assert capsys.readouterr().err == f"stepsim: error: {tmp_path / 'none.onnx'}: no such ONNX file\n"


def test_a_whole_model_runs_with_seeded_token_ids(tmp_path, capsys):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
    from onnx_models import MODELS

    path = tmp_path / "llama_decode.onnx"
    onnx.save(MODELS["llama"](past=7), path)
    row = _json(capsys, "run", str(path), "--functional", "--check")
    assert row["check_passed"] is True and row["check_max_rel_error"] < 2e-6
    w = from_onnx(path, values="seeded")
    assert row["cycles"] == simulate(w).cycles
    assert w.frontend.bound["input_ids"].tolist() == np.random.default_rng(0).integers(0, 128, (2, 1)).tolist()
