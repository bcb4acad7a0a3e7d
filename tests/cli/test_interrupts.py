"""Ctrl-C and SIGTERM stop `stepsim run` and `stepsim reproduce` at once, with one line and the shell's status.

The engine runs in slices (stepsim.kernels.api._call), so a signal during a long simulation takes effect within a
slice (about 0.1 s) instead of after the whole run; the CLI prints ``stepsim: interrupted`` (exit 130) or
``stepsim: terminated`` (exit 143), no traceback, and leaves no partial or temporary file.

At the end: a stopped program ends with its stop's exit status (130 for Ctrl-C, 143 for SIGTERM) and its one line,
wherever the signal landed: also inside code run by ``exec`` of a string, after which CPython would otherwise kill
the process with SIGINT at exit (exit status -2; stepsim.cli._ignore_stop_signals), and inside a library that
turns the signal's exception into its own (numpy's import: an ImportError and a traceback, exit status 1;
stepsim.base.signals.interrupts_raise). Each signal comes at a fixed place of the script, so a case is the same
every run (by timing, under load: 1 in 16 and 1 in 80 stops in a command's first second).
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


#: where the Ctrl-C lands: a command stopped by stepsim.cli itself, and one that prints its own stop line
PLACES = {
    "run": ("import stepsim.cli as place\nplace._compile_notice = interrupted_in_exec\n",
            ["run", "swiglu", "--out", "o"]),
    "sweep": ("import stepsim.batch.config as place\nplace.load_sweep = interrupted_in_exec\n",
              ["sweep", "sw.toml", "--out", "o"]),
}

SCRIPT = """import os, signal, sys, time

def interrupted_in_exec(*args, **kwargs):
    exec("raise KeyboardInterrupt")  # as a Ctrl-C landing in the methods dataclasses makes by exec

def signalled_in_a_library(*args, **kwargs):
    try:  # as numpy's import of its C extension does with a Ctrl-C
        os.kill(os.getpid(), signal.{signame})
        time.sleep(30)
    except KeyboardInterrupt:
        raise ImportError("PyCapsule_Import could not import module 'datetime'") from None

{patch}
from stepsim.cli import main

sys.argv = ["stepsim", *{argv!r}]
raise SystemExit(main())
"""


def _stopped(tmp_path, patch: str, argv: list[str], signame: str = "SIGINT") -> tuple[int, str, str]:
    """(exit status, stderr, stdout) of ``stepsim argv`` run with ``patch`` applied, as ``python -m``."""
    (tmp_path / "sw.toml").write_text('workload = "swiglu"\n[axes]\ntile_m = [16, 32]\n')
    (tmp_path / "stop.py").write_text(SCRIPT.format(patch=patch, argv=argv, signame=signame))
    # run as `python -m`, as the tests run stepsim: a script file's SystemExit ends the process before CPython
    # looks at its mark, a module's does not
    done = subprocess.run([sys.executable, "-m", "stop"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "__pycache__") == ["stop.py", "sw.toml"]
    return done.returncode, done.stderr, done.stdout


@pytest.mark.parametrize("place", sorted(PLACES))
def test_a_ctrl_c_inside_exec_of_a_string_still_exits_130(tmp_path, place):
    assert _stopped(tmp_path, *PLACES[place]) == (130, "stepsim: interrupted\n", "")


@pytest.mark.parametrize(("signame", "status", "line"), [("SIGINT", 130, "stepsim: interrupted\n"),
                                                         ("SIGTERM", 143, "stepsim: terminated\n")])
def test_a_signal_a_library_turned_into_its_own_error_is_the_stop(tmp_path, signame, status, line):
    patch = "import stepsim.cli as place\nplace._compile_notice = signalled_in_a_library\n"
    assert _stopped(tmp_path, patch, ["run", "swiglu", "--out", "o"], signame) == (status, line, "")
