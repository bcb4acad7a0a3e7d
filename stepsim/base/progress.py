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
