"""Shared fixtures: the real traces live in ``../shared/traces`` beside the repository, never inside it."""

import os
from pathlib import Path

import pytest
from shared_traces_folder import require_shared_traces

# Commands the tests start run in their own process, even when the user has a command server running
# (stepsim.cli.server_daemon): the tests of the server itself turn it back on for their own commands.
os.environ["STEPSIM_SERVER"] = "off"

@pytest.fixture(scope="session")
def shared_traces() -> Path:
    """``../shared/traces``; tests that need it skip (with this reason) only when the folder is absent, and fail
    instead under CI (:mod:`shared_traces_folder`)."""
    return require_shared_traces()


@pytest.fixture
def qwen_b64_traces(shared_traces) -> dict[str, str]:
    """The decoder's shared Qwen3-30B-A3B B=64 inputs as config values: one layer's routing
    (``expert_routing/qwen_b64/032_012.npz``) and an Azure conversation window of KV lengths."""
    return {"routing": str(shared_traces / "expert_routing" / "qwen_b64" / "032_012.npz"),
            "kv_lengths": str(shared_traces / "kv_lengths" / "b64" / "conv_stdev0477_0271_0334.npy")}
