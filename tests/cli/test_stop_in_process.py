"""Ctrl-C / SIGTERM as the CLI sees them (a KeyboardInterrupt or stepsim.base.signals.Terminated raised inside a
command): one line on stderr, exit 130 / 143, no traceback, and no partial or temporary file, for `run`, `demo` and
`trace import` (the subprocess tests with real signals are in test_interrupts.py)."""

from __future__ import annotations

import numpy as np
import pytest

from stepsim.base.signals import Terminated
from stepsim.cli import main

STOPS = [(KeyboardInterrupt, 130, "stepsim: interrupted\n"), (Terminated, 143, "stepsim: terminated\n")]


def _files(folder):
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())


@pytest.mark.parametrize(("exc", "status", "err"), STOPS)
def test_demo_stopped_between_points_writes_nothing(tmp_path, monkeypatch, capsys, exc, status, err):
    import stepsim.demo.moe_tiling as demo

    calls = []

    def stop_at_the_third(config, **kw):
        calls.append(config)
        if len(calls) == 3:
            raise exc
        return real(config, **kw)

    real = demo.run_config
    monkeypatch.setattr(demo, "run_config", stop_at_the_third)
    assert main(["demo", "--metrics-only", "--out", str(tmp_path / "d")]) == status
    assert capsys.readouterr().err == err
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize(("exc", "status", "err"), STOPS)
def test_trace_import_stopped_while_writing_leaves_no_temporary_file(tmp_path, monkeypatch, capsys, exc, status,
                                                                      err):
    import stepsim.cli.trace as trace_cli

    src = tmp_path / "003_007.npz"
    np.savez(src, data=np.array([[0, 1], [2, 3]] * 8, dtype=np.int64))
    (tmp_path / "out").mkdir()
    real_open = trace_cli._open

    class Stopping:
        """The opened trace, whose second batch never comes: the interrupt arrives mid-write."""

        def __init__(self, stream):
            self._stream = stream

        def __getattr__(self, name):
            return getattr(self._stream, name)

        def batches(self):
            for batch in self._stream.batches():
                yield batch
                raise exc

    monkeypatch.setattr(trace_cli, "_open", lambda path, args: Stopping(real_open(path, args)))
    for suffix in (".parquet", ".arrow"):
        assert main(["trace", "import", str(src), "--model", "mixtral", "--out",
                     str(tmp_path / "out" / f"t{suffix}")]) == status
        assert capsys.readouterr().err == err
    assert _files(tmp_path / "out") == []


@pytest.mark.parametrize(("exc", "status", "err"), STOPS)
def test_run_stopped_while_writing_a_parquet_file_leaves_none_of_its_files(tmp_path, monkeypatch, capsys, exc,
                                                                           status, err):
    import stepsim.base.files as results

    real = results.write_parquet_atomic
    written = []

    def stop_at_the_third(table, path, *a, **kw):
        if len(written) == 2:
            raise exc
        written.append(path)
        return real(table, path, *a, **kw)

    monkeypatch.setattr(results, "write_parquet_atomic", stop_at_the_third)
    assert main(["run", "swiglu", "--out", str(tmp_path / "r.parquet")]) == status
    assert capsys.readouterr().err == err
    assert [p.name for p in written] == ["r_units.parquet", "r_channels.parquet"]
    assert _files(tmp_path) == []


@pytest.mark.parametrize(("signum", "exc"), [(2, KeyboardInterrupt), (15, Terminated)])
def test_a_stop_swallowed_by_a_destructor_is_raised_before_the_next_engine_slice(signum, exc):
    """Python ignores an exception raised while it runs a destructor ("Exception ignored in ..."): a Ctrl-C that
    lands there would be lost and the command would run to its end (seen once in CI on `stepsim reproduce`). The
    handlers of interrupts_raise remember the stop, and the engine raises it again before its next slice."""
    import gc
    import signal

    from stepsim.base.signals import interrupts_raise, raise_if_stopped
    from stepsim.simulation.simulate import simulate
    from stepsim.workloads.config import workload_from_config

    class SignalledWhileCollected:
        def __del__(self):
            signal.getsignal(signum)(signum, None)  # the handler, as the interpreter calls it: raises, swallowed

    workload = workload_from_config({"workload": "swiglu"})
    with interrupts_raise():
        SignalledWhileCollected()  # collected at once: its KeyboardInterrupt is printed and ignored
        gc.collect()
        with pytest.raises(exc):
            simulate(workload)
    raise_if_stopped()  # outside the block nothing is pending: the next command starts afresh


@pytest.mark.parametrize(("signum", "line"), [(2, "stopped: KeyboardInterrupt"), (15, "stopped: Terminated")])
def test_a_swallowed_stop_is_not_reported_as_an_ignored_exception(signum, line):
    """The stop line says it once: Python's "Exception ignored in ..." report (with its traceback, on stderr) of
    the swallowed stop is silenced inside interrupts_raise, and other unraisable exceptions are still reported.
    A fresh interpreter, since pytest installs its own unraisable hook."""
    import subprocess
    import sys

    script = f"""
import gc, signal, sys
from stepsim.base.signals import interrupts_raise, raise_if_stopped

class SignalledWhileCollected:
    def __del__(self):
        signal.getsignal({signum})({signum}, None)

class FailingWhileCollected:
    def __del__(self):
        raise ValueError("an unrelated failure")

try:
    with interrupts_raise():
        FailingWhileCollected()
        SignalledWhileCollected()
        gc.collect()
        raise_if_stopped()
except KeyboardInterrupt as exc:
    print("stopped:", type(exc).__name__)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == line
    assert "ValueError: an unrelated failure" in done.stderr
    assert "KeyboardInterrupt" not in done.stderr and "Terminated" not in done.stderr


@pytest.mark.parametrize(("signum", "line"), [(2, "stopped: KeyboardInterrupt"), (15, "stopped: Terminated")])
def test_after_a_stop_destructors_and_loggers_say_nothing(signum, line):
    """After the stop, what a destructor raises and what a library logs are the stop's doing, not news: a Ctrl-C'd
    Dask sweep printed, under its stop line, a half-built Future's AttributeError ('_cleared',
    dask/distributed#4305), tornado's "Exception in callback" of the interrupted ``sync`` and the scheduler's comm
    errors, each with a traceback (seen in the suite, 2026-11-26). Inside interrupts_raise the stop turns both off;
    logging comes back after the block (an in-process caller's), and quiet_after_stop (the program's own exit)
    keeps both off. A fresh interpreter, since pytest installs its own unraisable hook."""
    import subprocess
    import sys

    script = f"""
import gc, logging, signal, sys
from stepsim.base.signals import interrupts_raise, quiet_after_stop

logging.basicConfig(stream=sys.stderr)
log = logging.getLogger("distributed.scheduler")

class FailingWhileCollected:
    def __init__(self, why):
        self.why = why
    def __del__(self):
        raise AttributeError(self.why)

try:
    with interrupts_raise():
        try:
            signal.getsignal({signum})({signum}, None)
        finally:
            FailingWhileCollected("half built")
            gc.collect()
            log.error("during the stop")
except KeyboardInterrupt as exc:
    print("stopped:", type(exc).__name__)
log.error("after the block")
quiet_after_stop()
log.error("after quiet_after_stop")
FailingWhileCollected("at exit")
gc.collect()
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == line
    assert done.stderr == "ERROR:distributed.scheduler:after the block\n"
