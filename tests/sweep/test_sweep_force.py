"""``--force`` on ``run`` and ``sweep``: a run whose estimated engine events are over the limit
(stepsim.kernels.run_size) is refused without it and runs with it; in a sweep the refusal is a failed row whose
error names the estimate (optimize and reproduce: tests/optimize/test_optimize_force.py,
tests/reproduce/test_repro_force.py). The limit is lowered with STEPSIM_MAX_EVENTS to 2,000 so that the refused
point is a small one: SwiGLU with 16 x 16 tiles is estimated at 3,880 events (2,003 real), with 16 x 64 tiles at
1,000 (599 real)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from sweep_helpers import SWIGLU_CYCLES

from stepsim.batch.rows import read_sweep
from stepsim.cli import main

E = "stepsim: error: "
SWEEP = """
workload = "swiglu"
mode = "simulate"
[axes]
tile_m = [16]
tile_n = [16, 64]
"""
REFUSED_SWIGLU = ("this run needs up to 3.88e+03 engine events, under a second at 1e+06 events/s; the limit is 2,000 "
                  "(check the model dimensions), --force runs it anyway")


def _stepsim(args, tmp_path, limit):
    """Run ``stepsim ARGS`` in a fresh process (its workers inherit STEPSIM_MAX_EVENTS) and return it."""
    env = {**os.environ, "STEPSIM_SERVER": "off", "STEPSIM_MAX_EVENTS": str(limit)}
    return subprocess.run([sys.executable, "-m", "stepsim", *args], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=300)


@pytest.mark.parametrize("force", [False, True], ids=["refused point is a failed row", "--force runs it"])
def test_sweep(force, tmp_path):
    (tmp_path / "sweep.toml").write_text(SWEEP)
    out = tmp_path / "results"
    proc = _stepsim(["sweep", "sweep.toml", "--out", str(out), "--jobs", "2", "--no-progress",
                     *(["--force"] if force else [])], tmp_path, 2000)
    assert "Traceback" not in proc.stderr
    assert proc.returncode == (0 if force else 1), proc.stderr  # 1: the sweep finished with a failed task
    rows = {r["tile_n"]: r for r in read_sweep(out).to_pylist()}
    assert rows[64]["status"] == "ok" and rows[64]["cycles"] == SWIGLU_CYCLES[(16, 64)]
    if force:
        assert rows[16]["status"] == "ok" and rows[16]["cycles"] == SWIGLU_CYCLES[(16, 16)]
    else:
        assert {k: rows[16][k] for k in ("status", "error_type", "error_message", "cycles")} == {
            "status": "failed", "error_type": "ConfigError", "error_message": REFUSED_SWIGLU, "cycles": None}


def test_a_bad_limit_is_one_line(tmp_path):
    proc = _stepsim(["run", "swiglu"], tmp_path, "many")
    assert (proc.returncode, proc.stderr.splitlines()[-1]) == (
        2, E + "the environment variable STEPSIM_MAX_EVENTS must be a positive integer (engine events), got 'many'")


@pytest.mark.parametrize("force", [False, True], ids=["refused", "--force"])
def test_run(force, capsys, monkeypatch):
    monkeypatch.setenv("STEPSIM_MAX_EVENTS", "2000")
    status = main(["run", "swiglu", "--tile-m", "16", "--tile-n", "16", "--json", *(["--force"] if force else [])])
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    if force:
        assert status == 0 and f'"cycles": {SWIGLU_CYCLES[(16, 16)]}' in captured.out
    else:
        assert (status, captured.err.splitlines()[-1]) == (2, E + REFUSED_SWIGLU)
