"""Ctrl-C and SIGTERM: one way to stop every command cleanly.

Inside :func:`interrupts_raise`, SIGINT raises :class:`KeyboardInterrupt` and SIGTERM raises
:class:`Terminated` (a KeyboardInterrupt), whatever handlers were installed before, so ``finally`` blocks run
and nothing is left half-written (every file stepsim writes goes to a temporary name first and is renamed
into place). The engine runs in slices (:func:`stepsim.kernels.api._call`), so a signal takes effect within
about 0.1 s even in a long simulation. The CLI turns the exception into one line on stderr and the exit status
a shell reports for that signal (:func:`stopped_status`).
"""

from __future__ import annotations

import logging
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


#: the stop a signal asked for inside :func:`interrupts_raise` (None: none yet). Python swallows an exception
#: raised while it runs a destructor or a weakref callback ("Exception ignored in ...": a Ctrl-C that lands there
#: is printed and lost, and the command ran to its end); :func:`raise_if_stopped` raises it again
_requested: str | None = None


def raise_if_stopped() -> None:
    """Raise the stop a signal asked for, if its exception was swallowed (see ``_requested``): called between
    engine slices (:func:`stepsim.kernels.api._call`), so a lost Ctrl-C still stops the command within a slice."""
    if _requested is not None:
        raise Terminated if _requested == "terminated" else KeyboardInterrupt


def stop_requested() -> bool:
    """Whether a signal asked the command to stop (inside :func:`interrupts_raise`): a worker pool closed on the way
    out is then killed, not waited for (:func:`stepsim.batch.executors.close_pool`)."""
    return _requested is not None


@contextmanager
def interrupts_raise() -> Iterator[None]:
    """SIGINT raises KeyboardInterrupt and SIGTERM raises Terminated inside the block (and again at the next
    :func:`raise_if_stopped` if that exception was swallowed, or in place of the exception a library made of it)."""
    global _requested

    def stop(why: str) -> None:
        global _requested
        _requested = why
        logging.disable(logging.CRITICAL)  # see quiet_after_stop

    def interrupt(signum, frame):
        stop("interrupted")
        raise KeyboardInterrupt

    def terminate(signum, frame):
        stop("terminated")
        raise Terminated

    def unraisable(info):
        # Python reports an exception it had to swallow ("Exception ignored in ...", with a traceback). A swallowed
        # stop is remembered and raised again (raise_if_stopped), so it is said once, by the command's stop line;
        # after a stop, whatever a destructor raises is the stop's doing (an object the interrupt left half built: a
        # Dask Future without ``_cleared``, dask/distributed#4305, seen under a Ctrl-C'd sweep)
        if _requested is None:
            previous_hook(info)

    _requested = None
    previous_hook, sys.unraisablehook = sys.unraisablehook, unraisable
    logging_disabled = logging.root.manager.disable
    try:
        with handlers({signal.SIGINT: interrupt, signal.SIGTERM: terminate}):
            yield
    except Exception as exc:
        from stepsim.base.errors import StepsimError

        if _requested is None or isinstance(exc, StepsimError):  # stepsim's own answer to the stop (SweepStopped)
            raise
        # the signal's exception came back as another one: a library caught it and raised its own (a Ctrl-C
        # during numpy's import of its C extension is an ImportError); the stop is what happened
        raise (Terminated if _requested == "terminated" else KeyboardInterrupt)() from exc
    finally:
        _requested = None  # a command server's next command starts afresh
        sys.unraisablehook = previous_hook
        logging.disable(logging_disabled)


def quiet_after_stop() -> None:
    """The program is stopping because of a signal: nothing but its stop line is said from here on. The libraries'
    loggers are off (a stopped Dask cluster's scheduler and event loop log the comm errors of the workers being
    killed and the callbacks the interrupt cancelled, each with a traceback: seen under Ctrl-C'd sweeps in two
    suite runs, and in 1 of 8 by script beside two busy loops) and so are the exceptions destructors raise at exit.
    Inside :func:`interrupts_raise` the signal itself turns logging off; this keeps it off past the block, for the
    program itself only."""
    logging.disable(logging.CRITICAL)
    sys.unraisablehook = lambda info: None
