"""Ctrl-C and SIGTERM stop `stepsim run` and `stepsim reproduce` at once, with one line and the shell's status.

The engine runs in slices (stepsim.kernels.api._call), so a signal during a long simulation takes effect within a
slice (about 0.1 s) instead of after the whole run; the CLI prints ``stepsim: interrupted`` (exit 130) or
``stepsim: terminated`` (exit 143), no traceback, and leaves no partial or temporary file.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

STEPSIM = [sys.executable, "-m", "stepsim"]
#: the runs below take many seconds; the signal comes after this many
SIGNAL_AFTER_S = 3.0
#: the process must be gone this soon after the signal (a slice is ~0.1 s; generous for a loaded machine)
STOP_WITHIN_S = 10.0


@pytest.fixture(scope="module")
def long_trace(tmp_path_factory) -> Path:
    """A Mixtral routing trace of 16,384 tokens: static tiling with 16-token tiles simulates for many seconds."""
    subprocess.run([*STEPSIM, "cache", "warm"], check=True, capture_output=True)  # no compile inside the timing
    path = tmp_path_factory.mktemp("intr") / "routing.arrow"
    subprocess.run([*STEPSIM, "trace", "synth", "routing", "--model", "mixtral", "--tokens", "16384", "--seed", "1",
                    "--out", str(path)], check=True, capture_output=True)
    return path


def _handlers_installed(pid: int) -> bool:
    """True once the process catches SIGTERM: stepsim.cli.main has installed its handlers (a signal before that
    would hit the interpreter's start-up, which is not what these tests are about)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    caught = int(next(line for line in status.splitlines() if line.startswith("SigCgt:")).split()[1], 16)
    return bool(caught & (1 << (signal.SIGTERM - 1)))


def _signal_and_wait(cmd, signum, cwd):
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not _handlers_installed(proc.pid) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(SIGNAL_AFTER_S)  # well into the work (building, lowering, simulating)
    assert proc.poll() is None, "the command ended before the signal: make the run longer"
    proc.send_signal(signum)
    sent = time.monotonic()
    out, err = proc.communicate(timeout=60)
    return proc.returncode, out, err, time.monotonic() - sent


def _no_partial_files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()
                  and (".tmp" in p.name or p.name.startswith(".")))


@pytest.mark.slow
@pytest.mark.parametrize(("signum", "status", "line"), [(signal.SIGINT, 130, "stepsim: interrupted"),
                                                        (signal.SIGTERM, 143, "stepsim: terminated")])
def test_run_stops_during_the_simulation(long_trace, tmp_path, signum, status, line):
    out = tmp_path / "out"
    rc, stdout, stderr, waited = _signal_and_wait(
        [*STEPSIM, "run", "moe", "--model", "mixtral", "--trace", str(long_trace), "--tiling", "static",
         "--tile-n", "16", "--channel-depth", "1024", "--out", str(out)], signum, tmp_path)
    assert (rc, stderr.strip().splitlines()[-1]) == (status, line)
    assert "Traceback" not in stderr
    assert waited < STOP_WITHIN_S
    assert not out.exists() or not any(out.iterdir())  # nothing written: the run never finished


@pytest.mark.slow
@pytest.mark.traces
@pytest.mark.parametrize(("signum", "status", "line"), [(signal.SIGINT, 130, "stepsim: interrupted"),
                                                        (signal.SIGTERM, 143, "stepsim: terminated")])
def test_reproduce_stops_and_leaves_no_partial_file(shared_traces, tmp_path, signum, status, line):
    out = tmp_path / "repro"
    rc, stdout, stderr, waited = _signal_and_wait(
        [*STEPSIM, "reproduce", "all", "--traces", str(shared_traces), "--out", str(out), "--jobs", "1"],
        signum, tmp_path)
    assert (rc, stderr.strip().splitlines()[-1]) == (status, line)
    assert "Traceback" not in stderr
    assert waited < STOP_WITHIN_S
    assert _no_partial_files(out) == [] if out.exists() else True
