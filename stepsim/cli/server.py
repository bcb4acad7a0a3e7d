"""``stepsim server start | stop | status``: the resident command server (see :mod:`stepsim.cli.server_daemon`)."""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time

from stepsim.base.errors import StepsimError
from stepsim.base.ranges import json_text
from stepsim.cli import server_client as client
from stepsim.cli.server_daemon import log_file, state_file

#: default idle timeout of a server (seconds)
DEFAULT_IDLE_TIMEOUT_S = 3600.0
#: default wait for a server to be ready (seconds): a cold kernel cache compiles for about a minute
DEFAULT_START_WAIT_S = 300.0
#: what the server process runs: the starting program's sys.path first, so it loads what the program would
_BOOT = ("import sys, json; spec = json.loads(sys.argv[1]); sys.path[:] = spec['path']; "
         "from stepsim.cli.server_daemon import main; main(sys.argv[1])")


class ServerError(StepsimError):
    """The command server could not be started, reached or stopped."""


def register(subparsers) -> None:
    """Add the ``server`` command family to the top-level subparsers."""
    server = subparsers.add_parser("server", help="keep stepsim loaded in a resident process, so commands start "
                                                  "in about 0.1 s")
    actions = server.add_subparsers(dest="server_command", metavar="ACTION")
    start = actions.add_parser("start", formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                               help="start this environment's server (in the background) and wait until it serves")
    start.add_argument("--idle-timeout", type=float, default=DEFAULT_IDLE_TIMEOUT_S, metavar="SECONDS",
                       help="the server ends after this long without a command (default %(default)g)")
    start.add_argument("--wait", type=float, default=DEFAULT_START_WAIT_S, metavar="SECONDS",
                       help="how long to wait for the server to be ready (default %(default)g)")
    start.set_defaults(handler=_start)
    stop = actions.add_parser("stop", help="stop this environment's server (--all: every server of this user)")
    stop.add_argument("--all", action="store_true", help="stop every server in the server folder")
    stop.set_defaults(handler=_stop)
    status = actions.add_parser("status", help="list this user's servers and which one serves this environment")
    status.add_argument("--json", action="store_true", help="print the list as JSON")
    status.set_defaults(handler=_status)
    server.set_defaults(handler=lambda args: server.print_help() or 1)


def _start(args) -> int:
    if not hasattr(socket, "send_fds"):
        raise ServerError("the command server needs Unix sockets with descriptor passing (POSIX); "
                          "commands run in their own process here")
    from stepsim.base.ranges import positive_seconds

    positive_seconds("--idle-timeout", args.idle_timeout)  # nan would compare false and be taken: refused here
    positive_seconds("--wait", args.wait)
    directory = _ensure_dir(client.server_dir())
    path = client.socket_path(directory, client.fingerprint())
    if len(path) > client.MAX_SOCKET_PATH:
        raise ServerError(f"server socket path {path} is longer than {client.MAX_SOCKET_PATH} bytes; set "
                          f"{client.DIR_ENV} to a shorter folder")
    running = ping(path)
    if running:
        print(f"stepsim server: already running (pid {running['pid']}, socket {path})")
        return 0
    log_path = log_file(path)
    spec = json.dumps({"path": sys.path, "socket": path, "idle_timeout": args.idle_timeout})
    with open(log_path, "ab") as log:
        process = subprocess.Popen([sys.executable, *subprocess._args_from_interpreter_flags(), "-c", _BOOT, spec],
                                   stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd="/",
                                   start_new_session=True)
    _write_state(path, process.pid, args.idle_timeout)
    deadline = time.monotonic() + args.wait
    while time.monotonic() < deadline:
        running = ping(path)
        if running and running["pid"] == process.pid:
            print(f"stepsim server: ready (pid {process.pid}, socket {path}); commands of this environment run "
                  f"in it until {args.idle_timeout:g} s without one, or `stepsim server stop`")
            return 0
        if process.poll() is not None:
            raise ServerError(f"the server process ended with status {process.returncode} before serving: "
                              f"{_last_line(log_path)} (log: {log_path})")
        time.sleep(0.05)
    process.terminate()
    raise ServerError(f"the server was not ready after {args.wait:g} s (--wait); log: {log_path}")


def _stop(args) -> int:
    directory = client.server_dir()
    if args.all:
        sockets = [os.path.join(directory, n) for n in sorted(_names(directory)) if n.endswith(".sock")]
    else:
        sockets = [client.socket_path(directory, client.fingerprint())]
    stopped = 0
    for path in sockets:
        answer = _request(path, {"stop": True})
        if answer:
            print(f"stepsim server: stopped pid {answer['pid']} ({path})")
            stopped += 1
    if not stopped:
        print("stepsim server: no server was running" + ("" if args.all else " for this environment"))
    return 0


def _status(args) -> int:
    directory = client.server_dir()
    mine = client.socket_path(directory, client.fingerprint())
    servers = []
    for name in sorted(_names(directory)):
        if not name.endswith(".sock"):
            continue
        path = os.path.join(directory, name)
        answer = ping(path)
        state = _read_state(path)
        servers.append({"socket": path, "pid": answer["pid"] if answer else state.get("pid"),
                        "running": bool(answer), "serves_this_environment": path == mine,
                        "served": answer["served"] if answer else None,
                        "commands_running": len(answer["running"]) if answer else None,
                        "started": state.get("started"), "idle_timeout_s": state.get("idle_timeout_s")})
    if args.json:
        print(json_text({"server_dir": directory, "servers": servers}, indent=2))
        return 0
    if not servers:
        print(f"stepsim server: none in {directory}")
    for s in servers:
        print(f"pid {s['pid']}  {'running' if s['running'] else 'not answering'}  started {s['started']}  "
              f"served {s['served']}  "
              f"{'serves this environment' if s['serves_this_environment'] else 'another environment'}  "
              f"{s['socket']}")
    return 0


def ping(path: str) -> dict | None:
    """The answer of the server at socket ``path``, or None when none answers: ``pid``, ``socket``, ``served``
    (commands forked so far) and ``running`` (the pids of the commands running now)."""
    return _request(path, {"ping": True})


def _request(path: str, message: dict) -> dict | None:
    """Send ``message`` (ping or stop) to the server at ``path``; its answer, or None."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(5.0)
    try:
        sock.connect(path)
        client.send_message(sock, message)
        answer = client.recv_message(sock)
        while answer and "hello" in answer:  # the greeting every connection gets first
            answer = client.recv_message(sock)
        return answer if answer and "pid" in answer else None
    except (OSError, ValueError):
        return None
    finally:
        sock.close()


def _ensure_dir(directory: str) -> str:
    """``directory`` created private (mode 700) if missing, and checked to be private."""
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
    except OSError as exc:
        raise ServerError(f"cannot create the server folder {directory}: {exc.strerror}") from None
    problem = client.private_dir_problem(directory)
    if problem:
        raise ServerError(f"{problem} ({client.DIR_ENV} chooses another)")
    return directory


def _names(directory: str) -> list[str]:
    try:
        return os.listdir(directory)
    except OSError:
        return []


def _write_state(path: str, pid: int, idle_timeout: float) -> None:
    """The server's state file, written whole (a temporary file renamed into place)."""
    from stepsim._version import __version__

    state = {"pid": pid, "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "idle_timeout_s": idle_timeout,
             "python": sys.executable, "stepsim": __version__}
    temporary = f"{state_file(path)}.{os.getpid()}"
    with open(temporary, "w") as f:
        json.dump(state, f)
    os.replace(temporary, state_file(path))


def _read_state(path: str) -> dict:
    try:
        with open(state_file(path)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def _last_line(log_path: str) -> str:
    """The last non-empty line of the server's log (its error, usually)."""
    try:
        with open(log_path, errors="replace") as f:
            lines = [line.strip() for line in f if line.strip()]
    except OSError:
        return "(no log)"
    return lines[-1] if lines else "(empty log)"
