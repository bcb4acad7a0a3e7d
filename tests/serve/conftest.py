"""Fixtures of the serve tests (request-trace writing: serve_requests.py)."""

from __future__ import annotations

import pytest


@pytest.fixture
def conv_csv(shared_traces):
    """The Azure conversation request trace (19,366 requests)."""
    return shared_traces / "azure" / "AzureLLMInferenceTrace_conv.csv"
