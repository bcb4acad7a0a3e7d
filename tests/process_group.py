"""A command started in a process group of its own (``start_new_session=True``), as a terminal runs it: when its
pool's workers run, a Ctrl-C to the whole group, and whether every process of the group has ended."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path


def group_processes(pgid: int) -> list[str]:
    """The command lines of the live processes of group ``pgid`` (zombies left out)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if fields[0] != "Z" and int(fields[2]) == pgid:
                found.append((entry / "cmdline").read_bytes().replace(b"\0", b" ").decode())
        except (OSError, IndexError, ValueError):
            continue  # ended meanwhile
    return found


def wait_for_pool_workers(pgid: int, workers: int, timeout_s: float = 120.0) -> None:
    """Return once ``workers`` pool workers run in the group (processes forked from its fork server, which share
    its command line)."""
    deadline = time.monotonic() + timeout_s
    while sum("multiprocessing.forkserver" in c for c in group_processes(pgid)) < 1 + workers:
        assert time.monotonic() < deadline, f"no {workers} pool workers within {timeout_s:g} s"
        time.sleep(0.1)


def signal_group(pgid: int, signame: str) -> float:
    """Send ``signame`` to the whole group, as a terminal's Ctrl-C does; returns when (``time.monotonic``)."""
    os.killpg(pgid, getattr(signal, signame))
    return time.monotonic()


def group_ended(pgid: int, within_s: float = 10.0) -> bool:
    """Whether every process of the group has ended within ``within_s`` seconds (the fork server and the resource
    tracker end once the command has)."""
    deadline = time.monotonic() + within_s
    while group_processes(pgid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def stopped_with_its_workers(command: list[str], signame: str, *, cwd, env, workers: int = 2) -> tuple[int, str, str]:
    """Start ``command`` in a group of its own, send ``signame`` to the group once its ``workers`` pool workers have
    run for 2 s, and return its ``(exit status, stderr, stdout)``; it must end within 10 s of the signal, and every
    process of its group within 10 s more."""
    proc = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    wait_for_pool_workers(proc.pid, workers)
    time.sleep(2.0)  # the workers' tasks are running
    sent = signal_group(proc.pid, signame)
    out, err = proc.communicate(timeout=120)
    assert time.monotonic() - sent < 10
    assert group_ended(proc.pid), "a process of the command's group outlived it by 10 s"
    return proc.returncode, err, out
