"""``stepsim optimize --max-chips`` over a stack of MoE layers: ``pp x ep`` (stepsim/optimize/chips.py,
``stack_ep``; the stack: stepsim/workloads/moe/pipeline_ep.py). The combinations, the grids (micro-batches with
ep where every shard splits), and the pruned search: its front equals the exhaustive front, every bound pinned and
below its run, the default systems of P x E chips written and read back."""

from __future__ import annotations

import json

import pytest
from small_routing import write_small_routing

from stepsim.base.system import System
from stepsim.optimize import optimize
from stepsim.optimize.chips import parallel_combos, parallel_grids
from stepsim.optimize.stack import micro_batch_grids

SMALL = {"model": "custom", "hidden": 512, "intermediate": 512, "experts": 8, "top_k": 2}
STATIC = {"tiling": ("static",), "tile_n": (8,), "tile_f": (128,)}
PLACEMENTS = ("contiguous", "round-robin", "load-balanced")


@pytest.fixture
def trace(tmp_path):
    return write_small_routing(tmp_path)[0]


def test_a_moe_stack_combines_pp_with_ep_never_tp():
    assert parallel_combos(("tp", "ep", "pp"), 4, experts=8, widths=(64,), batch=24, layers=2, stack_ep=True) == [
        {"ep": 2}, {"pp": 2}, {"ep": 4}, {"ep": 2, "pp": 2}]
    # without stack_ep (a dense decoder stack) pipelines alone
    assert parallel_combos(("tp", "ep", "pp"), 4, experts=8, widths=(64,), batch=24, layers=2) == [{"pp": 2}]


def test_pruned_search_over_pp_and_ep_equals_exhaustive(trace, tmp_path, serial, exhaustive_front):
    """A 2-layer stack under a 4-chip budget: one chip, ep 2, pp 2, ep 4 and pp 2 x ep 2 (every placement with
    ep), each with M = 2 too (with ep: every chip's shard split in two, moe/sharded_micro.py). Expert parallelism
    pays on this stack, pipelining barely (one micro-batch: a stage is a barrier); pp 2 x ep 2 is slower than ep 2
    by its boundary's hop and stays off the front (ep 4 is faster on as many chips); M = 2 with ep costs 30 to
    154 cycles more than M = 1 (a second weight read per expert tile), so the front is M = 1's."""
    grids = micro_batch_grids(parallel_grids([STATIC], 4, axes=("tp", "ep", "pp"), experts=8, widths=(512,),
                                             batch=24, layers=2, stack_ep=True),
                              workload="moe", batch=24, layers=2, bound=2)
    ep2, ep4 = {**STATIC, "ep": (2,), "placement": PLACEMENTS}, {**STATIC, "ep": (4,), "placement": PLACEMENTS}
    pp2ep2 = {**STATIC, "ep": (2,), "pp": (2,), "placement": PLACEMENTS}
    assert grids == [STATIC, {**STATIC, "micro_batches": (2,)}, ep2, {**ep2, "micro_batches": (2,)},
                     {**STATIC, "pp": (2,)}, {**STATIC, "pp": (2,), "micro_batches": (2,)},
                     ep4, {**ep4, "micro_batches": (2,)}, pp2ep2, {**pp2ep2, "micro_batches": (2,)}]
    out = tmp_path / "opt"
    r = optimize("moe", out=out, executor=serial, max_chips=4, space=grids, trace=trace, layers=2, **SMALL)
    front, cycles = exhaustive_front(r)
    assert sorted((c.run_id, *c.objectives) for c in r.front) == front
    systems = out / "systems"
    assert [(c.config.get("pp"), c.config.get("ep"), c.config.get("placement"), c.config.get("micro_batches"),
             c.config.get("system"), c.status, c.lower_bound, cycles[c.run_id]) for c in r.candidate_list] == [
        (None, None, None, None, None, "simulated", 29720, 50334),
        (None, None, None, 2, None, "pruned", 51222, 54416),
        (None, 2, "contiguous", None, None, "simulated", 20506, 43820),
        (None, 2, "round-robin", None, None, "simulated", 20506, 43823),
        (None, 2, "load-balanced", None, None, "simulated", 20506, 43820),
        (None, 2, "contiguous", 2, None, "simulated", 26646, 43974),
        (None, 2, "round-robin", 2, None, "simulated", 26646, 43950),
        (None, 2, "load-balanced", 2, None, "simulated", 26646, 43974),
        (2, None, None, None, (systems / "fully-connected-2.toml").as_posix(), "simulated", 21324, 50849),
        (2, None, None, 2, (systems / "fully-connected-2.toml").as_posix(), "simulated", 26646, 49656),
        (None, 4, "contiguous", None, None, "simulated", 20506, 43616),
        (None, 4, "round-robin", None, None, "simulated", 20506, 43616),
        (None, 4, "load-balanced", None, None, "simulated", 20506, 43616),
        (None, 4, "contiguous", 2, None, "simulated", 20506, 43646),
        (None, 4, "round-robin", 2, None, "simulated", 20506, 43648),
        (None, 4, "load-balanced", 2, None, "simulated", 20506, 43646),
        (2, 2, "contiguous", None, (systems / "fully-connected-4.toml").as_posix(), "simulated", 20506, 44335),
        (2, 2, "round-robin", None, (systems / "fully-connected-4.toml").as_posix(), "simulated", 20506, 44338),
        (2, 2, "load-balanced", None, (systems / "fully-connected-4.toml").as_posix(), "simulated", 20506, 44335),
        (2, 2, "contiguous", 2, (systems / "fully-connected-4.toml").as_posix(), "simulated", 20506, 44489),
        (2, 2, "round-robin", 2, (systems / "fully-connected-4.toml").as_posix(), "simulated", 20506, 44465),
        (2, 2, "load-balanced", 2, (systems / "fully-connected-4.toml").as_posix(), "simulated", 20506, 44489)]
    assert [(c.cycles, c.chips, c.config.get("pp"), c.config.get("ep"), c.config.get("placement"),
             c.config.get("micro_batches")) for c in r.front] == [
        (43616, 4, None, 4, "contiguous", None), (43616, 4, None, 4, "round-robin", None),
        (43616, 4, None, 4, "load-balanced", None), (43820, 2, None, 2, "contiguous", None),
        (43820, 2, None, 2, "load-balanced", None), (49656, 2, 2, None, None, 2), (50334, 1, None, None, None, None)]
    written = System.load(systems / "fully-connected-4.toml")
    assert (written.chips, written.dimensions[0].topology) == (4, "fully-connected")
    doc = json.loads((out / "optimize.json").read_text())
    assert [(p["pp"], p["ep"], p["micro_batches"], p["chips"]) for p in doc["pareto"]] == [
        (1, 4, 1, 4), (1, 4, 1, 4), (1, 4, 1, 4), (1, 2, 1, 2), (1, 2, 1, 2), (2, 1, 2, 2), (1, 1, 1, 1)]
