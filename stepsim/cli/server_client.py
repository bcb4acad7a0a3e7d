"""The program's side of the command server: find a server for this environment and run a command in it.

Light on purpose (only the standard library's os, sys, socket, json, hashlib): it runs before every command,
and when no server is running it must cost next to nothing (about 2 ms: one walk over stepsim's files).
"""

from __future__ import annotations

import hashlib
import json
import os
import select
import signal
import socket
import struct
import sys
import time

#: environment variables that decide what a process loads or how (read at import time by numba, numpy,
#: Python or stepsim), so a server only serves commands whose values are the same
FINGERPRINT_ENV_PREFIXES = ("NUMBA_", "STEPSIM_", "PYTHON", "OMP_", "OPENBLAS_", "MKL_", "MPLBACKEND", "LC_", "LANG")
#: ``STEPSIM_SERVER=off`` runs every command in its own process even when a server is running
SWITCH_ENV = "STEPSIM_SERVER"
#: the folder of server sockets, logs and state files (default: see :func:`server_dir`)
DIR_ENV = "STEPSIM_SERVER_DIR"
#: longest Unix socket path Linux accepts (``sun_path`` holds 108 bytes with the terminating NUL)
MAX_SOCKET_PATH = 107
#: signals a waiting program passes on to its command in the server
FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM)
#: seconds a server may take to start a command it was sent (its child says "started" first thing): a frozen
#: server (stopped, swapped out, deadlocked) is one line after this long instead of a wait forever
START_TIMEOUT_S = 10.0
#: sets another start timeout (seconds); not part of the fingerprint (it changes nothing a server loads)
TIMEOUT_ENV = "STEPSIM_SERVER_TIMEOUT"
#: seconds a command in the server has to stop after a forwarded Ctrl-C / SIGTERM (it normally takes a tenth of
#: that); then it is killed and the program stops waiting, so a frozen server cannot make Ctrl-C deaf
STOP_GRACE_S = 2.0
#: the exit status and line of a program stopped by a signal (as stepsim.base.signals.STOPPED; stdlib only here)
_STOPPED = {signal.SIGINT: (130, "stepsim: interrupted"), signal.SIGTERM: (143, "stepsim: terminated")}

#: set in the server process: its commands run here and are never forwarded again
in_server = False

_LENGTH = struct.Struct("!I")


def server_dir() -> str:
    """The folder of this user's servers: ``$STEPSIM_SERVER_DIR``, else ``$XDG_RUNTIME_DIR/stepsim``, else
    ``/tmp/stepsim-<uid>``."""
    if os.environ.get(DIR_ENV):
        return os.environ[DIR_ENV]
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    return os.path.join(runtime, "stepsim") if runtime else f"/tmp/stepsim-{os.getuid()}"


def private_dir_problem(path: str) -> str | None:
    """Why ``path`` may not hold server sockets, or None when it may: it must be a real folder of this user
    that nobody else can enter (a socket there runs commands as this user)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return f"server folder {path} does not exist"
    import stat

    if not stat.S_ISDIR(st.st_mode):
        return f"server folder {path} is not a folder"
    if st.st_uid != os.getuid():
        return f"server folder {path} belongs to another user (uid {st.st_uid})"
    if st.st_mode & 0o077:
        return f"server folder {path} is open to other users (mode {st.st_mode & 0o777:o}; it must be 700)"
    return None


def fingerprint() -> str:
    """16 hex digits naming everything that decides what this process would load: the interpreter, its
    ``sys.path`` but its first entry and the mtime of each folder on it (an install or upgrade changes its
    site-packages), every
    file of stepsim (path, size, mtime), the user and the environment variables of
    :data:`FINGERPRINT_ENV_PREFIXES`. A server started under another fingerprint is never used."""
    h = hashlib.sha256()
    # sys.path[0] is the working folder (python -m) or the script's folder: it varies from command to command
    # and is handed to the command's process instead (a module there shadowing one the server already loaded,
    # such as a numpy.py, is the one case this misses)
    h.update(repr((sys.executable, sys.version, os.getuid(), sys.flags, sys.path[1:])).encode())
    for entry in sys.path[1:]:
        try:
            h.update(repr((entry, os.stat(entry or ".").st_mtime_ns)).encode())
        except OSError:
            h.update(repr((entry, None)).encode())
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for path, size, mtime in _package_files(package):
        h.update(repr((path, size, mtime)).encode())
    env = sorted((k, v) for k, v in os.environ.items()
                 if k.startswith(FINGERPRINT_ENV_PREFIXES) and k not in (SWITCH_ENV, TIMEOUT_ENV))
    h.update(repr(env).encode())
    return h.hexdigest()[:16]


def _package_files(root: str) -> list[tuple[str, int, int]]:
    """``(path, size, mtime_ns)`` of every file under ``root`` but the byte-code caches, sorted."""
    out, pending = [], [root]
    while pending:
        with os.scandir(pending.pop()) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    if entry.name != "__pycache__":
                        pending.append(entry.path)
                else:
                    st = entry.stat()
                    out.append((entry.path, st.st_size, st.st_mtime_ns))
    return sorted(out)


def socket_path(directory: str, print_: str) -> str:
    """The socket of the server of fingerprint ``print_`` in ``directory``."""
    return os.path.join(directory, f"{print_}.sock")


def command_of(args: list[str]) -> str | None:
    """The command word of a command line (its first argument that is not an option)."""
    return next((a for a in args if not a.startswith("-")), None)


def forward(argv: list[str]) -> int | None:
    """Run the command line ``argv`` (``sys.argv``) in this environment's server and return its exit status,
    or None when it should run here: no server for this fingerprint, ``STEPSIM_SERVER=off``, the ``server``
    command itself, a platform without descriptor passing, or a server that did not take the command. Once a
    server has taken the command, its status is the answer (it never runs twice)."""
    if in_server or os.environ.get(SWITCH_ENV, "").lower() in ("off", "0", "no", "false"):
        return None
    if command_of(argv[1:]) in (None, "server") or not hasattr(socket, "send_fds"):
        return None
    directory = server_dir()
    path = socket_path(directory, fingerprint())
    if not os.path.exists(path) or private_dir_problem(directory):
        return None
    request = {"run": argv[1:], "argv0": argv[0], "path0": sys.path[0], "cwd": os.getcwd(), "env": dict(os.environ),
               "umask": _umask(), "stdio": _stdio_settings()}
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except OSError:  # no server listening (a leftover socket), a server going away
        sock.close()
        return None
    with sock:
        return _wait_for_status(sock, request)


def _start_timeout() -> float:
    """:data:`START_TIMEOUT_S`, or the seconds ``$STEPSIM_SERVER_TIMEOUT`` gives (a positive number)."""
    try:
        value = float(os.environ.get(TIMEOUT_ENV, ""))
    except ValueError:
        return START_TIMEOUT_S
    return value if 0 < value < float("inf") else START_TIMEOUT_S


def _wait_for_status(sock: socket.socket, request: dict) -> int | None:
    """Hand ``request`` to the server once it greets, pass signals on to the command while it runs; its exit
    status (1 with a message if the server's process ended without one), or None when the command should run
    here (the server did not greet, refused the command, or the descriptors could not be sent).

    Never a wait forever. The server greets every connection it accepts before the command (and the caller's
    stdin / stdout / stderr) is sent: a server that does not within :func:`_start_timeout` (frozen: stopped,
    swapped out, deadlocked) never gets the command, which runs here after one warning line (the descriptors are
    not left in a frozen server's queue, where they would hold the caller's pipes open). A server that greeted but
    does not start the command within the timeout is one line (exit 2). After a forwarded signal the command has
    :data:`STOP_GRACE_S` to end, then it is killed and the program prints its stop line; a signal before the
    command started stops the program at once."""
    signals: list[tuple[int, float]] = []
    sent = [False]

    def pass_on(signum, frame):
        signals.append((signum, time.monotonic()))
        if sent[0]:
            try:
                send_message(sock, {"signal": signum})
            except OSError:
                pass

    previous = {signum: signal.signal(signum, pass_on) for signum in FORWARDED_SIGNALS}
    since = time.monotonic()
    timeout = _start_timeout()
    child = None  # the pid of the command's process, once the server said it started
    try:
        while True:
            now = time.monotonic()
            if signals and (child is None or now - signals[0][1] > STOP_GRACE_S):
                if child is not None:
                    try:
                        os.kill(child, signal.SIGKILL)  # a frozen command: it will not stop by itself
                    except OSError:
                        pass
                status, line = _STOPPED[signals[0][0]]
                print(line, file=sys.stderr)
                return status
            if child is None and now - since > timeout:
                if not sent[0]:
                    print(f"stepsim: warning: the command server did not answer within {timeout:g} s (frozen?); "
                          f"running the command here (`stepsim server stop` ends the server)", file=sys.stderr)
                    return None
                print(f"stepsim: error: the command server did not start the command within {timeout:g} s (frozen "
                      f"or overloaded?): `stepsim server stop` ends it, STEPSIM_SERVER=off runs commands without "
                      f"it", file=sys.stderr)
                return 2
            if not select.select([sock], [], [], 0.1)[0]:
                continue
            try:
                message = recv_message(sock)
            except (OSError, ValueError):
                message = None
            if message is None:
                if not sent[0]:  # the server went away before it took the command: run it here
                    return None
                print("stepsim: error: the command's process in the server ended without an exit status "
                      "(`stepsim server status` lists the servers)", file=sys.stderr)
                return 1
            if "hello" in message and not sent[0]:
                try:
                    send_message(sock, request, fds=[0, 1, 2])
                except OSError:  # a closed stdio descriptor, a server going away: run it here
                    return None
                sent[0] = True
                since = time.monotonic()
            elif "started" in message:
                child = int(message["started"])
            elif "refused" in message:
                return None
            elif "exit" in message:
                return int(message["exit"])
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _umask() -> int:
    """This process's umask (reading it means setting it, so it is set back at once)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _stdio_settings() -> list[list[str | None]]:
    """``[encoding, errors]`` of stdin, stdout and stderr, so the command writes text exactly as here."""
    return [[getattr(s, "encoding", None), getattr(s, "errors", None)] for s in (sys.stdin, sys.stdout, sys.stderr)]


def send_message(sock: socket.socket, message: dict, fds: list[int] = ()) -> None:
    """Send ``message`` as JSON after its 4-byte length, with the descriptors ``fds`` attached."""
    data = json.dumps(message).encode()
    data = _LENGTH.pack(len(data)) + data
    if fds:
        sent = socket.send_fds(sock, [data], list(fds))
        data = data[sent:]
    sock.sendall(data)


def recv_message(sock: socket.socket, max_fds: int = 0) -> dict | tuple[dict, list[int]] | None:
    """The next message of :func:`send_message` (with ``max_fds``: ``(message, descriptors)``), None at the end
    of the connection."""
    fds: list[int] = []
    if max_fds:
        head, fds, _, _ = socket.recv_fds(sock, _LENGTH.size, max_fds)
    else:
        head = sock.recv(_LENGTH.size)
    head += _recv_exactly(sock, _LENGTH.size - len(head)) if head else b""
    if len(head) < _LENGTH.size:
        for fd in fds:
            os.close(fd)
        return None
    body = _recv_exactly(sock, _LENGTH.unpack(head)[0])
    message = json.loads(body)
    return (message, fds) if max_fds else message


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    """``n`` bytes from ``sock`` (fewer only at the end of the connection)."""
    chunks = []
    while n > 0:
        chunk = sock.recv(n)
        if not chunk:
            break
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)
