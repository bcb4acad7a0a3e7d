"""size_fifos on Qwen3-30B-A3B MoE layers that deadlock at the experiments' FIFO depth of 2.

Synthetic skewed routing (Dirichlet alpha 0.3, seed 1; the hottest expert gets 718 of 8192 slots at B=1024),
made here with stepsim.trace_io.synthetic. The layer dims are reduced (D=32, F=192) so each sizing takes
seconds; the graph structure (128 experts, top-8, tiles per expert, regions) and the deadlock at depth 2 are
those of the full layer. The full-size case is timed in bench/test_bench_size_fifos.py.

Every claim is checked by an independent simulation: the sized depths finish, their cycles equal the
reported ones and are within 1 % of 1024-deep FIFOs, and the byte totals are recomputed from the channels.
"""

import math

import numpy as np
import pytest

from stepsim.base.errors import DeadlockError
from stepsim.graph.channels import channel_infos
from stepsim.passes import size_fifos
from stepsim.simulation.simulate import simulate
from stepsim.trace_io.synthetic import synthetic_routing
from stepsim.workloads.moe.build import build_moe
from stepsim.workloads.reference import small_moe_model

pytestmark = pytest.mark.slow

MODEL = small_moe_model("qwen3-30b-a3b", hidden=32, intermediate=192)


def _routing(batch: int) -> np.ndarray:
    table = synthetic_routing(batch, 128, 8, seed=1, skew="dirichlet", alpha=0.3)
    return np.stack(table.column("expert_ids").to_numpy(zero_copy_only=False)).astype(np.int64)


@pytest.fixture(scope="module")
def routing_b1024():
    routing = _routing(1024)
    assert np.bincount(routing.ravel(), minlength=128).max() == 718
    return routing


def _check_sizing(workload, *, deadlocks_at_default: bool):
    named = {}
    if deadlocks_at_default:
        with pytest.raises(DeadlockError) as err:
            simulate(workload)  # the experiments' FIFOs of 2
        named = err.value.diagnosis.fix_capacities  # the channels the diagnosis tells the user to deepen
        assert named
    result = size_fifos(workload, slack=0.01, uniform=False)
    # the diagnosis and the pass agree: every channel the diagnosis names is deepened by the pass
    assert result.deadlock_fix_channels == {name: depth + 1 for name, depth in named.items()}
    assert all(result.depths[name] > depth for name, depth in named.items())
    assert result.deadlock_fix_bytes == sum(result.deadlock_fix_channels[c.name] * c.elem_bytes
                                            for c in channel_infos(workload.graph, workload.bindings)
                                            if c.name in named)
    channels = channel_infos(workload.graph, workload.bindings)
    assert list(result.depths) == [c.name for c in channels]
    assert all(1 <= d <= 1024 for d in result.depths.values())
    unbounded = simulate(workload, channel_depth=1024)
    sized = simulate(workload, channel_depths=result.depths)
    assert (result.unbounded_cycles, result.cycles) == (unbounded.cycles, sized.cycles)
    assert sized.cycles <= math.floor(1.01 * unbounded.cycles)
    assert result.total_fifo_bytes == sum(result.depths[c.name] * c.elem_bytes for c in channels)
    assert result.unbounded_fifo_bytes == 1024 * sum(c.elem_bytes for c in channels)
    assert result.lp_fifo_bytes == sum(result.lp_depths[c.name] * c.elem_bytes for c in channels)
    # orders of magnitude below the artifact's 1024-deep FIFOs
    assert result.total_fifo_bytes * 100 < result.unbounded_fifo_bytes
    assert result.channels_changed == sum(1 for d in result.depths.values() if d != 2) > 0
    assert result.simulations >= 3
    return result


def test_static_tile_32_one_region_per_expert(routing_b1024):
    workload = build_moe(MODEL, routing_b1024, tiling="static", tile_n=32)
    result = _check_sizing(workload, deadlocks_at_default=True)
    # the wait cycle runs through one hot expert's chain: ten full channels, all kept deeper than 2
    assert len(result.deadlock_fix_channels) == 10


@pytest.mark.parametrize("regions", [64, 32])
def test_static_tile_32_time_multiplexed(routing_b1024, regions):
    _check_sizing(build_moe(MODEL, routing_b1024, tiling="static", tile_n=32, regions=regions),
                  deadlocks_at_default=True)


def test_dynamic_tiling(routing_b1024):
    _check_sizing(build_moe(MODEL, routing_b1024, tiling="dynamic"), deadlocks_at_default=False)


def test_b4096_static_tile_64_finishes_with_sized_fifos():
    _check_sizing(build_moe(MODEL, _routing(4096), tiling="static", tile_n=64), deadlocks_at_default=True)
