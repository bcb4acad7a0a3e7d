"""Huge inputs: a run's memory and engine events are estimated before the engine starts (refused with the
estimate, or run with --force), and the engine's slices are bounded by work, so that Ctrl-C and SIGTERM act within 0.5 s
whatever the tile sizes, without changing any count."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from stepsim.cli import main
from stepsim.kernels import api

E = "stepsim: error: "
#: 2^30 tiles of the intermediate dimension: an estimated 4.3e9 engine events (a 2^30-wide hidden dimension is
#: few tiles, huge ones: 4,821 estimated events, about a second; tests/kernels/test_event_estimate.py runs it)
HUGE = ["moe", "--model", "custom", "--hidden", "4096", "--intermediate", str(2**30), "--experts", "8", "--top-k",
        "2"]
#: a forced run that keeps the engine busy for minutes (2^24 columns per expert: 6.7e7 estimated events, under
#: the limit, so it needs no --force; the test forces it anyway, as a user of a huge run would)
LONG = ["moe", "--model", "custom", "--hidden", str(2**16), "--intermediate", str(2**24), "--experts", "8",
        "--top-k", "2"]


@pytest.fixture(scope="module")
def routing(tmp_path_factory):
    path = tmp_path_factory.mktemp("huge") / "r8.npz"
    rng = np.random.default_rng(1)
    np.savez(path, data=np.stack([rng.choice(8, 2, replace=False) for _ in range(64)]).astype(np.int64))
    return path


def _last_line(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err.splitlines()[-1]


CASES = [
    (HUGE, E + "this run needs up to 4.29e+09 engine events, about 72 minutes at 1e+06 events/s; the limit is 1e+09 "
               "(check the model dimensions), --force runs it anyway"),
    (["moe", "--model", "custom", "--hidden", "32", "--intermediate", str(2**40), "--experts", "8", "--top-k", "2"],
     E + "--intermediate must be at most 2,147,483,647 (2**31 - 1), got 1099511627776"),
    (["moe", "--model", "custom", "--hidden", str(10**15), "--intermediate", "64", "--experts", "8", "--top-k", "2"],
     E + "--hidden must be at most 2,147,483,647 (2**31 - 1), got 1000000000000000"),
]


@pytest.mark.parametrize("flags, last", CASES, ids=["intermediate 2^30", "intermediate 2^40", "hidden 10^15"])
def test_a_huge_run_is_refused_with_its_estimate(routing, capsys, flags, last):
    assert main(["run", *flags, "--trace", str(routing)]) == 2
    assert _last_line(capsys) == last


def test_a_run_larger_than_memory_is_refused_even_with_force(capsys, monkeypatch):
    monkeypatch.setattr("stepsim.kernels.run_size.available_memory", lambda: 10**9)
    assert main(["run", "swiglu", "--channel-depth", "100000000", "--force"]) == 2
    assert _last_line(capsys) == (E + "this run needs about 96.0 GB of engine memory (1,200,000,000 FIFO slots: the "
                                      "sum of the FIFO depths), more than the 1.0 GB available; use smaller FIFO "
                                      "depths (--channel-depth, the depths file) or model dimensions")


def _wait_until_numba_is_loaded(proc, timeout_s: float = 120.0) -> None:
    """Until ``proc`` has loaded llvmlite's library (numba is imported inside the CLI's signal handlers, so a signal
    from then on is stepsim's to handle). A fixed 1 s wait failed under load: the SIGINT came while the interpreter
    still started up, before the handlers (Python's own KeyboardInterrupt: status -2)."""
    deadline = time.monotonic() + timeout_s
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            if "llvmlite" in Path(f"/proc/{proc.pid}/maps").read_text():
                return
        except FileNotFoundError:  # it has just ended
            return
        time.sleep(0.05)


@pytest.mark.parametrize("signum, line, status", [(signal.SIGINT, "stepsim: interrupted", 130),
                                                  (signal.SIGTERM, "stepsim: terminated", 143)])
def test_a_forced_huge_run_stops_within_half_a_second(routing, tmp_path, signum, line, status):
    out = tmp_path / "run"
    env = {**os.environ, "STEPSIM_SERVER": "off"}
    proc = subprocess.Popen([sys.executable, "-m", "stepsim", "run", *LONG, "--trace", str(routing), "--force",
                             "--out", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    _wait_until_numba_is_loaded(proc)
    if proc.poll() is not None:  # it must still be running (the run takes minutes): say what it did
        out_text, err_text = proc.communicate()
        pytest.fail(f"the run ended before the signal, status {proc.returncode}: {err_text[-2000:]} {out_text[-500:]}")
    sent = time.perf_counter()
    proc.send_signal(signum)
    try:
        _, err = proc.communicate(timeout=10)
    finally:
        proc.kill()
    elapsed = time.perf_counter() - sent
    assert (proc.returncode, err.splitlines()[-1]) == (status, line)
    assert "Traceback" not in err
    assert elapsed < 0.5, f"stopped {elapsed:.2f} s after the signal"
    assert not out.exists() and list(tmp_path.iterdir()) == []  # no run folder, no temp folder


def test_slices_bounded_by_work_change_no_count(routing, monkeypatch):
    # a run whose HBM ticks dominate, cut into slices of a few ticks each, gives the same counts as one slice
    from stepsim.simulation.simulate import simulate
    from stepsim.workloads.config import workload_from_config

    workload = workload_from_config({"workload": "moe", "model": "custom", "hidden": 4096, "intermediate": 64,
                                     "experts": 8, "top_k": 2, "trace": str(routing)})
    whole = simulate(workload)
    monkeypatch.setattr(api, "FIRST_SLICE_WORK", 7)
    monkeypatch.setattr(api, "SLICE_SECONDS", 0.0)  # never grow the slices
    reports = []
    sliced = simulate(workload, progress=lambda events, cycle: reports.append(events))
    # many slices, most ending inside an HBM event (the event count does not move between them)
    assert len(reports) > 1000 and len(set(reports)) < len(reports) / 10
    assert (sliced.cycles, sliced.events, sliced.fires, sliced.off_chip_bytes_read, sliced.off_chip_bytes_written) \
        == (whole.cycles, whole.events, whole.fires, whole.off_chip_bytes_read, whole.off_chip_bytes_written)
    assert np.array_equal(sliced.unit_counters, whole.unit_counters)
    assert np.array_equal(sliced.channel_counters, whole.channel_counters)
