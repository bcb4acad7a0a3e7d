"""A frozen resident server never makes a command wait forever: a command it does not start within the start
timeout is one line (exit 2), Ctrl-C / SIGTERM while waiting for it stop the program at once with their line, and
a command frozen inside the server is killed a grace period after the forwarded signal (the program prints its
stop line). The server is frozen with SIGSTOP (and woken afterwards, then stopped)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

import pytest

STEPSIM = [sys.executable, "-m", "stepsim"]


@pytest.fixture
def server():
    """A server of this environment in a private folder: ``(env, pid)``; stopped (woken first) afterwards."""
    with tempfile.TemporaryDirectory(prefix="stepsim-test-", dir="/tmp") as folder:
        env = dict(os.environ, STEPSIM_SERVER_DIR=folder)
        env.pop("STEPSIM_SERVER", None)
        start = subprocess.run([*STEPSIM, "server", "start", "--idle-timeout", "120"], env=env, capture_output=True,
                               text=True, cwd=folder)
        assert start.returncode == 0, start.stderr
        pid = int(re.match(r"stepsim server: ready \(pid (\d+)", start.stdout).group(1))
        try:
            yield env, pid
        finally:
            os.kill(pid, signal.SIGCONT)
            subprocess.run([*STEPSIM, "server", "stop"], env=env, capture_output=True, text=True, cwd=folder)


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(p) for p in f.read().split()]


#: (case, extra environment, signal sent to the program after 1 s or None, exit status, the exact stderr)
FROZEN = [
    ("no greeting: runs here", {"STEPSIM_SERVER_TIMEOUT": "1"}, None, 0,
     "stepsim: warning: the command server did not answer within 1 s (frozen?); running the command here "
     "(`stepsim server stop` ends the server)\n"),
    ("Ctrl-C while waiting", {"STEPSIM_SERVER_TIMEOUT": "60"}, signal.SIGINT, 130, "stepsim: interrupted\n"),
    ("SIGTERM while waiting", {"STEPSIM_SERVER_TIMEOUT": "60"}, signal.SIGTERM, 143, "stepsim: terminated\n"),
]


@pytest.mark.parametrize("case, extra, signum, status, err", FROZEN, ids=[c[0] for c in FROZEN])
def test_a_frozen_server_is_one_line_not_a_hang(server, tmp_path, case, extra, signum, status, err):
    """The program connects (the kernel queues the connection of a stopped server), waits for the greeting and
    gives up: the command runs in its own process after the warning, or the signal stops the program at once. The
    caller's pipes were never handed to the frozen server, so they close when the program ends."""
    env, pid = server
    os.kill(pid, signal.SIGSTOP)
    alone = subprocess.run([*STEPSIM, "metrics", "swiglu", "--json"], env={**env, "STEPSIM_SERVER": "off"},
                           cwd=tmp_path, capture_output=True, text=True)
    started = time.monotonic()
    proc = subprocess.Popen([*STEPSIM, "metrics", "swiglu", "--json"], env={**env, **extra}, cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if signum is not None:
        time.sleep(1.0)
        proc.send_signal(signum)
    out, got = proc.communicate(timeout=30)
    assert (proc.returncode, got) == (status, err)
    assert json.loads(out)["flops"] == json.loads(alone.stdout)["flops"] if status == 0 else out == ""
    # a connection waits in the frozen server's queue: woken, it finds the caller gone and runs nothing
    os.kill(pid, signal.SIGCONT)
    time.sleep(1.0)
    assert _children(pid) == [] and _served(env) == 0
    if signum is None:
        assert time.monotonic() - started < 15  # 1 s of timeout, then the command alone (a few seconds)
    else:
        assert time.monotonic() - started < 5  # 1 s before the signal, then a moment


def _served(env) -> int:
    proc = subprocess.run([*STEPSIM, "server", "status", "--json"], env=env, capture_output=True, text=True)
    (mine,) = [s for s in json.loads(proc.stdout)["servers"] if s["serves_this_environment"]]
    return mine["served"]


@pytest.mark.slow
@pytest.mark.parametrize(("signum", "status", "line"), [(signal.SIGINT, 130, "stepsim: interrupted\n"),
                                                        (signal.SIGTERM, 143, "stepsim: terminated\n")])
def test_a_command_frozen_in_the_server_is_killed_after_the_grace(server, tmp_path, signum, status, line):
    env, pid = server
    (tmp_path / "ring128.toml").write_text('chips = 128\ntopology = "ring"\nlink_bandwidth = 64\nlink_latency = 500\n')
    proc = subprocess.Popen([*STEPSIM, "run", "collective", "--system", "ring128.toml", "--bytes", "8192"], env=env,
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while not _children(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    (child,) = _children(pid)
    time.sleep(1.0)
    os.kill(child, signal.SIGSTOP)  # the command freezes (the server stays up)
    proc.send_signal(signum)
    sent = time.monotonic()
    out, err = proc.communicate(timeout=30)
    assert (proc.returncode, err) == (status, line)
    assert time.monotonic() - sent < 5  # the 2 s grace, then the kill
    deadline = time.monotonic() + 10
    while _children(pid) and time.monotonic() < deadline:  # the server reaps the killed command
        time.sleep(0.05)
    assert _children(pid) == []
