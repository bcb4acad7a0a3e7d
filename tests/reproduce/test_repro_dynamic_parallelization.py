"""dynamic-parallelization (§5.5) on a reduced configuration: B=16, one window per variance class."""

import math

import numpy as np
import pytest
from repro_traces import KV_B16, tiny_traces

from stepsim.reproduce import reproduce
from stepsim.simulation.simulate import simulate
from stepsim.workloads.attention.build import build_attention

pytestmark = pytest.mark.traces

#: STEP_SEMANTICS §8.5: (sum of seq_len_tiled, max) of the three windows
TILES = {"high": (877, 145), "med": (604, 128), "low": (491, 71)}


@pytest.fixture(scope="module")
def traces(shared_traces, tmp_path_factory):
    return tiny_traces(shared_traces, tmp_path_factory.mktemp("traces"), routing=())


@pytest.fixture(scope="module")
def result(traces, tmp_path_factory):
    return reproduce("dynamic-parallelization", traces, tmp_path_factory.mktemp("out"))[0]


def test_one_row_per_window_in_variance_order_with_window_statistics(result, traces):
    rows = result.table.to_pylist()
    assert [(r["batch"], r["variance"], r["trace"]) for r in rows] == [(16, v, f) for v, f in KV_B16.items()]
    assert [(r["start"], r["end"]) for r in rows] == [(2805, 2820), (3349, 3364), (3799, 3814)]
    assert [(r["kv_tiles"], r["max_kv_tiles"]) for r in rows] == list(TILES.values())
    assert [(r["max_n"], r["coarse_regions"]) for r in rows] == [(4672, 1)] * 3
    for r in rows:
        kv = np.load(traces / "kv_lengths" / r["trace"])
        assert r["stdev"] == float(np.std(kv.astype(np.float64), ddof=1))


def test_cycles_and_traffic_match_independent_simulations_of_each_strategy(result, traces):
    for r in result.table.to_pylist():
        kv = np.load(traces / "kv_lengths" / r["trace"])
        traffic = set()
        for strategy in ("coarse", "interleave", "dynamic"):
            sim = simulate(build_attention(kv, strategy))
            assert r[f"{strategy}_cycles"] == sim.cycles
            traffic.add(sim.off_chip_bytes)
        # §8.5: 8192 B per K+V tile read, 9216 B per request (write-backs and output), 20480 B of q/k/v loads
        assert traffic == {r["off_chip_bytes"]} == {8192 * r["kv_tiles"] + 9216 * 16 + 20480}


def test_headline_is_the_geomean_speedup_over_the_better_static_strategy(result):
    rows = result.table.to_pylist()
    speedups = []
    for r in rows:
        best = "coarse" if r["coarse_cycles"] <= r["interleave_cycles"] else "interleave"
        assert r["best_static"] == best
        assert r["speedup_vs_best_static"] == r[f"{best}_cycles"] / r["dynamic_cycles"]
        speedups.append(r[f"{best}_cycles"] / r["dynamic_cycles"])
    assert result.headline == {"dynamic_parallelization_speedup_geomean": pytest.approx(
        math.prod(speedups) ** (1 / 3), rel=1e-12)}
    [batch] = result.details["batches"]
    assert batch["classes"]["med"] == {"coarse": rows[1]["coarse_cycles"] / rows[1]["dynamic_cycles"],
                                       "interleave": rows[1]["interleave_cycles"] / rows[1]["dynamic_cycles"]}


def test_two_worker_processes_give_the_same_table(result, traces, tmp_path):
    [parallel] = reproduce("dynamic-parallelization", traces, tmp_path, jobs=2)
    assert parallel.table.equals(result.table)
    assert parallel.headline == result.headline
