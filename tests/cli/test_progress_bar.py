"""The engine progress bar: drawn on a terminal once a run is slow, never into a pipe or for a short run."""

from __future__ import annotations

import io

from stepsim.base.progress import engine_progress


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_bar_on_a_terminal_after_the_delay():
    stream = _Terminal()
    with engine_progress(after_s=0.0, stream=stream) as progress:
        progress(2_000_000, 1_234_567)
    text = stream.getvalue()
    assert "simulating: 1.23M cycles" in text and "M events/s" in text


def test_nothing_into_a_pipe_or_before_the_delay():
    pipe = io.StringIO()
    with engine_progress(after_s=0.0, stream=pipe) as progress:
        progress(10, 10)
    terminal = _Terminal()
    with engine_progress(after_s=3600.0, stream=terminal) as progress:
        progress(10, 10)
    assert (pipe.getvalue(), terminal.getvalue()) == ("", "")
