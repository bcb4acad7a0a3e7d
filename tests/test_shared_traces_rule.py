"""Tests that read ../shared/traces skip when it is absent, except under CI, where they fail."""

from __future__ import annotations

import pytest
from _pytest.outcomes import Failed, Skipped
from shared_traces_folder import SHARED_TRACES, require_shared_traces


def test_present_traces_are_returned():
    assert require_shared_traces(SHARED_TRACES.parent) == SHARED_TRACES.parent


@pytest.mark.parametrize("ci", ["true", "1", "YES"])
def test_missing_traces_fail_under_ci(tmp_path, monkeypatch, ci):
    monkeypatch.setenv("CI", ci)
    with pytest.raises(Failed) as info:
        require_shared_traces(tmp_path / "traces")
    assert str(info.value) == (f"real traces not found at {tmp_path / 'traces'} (expected ../shared/traces beside "
                               "the repository); CI needs them, so the tests that read them fail instead of skipping")


@pytest.mark.parametrize("ci", [None, "", "false", "0"])
def test_missing_traces_skip_elsewhere(tmp_path, monkeypatch, ci):
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    with pytest.raises(Skipped) as info:
        require_shared_traces(tmp_path / "traces")
    assert str(info.value) == (f"real traces not found at {tmp_path / 'traces'} (expected ../shared/traces beside "
                               "the repository)")
