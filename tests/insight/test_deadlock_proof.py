"""The static deadlock proof (stepsim.analysis.deadlock_proof): exact on a Qwen3 layer, and never wrong on random layers.

Soundness is what matters (``stepsim optimize`` skips a proven candidate without simulating it), so every
proof below is checked against the engine: the layer it proves must deadlock when simulated.
"""

from __future__ import annotations

import numpy as np
import pytest

from stepsim.analysis.deadlock_proof import DeadlockProof, prove_deadlock
from stepsim.base.defaults import UNSET, channel_capacity, resolve_channel_depth
from stepsim.base.errors import DeadlockError
from stepsim.base.hardware import Hardware
from stepsim.models.presets import MoEModel
from stepsim.results.records import run_config
from stepsim.simulation.simulate import simulate
from stepsim.workloads.config import resolve_hardware, workload_from_config
from stepsim.workloads.moe.build import build_moe


def _depth(workload, hardware) -> int:
    return resolve_channel_depth(UNSET, hardware, workload.channel_depth)


@pytest.mark.traces
def test_qwen_b64_one_region_of_one_token_tiles(shared_traces):
    """Qwen3 B=64, static tiles of 1 token, every expert on one time-multiplexed region, FIFO depth 2. Expert 5
    has tokens 1, 62 and 63: its tile of token 1 closes when the Reshape sees token 62. Before that the
    Partition has sent expert 74 its 30 tokens in between, and the Reassemble takes none of them before token
    1. Expert 74's path holds 14 rows before the region (4 channels of 2 rows, and 2 in each of its Reshape,
    Flatten and Accum) and 10 after it (3 channels of 2, 2 in its RetileStreamify and in its Map): 24 < 30.
    The engine deadlocks; with FIFOs 8 deep the paths hold 66 rows and nothing is proven."""
    config = {"workload": "moe", "model": "qwen3-30b-a3b",
              "trace": str(shared_traces / "expert_routing" / "qwen_b64" / "032_012.npz"),
              "tiling": "static", "tile_n": 1, "tile_f": 32, "regions": 1}
    workload = workload_from_config(config)
    hardware = resolve_hardware(config, workload)
    proof = prove_deadlock(workload, _depth(workload, hardware))
    assert proof == DeadlockProof(merge="EagerMerge_389", x=74, y=5, token=1, until=62, rows=30, pre=14, post=10,
                                  batch=64)
    assert proof.message == (
        "deadlock at these FIFO depths, proven without simulating: region EagerMerge_389 can take expert 5's "
        "tile holding token 1 only once token 62 is routed, and the Reassemble needs token 1 first, so expert "
        "74's 30 tokens in between must wait in its path, which holds 24 rows (14 before the region, 10 after it)")
    routing = workload.trace["routing"]
    assert [int(t) for t in np.flatnonzero((routing == 5).any(axis=1))] == [1, 62, 63]
    assert int(((routing == 74).any(axis=1))[2:62].sum()) == 30
    with pytest.raises(DeadlockError):
        simulate(workload, hardware=hardware)
    assert prove_deadlock(workload, 8) is None
    # the metrics record carries the proof
    assert run_config({**config, "mode": "metrics"}).row["deadlock_proof"] == proof.message
    # a dedicated layout (a region per expert) is proven by its whole private path: expert 104's chain from the
    # Partition holds 34 rows: 2 in the Partition's output, 2 + 2 in each of Reshape, Flatten, Accum and
    # Broadcast (held, output), 2 held by the RepeatStatic, 2 tiles of 1 row for the 14 element slots of its
    # 24 repeats (RepeatStatic output, Broadcast, Map, Map: 2 + 4 + 4 + 4), and 2 + 2 in each of MapAccum,
    # RetileStreamify and Map; its 39 tokens between token 1 and token 62 do not fit, and the engine deadlocks
    dedicated = {k: v for k, v in config.items() if k != "regions"}
    workload = workload_from_config(dedicated)
    proof = prove_deadlock(workload, _depth(workload, hardware))
    assert proof == DeadlockProof(merge="Partition_5", x=104, y=5, token=1, until=62, rows=39, pre=34, post=0,
                                  batch=64)
    assert proof.message == (
        "deadlock at these FIFO depths, proven without simulating: expert 5's tile holding token 1 closes only "
        "once token 62 is routed, and the Reassemble needs token 1 first, so expert 104's 39 tokens in between "
        "must wait in its path from Partition_5, which holds 34 rows")
    assert run_config({**dedicated, "mode": "metrics"}).row["deadlock_proof"] == proof.message
    with pytest.raises(DeadlockError):
        simulate(workload, hardware=resolve_hardware(dedicated, workload))


def test_random_layers_every_proof_deadlocks():
    """300 random static layers (4-16 experts, top-1 to top-3 of a skewed routing, 8-64 tokens, tiles of 1-4
    tokens, 1-4 regions, FIFO depths 1-4): every layer proven deadlocks in the engine. The counts are exact:
    9 proven, 79 deadlocks the counting argument does not see, 212 layers that finish."""
    rng = np.random.default_rng(0)
    outcomes = {}
    for _ in range(300):
        experts = int(rng.choice([4, 8, 16]))
        top_k = int(rng.integers(1, 4))
        batch = int(rng.integers(8, 65))
        skew = rng.dirichlet(np.full(experts, 0.5))
        routing = np.stack([rng.choice(experts, top_k, replace=False, p=skew) for _ in range(batch)])
        regions = int(rng.choice([r for r in (1, 2, 4) if experts % r == 0]))
        tile_n = int(rng.choice([1, 2, 4]))
        depth = int(rng.choice([1, 2, 3, 4]))
        model = MoEModel("random", hidden=32, intermediate=32, experts=experts, top_k=top_k)
        workload = build_moe(model, routing, tiling="static", tile_n=tile_n, tile_f=16, regions=regions,
                             channel_depth=depth)
        hardware = Hardware.preset(workload.hardware)
        proven = prove_deadlock(workload, _depth(workload, hardware)) is not None
        try:
            simulate(workload, hardware=hardware)
            deadlocked = False
        except DeadlockError:
            deadlocked = True
        assert deadlocked or not proven, (experts, top_k, batch, regions, tile_n, depth)
        outcomes[proven, deadlocked] = outcomes.get((proven, deadlocked), 0) + 1
    assert outcomes == {(True, True): 9, (False, True): 79, (False, False): 212}


def test_fifo_depth_overrides_count():
    """The proof sizes each channel as the lowering does: a per-channel override wins over the producer's own
    depth, which wins over the run's default. Two experts on one region, FIFOs 1 deep: expert 0 has tokens 0 and
    23, expert 1 the 22 in between. Expert 1's path holds 10 rows before the region (4 channels of 1 row, 2 in
    each of 3 operators) and 7 after it (3 channels, 2 in each of 2 operators): 17 < 22, and the engine
    deadlocks. Its Partition output 6 deep instead holds 5 rows more: 22, no longer a proof."""
    routing = np.array([[0]] + [[1]] * 22 + [[0]])
    model = MoEModel("two", hidden=32, intermediate=32, experts=2, top_k=1)
    workload = build_moe(model, routing, tiling="static", tile_n=1, tile_f=16, regions=1, channel_depth=1)
    proof = prove_deadlock(workload, 1)
    assert (proof.x, proof.y, proof.token, proof.until, proof.rows, proof.pre, proof.post) == (1, 0, 0, 23, 22, 10, 7)
    with pytest.raises(DeadlockError):
        simulate(workload, hardware=Hardware.preset(workload.hardware))
    partition = next(op for op in workload.graph.ops if op.kind == "Partition")
    name = f"{partition.name}[1]"
    assert (channel_capacity(partition, 1, 1, {}), channel_capacity(partition, 1, 1, {name: 6})) == (1, 6)
    workload.channel_depths = {name: 6}
    assert prove_deadlock(workload, 1) is None


def test_random_dedicated_layers_every_proof_deadlocks():
    """300 random static layers with a region per expert (2-8 experts, top-1 to top-3 of a skewed routing, 8-128
    tokens, tiles of 1-8 tokens, FIFO depths 1-3): every layer the whole-path count proves deadlocks in the engine.
    The counts are exact: 13 proven, 26 deadlocks the counting argument does not see, 261 layers that finish."""
    rng = np.random.default_rng(1)
    outcomes = {}
    for _ in range(300):
        experts = int(rng.choice([2, 4, 8]))
        top_k = int(rng.integers(1, min(3, experts) + 1))
        batch = int(rng.integers(8, 129))
        skew = rng.dirichlet(np.full(experts, 0.5))
        routing = np.stack([rng.choice(experts, top_k, replace=False, p=skew) for _ in range(batch)])
        tile_n = int(rng.choice([1, 2, 4, 8]))
        depth = int(rng.choice([1, 2, 3]))
        model = MoEModel("random", hidden=32, intermediate=int(rng.choice([32, 64])), experts=experts, top_k=top_k)
        workload = build_moe(model, routing, tiling="static", tile_n=tile_n, tile_f=16, channel_depth=depth)
        hardware = Hardware.preset(workload.hardware)
        proof = prove_deadlock(workload, _depth(workload, hardware))
        assert proof is None or proof.merge.startswith("Partition")  # no shared region: the dedicated count
        try:
            simulate(workload, hardware=hardware)
            deadlocked = False
        except DeadlockError:
            deadlocked = True
        assert deadlocked or proof is None, (experts, top_k, batch, tile_n, depth)
        outcomes[proof is not None, deadlocked] = outcomes.get((proof is not None, deadlocked), 0) + 1
    assert outcomes == {(True, True): 13, (False, True): 26, (False, False): 261}
