"""The pruned search finds exactly the exhaustive front, on spaces small enough to simulate exhaustively.

Qwen3-30B-A3B and Mixtral-8x7B on the shared B=64 routing traces, attention on B=16 KV-length windows. Every
simulated point's cycles are checked against its roofline lower bound (the bound the pruning relies on), and
the counts (space size, pruned, simulated) are exact: the search is deterministic.
"""

from __future__ import annotations

import pytest

from stepsim.optimize import optimize

pytestmark = pytest.mark.traces

QWEN_SPACE = [{"tiling": ("dynamic",), "tile_f": (64, 256)},
              {"tiling": ("dynamic",), "tile_f": (64,), "regions": (4, 32)},
              {"tiling": ("static",), "tile_n": (16, 64), "tile_f": (96,), "regions": (32,)}]
MIXTRAL_SPACE = [{"tiling": ("dynamic",), "tile_f": (256, 512)},
                 {"tiling": ("static",), "tile_n": (16, 64), "tile_f": (512,), "regions": (2,)}]


def _check(result, exhaustive_front):
    front, cycles = exhaustive_front(result)
    found = sorted((c.run_id, *c.objectives) for c in result.front)
    assert found == front
    for c in result.candidate_list:
        if c.status == "simulated":
            assert cycles[c.run_id] == c.cycles
            assert c.lower_bound <= c.cycles, c.config
        if c.status == "pruned":  # a pruned candidate is dominated in reality too
            assert cycles[c.run_id] is None or any(
                p[1] <= cycles[c.run_id] and p[2] <= c.on_chip_bytes and p[3] <= c.allocated_flops_per_cycle
                for p in front)
        if c.status == "deadlock":  # proven without simulating: the exhaustive run deadlocked
            assert cycles[c.run_id] is None, c.config
        if cycles.get(c.run_id) is not None:  # the bound holds on every simulated point, pruned ones too
            assert c.lower_bound <= cycles[c.run_id], c.config
    return front


def test_qwen_b64_front_equals_exhaustive(shared_traces, tmp_path, serial, exhaustive_front):
    trace = shared_traces / "expert_routing" / "qwen_b64" / "032_012.npz"
    result = optimize("moe", out=tmp_path / "opt", model="qwen", trace=str(trace), space=QWEN_SPACE,
                      executor=serial, round_size=1)
    _check(result, exhaustive_front)
    assert (result.candidates, result.pruned_symbolically, result.simulations) == (6, 2, 4)


def test_mixtral_b64_front_equals_exhaustive(shared_traces, tmp_path, serial, exhaustive_front):
    trace = shared_traces / "expert_routing" / "mixtral_b64" / "008_010.npz"
    result = optimize("moe", out=tmp_path / "opt", model="mixtral", trace=str(trace), space=MIXTRAL_SPACE,
                      executor=serial, round_size=1)
    _check(result, exhaustive_front)
    assert (result.candidates, result.pruned_symbolically, result.simulations) == (4, 1, 3)


@pytest.mark.parametrize("window", ["conv_stdev0174_1845_1860.npy", "conv_stdev1974_1487_1502.npy"])
def test_attention_b16_front_equals_exhaustive(shared_traces, tmp_path, serial, exhaustive_front, window):
    trace = shared_traces / "kv_lengths" / "b16" / window
    result = optimize("attention", out=tmp_path / "opt", trace=str(trace), executor=serial)
    _check(result, exhaustive_front)
    assert (result.candidates, result.pruned_symbolically, result.simulations) == (11, 0, 11)


def test_attention_b64_front_equals_exhaustive(shared_traces, tmp_path, serial, exhaustive_front):
    """B=64: dynamic parallelization assigns requests to regions during the run, so its per-region bounds use
    the mean over the regions (stepsim.analysis.bounds); the round-robin assignment's busiest region (40,836 cycles of
    K-cache tiles with 4 regions) exceeds the real run (39,961) and would have pruned by a wrong bound."""
    trace = sorted((shared_traces / "kv_lengths" / "b64").glob("*.npy"))[0]
    result = optimize("attention", out=tmp_path / "opt", trace=str(trace), executor=serial)
    _check(result, exhaustive_front)
    assert (result.candidates, result.pruned_symbolically, result.simulations) == (13, 1, 12)


def test_mixtral_b64_pipeline_bound_prunes_large_weight_tiles(shared_traces, tmp_path, serial, exhaustive_front):
    """Dynamic tiles on 4 time-multiplexed regions: tile_f 32 runs 5,419,308 cycles; tile_f 256 does the same
    FLOPs with more on-chip bytes, and its busiest unit's work alone (5,390,336) does not beat that, but its
    fill does: a 4096 x 256 weight tile and a gate firing before the down projection can start
    (pipeline_cycles 5,479,631; run 5,491,035). So it is pruned without simulating, and the front is exact."""
    trace = shared_traces / "expert_routing" / "mixtral_b64" / "008_010.npz"
    space = [{"tiling": ("dynamic",), "tile_f": (32, 256), "regions": (4,)}]
    result = optimize("moe", out=tmp_path / "opt", model="mixtral", trace=str(trace), space=space,
                      executor=serial, round_size=1)
    _check(result, exhaustive_front)
    assert [(c.config["tile_f"], c.status, c.lower_bound, c.cycles) for c in result.candidate_list] == \
        [(32, "simulated", 5_409_698, 5_419_308), (256, "pruned", 5_479_631, None)]
    assert (result.candidates, result.pruned_symbolically, result.simulations) == (2, 1, 1)


def test_qwen_b64_drain_bound_prunes_a_memory_bound_candidate(shared_traces, tmp_path, serial, exhaustive_front):
    """A region per expert: static tile_n 64 with tile_f 32 runs 571,459 cycles. Tile_n 32 has more on-chip
    bytes, and no weight request can start before the first tile of an expert's tokens closes (4,348 for the
    expert with 42 tokens, 5,250 for the others; tests/records/test_bounds.py), so the HBM's last weight
    request plus the firing on its tile (hbm_drain_cycles) already exceeds 571,459: 582,926 with tile_f 256
    (a 16,384-cycle firing) and 574,734 with tile_f 128 (8,192; counting the requests from tick 2 gives
    570,386, which would not prune it). Both are pruned without simulating, and the front is exact."""
    trace = shared_traces / "expert_routing" / "qwen_b64" / "032_012.npz"
    space = [{"tiling": ("static",), "tile_n": (64,), "tile_f": (32,)},
             {"tiling": ("static",), "tile_n": (32,), "tile_f": (256, 128)}]
    result = optimize("moe", out=tmp_path / "opt", model="qwen", trace=str(trace), space=space, executor=serial,
                      round_size=1)
    _check(result, exhaustive_front)
    assert [(c.config["tile_n"], c.config["tile_f"], c.status, c.lower_bound, c.cycles)
            for c in result.candidate_list] == [(64, 32, "simulated", 560_276, 571_459),
                                                (32, 256, "pruned", 582_926, None),
                                                (32, 128, "pruned", 574_734, None)]


def test_qwen_b64_proven_deadlocks_are_not_simulated(shared_traces, tmp_path, serial, exhaustive_front):
    """Static tiles of one token on 1 or 2 time-multiplexed regions at the workload's FIFO depth (2) are proven
    to deadlock (stepsim.analysis.deadlock_proof) and dropped without simulating; the exhaustive runs deadlock too. The
    same layer with ``channel_depth = 8`` sets a FIFO knob, which the shared metrics row (evaluated at the
    workload's own depth) does not cover: it is simulated, and finishes."""
    trace = shared_traces / "expert_routing" / "qwen_b64" / "032_012.npz"
    space = [{"tiling": ("static",), "tile_n": (1,), "tile_f": (32,), "regions": (1, 2)},
             {"tiling": ("dynamic",), "tile_f": (32,), "regions": (1,)},
             {"tiling": ("static",), "tile_n": (1,), "tile_f": (32,), "regions": (1,), "channel_depth": (8,)}]
    result = optimize("moe", out=tmp_path / "opt", model="qwen", trace=str(trace), space=space, executor=serial,
                      round_size=1)
    _check(result, exhaustive_front)
    assert [(c.config.get("tiling"), c.config.get("regions"), c.config.get("channel_depth"), c.status)
            for c in result.candidate_list] == [("static", 1, None, "deadlock"), ("static", 2, None, "deadlock"),
                                                ("dynamic", 1, None, "simulated"), ("static", 1, 8, "simulated")]
    assert result.candidate_list[0].error.startswith("deadlock at these FIFO depths, proven without simulating: ")
    report = result.to_json()
    assert (report["candidates"], report["pruned_symbolically"], report["proven_deadlocks"],
            report["simulations"]) == (4, 2, 2, 2)

