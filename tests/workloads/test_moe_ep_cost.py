"""The no-regions cost model of expert parallelism (stepsim/workloads/moe/ep_cost.py) and the load-balanced placement
that minimizes it (``--ep N`` without ``--regions``, stepsim/workloads/moe/parallel.py).

Pinned: the model's figures from the hardware; the search against brute force on small cases; and Qwen3-30B-A3B
on the bundled and shared B=64 traces and a synthetic B=1024 trace (seed 1) on 2, 4 and 8 chips, every placement
on the engine: load-balanced is never slower than contiguous, and the model orders the placements as the engine
does (docs/system.md, "What sets a chip's time")."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest
from shared_traces_folder import require_shared_traces

from stepsim.base.hardware import Hardware
from stepsim.models.presets import MoEModel
from stepsim.serve.routing import SyntheticRouting
from stepsim.simulation.simulate import simulate
from stepsim.workloads.config import workload_from_config
from stepsim.workloads.moe.ep_cost import PassCost, chip_cycles, pass_cost, placement_cycles
from stepsim.workloads.moe.parallel import place_experts
from stepsim.workloads.routing import expert_counts

QWEN = MoEModel("qwen3-30b-a3b", hidden=2048, intermediate=768, experts=128, top_k=8)
EVAL = Hardware.preset("step-eval")


@pytest.mark.parametrize("hw, tile_f, shared, alone", [
    # 36 tiles of 4,096 requests at 16 a cycle; alone 12 tiles x (4,096 requests + 18 cycles of round trip)
    (EVAL, 64, 9216, 49368),
    # 72 tiles of 2,048 requests; alone 24 x (2,048 + 18)
    (EVAL, 32, 9216, 49584),
    # 8 channels: 4 requests a cycle; alone still paced by the load units
    (Hardware.preset("step-hdl"), 64, 36864, 49368),
    # 2 channels: 1 request a cycle, slower than a pass's own units: alone is the HBM's peak
    (Hardware.preset("step-eval", hbm_channels=2), 64, 147456, 147456),
])
def test_pass_cycles_follow_the_hardware_and_the_tiles(hw, tile_f, shared, alone):
    assert pass_cost(QWEN, 32, tile_f, 4096, hw) == PassCost(shared=shared, alone=alone)


def test_alone_is_paced_by_the_matmul_when_it_is_slower_than_the_loads():
    """512 FLOPs/cycle: 2 x 32 x 2048 x 64 / 512 = 16,384 cycles a weight tile, 12 of them."""
    assert pass_cost(QWEN, 32, 64, 512, EVAL) == PassCost(shared=9216, alone=196608)


@pytest.mark.parametrize("tiles, cycles", [
    ([], 0), ([0, 0], 0), ([3], 90), ([1] * 6, 60), ([2, 2, 1], 60), ([2, 1, 1, 1, 1], 80), ([4, 2, 2, 2], 140)])
def test_chip_cycles_sum_the_phases(tiles, cycles):
    """Phase j costs max(n_j x 10, 30) (n_j experts with at least j tiles), 0 when no expert has j tiles."""
    assert chip_cycles(tiles, PassCost(shared=10, alone=30)) == cycles


def _brute_force(tiles, chips, cost):
    per_chip = -(-len(tiles) // chips)
    return min(max(placement_cycles(tiles, list(a), chips, cost)) for a in itertools.product(range(chips),
                                                                                              repeat=len(tiles))
               if all(a.count(c) <= per_chip for c in range(chips)))


def test_load_balanced_against_brute_force_on_small_layers():
    """300 seeded small layers (6-8 experts, 2 or 3 chips, 0-3 tiles of 4 rows each; a pass 10 cycles shared, 15
    alone): load-balanced is never modelled slower than contiguous or round-robin; 64 times the search's placement
    is taken and reaches the brute-force least busiest chip, 235 times contiguous or round-robin is kept within
    one shared pass of the least, and once neither: tiles [3, 1, 3, 2, 0, 1, 1, 0] on 2 chips, where the two
    three-tile experts with the idle ones (60 cycles) beat the search's 70 (kept round-robin's): the greedy
    splits them and the blocks, which keep the idle experts last, cannot put them together within 4 a chip."""
    cost = PassCost(shared=10, alone=15)
    rng = random.Random(7)
    outcomes = {"search, least": 0, "kept, within a pass": 0}
    missed = []
    for _ in range(300):
        chips = rng.choice([2, 3])
        counts = [rng.choice([0, 1, 1, 1, 4, 5, 9, 12]) for _ in range(rng.choice([6, 7, 8]))]
        tiles = [-(-n // 4) for n in counts]
        placed = {p: place_experts(counts, chips, p, tile_n=4, cost=cost) for p in
                  ("contiguous", "round-robin", "load-balanced")}
        modelled = {p: max(placement_cycles(tiles, c, chips, cost)) for p, c in placed.items()}
        best = _brute_force(tiles, chips, cost)
        assert modelled["load-balanced"] <= min(modelled["contiguous"], modelled["round-robin"])
        kept = placed["load-balanced"] in (placed["contiguous"], placed["round-robin"])
        if kept and modelled["load-balanced"] < best + cost.shared:
            outcomes["kept, within a pass"] += 1
        elif not kept and modelled["load-balanced"] == best:
            outcomes["search, least"] += 1
        else:
            missed.append((chips, tiles, modelled["load-balanced"], best))
    assert outcomes == {"search, least": 64, "kept, within a pass": 235}
    assert missed == [(2, [3, 1, 3, 2, 0, 1, 1, 0], 70, 60)]


def test_the_search_is_deterministic_and_fills_no_chip_beyond_its_share():
    rng = np.random.default_rng(3)
    counts = rng.integers(0, 200, size=128)
    cost = pass_cost(QWEN, 32, 64, 4096, EVAL)
    chip_of = place_experts(counts, 8, "load-balanced", 32, cost)
    assert chip_of == place_experts(counts.tolist(), 8, "load-balanced", 32, cost)
    assert max(np.bincount(chip_of, minlength=8)) <= 16


SHARED = "expert_routing/qwen_b64/032_012.npz"
#: (trace, ep) -> placement -> (engine cycles, modelled busiest chip); static tiling (tile_n 32, tile_f 64,
#: 4,096 FLOPs/cycle), one region per expert, step-eval, fully connected chips
CASES = {
    ("bundled", 2): {"contiguous": (409441, 399576), "round-robin": (437220, 427224),
                     "load-balanced": (409441, 399576)},
    ("shared", 2): {"contiguous": (320280, 304128), "round-robin": (364046, 353496),
                    "load-balanced": (320280, 304128)},
    ("shared", 4): {"contiguous": (214300, 206040), "round-robin": (205234, 196824),
                    "load-balanced": (169912, 156672)},
    ("shared", 8): {"contiguous": (133430, 123096), "round-robin": (123844, 113880),
                    "load-balanced": (108899, 98736)},
    ("b1024 seed 1", 2): {"contiguous": (1929128, 1912944), "round-robin": (1744665, 1845792),
                          "load-balanced": (1721841, 1657536)},
    ("b1024 seed 1", 4): {"contiguous": (1319205, 1309272), "round-robin": (1260425, 1253976),
                          "load-balanced": (1143884, 1131528)},
    ("b1024 seed 1", 8): {"contiguous": (1091239, 1082160), "round-robin": (1067901, 1057800),
                          "load-balanced": (998586, 987360)},
}


@pytest.mark.parametrize("trace, ep", list(CASES), ids=[f"{t}-ep{e}" for t, e in CASES])
def test_load_balanced_is_never_slower_than_contiguous_and_the_model_orders_the_placements(tmp_path, trace, ep):
    """On the bundled trace over 2 chips the search is modelled 3,288 cycles (under one shared pass) faster than
    contiguous, so contiguous is kept: the engine runs the search's placement 2,988 cycles slower."""
    cfg = {"workload": "moe", "model": "qwen3-30b-a3b", "ep": ep}
    if trace == "shared":
        cfg["trace"] = str(require_shared_traces() / SHARED)
    elif trace.startswith("b1024"):
        path = tmp_path / "b1024.npz"
        np.savez(path, data=SyntheticRouting(128, 8, 1, seed=1).route(1024)[:, 0, :])
        cfg["trace"] = str(path)
    cost = pass_cost(QWEN, 32, 64, 4096, EVAL)
    measured = {}
    for placement in CASES[trace, ep]:
        w = workload_from_config({**cfg, "placement": placement})
        tiles = -(-expert_counts(w.trace["routing"], 128) // 32)
        modelled = max(placement_cycles(tiles, w.params["expert_chips"], ep, cost))
        measured[placement] = (simulate(w).cycles, modelled)
    assert measured == CASES[trace, ep]
    assert measured["load-balanced"][0] <= measured["contiguous"][0]
    for a, b in itertools.combinations(measured, 2):  # where the model tells two placements apart, so does the engine
        (cycles_a, model_a), (cycles_b, model_b) = measured[a], measured[b]
        if model_a != model_b:
            assert (model_a < model_b) == (cycles_a < cycles_b)


@pytest.mark.parametrize("channels", [None, 32, 2])
def test_the_placement_models_the_hardware_the_run_uses(tmp_path, channels):
    """``--hardware`` without ``--system``: the chips of the default system get that hardware, so load-balanced
    models it (none, or a file equal to step-eval: the default system). Two HBM channels make a pass as slow alone
    as shared (147,456 cycles): the model then balances the tiles alone, and the bundled trace's placement on 2
    chips is no longer contiguous kept."""
    cfg = {"workload": "moe", "model": "qwen3-30b-a3b", "ep": 2, "placement": "load-balanced"}
    if channels is not None:
        (tmp_path / "hw.toml").write_text(f'preset = "step-eval"\nhbm_channels = {channels}\n')
        cfg["hardware"] = str(tmp_path / "hw.toml")
    w = workload_from_config(cfg)
    counts = expert_counts(w.trace["routing"], 128)
    cost = pass_cost(QWEN, 32, 64, 4096, Hardware.preset("step-eval", hbm_channels=channels or 32))
    assert cost == (PassCost(147456, 147456) if channels == 2 else PassCost(9216, 49368))
    assert w.params["expert_chips"] == place_experts(counts, 2, "load-balanced", 32, cost)
    assert (w.params["expert_chips"] == place_experts(counts, 2, "contiguous")) == (channels != 2)
    assert w.params["system"] == "fully-connected-2"
