"""Ctrl-C and SIGTERM: one way to stop every command cleanly.

Inside :func:`interrupts_raise`, SIGINT raises :class:`KeyboardInterrupt` and SIGTERM raises
:class:`Terminated` (a KeyboardInterrupt), whatever handlers were installed before, so ``finally`` blocks run
and nothing is left half-written (every file stepsim writes goes to a temporary name first and is renamed
into place). The engine runs in slices (:func:`stepsim.kernels.api._call`), so a signal takes effect within
about 0.1 s even in a long simulation. The CLI turns the exception into one line on stderr and the exit status
a shell reports for that signal (:func:`stopped_status`).
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived: handled as Ctrl-C."""


#: exit status and stderr line of a command stopped by a signal (128 + signal number, as shells report it)
STOPPED = {"interrupted": (130, "stepsim: interrupted"), "terminated": (143, "stepsim: terminated")}


def reason(exc: KeyboardInterrupt) -> str:
    """``"terminated"`` for SIGTERM, ``"interrupted"`` for Ctrl-C / SIGINT."""
    return "terminated" if isinstance(exc, Terminated) else "interrupted"


def stopped_status(why: str) -> int:
    """Print the stop line for ``why`` (a :func:`reason`) on stderr; returns the exit status."""
    status, line = STOPPED[why]
    print(line, file=sys.stderr)
    return status


@contextmanager
def handlers(installed: dict) -> Iterator[None]:
    """Install ``{signal number: handler}`` inside the block and restore the previous handlers afterwards
    (main thread only; elsewhere the signals are left alone)."""
    try:
        previous = {signum: signal.signal(signum, handler) for signum, handler in installed.items()}
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


@contextmanager
def interrupts_raise() -> Iterator[None]:
    """SIGINT raises KeyboardInterrupt and SIGTERM raises Terminated inside the block."""
    def terminate(signum, frame):
        raise Terminated

    with handlers({signal.SIGINT: signal.default_int_handler, signal.SIGTERM: terminate}):
        yield
