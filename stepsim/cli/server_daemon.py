"""The server process: preload stepsim once, then fork one child per command.

Started by ``stepsim server start`` (:mod:`stepsim.cli.server`) in a session of its own, with the starting
program's ``sys.path`` and environment, so it loads exactly what that program would. It listens on a Unix
socket in a private folder (:func:`stepsim.cli.server_client.server_dir`) and ends after ``idle_timeout`` seconds
without a command, on ``stepsim server stop``, on SIGTERM, or when its socket is removed or replaced.

Each command runs in a child forked from the state right after the preload: it takes over the caller's
stdin, stdout and stderr, working directory, environment, umask and ``sys.argv``, and runs
:func:`stepsim.cli.main` as the program would. Forking is safe because the server is single-threaded (the
engine starts no threads; see :mod:`stepsim.batch.forkserver_preload`).

A resident command server: ``stepsim server start`` keeps one process with stepsim loaded, and later
commands of the same environment run in a fork of it instead of starting from nothing.

Why: a command spends about half a second before it does any work. Importing numba and numpy takes
0.3-0.6 s on a 2-core EPYC (the machine's speed varies), stepsim's modules and loading the engine kernels from
numba's cache 0.1-0.2 s more, sympy and pyarrow (imported when a command needs them) 0.3-0.5 s, while a small
simulation takes milliseconds. The same remedy as Gradle's daemon or Nailgun: pay those costs once, in a process that
stays, and fork it per command (about 10 ms). A forked command starts from the server's state right after its
preload, never from another command's leftovers, so its output is the same as in a fresh process.

How a command gets there (:mod:`stepsim.cli.server_client`): the ``stepsim`` program computes a fingerprint of
everything that decides what a process would load (Python, ``sys.path`` and the mtimes of its folders,
stepsim's files, the ``NUMBA_*``, ``STEPSIM_*`` and ``PYTHON*`` variables, ...) and looks for a server socket of
that name in a private folder. Without one, or with ``STEPSIM_SERVER=off``, the command runs in its own process
as before. With one, it sends its arguments, working directory, environment, umask and its stdin, stdout and
stderr (the file descriptors themselves, ``SCM_RIGHTS``) and waits for the exit status; Ctrl-C and SIGTERM are
passed on. Changed code or a changed environment simply gives another fingerprint, so a stale server is never
used; it ends after its idle timeout.

POSIX only (Unix sockets and descriptor passing); elsewhere every command runs in its own process.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import io
import json
import os
import select
import signal
import socket
import sys
import threading
import time
import traceback

from stepsim.base.collector import tune_process
from stepsim.cli import server_client as client

#: modules the server imports before it serves (every command's module, the worker pool's preload); the kernels
#: are loaded by the last one
PRELOAD = ("stepsim.cli", "stepsim.batch.tasks", "stepsim.results.records", "stepsim.simulation.simulate", "stepsim.kernels.engine",
           "stepsim.batch.forkserver_preload")  # the last one also imports sympy and pyarrow
#: imported too when installed (the ``plot`` extra): a demo or reproduce run draws figures
OPTIONAL_PRELOAD = ("matplotlib.pyplot",)
#: seconds between checks of the idle timeout and of the socket file
POLL_S = 1.0
#: seconds a connection may take to deliver its request
REQUEST_TIMEOUT_S = 10.0

#: commands this server has forked so far (told by ``ping``)
_served = [0]


def serve(socket_file: str, idle_timeout: float) -> None:
    """Preload, listen on ``socket_file`` and serve until idle for ``idle_timeout`` seconds (or stopped)."""
    client.in_server = True
    _preload()
    listener = _listen(socket_file)
    inode = os.stat(socket_file).st_ino
    children: dict[int, socket.socket] = {}
    last_active = time.monotonic()
    stop = []
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.append(signum))
    try:
        while not stop:
            _reap(children)
            if children:
                last_active = time.monotonic()
            elif time.monotonic() - last_active > idle_timeout or not _still_ours(socket_file, inode):
                break
            if not select.select([listener], [], [], POLL_S)[0]:
                continue
            conn, _ = listener.accept()
            if _handle(conn, listener, children, socket_file) == "stop":
                break
            last_active = time.monotonic()
    finally:
        listener.close()
        if _still_ours(socket_file, inode):
            os.unlink(socket_file)
            _remove_if_empty(log_file(socket_file))  # a log is kept only when it says something
        with contextlib.suppress(FileNotFoundError):
            os.unlink(state_file(socket_file))


def log_file(socket_file: str) -> str:
    """The server's log beside its socket (its stdout and stderr; empty unless something went wrong)."""
    return _beside(socket_file, ".log")


def _remove_if_empty(path: str) -> None:
    with contextlib.suppress(OSError):
        if os.path.getsize(path) == 0:
            os.unlink(path)


def state_file(socket_file: str) -> str:
    """The JSON file beside a server's socket describing it (pid, start time, versions, idle timeout)."""
    return _beside(socket_file, ".json")


def _beside(socket_file: str, suffix: str) -> str:
    """The file named like the server's socket with ``suffix`` instead of ``.sock``."""
    return socket_file.removesuffix(".sock") + suffix


def _preload() -> None:
    """Import what commands use and load the engine kernels; then freeze the collector's view of it all so
    the children's collections skip it and leave the shared pages alone."""
    tune_process()  # as the program's own process, before sympy is imported here (stepsim.base.collector)
    for name in PRELOAD:
        importlib.import_module(name)
    for name in OPTIONAL_PRELOAD:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    gc.collect()
    gc.freeze()


def _listen(socket_file: str) -> socket.socket:
    """A listening socket at ``socket_file``, bound under a temporary name and renamed into place, so a
    client never finds a socket that is not listening yet and two starting servers cannot both serve."""
    temporary = f"{socket_file}.{os.getpid()}"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(temporary)
    listener.listen(64)
    os.rename(temporary, socket_file)
    return listener


def _still_ours(socket_file: str, inode: int) -> bool:
    """Whether ``socket_file`` is still this server's socket (``stepsim server stop`` or a newer server
    removes or replaces it)."""
    try:
        return os.stat(socket_file).st_ino == inode
    except FileNotFoundError:
        return False


def _reap(children: dict[int, socket.socket]) -> None:
    """Collect ended children; tell each one's caller its exit status (a child normally sends it itself,
    this covers one killed by a signal: status 128 + signal number, as a shell reports it)."""
    for pid in list(children):
        done, status = os.waitpid(pid, os.WNOHANG)
        if not done:
            continue
        conn = children.pop(pid)
        code = os.waitstatus_to_exitcode(status)
        with contextlib.suppress(OSError):
            client.send_message(conn, {"exit": code if code >= 0 else 128 - code})
        conn.close()


def _handle(conn: socket.socket, listener: socket.socket, children: dict, socket_file: str) -> str | None:
    """Answer one connection: ``ping``, ``stop`` or ``run`` (forks the command's child). Returns "stop" when
    the server should end."""
    conn.settimeout(REQUEST_TIMEOUT_S)
    fds: list[int] = []
    try:
        if not _same_user(conn):
            raise ValueError("the caller runs as another user")
        client.send_message(conn, {"hello": os.getpid()})  # a caller hands its command over only after this
        received = client.recv_message(conn, max_fds=3)
        if received is None:
            conn.close()
            return None
        request, fds = received
        if "ping" in request or "stop" in request:
            client.send_message(conn, {"pid": os.getpid(), "socket": socket_file, "served": _served[0],
                                       "running": sorted(children)})
            conn.close()
            return "stop" if "stop" in request else None
        if len(fds) != 3:
            raise ValueError("a command request carries stdin, stdout and stderr")
        conn.settimeout(None)
        pid = os.fork()
    except (OSError, ValueError) as exc:  # the command did not start: the caller runs it itself
        for fd in fds:
            os.close(fd)
        with contextlib.suppress(OSError):
            client.send_message(conn, {"refused": str(exc)})
        conn.close()
        return None
    if pid == 0:
        listener.close()
        _run_child(conn, fds, request)  # never returns
    for fd in fds:
        os.close(fd)
    children[pid] = conn
    _served[0] += 1
    return None


def _same_user(conn: socket.socket) -> bool:
    """Whether the peer runs as this user (Linux's ``SO_PEERCRED``; elsewhere the private folder guards)."""
    if not hasattr(socket, "SO_PEERCRED"):
        return True
    import struct

    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1] == os.getuid()


def _run_child(conn: socket.socket, fds: list[int], request: dict) -> None:
    """In the forked child: become the caller's process (descriptors, folder, environment, umask, argv), run
    the command, send its exit status and exit."""
    status = 1
    try:
        client.send_message(conn, {"started": os.getpid()})  # the caller waits for this only so long (a frozen server)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # as in a fresh process (the server's own handler: serve)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        _reopen_stdio(request["stdio"])
        os.environ.clear()
        os.environ.update(request["env"])
        os.umask(request["umask"])
        sys.argv = [request["argv0"], *request["run"]]
        sys.path[0] = request["path0"]  # the caller's working folder or script folder (client.fingerprint)
        threading.Thread(target=_watch_caller, args=(conn,), daemon=True).start()
        try:
            os.chdir(request["cwd"])
        except OSError as exc:
            print(f"stepsim: error: cannot enter the working folder {request['cwd']}: {exc.strerror}",
                  file=sys.stderr)
            status = 2
        else:
            from stepsim.cli import main

            status = main()
    except SystemExit as exc:
        status = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # noqa: BLE001 - the command's own crash: print it as the program would, then report
        traceback.print_exc()
        status = 1
    finally:
        _exit_as_python_does()
        with contextlib.suppress(OSError):
            client.send_message(conn, {"exit": status})
        os._exit(status & 0xFF)


def _exit_as_python_does() -> None:
    """What an interpreter does at exit that matters to the caller: the atexit handlers (a pool's clean-up,
    those of the modules the server preloaded, as in any process that loaded them) and flushing the output,
    before the status is sent, so everything the command writes is in place when its caller returns."""
    import atexit

    with contextlib.suppress(Exception):
        atexit._run_exitfuncs()  # noqa: SLF001 - os._exit below skips them; nothing else runs them in a child
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()


def _reopen_stdio(settings: list) -> None:
    """New ``sys.stdin/stdout/stderr`` on descriptors 0-2 with the caller's encodings, buffered as Python
    buffers them (stdout line-buffered on a terminal, stderr always line-buffered)."""
    streams = []
    for fd, (encoding, errors) in enumerate(settings):
        mode = "r" if fd == 0 else "w"
        stream = io.open(fd, mode, encoding=encoding or "utf-8", errors=errors or "strict", closefd=False)
        if fd:
            stream.reconfigure(line_buffering=fd == 2 or os.isatty(fd))
        streams.append(stream)
    sys.stdin, sys.stdout, sys.stderr = streams
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = streams


def _watch_caller(conn: socket.socket) -> None:
    """Deliver the caller's signals to this process; if the caller goes away (killed, its terminal closed),
    stop the command as SIGTERM would, so nothing is left half-written."""
    while True:
        try:
            message = client.recv_message(conn)
        except (OSError, ValueError):
            message = None
        if message is None:
            os.kill(os.getpid(), signal.SIGTERM)
            return
        if "signal" in message:
            os.kill(os.getpid(), int(message["signal"]))


def main(spec_json: str) -> None:
    """Entry point of the server process: ``spec_json`` holds ``path`` (the starting program's ``sys.path``),
    ``socket`` and ``idle_timeout``."""
    spec = json.loads(spec_json)
    serve(spec["socket"], float(spec["idle_timeout"]))
