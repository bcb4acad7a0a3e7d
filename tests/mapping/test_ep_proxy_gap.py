"""The expert-parallel block's regions searched on the system (:func:`stepsim.mapping.expert_parallel.search_knobs`)
against the proxy's whole space searched there (``bench/ep_proxy_gap.py``, docs/mapping.md §9): on the small MoE on
``ring-2`` at 8 tokens the proxy alone kept one region an expert, 1.17x the best (one region a chip); with the
regions searched the choice is the best. The search's choice is cached by its own key and read back."""

import dataclasses
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import ep_proxy_gap  # noqa: E402

from stepsim.base.hardware import Hardware  # noqa: E402
from stepsim.base.system import System  # noqa: E402
from stepsim.models.presets import resolve_model  # noqa: E402

SN40L = Hardware.preset("sn40l")


def _case():
    system = dataclasses.replace(System.preset("ring-2"), hardware=SN40L)
    return resolve_model(str(ROOT / "examples" / "small-moe.json")).moe, system


def test_the_searched_regions_are_the_best_of_the_proxys_space_on_the_system():
    model, system = _case()
    got = ep_proxy_gap.gap(model, system, 8, SN40L)
    got.pop("wall_s")
    assert got == {"system": "ring-2", "tokens": 8,
                   "chosen": {"tile_n": 4, "tile_f": 32, "lanes": 4, "regions": 2}, "chosen_cycles": 2708.5,
                   "best": {"tile_n": 4, "tile_f": 32, "lanes": 4, "regions": 2}, "best_cycles": 2708.5,
                   "ratio": 1.0, "candidates": 96}


def test_the_search_is_cached_by_its_key_and_read_back(tmp_path, monkeypatch):
    from stepsim.base.files import stable_hash
    from stepsim.mapping import expert_parallel as xp

    model, system = _case()
    monkeypatch.setattr(xp, "_SEARCHED", {})
    knobs = xp.search_knobs(8, model, system, SN40L, cache=tmp_path)
    material = xp.search_material(8, model, system, SN40L)
    [record] = [json.loads(p.read_text()) for p in tmp_path.glob("*.json") if p.stem == stable_hash(material)]
    assert (record["material"], record["schedule"]["kind"], record["schedule"]["knobs"]) == (material, "ep", knobs)
    assert knobs == {"tile_n": 4, "tile_f": 32, "lanes": 4, "regions": 2}
    # a fresh process (no memo) reads the file: nothing is simulated again
    monkeypatch.setattr(xp, "_SEARCHED", {"source": material["source"]})
    monkeypatch.setattr(xp, "_mean_cycles", lambda *a: (_ for _ in ()).throw(AssertionError("simulated again")))
    assert xp.search_knobs(8, model, system, SN40L, cache=tmp_path) == knobs
    # another system (its links) is another key
    assert xp.search_material(8, model, dataclasses.replace(System.preset("ring-4"), hardware=SN40L),
                              SN40L)["links"] != material["links"]
