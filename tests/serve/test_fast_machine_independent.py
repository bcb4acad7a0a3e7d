"""Fast mode gives the same outputs on any x86-64 machine (issue 44): its fits (stepsim.serve.exact_lstsq) use no
BLAS, so the calibration and the replay it prices are bit-identical whatever kernel OpenBLAS picks for the CPU
(``OPENBLAS_CORETYPE``: Haswell's AVX2 against Prescott's SSE3, as two machines would) and however many threads
it, OpenMP or MKL use. ``np.linalg.lstsq`` here moved the coefficients' last bits and, through whole-cycle
rounding, the replay's steps (requests.parquet and iterations.parquet differed between those two settings)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from stepsim.serve.exact_lstsq import numeric_rank, solve

#: the child: a fast serve of test_fast.py's small model on 24 requests, printing what it calibrated and replayed
CHILD = r"""
import json, sys
from pathlib import Path
import numpy as np
import pyarrow.parquet as pq
sys.path.insert(0, sys.argv[1])
from serve_requests import requests_file
from test_exact import SMALL
import stepsim
Path("small.json").write_text(json.dumps(SMALL))
rng = np.random.default_rng(3)
trace = requests_file("t.parquet", np.sort(rng.uniform(0, 0.05, 24)), rng.integers(5, 400, 24),
                      rng.integers(2, 30, 24))
r = stepsim.serve("small.json", trace, out="out", fidelity="fast", calibration_cache="cache")
summary = json.loads(Path("out/summary.json").read_text())
summary.pop("wall_s")
tables = {n: repr(pq.read_table(Path("out") / n).replace_schema_metadata(None).to_pylist())
          for n in ("requests.parquet", "iterations.parquet")}
print(json.dumps({"theta": r.summary["fidelity"]["theta"], "summary": summary, "tables": tables}))
"""

SETTINGS = [{"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
             "OPENBLAS_CORETYPE": "Haswell"},
            {"OPENBLAS_NUM_THREADS": "2", "OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2",
             "OPENBLAS_CORETYPE": "Prescott"}]


def _calibrate(folder: Path, env: dict) -> dict:
    import stepsim

    folder.mkdir()
    root = str(Path(stepsim.__file__).resolve().parents[1])  # the child imports the stepsim under test
    path = os.pathsep.join([root, *filter(None, [os.environ.get("PYTHONPATH")])])
    proc = subprocess.run([sys.executable, "-c", CHILD, str(Path(__file__).parent)], cwd=folder, capture_output=True,
                          text=True, timeout=900,
                          env={**os.environ, **env, "STEPSIM_SERVER": "off", "PYTHONPATH": path})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


@pytest.mark.slow
def test_fast_calibration_and_replay_are_identical_under_two_blas_settings(tmp_path):
    a, b = (_calibrate(tmp_path / f"s{i}", env) for i, env in enumerate(SETTINGS))
    assert json.dumps(a["theta"]) == json.dumps(b["theta"])  # every coefficient to the last bit
    assert a["summary"] == b["summary"]
    assert a["tables"] == b["tables"]
    assert a["summary"]["fidelity"]["mode"] == "fast" and a["summary"]["completed"] == 24


def test_solve_is_lstsqs_minimum_norm_solution():
    """Full rank and rank-deficient (a column repeated, a column of zeros), over columns spanning six decades: the
    solution np.linalg.lstsq returns, to rounding, and the rank np.linalg.matrix_rank finds."""
    rng = np.random.default_rng(0)
    for t in range(120):
        m, n = int(rng.integers(1, 40)), int(rng.integers(1, 12))
        a = rng.standard_normal((m, n)) * 10.0 ** rng.integers(-3, 4, n)
        if t % 3 == 0 and n > 2:
            a[:, -1] = 2 * a[:, 0] + a[:, 1]
        if t % 5 == 0 and n > 1:
            a[:, 1] = 0
        y = rng.standard_normal(m) * 100
        ref = np.linalg.lstsq(a, y, rcond=None)[0]
        assert np.abs(solve(a, y) - ref).max() <= 1e-7 * np.abs(ref).max(), t
        assert numeric_rank(a) == np.linalg.matrix_rank(a), t
    assert solve(np.zeros((3, 2)), np.ones(3)).tolist() == [0.0, 0.0]
    assert solve(np.array([[1.0, 1.0], [1.0, 1.0]]), np.array([2.0, 2.0])).tolist() == pytest.approx([1.0, 1.0], rel=1e-15)  # minimum norm
    assert numeric_rank(np.zeros((0, 3))) == 0


def test_solve_uses_no_blas(monkeypatch):
    """No matrix product or LAPACK call: each would take the machine's BLAS kernel."""
    def refuse(*_, **__):
        raise AssertionError("BLAS used")

    for name in ("dot", "matmul", "inner", "vdot", "einsum"):
        monkeypatch.setattr(np, name, refuse)
    for name in ("lstsq", "svd", "qr", "solve", "matrix_rank", "pinv"):
        monkeypatch.setattr(np.linalg, name, refuse)
    a = np.arange(12.0).reshape(4, 3) ** 1.5
    assert solve(a, np.arange(4.0)).shape == (3,) and numeric_rank(a) == 3
