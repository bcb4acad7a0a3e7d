"""Every shipped workload simulates, and the engine's measured off-chip traffic equals the symbolic metric.

Two independent layers meet here: the graph layer's symbolic off-chip formula (with the trace's values bound
by meaning) and the engine's byte counters, which count what the memory units actually moved while dynamic
tiles, routing and merging followed the trace. They must agree exactly on every workload.

The numba engine and the pure-Python reference engine must also agree (cycles, unit and channel counters, bytes)
on the workloads at reduced size.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from stepsim.base.errors import GraphError
from stepsim.base.hardware import Hardware
from stepsim.graph import (
    FP32,
    Add,
    FlatMap,
    Flatten,
    Graph,
    LinearOffChipLoad,
    LinearOffChipStore,
    Map,
    Reshape,
    RowStreamify,
    Sink,
    Tensor,
    Zero,
    Zip,
)
from stepsim.graph.lower import lower
from stepsim.kernels.api import run as fast_run
from stepsim.kernels.reference import run as ref_run
from stepsim.models.presets import moe_model
from stepsim.simulation.simulate import simulate
from stepsim.trace_io.load import load_kv_lengths, load_routing
from stepsim.workloads.attention.build import build_attention
from stepsim.workloads.moe.build import build_moe

MOE_MODELS = {"mixtral-8x7b": "mixtral_b64", "qwen3-30b-a3b": "qwen_b64"}


def _first(folder, pattern):
    files = sorted(folder.glob(pattern))
    assert files, f"no {pattern} in {folder}"
    return files[0]


def _assert_traffic_matches(workload):
    result = simulate(workload)
    metrics = workload.metrics()
    assert result.off_chip_bytes == metrics["off_chip_bytes"]
    # a memory floor: step-eval moves at most 1024 B/cycle off chip
    peak = Hardware.preset(workload.hardware).hbm_peak_bytes_per_cycle
    assert result.cycles >= result.off_chip_bytes // peak
    return result


@pytest.mark.parametrize("model", sorted(MOE_MODELS))
@pytest.mark.parametrize("tiling,tile_n", [("static", 16), ("static", 64), ("dynamic", None)])
def test_moe_measured_traffic_equals_symbolic_on_real_routing(shared_traces, model, tiling, tile_n):
    m = moe_model(model)
    routing = load_routing(_first(shared_traces / "expert_routing" / MOE_MODELS[model], "*.npz"), m.experts)
    workload = build_moe(m, routing, tiling=tiling, tile_n=tile_n)
    _assert_traffic_matches(workload)


@pytest.mark.parametrize("regions", [32, 8])
@pytest.mark.parametrize("tiling,tile_n", [("static", 32), ("dynamic", None)])
def test_time_multiplexed_moe_measured_traffic_equals_symbolic(shared_traces, regions, tiling, tile_n):
    m = moe_model("qwen3-30b-a3b")
    routing = load_routing(_first(shared_traces / "expert_routing" / "qwen_b64", "*.npz"), m.experts)
    _assert_traffic_matches(build_moe(m, routing, tiling=tiling, tile_n=tile_n, regions=regions))


@pytest.mark.parametrize("batch", ["b16", "b64"])
@pytest.mark.parametrize("strategy", ["coarse", "interleave", "dynamic"])
def test_attention_measured_traffic_equals_symbolic_on_real_kv_lengths(shared_traces, batch, strategy):
    kv = load_kv_lengths(_first(shared_traces / "kv_lengths" / batch, "*.npy"), None)
    _assert_traffic_matches(build_attention(kv, strategy))


def test_dynamic_tiling_is_faster_than_small_static_tiles(shared_traces):
    """The paper's direction (§5.3): dynamic tiling beats static tile 16 on a real B=64 batch."""
    m = moe_model("mixtral-8x7b")
    routing = load_routing(_first(shared_traces / "expert_routing" / "mixtral_b64", "*.npz"), m.experts)
    static = simulate(build_moe(m, routing, tiling="static", tile_n=16)).cycles
    dynamic = simulate(build_moe(m, routing, tiling="dynamic")).cycles
    assert dynamic < static


def test_dynamic_attention_parallelization_beats_coarse(shared_traces):
    """The paper's direction (§5.5): greedy dispatch beats contiguous blocks on a real B=64 window."""
    kv = load_kv_lengths(_first(shared_traces / "kv_lengths" / "b64", "*.npy"), None)
    cycles = {s: simulate(build_attention(kv, s)).cycles for s in ("coarse", "dynamic")}
    assert cycles["dynamic"] < cycles["coarse"]


# --------------------------------------------------------------------------- engines agree at reduced size
SMALL_MOE = moe_model("custom", hidden=64, intermediate=128, experts=4, top_k=2)
#: 8 tokens, top-2 over 4 experts; expert 3 gets no token (an idle expert)
SMALL_ROUTING = np.array([[0, 1], [1, 2], [0, 2], [1, 0], [2, 1], [0, 1], [2, 0], [1, 2]])


def _assert_engines_agree(workload):
    program = lower(workload.graph, Hardware.preset(workload.hardware), channel_depth=workload.channel_depth)
    fast = _assert_same_run(ref_run(program, max_steps=20_000_000), program)
    assert fast.bytes_read + fast.bytes_written == workload.metrics()["off_chip_bytes"]
    return fast


def _assert_same_run(ref, program):
    """The numba engine's run of ``program`` equals the reference engine's result ``ref``: cycles, unit and
    channel counters (pushes, peak occupancy), off-chip bytes. Returns the numba engine's result."""
    fast = fast_run(program)
    assert ref.cycles == fast.cycles
    np.testing.assert_array_equal(ref.unit_counters, fast.unit_counters)
    np.testing.assert_array_equal(ref.channel_counters, fast.channel_counters)
    assert (ref.off_chip_bytes_read, ref.off_chip_bytes_written) == (fast.bytes_read, fast.bytes_written)
    return fast


@pytest.mark.parametrize("tiling,tile_n,regions", [("static", 4, None), ("static", 16, None),
                                                   ("dynamic", None, None), ("static", 4, 2),
                                                   ("dynamic", None, 2)])
def test_engines_agree_on_reduced_moe(tiling, tile_n, regions):
    kw = {"tile_f": 32} if regions else {}
    _assert_engines_agree(build_moe(SMALL_MOE, SMALL_ROUTING, tiling=tiling, tile_n=tile_n, regions=regions, **kw))


@pytest.mark.parametrize("strategy", ["coarse", "interleave", "dynamic"])
def test_engines_agree_on_reduced_attention(strategy):
    kv = [70, 3, 31, 32, 100, 0, 64, 5]
    _assert_engines_agree(build_attention(kv, strategy, head_dim=16, query_per_kv_head=2, tile_n=16))


def test_flatmap_row_streamify_opens_a_new_dim_in_both_engines():
    """FlatMap(RowStreamify) of a [1, 2] stream of (4, 8) tiles gives [1, 2, 4] of (1, 8) rows: the last row of
    each tile carries the tile's stop + 1 (levels 1 then 2)."""
    g = Graph("flatmap")
    rows = FlatMap(g, LinearOffChipLoad(g, Tensor("x", (8, 8), FP32), (4, 8), (2,), (1,)), RowStreamify())
    Sink(g, rows)
    assert rows.stream.shape == (1, 2, 4)
    program = lower(g, Hardware.preset("step-eval"), channel_depth=2)
    ref = ref_run(program, record_tokens=True)
    out = program.channel_names.index(next(n for n in program.channel_names if n.startswith(rows.name)))
    assert [t.stop for t in ref.tokens[out]] == [0, 0, 0, 1, 0, 0, 0, 2]
    assert all((t.rows, t.cols) == (1, 8) for t in ref.tokens[out])
    _assert_same_run(ref, program)


def test_a_graph_that_reads_reshape_padding_flags_lowers_and_runs_in_both_engines():
    """5 tiles of (2, 8) in chunks of 4 padded with Zero(2, 8): flags 0 0 0 0 | 0 1 1 1 with the data's stops;
    without a reader the flag output gets no channel at all (step-perf has none)."""
    def graph(read_flags: bool) -> Graph:
        g = Graph("flags")
        x = LinearOffChipLoad(g, Tensor("x", (10, 8), FP32), (2, 8), (5,), (1,))
        r = Reshape(g, x, 4, 0, pad=Zero(2, 8))
        Sink(g, r)
        if read_flags:
            Sink(g, r[1], name="flag_sink")
        return g

    hw = Hardware.preset("step-eval")
    assert not any("Reshape" in n and "[1]" in n for n in lower(graph(False), hw, channel_depth=2).channel_names)
    program = lower(graph(True), hw, channel_depth=2)
    flags = next(i for i, n in enumerate(program.channel_names) if n.startswith("Reshape") and n.endswith("[1]"))
    ref = ref_run(program, record_tokens=True)
    assert [(t.stop, t.value) for t in ref.tokens[flags]] == [(0, 0), (0, 0), (0, 0), (1, 0),
                                                              (0, 0), (0, 1), (0, 1), (2, 1)]
    _assert_same_run(ref, program)
    result = simulate(graph(True), "step-eval", channel_depth=2)
    assert result.unit_counters[result.unit_names.index("flag_sink"), 0] == 8


def _zip_graph(read):
    """Two loads of 3 (2, 8) fp32 tiles; ``read(g, a, b)`` builds what reads them."""
    g = Graph("zip")
    a = LinearOffChipLoad(g, Tensor("a", (6, 8), FP32), (2, 8), (3,), (1,))
    b = LinearOffChipLoad(g, Tensor("b", (6, 8), FP32), (2, 8), (3,), (1,))
    read(g, a, b)
    return g


def test_a_map_over_a_zip_runs_as_the_binary_map_of_its_two_streams():
    zipped = _zip_graph(lambda g, a, b: LinearOffChipStore(g, Map(g, Zip(g, a, b), Add(), compute_bw=64),
                                                           tensor_name="y"))
    binary = _zip_graph(lambda g, a, b: LinearOffChipStore(g, Map(g, [a, b], Add(), compute_bw=64),
                                                           tensor_name="y"))
    z, m = (simulate(g, "step-eval", functional=True, seed=3) for g in (zipped, binary))
    assert z.cycles == m.cycles and z.events == m.events
    np.testing.assert_array_equal(z.unit_counters, m.unit_counters)
    np.testing.assert_array_equal(z.outputs["y"], z.inputs["a"] + z.inputs["b"])


def _flatten(g, pairs):
    Flatten(g, pairs, 0, 1)


def _two_maps(g, pairs):
    for _ in range(2):
        Map(g, pairs, Add(), compute_bw=64)


@pytest.mark.parametrize("read, readers", [(_flatten, "['Flatten_"), (_two_maps, "['Map_"),
                                           (lambda g, pairs: None, "[]")])
def test_a_zip_not_read_by_exactly_one_map_is_rejected_when_the_graph_is_finalized(read, readers):
    g = _zip_graph(lambda g, a, b: read(g, Zip(g, a, b, name="pairs")))
    with pytest.raises(GraphError, match=r"pairs: a Zip must be read by exactly one Map.*read by " + re.escape(readers)):
        simulate(g, "step-eval")
