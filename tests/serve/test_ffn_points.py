"""The FFN buckets' simulated points stored in the mapping cache (stepsim/serve/ffn_points.py): a point is the exact
provider's fresh build of the model's FFN on each representative routing, on one chip and on a system's
expert-parallel chips; it is simulated once per key and read back by a fresh process (an emptied memo with the
simulation forbidden), never reused for other knobs, and a damaged file is warned about, simulated again and
replaced."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest
from test_fast_mapped import TINY, _schedule_for
from test_serve_system_templates import SMALL

import stepsim.mapping
from stepsim.base.errors import StepsimWarning
from stepsim.base.files import stable_hash
from stepsim.base.hardware import PRESETS
from stepsim.base.system import System
from stepsim.mapping.kinds.ffn import ffn_routing, ffn_samples
from stepsim.models.presets import resolve_model
from stepsim.serve import ffn_points
from stepsim.serve.layers import KV_TILE, LayerRunner, LayerSpec
from stepsim.serve.stored_costs import cost_path

SN40L = PRESETS["sn40l"]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A private mapping cache holding the suite's seeded schedules, and an empty memo: the test sees only the
    points it stores."""
    import os

    folder = tmp_path / "cache"
    shutil.copytree(os.environ["STEPSIM_MAPPING_CACHE"], folder, ignore=shutil.ignore_patterns(ffn_points.FOLDER, "projection-costs"))
    monkeypatch.setenv("STEPSIM_MAPPING_CACHE", str(folder))
    monkeypatch.setattr(ffn_points, "_POINTS", {})
    return folder


def _model(tmp_path, config: dict):
    path = tmp_path / "model.json"
    path.write_text(json.dumps(config))
    return resolve_model(str(path))


def _forbid_simulation(monkeypatch):
    def refuse(*args):
        raise AssertionError("simulated although the point was stored")

    monkeypatch.setattr(ffn_points, "simulate_point", refuse)


def _runner_cycles(spec: LayerSpec, tokens: int) -> list[int]:
    """The exact provider's fresh build of the whole model's FFN on each representative routing."""
    dims = spec.ffn_model
    return [LayerRunner(spec).fresh_cycles("ffn", ffn_routing(tokens, dims, s)) for s in range(ffn_samples(tokens))]


def test_a_point_is_the_runners_fresh_cycles_stored_once_and_read_back(cache, tmp_path, monkeypatch):
    monkeypatch.setattr(stepsim.mapping, "schedule_for", _schedule_for)  # TINY's schedules, injected
    spec = LayerSpec(_model(tmp_path, TINY), SN40L, KV_TILE, None, "auto")
    cycles = ffn_points.point_cycles(5, spec.ffn_model, SN40L)
    assert list(cycles) == _runner_cycles(spec, 5) and len(cycles) == ffn_samples(5) == 4
    material = ffn_points.point_material(5, spec.ffn_model, SN40L)
    path = cost_path(ffn_points.FOLDER, material)
    assert [p.name for p in (cache / ffn_points.FOLDER).iterdir()] == [path.name]
    record = json.loads(path.read_text())
    assert record["material"] == material and record["cost"] == list(cycles)
    assert (material["tokens"], material["samples"], material["system"], material["knobs"]) == (
        5, 4, None, {"tile_n": 8, "tile_f": 32, "lanes": 2, "regions": 8})  # bucket 8's injected knobs
    monkeypatch.setattr(ffn_points, "_POINTS", {})
    _forbid_simulation(monkeypatch)
    assert ffn_points.point_cycles(5, spec.ffn_model, SN40L) == cycles


def test_other_knobs_are_another_point(cache, tmp_path, monkeypatch):
    """A schedule injected with other knobs (as tests inject the mapper's) never reads the real knobs' point."""
    spec = LayerSpec(_model(tmp_path, TINY), SN40L, KV_TILE, None, "auto")
    monkeypatch.setattr(stepsim.mapping, "schedule_for", _schedule_for)
    injected = ffn_points.point_material(5, spec.ffn_model, SN40L)

    def other(kind, size, dims, hardware, *, cache=True):
        schedule = _schedule_for(kind, size, dims, hardware)
        return dataclasses.replace(schedule, knobs={**schedule.knobs, "lanes": 1})

    monkeypatch.setattr(stepsim.mapping, "schedule_for", other)
    changed = ffn_points.point_material(5, spec.ffn_model, SN40L)
    assert {k for k in injected if injected[k] != changed[k]} == {"knobs"}
    assert ffn_points.point_cycles(5, spec.ffn_model, SN40L) == tuple(_runner_cycles(spec, 5))


def test_an_expert_parallel_point_is_the_systems_fresh_cycles(cache, tmp_path, monkeypatch):
    system = dataclasses.replace(System.preset("ring-2"), hardware=SN40L)
    spec = LayerSpec(_model(tmp_path, SMALL), SN40L, KV_TILE, system, "auto")
    cycles = ffn_points.point_cycles(3, spec.ffn_model, SN40L, system)
    assert list(cycles) == _runner_cycles(spec, 3)
    material = ffn_points.point_material(3, spec.ffn_model, SN40L, system)
    assert (material["system"], material["samples"]) == ("ring-2", 6)
    monkeypatch.setattr(ffn_points, "_POINTS", {})
    _forbid_simulation(monkeypatch)
    assert ffn_points.point_cycles(3, spec.ffn_model, SN40L, system) == cycles


@pytest.mark.parametrize("damage", ["truncated", "edited cycles", "other material", "too few cycles"])
def test_a_damaged_or_foreign_file_is_warned_about_simulated_again_and_replaced(cache, tmp_path, monkeypatch,
                                                                                 damage):
    monkeypatch.setattr(stepsim.mapping, "schedule_for", _schedule_for)
    dims = _model(tmp_path, TINY).moe
    cycles = ffn_points.point_cycles(2, dims, SN40L)
    path = cost_path(ffn_points.FOLDER, ffn_points.point_material(2, dims, SN40L))
    record = json.loads(path.read_text())
    body = {k: v for k, v in record.items() if k != "sha256"}
    if damage == "truncated":
        path.write_text(path.read_text()[:40])
    elif damage == "edited cycles":
        path.write_text(json.dumps({**body, "cost": [1] * len(cycles), "sha256": record["sha256"]}))
    else:  # a well-formed, correctly checksummed file that is not this key's point
        body = ({**body, "material": {**body["material"], "tokens": 3}} if damage == "other material"
                else {**body, "cost": list(cycles[:-1])})
        path.write_text(json.dumps({**body, "sha256": stable_hash(body)}))
    monkeypatch.setattr(ffn_points, "_POINTS", {})
    with pytest.warns(StepsimWarning, match=rf"ffn point file {path}: unusable \(.*simulating again"):
        assert ffn_points.point_cycles(2, dims, SN40L) == cycles
    assert json.loads(path.read_text()) == record
