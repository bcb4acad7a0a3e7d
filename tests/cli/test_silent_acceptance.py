"""Inputs that used to be accepted silently (a conflict settled by flag order, an empty path, a truncated depth,
a target of the wrong type, a program that exits, a damaged or moved run folder, a program edited after its run):
each is now one precise line, exit 2 (CLI) or a typed error (Python), never a traceback."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

from stepsim.base.errors import ArgumentError
from stepsim.cli import main

E = "stepsim: error: "
EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "user_graph.py")

CLI_CASES = [
    ("run decoder --one-head --kv-heads 2", E + "--one-head and --kv-heads 2 conflict: --one-head simulates 1 KV head; "
                                               "give one of them"),
    ("run decoder --kv-heads 2 --one-head", E + "--one-head and --kv-heads 2 conflict: --one-head simulates 1 KV head; "
                                               "give one of them"),
    ("run swiglu --timeline ''", E + "--timeline: empty path; give a file name ending in .json, .json.gz, .pftrace "
                                     "or .perfetto-trace"),
    ("run swiglu --deadlock-report ''", E + "--deadlock-report: empty path"),
    ("run exits.py:at_import", E + "program 'exits.py:at_import': importing exits.py called sys.exit(0); a program "
                                   "returns a Graph or Workload instead"),
    ("run calls_exit.py:build", E + "program 'calls_exit.py:build': build() called sys.exit(3); it must return a "
                                    "stepsim Graph or Workload"),
]


@pytest.fixture
def folder(tmp_path, monkeypatch):
    (tmp_path / "exits.py").write_text("import sys\nsys.exit(0)\ndef at_import():\n    pass\n")
    (tmp_path / "calls_exit.py").write_text("import sys\ndef build():\n    sys.exit(3)\n")
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("command, last", CLI_CASES, ids=[c[0] for c in CLI_CASES])
def test_cli_silent_acceptance_is_one_line(folder, capsys, command, last):
    import shlex

    status = main(shlex.split(command))
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert (status, err.splitlines()[-1]) == (2, last)
    assert sorted(p.name for p in folder.iterdir()) == ["calls_exit.py", "exits.py"]  # nothing written


def _workload():
    from stepsim.workloads.config import workload_from_config

    return workload_from_config({"workload": "swiglu"})


API_CASES = [
    ("float depth", lambda s: s(_workload(), channel_depth=2.5),
     "simulate: channel_depth must be an int >= 1 (elements) or None (1024), got 2.5 (float)"),
    ("bool depth", lambda s: s(_workload(), channel_depth=True),
     "simulate: channel_depth must be an int >= 1 (elements) or None (1024), got True (bool)"),
    ("zero depth", lambda s: s(_workload(), channel_depth=0),
     "simulate: channel_depth must be an int >= 1 (elements) or None (1024), got 0 (int)"),
    ("None", lambda s: s(None), "simulate: target must be a stepsim Graph or Workload, got NoneType None"),
    ("a path", lambda s: s("swiglu"), "simulate: target must be a stepsim Graph or Workload, got str 'swiglu'"),
    ("max_events 0", lambda s: s(_workload(), max_events=0),
     "simulate: max_events must be an int >= 1 or None (no limit), got 0"),
    ("max_events float", lambda s: s(_workload(), max_events=1e6),
     "simulate: max_events must be an int >= 1 or None (no limit), got 1000000.0"),
]


@pytest.mark.parametrize("name, call, message", API_CASES, ids=[c[0] for c in API_CASES])
def test_python_api_types_are_checked(name, call, message):
    from stepsim.simulation.simulate import simulate

    with pytest.raises(ArgumentError) as err:
        call(simulate)
    assert str(err.value) == message


def test_a_depth_given_as_int_still_runs():
    from stepsim.simulation.simulate import simulate

    assert simulate(_workload(), channel_depth=np.int64(2), max_events=10**9).cycles == \
        simulate(_workload(), channel_depth=2).cycles


# --- report: damaged, moved and stale run folders -------------------------------------------------------------
@pytest.fixture
def run_folder(tmp_path, monkeypatch):
    """A MoE run whose trace was given by a relative path (from tmp_path)."""
    from stepsim.trace_io.synthetic import synthetic_routing

    table = synthetic_routing(64, 8, 2, seed=1)
    np.savez(tmp_path / "r8.npz",
             data=np.stack(table.column("expert_ids").to_numpy(zero_copy_only=False)).astype(np.int64))
    monkeypatch.chdir(tmp_path)
    assert main(["run", "moe", "--model", "custom", "--hidden", "64", "--intermediate", "64", "--experts", "8",
                 "--top-k", "2", "--trace", "r8.npz", "--out", "run"]) == 0
    return tmp_path / "run"


def test_report_of_a_cut_parquet_file_is_one_line(run_folder, capsys):
    part = next(run_folder.glob("part-*.parquet"))
    part.write_bytes(part.read_bytes()[:3000])
    capsys.readouterr()
    assert main(["report", "run"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.splitlines()[-1] == (
        E + f"run/{part.name}: not a readable Parquet table (cut or damaged? Could not open Parquet input source "
            f"'run/{part.name}': Parquet magic bytes not found in footer. Either the file is corrupted or this is not "
            f"a parquet file.); write the run again with stepsim run --out")


def test_report_from_another_folder_finds_a_relative_trace(run_folder, tmp_path, capsys, monkeypatch):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    capsys.readouterr()
    assert main(["report", str(run_folder)]) == 0
    captured = capsys.readouterr()
    assert captured.err == "" and captured.out.startswith("verdict: ")


def test_report_of_an_edited_program_says_the_program_changed(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    shutil.copy(EXAMPLE, tmp_path / "ug.py")
    assert main(["run", "ug.py:silu_rows", "--out", "run"]) == 0
    run_id = next((tmp_path / "run").glob("part-*.parquet")).name[5:21]
    (tmp_path / "ug.py").write_text((tmp_path / "ug.py").read_text() + "\n# edited after the run\n")
    capsys.readouterr()
    assert main(["report", "run"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.splitlines()[-1] == (E + f"the program ug.py:silu_rows changed since the run (its content is part of "
                                        f"the run id {run_id}); run it again, then report")
