"""Where the real traces are (``../shared/traces`` beside the repository), and what a test that needs them does
when they are not there: skip with the path it looked at, or, under CI (``CI`` set to true, 1 or yes), fail, so a
CI machine without the traces cannot pass by skipping a sixth of the suite."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

SHARED_TRACES = Path(__file__).resolve().parents[1].parent / "shared" / "traces"


def under_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def require_shared_traces(path: Path = SHARED_TRACES) -> Path:
    """``path`` when it is a folder; otherwise skip the test, or fail it under CI."""
    if path.is_dir():
        return path
    reason = f"real traces not found at {path} (expected ../shared/traces beside the repository)"
    if under_ci():
        pytest.fail(f"{reason}; CI needs them, so the tests that read them fail instead of skipping", pytrace=False)
    pytest.skip(reason)
