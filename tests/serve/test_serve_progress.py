"""Progress bars of ``stepsim serve`` (calibrating: layer simulations and pilot replays; serving: requests
finished): drawn on a terminal once the work is slow, never into a pipe, and the results do not depend on them."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from serve_requests import requests_file
from test_exact import SMALL

import stepsim
from stepsim.base import progress as progress_module
from stepsim.base.progress import count_progress
from stepsim.cli import main


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_count_bar_on_a_terminal_after_the_delay_and_nothing_into_a_pipe():
    terminal, pipe, early = _Terminal(), io.StringIO(), _Terminal()
    with count_progress("serving (exact)", "requests", total=200, after_s=0.0, stream=terminal) as update:
        update(17, "step 412")
    with count_progress("serving (exact)", "requests", total=200, after_s=0.0, stream=pipe) as update:
        update(17, "step 412")
    with count_progress("serving (exact)", "requests", total=200, after_s=3600.0, stream=early) as update:
        update(17, "step 412")
    assert "serving (exact):   8%|" in terminal.getvalue() and "| 17/200 [" in terminal.getvalue()
    assert "step 412" in terminal.getvalue()
    assert (pipe.getvalue(), early.getvalue()) == ("", "")


@pytest.fixture
def small_run(tmp_path):
    model = tmp_path / "small.json"
    model.write_text(json.dumps(SMALL))
    rng = np.random.default_rng(3)
    trace = requests_file(tmp_path / "t.parquet", np.sort(rng.uniform(0, 0.05, 24)), rng.integers(5, 400, 24),
                          rng.integers(2, 30, 24))
    return str(model), trace


def test_fast_serve_shows_the_calibration_and_the_replay_and_writes_the_same_results(small_run, tmp_path,
                                                                                    monkeypatch):
    model, trace = small_run
    plain = stepsim.serve(model, trace, fidelity="fast", calibration_cache=tmp_path / "plain")
    terminal = _Terminal()
    monkeypatch.setattr(progress_module, "SHOW_AFTER_S", 0.0)
    monkeypatch.setattr("sys.stderr", terminal)
    shown = stepsim.serve(model, trace, fidelity="fast", calibration_cache=tmp_path / "shown", progress=True)
    text = terminal.getvalue()
    simulations = plain.summary["fidelity"]["error"]["calibration_simulations"]
    assert f"calibrating: {simulations} layer simulations" in text, text[-400:]
    assert "pilot replay: 24 requests served" in text and "simulating sampled steps exactly" in text
    assert "serving (fast): 100%|" in text and "| 24/24 [" in text and "step 384" in text
    assert shown.requests.equals(plain.requests) and shown.iterations.equals(plain.iterations)
    assert {**shown.summary, "wall_s": 0} == {**plain.summary, "wall_s": 0}


def test_the_cli_draws_its_bar_on_a_terminal_only(small_run, tmp_path, capsys, monkeypatch):
    model, trace = small_run
    argv = ["serve", "--model", model, "--requests", str(trace), "--iteration-latency", "0.02", "--out"]
    monkeypatch.setattr(progress_module, "SHOW_AFTER_S", 0.0)
    assert main([*argv, str(tmp_path / "piped")]) == 0
    assert capsys.readouterr().err == ""
    terminal = _Terminal()
    monkeypatch.setattr("sys.stderr", terminal)
    assert main([*argv, str(tmp_path / "shown")]) == 0
    assert "serving (iteration-latency): 100%|" in terminal.getvalue() and "| 24/24 [" in terminal.getvalue()
