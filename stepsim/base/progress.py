"""A progress bar for long engine runs: tqdm on stderr, shown only when a person can see it and is waiting.

The engine runs in slices (:func:`stepsim.kernels.api._call`) and reports ``(events, cycle)`` after each one.
:func:`engine_progress` turns those reports into a tqdm bar of simulated cycles with the event rate, drawn
only when stderr is a terminal and the run has already taken ``after_s`` seconds, so short runs, pipes, CI
logs and worker processes print nothing.

Example
-------
>>> from stepsim.base.progress import engine_progress
>>> with engine_progress() as progress:
...     pass  # simulate(workload, progress=progress)
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterator

#: seconds a run must take before its bar appears
SHOW_AFTER_S = 2.0
#: seconds between redraws of a count bar (:func:`count_progress`)
REDRAW_S = 0.2


@contextlib.contextmanager
def engine_progress(after_s: float = SHOW_AFTER_S, stream=None) -> Iterator[Callable[[int, int], None]]:
    """Yield a ``progress(events, cycle)`` callback that draws a bar once the run is slow; close it at exit.

    ``stream`` defaults to ``sys.stderr``; nothing is drawn unless it is a terminal.
    """
    stream = sys.stderr if stream is None else stream
    start = time.perf_counter()
    bar = None

    def progress(events: int, cycle: int) -> None:
        nonlocal bar
        elapsed = time.perf_counter() - start
        if bar is None:
            if elapsed < after_s or not stream.isatty():
                return
            from tqdm import tqdm

            bar = tqdm(file=stream, unit=" cycles", unit_scale=True, desc="simulating", leave=False,
                       bar_format="{desc}: {n_fmt} cycles [{elapsed}, {postfix}]")
        bar.n = cycle
        bar.set_postfix_str(f"{events / elapsed / 1e6:.2f} M events/s", refresh=False)
        bar.refresh()

    try:
        yield progress
    finally:
        if bar is not None:
            bar.close()


@contextlib.contextmanager
def count_progress(desc: str, unit: str, total: int | None = None, after_s: float | None = None,
                   stream=None) -> Iterator[Callable[..., None]]:
    """Yield ``update(done, note="")``: a tqdm bar of ``done`` of ``total`` ``unit`` (``total`` None: a count), with
    ``note`` after it, drawn only when ``stream`` (default ``sys.stderr``) is a terminal and the work has already
    taken ``after_s`` seconds (default :data:`SHOW_AFTER_S`); closed at exit. For work counted in steps rather than engine cycles (``stepsim
    serve``: requests finished, layers simulated while calibrating), where a run can take minutes without a line.

    >>> with count_progress("serving", "requests", total=200) as update:
    ...     update(17, "step 412")  # nothing drawn: not a terminal, and not yet slow
    """
    stream = sys.stderr if stream is None else stream
    after_s = SHOW_AFTER_S if after_s is None else after_s
    on_terminal = stream.isatty()  # asked once: update runs once per serving step
    start = time.perf_counter()
    bar = None
    drawn = [0.0]  # when the bar was last redrawn
    last = [0, ""]  # the latest count and note (drawn at the end)

    def draw(done: int, note: str) -> None:
        bar.n = done
        bar.set_postfix_str(note, refresh=False)
        bar.refresh()

    def update(done: int, note: str = "") -> None:
        nonlocal bar
        if not on_terminal:
            return
        last[:] = done, note
        now = time.perf_counter()
        if bar is None:
            if now - start < after_s:
                return
            from tqdm import tqdm

            bar = tqdm(file=stream, total=total, unit=f" {unit}", desc=desc, leave=False)
        elif now - drawn[0] < REDRAW_S:
            return  # thousands of steps a second: redraw a few times a second (and once more at the end)
        drawn[0] = now
        draw(done, note)

    try:
        yield update
    finally:
        if bar is not None:
            draw(*last)
            bar.close()
