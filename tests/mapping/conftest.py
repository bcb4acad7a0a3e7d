"""Fixtures of the mapping tests."""

from __future__ import annotations

import json
import shlex

import pytest
from test_map_cli import TINY

from stepsim.cli import main


@pytest.fixture(scope="module")
def ffn24_cache(tmp_path_factory):
    """``seed(folder)``: puts into ``folder / "cache"`` (a test's own mapping cache, made here) the cache file of
    test_map_cli's TINY MoE block at 24 tokens on sn40l, searched once for the module by ``stepsim map ffn --shape 24``. The tests that only read that schedule (``map --json``, ``map
    --out``, a mapped run's record, a functional check of the mapped layer) start from a cache holding it instead of
    each searching the same 96 candidates again (what they print is the stored schedule's either way); the search
    itself, its cache file and --no-cache are test_map_cli's test_map_prints_..., and the mapping of a run on an
    empty cache test_schedule_cli's test_runs_on_serving_hardware_..., which still map in empty caches."""
    folder = tmp_path_factory.mktemp("ffn24")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(folder)
        mp.setenv("STEPSIM_MAPPING_CACHE", str(folder / "cache"))
        mp.setattr("stepsim.mapping.mapper._MEMO", {})
        (folder / "tiny.json").write_text(json.dumps(TINY))
        assert main(shlex.split("map ffn --model tiny.json --shape 24")) == 0
    files = {path.name: path.read_bytes() for path in (folder / "cache").glob("*.json")}
    assert len(files) == 1

    def seed(target) -> None:
        (target / "cache").mkdir()
        for name, data in files.items():
            (target / "cache" / name).write_bytes(data)
    return seed
