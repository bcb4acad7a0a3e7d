"""The "compiling the simulation kernels once" line, said just before the first engine work of a command.

The command line arms it (:func:`arm`) for the commands that run the engine; the first engine run of the process
(:func:`stepsim.kernels.api.run`) or the first worker pool that loads the kernels
(:func:`stepsim.base.forkserver.start_fork_server`) says it (:func:`say_once`), and only when numba's disk cache is
cold. Said then and not when the command starts, a command refused for a bad input says only its error line,
whatever the state of the cache.
"""

from __future__ import annotations

from collections.abc import Callable

_armed: Callable[[], None] | None = None


def arm(say: Callable[[], None] | None) -> None:
    """``say()`` is called before this process's next engine work (None: nothing is)."""
    global _armed
    _armed = say


def say_once() -> None:
    """Call the armed ``say()`` once, then disarm."""
    global _armed
    say, _armed = _armed, None
    if say is not None:
        say()
