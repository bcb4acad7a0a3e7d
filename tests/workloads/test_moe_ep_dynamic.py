"""Expert parallelism with dynamic tiling (``--tiling dynamic --ep N``, one region per expert) and ``--tp T --ep E``:
the cost models load-balanced minimizes (stepsim/workloads/moe/ep_cost.py ``RaggedCost``, ``pass_cost`` of the
shard) and the placements they give.

Pinned: the ragged model's figures from the hardware; Qwen3-30B-A3B with dynamic tiling on the bundled B=64 trace
(2, 4 and 8 chips) and the shared one (4 chips), every placement on the engine: load-balanced is never slower than
contiguous or round-robin, and the model orders the placements as the engine does (docs/system.md, "The cost model
with dynamic tiling")."""

from __future__ import annotations

import itertools

import pytest
from shared_traces_folder import require_shared_traces

from stepsim.base.hardware import Hardware
from stepsim.models.presets import MoEModel
from stepsim.simulation.simulate import simulate
from stepsim.workloads.config import workload_from_config
from stepsim.workloads.moe.ep_cost import (
    RaggedCost,
    dispatch_cycles,
    pass_cost,
    ragged_chip_cycles,
    ragged_cost,
    ragged_cycles,
    ragged_placement_cycles,
)
from stepsim.workloads.moe.parallel import place_experts, shard_rows
from stepsim.workloads.routing import expert_counts

QWEN = MoEModel("qwen3-30b-a3b", hidden=2048, intermediate=768, experts=128, top_k=8)
EVAL = Hardware.preset("step-eval")


def test_the_ragged_model_follows_the_hardware_and_the_rows():
    """6,400 FLOPs/cycle: a weight tile's 2 x r x 2048 x 64 FLOPs take 40.96 r cycles, slower than its load (4,114
    cycles) from 101 rows; a row of 2,048 bf16 values is 64 cycles on a 64 B/cycle link."""
    cost = ragged_cost(QWEN, 64, 6400, EVAL, 64, 500)
    assert cost == RaggedCost(shared=9216, n_f=12, pace=4114, flops_per_row=262144, compute_bw=6400, row_cycles=64,
                              link_latency=500)
    assert [cost.alone(r) for r in (0, 1, 100, 101, 640)] == [0, 49368, 49368, 49644, 314580]
    assert ragged_cost(QWEN, 64, 6400, EVAL) == RaggedCost(9216, 12, 4114, 262144, 6400, 0, 0)


def test_a_chip_waits_for_its_busiest_link_and_shares_its_hbm():
    cost = ragged_cost(QWEN, 64, 6400, EVAL, 64, 500)
    assert dispatch_cycles([40, 0, 25, 7], 1, cost) == 40 * 64 + 500
    assert dispatch_cycles([0, 9, 0, 0], 1, cost) == 0  # its own shard's rows take no link
    assert ragged_chip_cycles([49368] * 10, 9216) == 10 * 9216
    assert ragged_chip_cycles([314580] + [49368] * 10, 9216) == 314580
    # two experts on chip 0: 3 + 1 rows from chip 1's shard, 4 + 0 from its own; one on chip 1: 2 from chip 0
    rows = [[4, 3], [0, 1], [2, 0]]
    assert ragged_placement_cycles([7, 1, 2], rows, [0, 0, 1], 2, cost) == [4 * 64 + 500 + 49368, 2 * 64 + 500 + 49368]
    # the placement: the latest passes, then the busiest link of any chip
    assert ragged_cycles([7, 1, 2], rows, [0, 0, 1], 2, cost) == 49368 + 4 * 64 + 500


def test_load_balanced_splits_the_heavy_experts_and_keeps_their_rows_home():
    """Two 200-row experts, each fed by one shard, on 2 chips: a heavy pass takes 98,304 cycles alone (its FLOPs),
    more than two shared passes. Contiguous puts both on chip 0, whose 200 rows from chip 1 take 13,300 cycles on
    the link after the passes; the least (98,304) has each heavy expert on its shard's chip with a light expert of
    the same shard. Round-robin is one light row from it on each link (98,868): under one shared pass (9,216)
    more, kept."""
    cost = ragged_cost(QWEN, 64, 6400, EVAL, 64, 500)
    counts = [200, 200, 1, 1]
    rows = [[200, 0], [0, 200], [0, 1], [1, 0]]
    cycles = {p: (ragged_placement_cycles(counts, rows, place_experts(counts, 2, p), 2, cost),
                  ragged_cycles(counts, rows, place_experts(counts, 2, p), 2, cost))
              for p in ("contiguous", "round-robin")}
    assert cycles == {"contiguous": ([98304 + 200 * 64 + 500, 49368 + 64 + 500], 98304 + 200 * 64 + 500),
                      "round-robin": ([98304 + 64 + 500] * 2, 98304 + 64 + 500)}
    assert ragged_cycles(counts, rows, [0, 1, 1, 0], 2, cost) == 98304
    assert place_experts(counts, 2, "load-balanced", None, cost, rows) == [0, 1, 0, 1]
    # with 200 rows each the light experts cost round-robin 13,300 cycles more than the least: searched
    far = [[200, 0], [0, 200], [0, 200], [200, 0]]
    assert place_experts([200] * 4, 2, "load-balanced", None, cost, far) == [0, 1, 1, 0]


SHARED = "expert_routing/qwen_b64/032_012.npz"
#: (trace, ep) -> placement -> (engine cycles, modelled busiest chip); dynamic tiling (tile_f 64, 6,400
#: FLOPs/cycle), one region per expert, step-eval, fully connected chips (64 B/cycle, 500 cycles)
CASES = {
    ("bundled", 2): {"contiguous": (402898, 396084), "round-robin": (394047, 386612),
                     "load-balanced": (386469, 375796)},
    ("bundled", 4): {"contiguous": (215995, 205620), "round-robin": (216566, 206068),
                     "load-balanced": (197804, 186868)},
    ("bundled", 8): {"contiguous": (131092, 121204), "round-robin": (131483, 121268),
                     "load-balanced": (103676, 93236)},
    ("shared", 4): {"contiguous": (188630, 178484), "round-robin": (170238, 160244),
                    "load-balanced": (151534, 140724)},
}


@pytest.mark.parametrize("trace, ep", list(CASES), ids=[f"{t}-ep{e}" for t, e in CASES])
def test_load_balanced_is_fastest_and_the_model_orders_the_placements(trace, ep):
    cfg = {"workload": "moe", "model": "qwen3-30b-a3b", "tiling": "dynamic", "ep": ep}
    if trace == "shared":
        cfg["trace"] = str(require_shared_traces() / SHARED)
    cost = ragged_cost(QWEN, 64, 6400, EVAL, 64, 500)
    measured = {}
    for placement in CASES[trace, ep]:
        w = workload_from_config({**cfg, "placement": placement})
        routing = w.trace["routing"]
        modelled = ragged_cycles(expert_counts(routing, 128), shard_rows(routing, 128, ep), w.params["expert_chips"],
                                 ep, cost)
        measured[placement] = (simulate(w).cycles, modelled)
    assert measured == CASES[trace, ep]
    assert measured["load-balanced"][0] <= min(measured["contiguous"][0], measured["round-robin"][0])
    for a, b in itertools.combinations(measured, 2):  # where the model tells two placements apart, so does the engine
        (cycles_a, model_a), (cycles_b, model_b) = measured[a], measured[b]
        if model_a != model_b:
            assert (model_a < model_b) == (cycles_a < cycles_b)


@pytest.mark.parametrize("tiling", ["static", "dynamic"])
def test_tp_x_ep_places_the_groups_by_the_shards_model(tiling):
    """``--tp 2 --ep 4``: every chip of a group runs F / 2 = 384 columns of its experts, 6 weight tiles a pass
    (static: 4,608 cycles shared, 24,684 alone), and the groups are placed as ``--ep 4`` would place experts of
    that width."""
    w = workload_from_config({"workload": "moe", "model": "qwen3-30b-a3b", "tiling": tiling, "tp": 2, "ep": 4,
                              "placement": "load-balanced"})
    routing = w.trace["routing"]
    shard = MoEModel("qwen3-30b-a3b", hidden=2048, intermediate=384, experts=128, top_k=8)
    if tiling == "static":
        cost = pass_cost(shard, 32, 64, 4096, EVAL)
        assert (cost.shared, cost.alone) == (4608, 24684)
        groups = place_experts(expert_counts(routing, 128), 4, "load-balanced", 32, cost)
    else:
        cost = ragged_cost(shard, 64, 6400, EVAL, 64, 500)
        groups = place_experts(expert_counts(routing, 128), 4, "load-balanced", None, cost, shard_rows(routing, 128, 4))
    assert w.params["expert_chips"] == [2 * g for g in groups]
