"""The suite's seeded schedules (tests/mapping_seeds, copied into each test process's mapping cache by
tests/conftest.py) are today's: each is a valid cache file whose key is the hash of what it was mapped for with
today's mapper, timing model and sources, so every seed is used and none is stale. When this fails, run
``python tests/mapping_seeds/refresh.py`` (the suite stays right without it, only slower: a stale seed is never
read)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from stepsim.base.files import stable_hash
from stepsim.mapping.mapper import MAPPER_VERSION, _load, dims_fields, key_material, source_hash

SEEDS = Path(__file__).resolve().parent.parent / "mapping_seeds"
SEED_FILES = sorted(SEEDS.glob("*.json"))


def test_the_suite_has_seeds_and_uses_a_copy_of_them():
    assert len(SEED_FILES) >= 10
    cache = Path(os.environ["STEPSIM_MAPPING_CACHE"])
    assert cache != SEEDS and {p.name for p in SEED_FILES} <= {p.name for p in cache.glob("*.json")}


@pytest.mark.parametrize("seed", SEED_FILES, ids=lambda p: p.name[:12])
def test_each_seed_is_a_schedule_todays_code_would_map(seed):
    import sys

    sys.path.insert(0, str(SEEDS))
    try:
        from refresh import request_of
    finally:
        sys.path.remove(str(SEEDS))
    record = json.loads(seed.read_text(encoding="utf-8"))
    if record["material"]["kind"] == "projection":  # a kind with a key of its own (stepsim.mapping.projection)
        from refresh import projection_request_of

        from stepsim.mapping import projection

        assert projection.key_material(*projection_request_of(record)) == record["material"], \
            "stale seed: run python tests/mapping_seeds/refresh.py"
        assert seed.name == f"{stable_hash(record['material'])}.json" == f"{record['key']}.json"
        assert _load(SEEDS, record["key"]).kind == "projection"
        return
    if record["material"]["kind"] == "ep":  # an expert-parallel search (stepsim.mapping.expert_parallel)
        from refresh import ep_request_of

        from stepsim.mapping import expert_parallel

        assert expert_parallel.search_material(*ep_request_of(record)) == record["material"], \
            "stale seed: run python tests/mapping_seeds/refresh.py"
        assert seed.name == f"{stable_hash(record['material'])}.json" == f"{record['key']}.json"
        assert _load(SEEDS, record["key"]).kind == "ep"
        return
    assert record["material"]["source"] == source_hash(record["material"]["kind"]), \
        "stale seed: run python tests/mapping_seeds/refresh.py"
    assert record["material"]["mapper_version"] == MAPPER_VERSION
    kind, size, dims, hardware = request_of(record)
    assert key_material(kind, size, dims, hardware) == record["material"]
    assert dims_fields(dims) == record["material"]["dims"]
    assert seed.name == f"{stable_hash(record['material'])}.json" == f"{record['key']}.json"
    schedule = _load(SEEDS, record["key"])
    assert schedule is not None and schedule.kind == kind


def _refresh():
    import sys

    sys.path.insert(0, str(SEEDS))
    try:
        import refresh
    finally:
        sys.path.remove(str(SEEDS))
    return refresh


@pytest.mark.parametrize("subfolder", ["projection-costs", "ffn-points"])
def test_each_simulated_cost_seed_is_todays_and_copied(subfolder):
    """Every seeded cost (a projection's at one token count, an FFN bucket's point) is named by the hash of what
    today's code would simulate it for, rebuilt from the seed alone (as refresh.py rebuilds it), and the run's
    cache has a copy."""
    refresh = _refresh()
    schedules = {record["key"]: record for record in (json.loads(p.read_text(encoding="utf-8")) for p in SEED_FILES)}
    seeds = sorted((SEEDS / subfolder).glob("*.json"))
    assert len(seeds) >= 10
    for seed in seeds:
        record = json.loads(seed.read_text(encoding="utf-8"))
        assert record["sha256"] == stable_hash({k: v for k, v in record.items() if k != "sha256"})
        injected = subfolder == "ffn-points" and not refresh.mapped_knobs(record["material"], schedules)
        now = refresh.todays_material(subfolder, record, refresh.cost_request_of(subfolder, record, schedules),
                                      injected)
        assert now == record["material"], f"stale seed {seed.name}: run python tests/mapping_seeds/refresh.py"
        assert seed.name == f"{stable_hash(now)}.json"
    cache = Path(os.environ["STEPSIM_MAPPING_CACHE"]) / subfolder
    assert {p.name for p in seeds} <= {p.name for p in cache.glob("*.json")}
