"""``optimize --force``: a candidate whose estimated engine events are over the limit (stepsim.kernels.run_size)
is a failed candidate whose reason names the estimate, and is simulated with --force. The limit is lowered with
STEPSIM_MAX_EVENTS to 29,000 events, between the attention candidates of a B=16 window (27,391 to 30,113)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from stepsim.optimize import optimize

pytestmark = pytest.mark.traces

WINDOW = "conv_stdev0174_1845_1860.npy"
#: the full front of this window (tests/optimize/test_optimize_cli.py): (strategy, regions, cycles)
FULL_FRONT = [("interleave", 16, 4724), ("interleave", 8, 6301), ("interleave", 4, 11754), ("dynamic", 2, 23094),
              ("interleave", 2, 23332), ("coarse", 1, 44691)]


def _refusal(estimate: str) -> str:
    return (f"this run needs up to {estimate} engine events, under a second at 1e+06 events/s; the limit is 29,000 "
            f"(check the model dimensions), --force runs it anyway")


def test_refused_candidates_fail_with_the_estimate(shared_traces, tmp_path, serial, monkeypatch):
    monkeypatch.setenv("STEPSIM_MAX_EVENTS", "29000")
    result = optimize("attention", out=tmp_path / "opt", executor=serial,
                      trace=str(shared_traces / "kv_lengths" / "b16" / WINDOW))
    failed = {(c.config["strategy"], c.config["regions"]): c.error for c in result.candidate_list
              if c.status == "failed"}
    assert failed == {("interleave", 16): _refusal("2.92e+04"), ("dynamic", 1): _refusal("3.00e+04"),
                      ("dynamic", 2): _refusal("3.01e+04"), ("dynamic", 4): _refusal("3.04e+04"),
                      ("dynamic", 8): _refusal("3.08e+04"), ("dynamic", 16): _refusal("3.18e+04")}
    # the front of what could run: the full front without its refused points
    assert [(c.config["strategy"], c.config["regions"], c.cycles) for c in result.front] == [
        p for p in FULL_FRONT if (p[0], p[1]) not in failed]


def test_force_simulates_them(shared_traces, tmp_path):
    out = tmp_path / "opt"
    env = {**os.environ, "STEPSIM_SERVER": "off", "STEPSIM_MAX_EVENTS": "29000"}
    proc = subprocess.run([sys.executable, "-m", "stepsim", "optimize", "attention", "--trace",
                           str(shared_traces / "kv_lengths" / "b16" / WINDOW), "--jobs", "2", "--out", str(out),
                           "--json", "--force"], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["failed_simulations"] == 0
    assert [(p["config"]["strategy"], p["config"]["regions"], p["cycles"]) for p in doc["pareto"]] == FULL_FRONT
