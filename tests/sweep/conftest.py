"""Fixtures of the sweep tests."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def sweep_file(tmp_path):
    """``sweep_file(text, name="sweep.toml")``: write a sweep file into the test's folder and return its path."""

    def write(text: str, name: str = "sweep.toml") -> Path:
        path = tmp_path / name
        path.write_text(text)
        return path

    return write
