"""``bench/ep_proxy_gap.py`` (docs/mapping.md §9): the expert-parallel block's knobs chosen on the one-chip proxy
against the proxy's whole space searched on the system's graph. Pinned on the small MoE on ``ring-2`` at 8 tokens,
where the proxy keeps one region an expert and one region a chip is 1.17x faster: the measurement the system-level
search (not built yet) must bring to 1."""

import dataclasses
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import ep_proxy_gap  # noqa: E402


def test_the_proxys_knobs_against_the_search_on_the_system():
    from stepsim.base.hardware import Hardware
    from stepsim.base.system import System
    from stepsim.models.presets import resolve_model

    hardware = Hardware.preset("sn40l")
    system = dataclasses.replace(System.preset("ring-2"), hardware=hardware)
    got = ep_proxy_gap.gap(resolve_model(str(ROOT / "examples" / "small-moe.json")).moe, system, 8, hardware)
    got.pop("wall_s")
    assert got == {"system": "ring-2", "tokens": 8,
                   "chosen": {"tile_n": 4, "tile_f": 32, "lanes": 4, "regions": 16}, "chosen_cycles": 3165.0,
                   "best": {"tile_n": 4, "tile_f": 32, "lanes": 4, "regions": 2}, "best_cycles": 2708.5,
                   "ratio": 1.1685, "candidates": 96}
