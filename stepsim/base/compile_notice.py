"""The "compiling the simulation kernels once" line, said just before the first engine work of a command.

The command line arms it (:func:`arm`) for the commands that run the engine; the first engine run of the process
(:func:`stepsim.kernels.api.run`) or the first worker pool that loads the kernels
(:func:`stepsim.base.forkserver.start_fork_server`) says it (:func:`say_once`), and only when numba's disk cache
lacks that kind of run (timing, functional, timeline: each its own specialization). Said then and not when the command starts, a command refused for a bad input says only its error line,
whatever the state of the cache.
"""

from __future__ import annotations

from collections.abc import Callable

#: ``say(functional, timeline)``: prints the notice if that kind of run compiles and returns whether it did
_armed: Callable[[bool, bool], bool] | None = None


def arm(say: Callable[[bool, bool], bool] | None) -> None:
    """``say(functional, timeline)`` is called before each of this process's engine runs until it has printed
    (None: nothing is)."""
    global _armed
    _armed = say


def say_once(functional: bool = False, timeline: bool = False) -> None:
    """Call the armed ``say`` for a run of this kind; disarm once it printed (one notice a process). A timing
    run found in the cache keeps it armed: the same command's functional or timeline run (``run --functional``
    sizes its arena with a timing run first; ``report`` records a timeline) compiles its own specialization."""
    global _armed
    if _armed is not None and _armed(functional, timeline):
        _armed = None


_said: set[str] = set()


def say_kernels_once(what: str, cached: Callable[[], bool], duration: str) -> None:
    """The notice for kernels outside the engine's (the serving replay's, :mod:`stepsim.kernels.serve_replay`):
    one line on stderr before they compile, when a command armed the notices (:func:`arm`) and ``cached()`` says
    numba's disk cache lacks them; once per ``what`` a process. ``duration``: how long compiling takes."""
    if _armed is None or what in _said or cached():
        return
    import sys

    _said.add(what)
    print(f"stepsim: compiling the {what} kernels once, {duration} (`stepsim cache warm` does it ahead)",
          file=sys.stderr, flush=True)
