"""No ``--json`` output and no JSON file of the command line is invalid JSON (issue 44: ``--iteration-latency
1e308`` printed ``NaN`` / ``Infinity``, which JSON has not): each goes through ``stepsim.base.ranges.json_text``,
which writes a non-finite number as ``null``.

The path test feeds every JSON-writing path a NaN, an infinity and a minus infinity: the module's ``json_text``
is wrapped to add them to what the command writes (nested), then the command's standard output and files must
parse with a reader that refuses ``NaN`` / ``Infinity``, with those values ``null`` and the command's own keys
kept. The source test checks no other JSON writer is left in the command line's modules."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from stepsim.base import ranges
from stepsim.cli import main

REPO = Path(__file__).resolve().parents[2]
INJECTED = {"nan": float("nan"), "deep": [float("inf"), {"x": -float("inf")}, np.float64("nan")]}


def strict_loads(text: str):
    """``json.loads`` that refuses NaN / Infinity (as JSON itself does)."""
    def refuse(name):
        raise ValueError(f"not JSON: {name}")

    return json.loads(text, parse_constant=refuse)


def _inject(real):
    def json_text(obj, **kwargs):
        if isinstance(obj, dict):
            obj = {**obj, "injected": INJECTED}
        elif isinstance(obj, list):
            obj = [*obj, {"injected": INJECTED}]
        return real(obj, **kwargs)

    return json_text


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """A small MoE run folder, a routing trace, a request trace and a small ONNX block."""
    import subprocess
    import sys

    d = tmp_path_factory.mktemp("json")
    np.savez(d / "r8.npz", data=np.array([[0, 1], [2, 3], [4, 5], [6, 7]] * 4, dtype=np.int64))
    (d / "req.csv").write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n"
                               "2023-11-16 18:15:47.6805900,37,4\n")
    subprocess.run([sys.executable, str(REPO / "examples" / "onnx_blocks.py"), "llama", str(d / "block.onnx")],
                   check=True, capture_output=True)
    assert main(["run", "moe", "--model", "custom", "--hidden", "64", "--intermediate", "64", "--experts", "8",
                 "--top-k", "2", "--trace", str(d / "r8.npz"), "--out", str(d / "run1")]) == 0
    return d


#: (command line, the modules whose json_text it calls, JSON files it writes (relative), a key of its own output)
PATHS = [
    ("metrics moe --model custom --hidden 64 --intermediate 64 --experts 8 --top-k 2 --trace r8.npz --json",
     ["stepsim.cli.record_output"], [], "off_chip_bytes"),
    ("run moe --model custom --hidden 64 --intermediate 64 --experts 8 --top-k 2 --trace r8.npz --json --report",
     ["stepsim.cli.record_output"], [], "record"),
    ("models show qwen --json", ["stepsim.cli.models"], [], "hidden"),
    ("models list --json", ["stepsim.cli.models"], [], None),
    ("trace inspect r8.npz --num-experts 8 --json", ["stepsim.cli.trace"], [], "rows"),
    ("compare run1 run1 --json", ["stepsim.cli.compare"], [], "regressed"),
    ("report run1 --json", ["stepsim.cli.report"], [], "bound"),
    ("map ffn --model llama --shape 1 --json --out o/s.json", ["stepsim.cli.map"], ["o/s.json"], "knobs"),
    ("serve --model qwen --requests req.csv --iteration-latency 0.02 --out o --json", ["stepsim.cli.serve"], [],
     "completed"),
    ("optimize block.onnx --out o --json", ["stepsim.cli.optimize", "stepsim.optimize.output"], ["o/optimize.json"],
     "pareto"),
]


@pytest.mark.parametrize(("command", "modules", "files", "key"), PATHS, ids=[p[0].split(" --")[0] for p in PATHS])
def test_every_json_path_writes_non_finite_numbers_as_null(inputs, tmp_path, monkeypatch, capsys, command, modules,
                                                          files, key):
    import importlib

    for name in ("r8.npz", "req.csv", "block.onnx", "run1"):
        (tmp_path / name).symlink_to(inputs / name)
    monkeypatch.chdir(tmp_path)
    for name in modules:
        module = importlib.import_module(name)
        monkeypatch.setattr(module, "json_text", _inject(ranges.json_text))
    capsys.readouterr()
    assert main(shlex.split(command)) == 0
    out = capsys.readouterr().out
    doc = strict_loads(out[out.index("{") if key is not None else out.index("["):])
    outputs = [doc, *(strict_loads((tmp_path / f).read_text()) for f in files)]
    for d in outputs:
        item = d if isinstance(d, dict) else d[-1]
        assert item["injected"] == {"nan": None, "deep": [None, {"x": None}, None]}
    if key is not None:
        assert key in doc


def test_json_text_writes_null_for_every_non_finite_number():
    value = {"a": float("nan"), "b": [1.5, float("inf"), np.float64("-inf"), np.int64(3)], "c": np.array([1.0, np.nan]),
             "d": (True, None, "x"), "e": np.float32("nan")}
    assert ranges.json_text(value) == ('{"a": null, "b": [1.5, null, null, 3], "c": [1.0, null], '
                                       '"d": [true, null, "x"], "e": null}')


def test_compare_json_of_a_nan_metric_is_valid_json(tmp_path, capsys):
    """A real non-finite number (a records file with a NaN metric): compare fails it and prints valid JSON."""
    row = {"run_id": ["r"], "workload": ["moe"], "params": ["{}"], "config": ['{"workload": "moe"}'],
           "cycles": [100.0], "off_chip_bytes": [10], "on_chip_bytes": [5], "compute_utilization": [0.5],
           "off_chip_bw_utilization": [0.5]}
    pq.write_table(pa.table(row), tmp_path / "a.parquet")
    pq.write_table(pa.table({**row, "cycles": [float("nan")]}), tmp_path / "b.parquet")
    code = main(["compare", str(tmp_path / "a.parquet"), str(tmp_path / "b.parquet"), "--json"])
    doc = strict_loads(capsys.readouterr().out)
    assert (code, doc["regressed"]) == (1, True), doc
    assert '"invalid": "NaN"' in json.dumps(doc)  # the candidate's cycles named, as a string


#: JSON written for other reasons than a user's output: the server's spawn spec, state file and socket messages, and
#: a candidate's config in a Parquet column (validated knobs: finite)
OTHER_WRITERS = [("stepsim/cli/server.py", "spec = json.dumps("), ("stepsim/cli/server.py", "json.dump(state, f)"),
                 ("stepsim/cli/server_client.py", "data = json.dumps(message)"),
                 ("stepsim/optimize/output.py", "json.dumps(c.config, sort_keys=True)")]


def test_no_other_json_writer_in_the_command_line():
    """Every JSON the command line prints or writes for a user goes through json_text."""
    found = []
    for path in [*(REPO / "stepsim" / "cli").glob("*.py"), REPO / "stepsim/insight/report.py",
                 REPO / "stepsim/insight/compare.py", REPO / "stepsim/optimize/output.py",
                 REPO / "stepsim/reproduce/output.py"]:
        rel = str(path.relative_to(REPO))
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"\bjson\.dumps?\(", line) and not any(rel == f and text in line for f, text in OTHER_WRITERS):
                found.append(f"{rel}:{n}: {line.strip()}")
    assert found == []
