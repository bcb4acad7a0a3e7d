"""The resident command server (``stepsim server``): a command run in it prints exactly what it prints in its own
process, gets its working folder, environment, exit status and signals, and a server is only used by the
environment it was started for.

Each test module starts one server in a private folder of its own (``STEPSIM_SERVER_DIR``), so a server the
user may be running is never touched.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from stepsim.cli import server_client as client

STEPSIM = [sys.executable, "-m", "stepsim"]
#: wall-time keys of a run record (they differ between any two runs)
TIMING_KEYS = ("build_s", "metrics_s", "lower_s", "compile_s", "sim_wall_s", "total_s")


def _short_folder():
    """A private folder under /tmp, removed afterwards: pytest's own are too deep for a socket path (at most 107
    bytes)."""
    return tempfile.TemporaryDirectory(prefix="stepsim-test-", dir="/tmp")


@pytest.fixture
def short_folder():
    with _short_folder() as folder:
        yield folder


@pytest.fixture(scope="module")
def server_env():
    """The environment of this module's commands: a private server folder, forwarding on; a server is started in
    it for the module and stopped afterwards."""
    with _short_folder() as folder:
        env = dict(os.environ, STEPSIM_SERVER_DIR=folder)
        env.pop("STEPSIM_SERVER", None)
        start = subprocess.run([*STEPSIM, "server", "start", "--idle-timeout", "300"], env=env, capture_output=True,
                               text=True, cwd=folder)
        assert start.returncode == 0, start.stderr
        assert start.stdout.startswith("stepsim server: ready (pid ")
        yield env
        stop = subprocess.run([*STEPSIM, "server", "stop"], env=env, capture_output=True, text=True, cwd=folder)
        assert stop.stdout.startswith("stepsim server: stopped pid ")


def _ping(env) -> dict:
    proc = subprocess.run([*STEPSIM, "server", "status", "--json"], env=env, capture_output=True, text=True,
                          cwd=env["STEPSIM_SERVER_DIR"])
    (mine,) = [s for s in json.loads(proc.stdout)["servers"] if s["serves_this_environment"]]
    return mine


def _run(args, env, cwd, **kwargs):
    return subprocess.run([*STEPSIM, *args], env=env, cwd=cwd, capture_output=True, text=True, **kwargs)


def test_a_command_in_the_server_prints_what_it_prints_alone(server_env):
    cwd = server_env["STEPSIM_SERVER_DIR"]
    served = _ping(server_env)["served"]
    in_server = _run(["run", "swiglu", "--json"], server_env, cwd)
    alone = _run(["run", "swiglu", "--json"], dict(server_env, STEPSIM_SERVER="off"), cwd)
    assert _ping(server_env)["served"] == served + 1  # the first ran in the server, the second did not
    assert (in_server.returncode, in_server.stderr) == (alone.returncode, alone.stderr) == (0, "")
    a, b = json.loads(in_server.stdout), json.loads(alone.stdout)
    for record in (a, b):
        for key in TIMING_KEYS:
            assert record.pop(key) >= 0
    assert a == b


def test_errors_exit_status_and_working_folder(server_env, tmp_path):
    served = _ping(server_env)["served"]
    bad = _run(["run", "swiglu", "--batch-id", "-3"], server_env, tmp_path)
    assert (bad.returncode, bad.stdout, bad.stderr) == (2, "", "stepsim: error: --batch-id must be an int >= 0, "
                                                                "got -3\n")
    out = _run(["run", "swiglu", "--out", "result.parquet"], server_env, tmp_path)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "result.parquet").is_file()  # relative to the caller's folder, not the server's
    assert _ping(server_env)["served"] == served + 2


def test_another_environment_runs_alone(server_env):
    cwd = server_env["STEPSIM_SERVER_DIR"]
    served = _ping(server_env)["served"]
    other = _run(["run", "swiglu", "--json"], dict(server_env, STEPSIM_TEST_VARIANT="1"), cwd)
    assert other.returncode == 0, other.stderr
    assert _ping(server_env)["served"] == served  # a STEPSIM_* variable changes the fingerprint


def test_fingerprint_follows_code_and_environment(monkeypatch, tmp_path):
    base = client.fingerprint()
    assert client.fingerprint() == base
    monkeypatch.setenv("NUMBA_OPT", "1")
    assert client.fingerprint() != base
    monkeypatch.delenv("NUMBA_OPT")
    monkeypatch.setattr(sys, "path", [*sys.path, str(tmp_path)])
    assert client.fingerprint() != base


@pytest.fixture(scope="module")
def long_trace(server_env) -> Path:
    """A Mixtral routing trace of 16,384 tokens (static 16-token tiles simulate for many seconds)."""
    path = Path(server_env["STEPSIM_SERVER_DIR"]) / "routing.arrow"
    _run(["trace", "synth", "routing", "--model", "mixtral", "--tokens", "16384", "--seed", "1", "--out",
          str(path)], dict(server_env, STEPSIM_SERVER="off"), "/", check=True)
    return path


def _long_run(server_env, long_trace, tmp_path) -> subprocess.Popen:
    """A long simulation started through the server; returns once the server runs it."""
    served = _ping(server_env)["served"]
    proc = subprocess.Popen([*STEPSIM, "run", "moe", "--model", "mixtral", "--trace", str(long_trace), "--tiling",
                             "static", "--tile-n", "16", "--channel-depth", "1024", "--out", "out"],
                            env=server_env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while _ping(server_env)["served"] == served and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _ping(server_env)["commands_running"] == 1
    time.sleep(1.0)  # into the simulation
    return proc


@pytest.mark.slow
@pytest.mark.parametrize(("signum", "status", "line"), [(signal.SIGINT, 130, "stepsim: interrupted"),
                                                        (signal.SIGTERM, 143, "stepsim: terminated")])
def test_signals_reach_the_command(server_env, long_trace, tmp_path, signum, status, line):
    proc = _long_run(server_env, long_trace, tmp_path)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=30)
    assert (proc.returncode, err) == (status, line + "\n")
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


@pytest.mark.slow
def test_a_killed_caller_stops_its_command(server_env, long_trace, tmp_path):
    proc = _long_run(server_env, long_trace, tmp_path)
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 30
    while _ping(server_env)["commands_running"] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _ping(server_env)["commands_running"] == 0


def test_start_refuses_a_folder_others_can_enter(short_folder, tmp_path):
    folder = short_folder
    Path(folder).chmod(0o755)
    proc = _run(["server", "start"], dict(os.environ, STEPSIM_SERVER_DIR=folder), tmp_path)
    assert (proc.returncode, proc.stderr) == (2, f"stepsim: error: server folder {folder} is open to other users "
                                                 f"(mode 755; it must be 700) (STEPSIM_SERVER_DIR chooses another)\n")


def test_idle_server_ends_and_removes_its_socket(short_folder, tmp_path):
    folder = short_folder
    env = dict(os.environ, STEPSIM_SERVER_DIR=folder)
    start = _run(["server", "start", "--idle-timeout", "1"], env, tmp_path)
    assert start.returncode == 0, start.stderr
    deadline = time.monotonic() + 30
    while any(n.endswith(".sock") for n in os.listdir(folder)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert os.listdir(folder) == []  # socket, state file and (empty) log removed
    status = _run(["server", "status"], env, tmp_path)
    assert status.stdout == f"stepsim server: none in {folder}\n"


@pytest.mark.parametrize("flag, value, message", [  # * nan was taken (a server that never idled out)
    ("--idle-timeout", "0", "--idle-timeout must be a positive number of seconds, got 0.0"),
    ("--idle-timeout", "nan", "--idle-timeout must be a positive number of seconds, got nan"),  # *
    ("--idle-timeout", "inf", "--idle-timeout must be a positive number of seconds, got inf"),  # *
    ("--idle-timeout", "-3", "--idle-timeout must be a positive number of seconds, got -3.0"),
    ("--idle-timeout", "1e300", "--idle-timeout must be at most 2**32 s (about 136 years; beyond it float64 seconds "
                                "are coarser than a microsecond), got 1e+300"),  # *
    ("--wait", "nan", "--wait must be a positive number of seconds, got nan"),  # *
    ("--wait", "0", "--wait must be a positive number of seconds, got 0.0"),
])
def test_bad_start_flags(tmp_path, flag, value, message):
    proc = _run(["server", "start", flag, value], os.environ, tmp_path)
    assert (proc.returncode, proc.stderr, proc.stdout) == (2, f"stepsim: error: {message}\n", "")


def test_a_refused_command_runs_in_its_own_process(short_folder, monkeypatch):
    """A server that does not start the command (here one that refuses every request) makes the program run it
    itself: forward() returns None and nothing was run twice."""
    folder = short_folder
    monkeypatch.setenv("STEPSIM_SERVER_DIR", folder)
    monkeypatch.delenv("STEPSIM_SERVER")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(client.socket_path(folder, client.fingerprint()))
    listener.listen(1)
    requests = []

    def refuse():
        conn, _ = listener.accept()
        client.send_message(conn, {"hello": os.getpid()})  # the greeting a caller waits for before it sends
        request, fds = client.recv_message(conn, max_fds=3)
        for fd in fds:
            os.close(fd)
        requests.append((request["run"], len(fds)))
        client.send_message(conn, {"refused": "test"})
        conn.close()

    server = threading.Thread(target=refuse)
    server.start()
    try:
        assert client.forward(["stepsim", "run", "swiglu"]) is None
    finally:
        server.join(10)
        listener.close()
    assert requests == [(["run", "swiglu"], 3)]
