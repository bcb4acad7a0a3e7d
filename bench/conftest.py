"""Shared fixtures of the benchmarks: the real-trace folder and a summary printed at the end of the run.

The benchmarks are run by hand (``python -m pytest bench -q --benchmark-enable``); pyproject's ``testpaths`` keeps
them out of the default test run. The summary collects one line per measurement so that the numbers quoted in
``bench/README.md`` can be read off one terminal report (pytest-benchmark's own table only shows call times).
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

import pytest

#: ``../shared/traces`` beside the repository, found the same way as ``tests/conftest.py`` does
SHARED_TRACES = Path(__file__).resolve().parents[1].parent / "shared" / "traces"

_SUMMARY: dict[str, list[str]] = {}


@pytest.fixture(scope="session")
def shared_traces() -> Path:
    """``../shared/traces``; benchmarks that need it skip (with this reason) only when the folder is absent."""
    if not SHARED_TRACES.is_dir():
        pytest.skip(f"real traces not found at {SHARED_TRACES} (expected ../shared/traces beside the repo)")
    return SHARED_TRACES


@pytest.fixture(scope="session")
def bench_summary():
    """``add(section, line)``: a line for the end-of-run summary, grouped by section in first-use order."""

    def add(section: str, line: str) -> None:
        _SUMMARY.setdefault(section, []).append(line)

    return add


@pytest.fixture
def json_command_once(benchmark, capsys):
    """``json_command_once(argv)``: run ``stepsim argv`` (a ``--json`` command) once under pytest-benchmark and
    return ``(its JSON report, wall seconds)``; the command must exit 0."""
    from stepsim.cli import main

    def run(argv: list[str]) -> tuple[dict, float]:
        reports = []

        def once():
            assert main(argv) == 0
            reports.append(json.loads(capsys.readouterr().out))

        t0 = time.perf_counter()
        benchmark.pedantic(once, rounds=1, iterations=1, warmup_rounds=0)
        wall = time.perf_counter() - t0
        [report] = reports
        return report, wall

    return run


@pytest.fixture
def rounds(benchmark):
    """``rounds(n)``: n when pytest-benchmark times for real (``--benchmark-enable``), else 1 (run-once mode)."""
    enabled = not getattr(benchmark, "disabled", False)
    return lambda n: n if enabled else 1


def pytest_terminal_summary(terminalreporter):
    if not _SUMMARY:
        return
    load = "/".join(f"{x:.2f}" for x in os.getloadavg())
    terminalreporter.write_sep("=", f"stepsim benchmark summary (Python {platform.python_version()}, "
                                    f"{os.cpu_count()} CPUs, load average at the end {load})")
    for section, lines in _SUMMARY.items():
        terminalreporter.write_sep("-", section)
        for line in lines:
            terminalreporter.write_line(line)
