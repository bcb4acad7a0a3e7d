"""Remote failures in one line: a ``--address`` that is malformed, where nothing listens, or where something that is
not a Dask scheduler listens is one line naming the address (was a 57-line traceback, or a wait forever), and
Ctrl-C at the terminal during a Dask sweep prints stepsim's line only (the workers ignore SIGINT; was Dask's
tracebacks from every worker)."""

from __future__ import annotations

import http.server
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

pytest.importorskip("distributed", reason="the dask extra is not installed: pip install 'stepsim[dist]'")

from stepsim.batch import dask_executor  # noqa: E402 - after the importorskip
from stepsim.cli import main  # noqa: E402

E = "stepsim: error: "
STEPSIM = [sys.executable, "-m", "stepsim"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def http_port():
    """An HTTP server on loopback: it accepts the connection and never speaks Dask."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()


@pytest.fixture
def sweep_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sw.toml").write_text('workload = "swiglu"\n[axes]\ntile_m = [16, 32]\n')
    return tmp_path


#: (address, the exact last line of stderr); {closed}: a port nothing listens on, {http}: the HTTP server's port
CASES = [
    ("foo", E + "cannot connect to the Dask scheduler at foo: missing port number in address 'foo'"),
    ("http://127.0.0.1:9", E + "cannot connect to the Dask scheduler at http://127.0.0.1:9: unknown address scheme "
                               "'http' (known schemes: ['inproc', 'tcp', 'tls', 'ucx', 'ws', 'wss'])"),
    ("tcp://127.0.0.1:{closed}", E + "cannot connect to the Dask scheduler at tcp://127.0.0.1:{closed}: [Errno 111] "
                                     "Connection refused"),
    ("tcp://127.0.0.1:{http}", E + "cannot connect to the Dask scheduler at tcp://127.0.0.1:{http}: no Dask "
                                   "scheduler answered within 3 s (something else listens there?)"),
]


@pytest.mark.parametrize("address, last", CASES, ids=[c[0] for c in CASES])
def test_a_bad_address_is_one_line(sweep_file, http_port, capsys, monkeypatch, address, last):
    monkeypatch.setattr(dask_executor, "ANSWER_TIMEOUT_S", 3)
    ports = {"closed": _free_port(), "http": http_port}
    start = time.monotonic()
    assert main(["sweep", "sw.toml", "--out", "out", "--address", address.format(**ports)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.splitlines()[-1] == last.format(**ports)
    assert time.monotonic() - start < 10
    # nothing but the sweep's lock (taken before the executor starts; it stays, as after every sweep)
    assert sorted(p.name for p in (sweep_file / "out").iterdir()) == [".stepsim-sweep.lock"]


@pytest.mark.slow
def test_ctrl_c_at_the_terminal_during_a_dask_sweep_is_one_line(tmp_path):
    """SIGINT to the whole process group (what a terminal's Ctrl-C does), workers included."""
    (tmp_path / "sw.toml").write_text('workload = "swiglu"\nmode = "simulate"\n[axes]\ntile_m = [16, 32, 64]\n'
                                      'channel_depth = {start = 1, stop = 400, step = 1}\n')
    env = dict(os.environ, STEPSIM_SERVER="off")
    proc = subprocess.Popen([*STEPSIM, "sweep", "sw.toml", "--out", "out", "--executor", "dask", "--jobs", "2"],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    deadline = time.monotonic() + 120
    while not list((tmp_path / "out").rglob("*.parquet")) and time.monotonic() < deadline:  # tasks are running
        time.sleep(0.2)
    assert proc.poll() is None
    os.killpg(proc.pid, signal.SIGINT)
    # a hang guard, not a speed check (a 5 s limit here failed once at load 2: 22.6 s); that the workers are killed
    # at once and none restarted is the next tests' deterministic check
    _, err = proc.communicate(timeout=120)
    assert "Restarting worker" not in err
    assert proc.returncode == 130
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    assert err.splitlines()[-1] == "stepsim: interrupted"
    assert [p.name for p in (tmp_path / "out").rglob("*") if p.name.endswith(".tmp")] == []


def _gone(pid: int) -> bool:
    """The process ``pid`` has ended (exited or a zombie not yet reaped)."""
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def _holds_the_gil():
    import re

    return re.match(r"(a+)+$", "a" * 40 + "b")


def test_abort_kills_the_local_workers_mid_task_before_closing_and_starts_none():
    """After a stop (Ctrl-C, fail-fast) the executor does not leave the workers' running tasks to Dask's graceful
    close (a sweep took 36 s to exit after Ctrl-C at load 2): the worker processes are killed first, and their
    nannies start none in their place."""
    executor = dask_executor.DaskExecutor(jobs=2)
    pids = [nanny.process.process.pid for nanny in executor._cluster.workers.values()]
    # tasks that hold the GIL (a regular expression's catastrophic backtracking, minutes), as a compiled
    # simulation does: their workers' event loops cannot answer a close until they end
    futures = [executor._client.submit(_holds_the_gil, pure=False) for _ in pids]
    deadline = time.monotonic() + 60
    while sum(map(len, executor._client.processing().values())) < len(pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(pids) == 2 and not any(f.done() for f in futures)
    gone_at_close = []
    close = executor.close

    def closing():
        deadline = time.monotonic() + 5
        while not all(map(_gone, pids)) and time.monotonic() < deadline:
            time.sleep(0.05)
        gone_at_close.append([_gone(pid) for pid in pids])
        close()

    executor.close = closing
    restarts = []  # the nanny's warning when it starts a worker in place of one that exited
    handler = logging.Handler()
    handler.emit = lambda record: restarts.append(record.getMessage())
    nanny_log = logging.getLogger("distributed.nanny")
    nanny_log.addHandler(handler)
    try:
        executor.abort()
    finally:
        nanny_log.removeHandler(handler)
    assert gone_at_close == [[True, True]]
    assert [m for m in restarts if m.startswith("Restarting worker")] == []
    assert executor._cluster.workers == {} and executor._cluster.status.name == "closed"


def test_a_local_worker_drops_only_its_heartbeat_failure_record():
    """The worker preload (stepsim.batch.dask_worker_preload): the heartbeat failure a worker logs when the stepsim
    process that holds its scheduler is stopping is dropped, with its traceback; the worker's other records are
    kept."""
    import logging

    from stepsim.batch import dask_worker_preload as preload

    logger = logging.getLogger("distributed.worker")
    seen = []
    handler = logging.Handler()
    handler.emit = seen.append
    logger.addHandler(handler)
    sigint = signal.getsignal(signal.SIGINT)
    try:
        preload.dask_setup(None)
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        try:
            raise OSError("Stream is closed")
        except OSError:
            logger.exception(preload.HEARTBEAT_FAILED)
            logger.exception("Unexpected exception during heartbeat. Closing worker.")
        logger.error("Compute Failed")
        assert [r.getMessage() for r in seen] == ["Unexpected exception during heartbeat. Closing worker.",
                                                  "Compute Failed"]
    finally:
        signal.signal(signal.SIGINT, sigint)
        logger.removeHandler(handler)
        for f in [f for f in logger.filters if isinstance(f, preload.SchedulerGone)]:
            logger.removeFilter(f)

