"""The projection costs stored in the mapping cache (stepsim/serve/projections.py ``projection_cost``): a cost is
simulated once per key, read back by a fresh process (here: an emptied memo with the simulation forbidden), never
reused for other material, and a damaged file is warned about, simulated again and replaced."""

from __future__ import annotations

import json

import pytest

from stepsim.base.errors import StepsimWarning
from stepsim.base.hardware import PRESETS
from stepsim.serve import projections

SHAPE = (4, 128, 256)  # 4 tokens (bucket 4, one tile), d_in 128, d_out 256: maps and simulates in well under a second


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A private mapping cache and an empty memo: the test sees only what it stores."""
    monkeypatch.setenv("STEPSIM_MAPPING_CACHE", str(tmp_path))
    monkeypatch.setattr(projections, "_COSTS", {})
    return tmp_path / projections.COST_FOLDER


def _forbid_simulation(monkeypatch):
    def refuse(*args):
        raise AssertionError("simulated although the cost was stored")

    monkeypatch.setattr(projections, "_simulate_cost", refuse)


def _file(cache, shape=SHAPE):
    material = projections.cost_material(*shape, PRESETS["sn40l"])
    return cache / f"{projections.stable_hash(material)}.json", material


def test_a_cost_is_simulated_once_and_read_back_identically_by_a_fresh_process(cache, monkeypatch):
    hw = PRESETS["sn40l"]
    cost = projections.projection_cost(*SHAPE, hw)
    assert cost == projections._simulate_cost(*SHAPE, hw)
    path, material = _file(cache)
    assert [p.name for p in cache.iterdir()] == [path.name]
    record = json.loads(path.read_text())
    assert record["material"] == material and record["cost"] == list(cost)
    assert material == {"what": "projection cost", "tokens": 4, "schedule_key": material["schedule_key"]}
    monkeypatch.setattr(projections, "_COSTS", {})
    _forbid_simulation(monkeypatch)
    assert projections.projection_cost(*SHAPE, hw) == cost


def test_counts_with_the_same_token_tiles_share_one_cost_and_others_have_their_own(cache, monkeypatch):
    """A count's graph is its padded count's (stepsim/serve/projections.py ``padded_tokens``): at 128 x 256 on sn40l
    bucket 4 takes tile_m 4 (3 and 4 tokens: one tile) and bucket 1024 tile_m 128 (600 tokens: 5 tiles, 650 and 700:
    6). Each cost equals the simulation at its own count, one file and one simulation per padded count."""
    hw = PRESETS["sn40l"]
    simulated = []
    real = projections._simulate_cost
    monkeypatch.setattr(projections, "_simulate_cost", lambda *a: simulated.append(a[0]) or real(*a))
    counts = (3, 4, 600, 650, 700)
    costs = [projections.projection_cost(n, 128, 256, hw) for n in counts]
    assert [projections.padded_tokens(n, 128, 256, hw) for n in counts] == [4, 4, 640, 768, 768]
    assert simulated == [4, 640, 768]
    assert sorted(p.name for p in cache.iterdir()) == sorted(_file(cache, (n, 128, 256))[0].name for n in (4, 640, 768))
    assert costs == [real(n, 128, 256, hw) for n in counts]
    assert costs[2][0] < costs[3][0] == costs[4][0]  # 5 tiles take fewer cycles than 6


@pytest.mark.parametrize("damage", ["truncated", "edited cost", "other material", "negative cost"])
def test_a_damaged_or_foreign_file_is_warned_about_simulated_again_and_replaced(cache, monkeypatch, damage):
    hw = PRESETS["sn40l"]
    cost = projections.projection_cost(*SHAPE, hw)
    path, _ = _file(cache)
    record = json.loads(path.read_text())
    if damage == "truncated":
        path.write_text(path.read_text()[:40])
    else:
        body = {k: v for k, v in record.items() if k != "sha256"}
        if damage == "edited cost":
            path.write_text(json.dumps({**body, "cost": [1, 2, 3, 4], "sha256": record["sha256"]}))
        else:  # a well-formed, correctly checksummed file that is not this key's cost
            body = ({**body, "material": {**body["material"], "tokens": 5}} if damage == "other material"
                    else {**body, "cost": [-1, 0, 0, 0]})
            path.write_text(json.dumps({**body, "sha256": projections.stable_hash(body)}))
    monkeypatch.setattr(projections, "_COSTS", {})
    with pytest.warns(StepsimWarning, match=rf"projection cost file {path}: unusable \(.*simulating again"):
        assert projections.projection_cost(*SHAPE, hw) == cost
    assert json.loads(path.read_text()) == record
