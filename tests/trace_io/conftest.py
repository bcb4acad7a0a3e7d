"""Fixtures for the trace_io tests.

The real traces live outside the repository, in ``../shared/traces`` beside the repo root. Tests that need
them take the ``shared_traces`` fixture of ``tests/conftest.py``, which skips (with the path it looked at) when
the folder is absent, and fails under CI.
"""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def conv_csv(shared_traces: Path) -> Path:
    """The Azure conversation request trace."""
    return shared_traces / "azure" / "AzureLLMInferenceTrace_conv.csv"


@pytest.fixture(scope="session")
def conv_requests(conv_csv: Path):
    """The conversation trace read as a normalized request table (read once per session)."""
    from stepsim.trace_io import read_trace

    return read_trace(conv_csv)


def pytest_collection_modifyitems(config, items):
    """Mark every trace_io test that reads the shared traces with ``traces`` (``-m "not traces"`` skips them)."""
    here = Path(__file__).resolve().parent
    for item in items:
        uses_traces = {"shared_traces", "conv_csv", "conv_requests"} & set(getattr(item, "fixturenames", ()))
        if uses_traces and here in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.traces)
