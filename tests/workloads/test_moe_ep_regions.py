"""Expert parallelism with time-multiplexed regions (``--ep N --regions R``): each chip runs its experts on R / N
regions, so the tokens a chip receives are its compute time and the placement decides the layer's cycles.

Pinned: Qwen3-30B-A3B on the shared B=64 trace and on a synthetic B=1024 trace with Qwen3's fitted skew
(stepsim.serve.routing.SyntheticRouting, seed 0), one region per chip, on 2, 4 and 8 chips."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from engines_agree import both_engines
from shared_traces_folder import require_shared_traces
from small_routing import write_small_routing

from stepsim.base.errors import ConfigError
from stepsim.graph.lower import lower
from stepsim.serve.routing import SyntheticRouting
from stepsim.simulation.simulate import simulate
from stepsim.workloads.config import workload_from_config
from stepsim.workloads.moe.parallel import region_members
from stepsim.workloads.reference import check_outputs, make_inputs
from stepsim.workloads.routing import expert_counts

TRACES = Path(__file__).resolve().parents[2].parent / "shared" / "traces"


def test_region_members_take_each_chips_experts_in_id_order():
    assert region_members([0, 1, 0, 1, 1, 0, 0, 1], 2, 4) == [[0, 2], [5, 6], [1, 3], [4, 7]]
    assert region_members([0, 1, 0, 1, 1, 0, 0, 1], 2, 2) == [[0, 2, 5, 6], [1, 3, 4, 7]]


@pytest.fixture
def trace(tmp_path):
    return write_small_routing(tmp_path)


def _config(path, **kw):
    cfg = {"workload": "moe", "model": "custom", "hidden": 16, "intermediate": 96, "experts": 8, "top_k": 2,
           "trace": path, "tile_n": 4, **kw}
    if cfg.get("tiling") == "dynamic":
        del cfg["tile_n"]
    return cfg


@pytest.mark.parametrize("tiling", ["static", "dynamic"])
@pytest.mark.parametrize("placement", ["contiguous", "load-balanced"])
def test_values_equal_the_one_chip_time_multiplexed_layer(trace, tiling, placement):
    path, _ = trace
    one = workload_from_config(_config(path, regions=4, tiling=tiling))
    w = workload_from_config(_config(path, regions=4, tiling=tiling, ep=2, placement=placement))
    members = w.params["region_experts"]
    # load-balanced: static tiling balances the experts' 4-row tiles, dynamic tiling their tokens
    assert members == {"contiguous": [[0, 1], [2, 3], [4, 5], [6, 7]]}.get(
        placement, [[1, 2], [3, 5], [0, 4], [6, 7]] if tiling == "static" else [[1, 3], [5, 6], [0, 2], [4, 7]])
    region_chips = {op.group[1]: op.chip for op in w.graph.ops if op.group and op.group[0] == "region"}
    assert region_chips == {0: 0, 1: 0, 2: 1, 3: 1}
    inputs, inputs1 = make_inputs(w, seed=2), make_inputs(one, seed=2)
    r = simulate(w, functional=True, inputs=inputs)
    assert all(c.passed for c in check_outputs(w, r.inputs, r.outputs).values())
    r1 = simulate(one, functional=True, inputs=inputs1)
    np.testing.assert_array_equal(np.concatenate([r.outputs["y.0"], r.outputs["y.1"]]), r1.outputs["y"])


@pytest.mark.parametrize("tiling", ["static", "dynamic"])
def test_both_engines_agree_with_time_multiplexed_chips(trace, tiling):
    path, _ = trace
    w = workload_from_config(_config(path, regions=4, tiling=tiling, ep=4, placement="load-balanced",
                                     system="ring-4"))
    program = lower(w.graph, channel_depth=w.channel_depth)
    fast = both_engines(program)
    assert fast.cycles == simulate(w).cycles


def test_regions_must_be_a_multiple_of_the_chips(trace):
    path, _ = trace
    with pytest.raises(ConfigError) as info:
        workload_from_config(_config(path, regions=2, ep=4))
    assert str(info.value) == ("--regions 2 must be a multiple of --ep 4: every chip time-multiplexes its experts "
                               "on the same number of regions")


# (ep, placement) -> cycles, per-chip tokens; one region per chip, static tiling (tile_n 32, tile_f 48, 1024 FLOPs/c)
B64 = {
    (2, "contiguous"): (3259288, [227, 285]),
    (2, "round-robin"): (3358499, [308, 204]),
    (2, "load-balanced"): (3062020, [253, 259]),
    (4, "contiguous"): (1881421, [76, 151, 110, 175]),
    (4, "round-robin"): (1684738, [162, 82, 146, 122]),
    (4, "load-balanced"): (1586512, [128] * 4),
    (8, "contiguous"): (995387, [47, 29, 72, 79, 79, 31, 107, 68]),
    (8, "round-robin"): (995291, [67, 44, 85, 47, 95, 38, 61, 75]),
    (8, "load-balanced"): (798776, [64] * 8),
}


@pytest.mark.parametrize("ep", [2, 4, 8])
def test_qwen3_on_the_shared_b64_trace(ep):
    """Per-chip token counts equal the trace's, the record names the busiest chip and the imbalance, and the
    load-balanced placement is the fastest on 2, 4 and 8 chips."""
    path = require_shared_traces(TRACES) / "expert_routing" / "qwen_b64" / "032_012.npz"
    counts = expert_counts(np.load(path)["data"], 128)
    cycles = {}
    for placement in ("contiguous", "round-robin", "load-balanced"):
        w = workload_from_config({"workload": "moe", "model": "qwen3-30b-a3b", "trace": str(path), "ep": ep,
                                  "placement": placement, "regions": ep})
        chip_of = np.array(w.params["expert_chips"])
        tokens = [int(counts[chip_of == c].sum()) for c in range(ep)]
        assert w.params["chip_tokens"] == tokens == B64[ep, placement][1]
        assert w.params["busiest_chip"] == int(np.argmax(tokens))
        assert w.params["imbalance"] == round(max(tokens) / (64 * 8 / ep), 6)
        cycles[placement] = simulate(w).cycles
    assert cycles == {p: B64[ep, p][0] for p in cycles}
    assert cycles["load-balanced"] < min(cycles["contiguous"], cycles["round-robin"])


@pytest.fixture(scope="module", params=[0, 1, 2])
def b1024(request, tmp_path_factory):
    """B=1024 tokens routed by the synthetic model fitted to Qwen3's skew (alpha 0.3, beta 0.05), seeds 0, 1, 2."""
    routing = SyntheticRouting(128, 8, 1, seed=request.param).route(1024)[:, 0, :]
    path = tmp_path_factory.mktemp("b1024") / f"qwen3_b1024_{request.param}.npz"
    np.savez(path, data=routing)
    return request.param, str(path), expert_counts(routing, 128)


# (seed, ep) -> (contiguous cycles, load-balanced cycles), and the token tiles (ceil(tokens / 32) per expert) per
# chip; one region per chip, so a chip's cycles are 98,304 per tile (16 F tiles of 6,144) plus a 12,000-21,000 fill
B1024 = {
    (0, 2): ((16338425, 16338425), ([166, 166], [166, 166])),
    (0, 4): ((8272089, 8174491), ([83, 83, 82, 84], [83] * 4)),
    (0, 8): ((5911388, 4142431), ([23, 60, 48, 35, 22, 60, 44, 40], [41, 41, 42, 41, 42, 41, 42, 42])),
    (1, 2): ((18104129, 16240290), ([184, 146], [165, 165])),
    (1, 4): ((10729047, 8173212), ([109, 75, 87, 59], [83, 82, 82, 83])),
    (1, 8): ((5419397, 4142259), ([54, 55, 37, 38, 54, 33, 28, 31], [42, 41, 41, 41, 41, 41, 41, 42])),
    (2, 2): ((17809955, 16237054), ([181, 148], [165, 164])),
    (2, 4): ((11712468, 8173621), ([119, 62, 58, 90], [83, 82, 82, 82])),
    (2, 8): ((7385769, 4142039), ([75, 44, 36, 26, 27, 31, 48, 42], [41, 41, 41, 41, 41, 41, 42, 41])),
}


TOP_COUNTS = {0: [640, 532, 488, 408], 1: [618, 534, 491, 421], 2: [623, 532, 493, 437]}


@pytest.mark.parametrize("ep", [2, 4, 8])
def test_load_balanced_against_contiguous_on_a_synthetic_b1024_trace(b1024, ep):
    """Load-balanced puts ceil(total tiles / ep) token tiles on its busiest chip, the least any placement can, and
    beats contiguous wherever contiguous has more; on seed 0 over 2 chips the contiguous halves already hold 166
    tiles each, so load-balanced keeps them (the same run)."""
    seed, path, counts = b1024
    assert sorted(counts.tolist(), reverse=True)[:4] == TOP_COUNTS[seed]  # the generator did not change
    total = int((-(-counts // 32)).sum())
    cycles, tiles = [], []
    for placement in ("contiguous", "load-balanced"):
        w = workload_from_config({"workload": "moe", "model": "qwen3-30b-a3b", "trace": path, "ep": ep,
                                  "placement": placement, "regions": ep})
        chip_of = np.array(w.params["expert_chips"])
        tokens = [int(counts[chip_of == c].sum()) for c in range(ep)]
        assert w.params["chip_tokens"] == tokens
        assert w.params["busiest_chip"] == int(np.argmax(tokens))
        assert w.params["imbalance"] == round(max(tokens) / (1024 * 8 / ep), 6)
        tiles.append([int((-(-counts[chip_of == c] // 32)).sum()) for c in range(ep)])
        cycles.append(simulate(w).cycles)
        print(f"B=1024 seed {seed} --ep {ep} --regions {ep} --placement {placement}: {cycles[-1]:,} cycles")
    assert (tuple(cycles), tuple(tiles)) == B1024[seed, ep]
    assert max(tiles[1]) == -(-total // ep)
    assert cycles[1] < cycles[0] if max(tiles[0]) > max(tiles[1]) else cycles[1] == cycles[0]
