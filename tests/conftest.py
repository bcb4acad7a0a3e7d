"""Shared fixtures: the real traces live in ``../shared/traces`` beside the repository, never inside it."""

import os
from pathlib import Path

import pytest

# Commands the tests start run in their own process, even when the user has a command server running
# (stepsim.cli.server_daemon): the tests of the server itself turn it back on for their own commands.
os.environ["STEPSIM_SERVER"] = "off"

SHARED_TRACES = Path(__file__).resolve().parents[1].parent / "shared" / "traces"


@pytest.fixture(scope="session")
def shared_traces() -> Path:
    """``../shared/traces``; tests that need it skip (with this reason) only when the folder is absent."""
    if not SHARED_TRACES.is_dir():
        pytest.skip(f"real traces not found at {SHARED_TRACES} (expected ../shared/traces beside the repo)")
    return SHARED_TRACES
