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


def test_a_count_bar_redraws_at_most_every_redraw_s_and_ends_on_the_last_count(monkeypatch):
    """A serving step is microseconds: drawing each would cost more than the replay. With REDRAW_S an hour, 10,000
    updates draw the bar when it appears (tqdm's own line, then the first count) and the last count at the end."""
    monkeypatch.setattr(progress_module, "REDRAW_S", 3600.0)
    terminal = _Terminal()
    with count_progress("serving (fast)", "requests", total=10_000, after_s=0.0, stream=terminal) as update:
        for done in range(1, 10_001):
            update(done, f"step {done}")
    draws = [line for line in terminal.getvalue().split("\r") if line.startswith("serving")]
    assert len(draws) == 3 and "| 0/10000 [" in draws[0] and "| 1/10000 [" in draws[1] and "step 1]" in draws[1]
    assert draws[2].startswith("serving (fast): 100%|") and "| 10000/10000 [" in draws[2] and "step 10000]" in draws[2]


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
    plain = stepsim.serve(model, trace, fidelity="fast", schedule="paper", calibration_cache=tmp_path / "plain")
    terminal = _Terminal()
    monkeypatch.setattr(progress_module, "SHOW_AFTER_S", 0.0)
    monkeypatch.setattr("sys.stderr", terminal)
    shown = stepsim.serve(model, trace, fidelity="fast", schedule="paper", calibration_cache=tmp_path / "shown", progress=True)
    text = terminal.getvalue()
    calibration = shown.summary["fidelity"]["calibration"]
    record = json.loads((tmp_path / "shown" / f"{calibration}.json").read_text())
    simulations = record["stats"]["simulations"]  # both passes' exact layer simulations, fitted and held out
    last = [line for line in text.split("\r") if line.startswith("calibrating:")][-1]
    assert last.startswith(f"calibrating: {simulations} layer simulations ["), last
    # drawn at once (after_s 0): the first pilot step's note; then at most every REDRAW_S, and the last state at
    # the end (the exact simulations come last)
    assert "calibrating: 0 layer simulations [00:00, ? layer simulations/s, pilot replay: 0 requests served]" in text
    assert last.endswith(", simulating sampled steps exactly]"), last
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
