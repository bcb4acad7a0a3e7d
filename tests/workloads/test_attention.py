"""GQA decode attention (spec §6.3, §5.5, §5.2): exact targets of §8.5 through the public API."""

from pathlib import Path

import numpy as np
import pytest
import sympy as sp
from shared_traces_folder import require_shared_traces

from stepsim.base.errors import ArgumentError
from stepsim.graph import make_symbol
from stepsim.workloads.attention.build import (
    assignment_bindings,
    attention_algorithmic_flops,
    build_attention,
    kv_metadata,
    region_assignment,
    region_symbols,
    spec_max_n,
)
from stepsim.workloads.base import evaluate

TRACES = Path(__file__).resolve().parents[2].parent / "shared" / "traces"
MED_B16 = "b16/conv_stdev0987_3349_3364.npy"

NUM_TOKENS = [181, 2292, 1119, 946, 2221, 1184, 425, 378, 1144, 1249, 203, 1037, 4079, 1083, 386, 1124]
SEQ_LEN_TILED = [6, 72, 35, 30, 70, 38, 14, 12, 36, 40, 7, 33, 128, 34, 13, 36]
OFFSET = [21, 20, 31, 18, 13, 0, 9, 26, 24, 1, 11, 13, 15, 27, 2, 4]

# §5.5 trace sets (start, end, stdev) in order, with §8.5's (sum of seq_len_tiled, max tiles per request)
SANITY = {
    16: [((2805, 2820, 1456), 877, 145), ((821, 836, 1455), 656, 129), ((985, 1000, 1454), 631, 129),
         ((3349, 3364, 987), 604, 128), ((3275, 3290, 987), 650, 128), ((3181, 3196, 986), 699, 128),
         ((3799, 3814, 480), 491, 71), ((2477, 2492, 479), 468, 69), ((1063, 1078, 479), 356, 42)],
    64: [((961, 1024, 1457), 2801, 130), ((3239, 3302, 1374), 2794, 157), ((1727, 1790, 1370), 2809, 202),
         ((4007, 4070, 996), 2147, 128), ((3123, 3186, 995), 2548, 156), ((733, 796, 995), 1912, 129),
         ((2019, 2082, 508), 2071, 86), ((4185, 4248, 484), 1880, 86), ((271, 334, 477), 1772, 79)],
}
SANITY_CASES = [(b, w, s, m) for b, rows in SANITY.items() for w, s, m in rows]


def trace_file(rel: str) -> Path:
    return require_shared_traces(TRACES) / "kv_lengths" / rel


def window_file(batch: int, window) -> Path:
    start, end, stdev = window
    return trace_file(f"b{batch}/conv_stdev{stdev:04d}_{start:04d}_{end:04d}.npy")


@pytest.fixture(scope="module")
def kv16():
    return np.load(trace_file(MED_B16))


@pytest.fixture(scope="module")
def built(kv16):
    return {s: build_attention(kv16, s) for s in ("dynamic", "interleave", "coarse")}


# --- §8.5 metadata -----------------------------------------------------------------------------------------
def test_trace_metadata_matches_the_spec(kv16):
    assert kv16.tolist() == NUM_TOKENS
    seq, off = kv_metadata(kv16, 32)
    assert seq.tolist() == SEQ_LEN_TILED and int(seq.sum()) == 604
    assert off.tolist() == OFFSET
    assert seq.dtype == np.int64 and off.dtype == np.int64


def test_kv_metadata_counts_the_new_tokens_slot():
    seq, off = kv_metadata([0, 30, 31, 32, 63, 64], 32)
    assert seq.tolist() == [1, 1, 1, 2, 2, 3]  # ceil((x+1)/32): the appended token may open a new tile
    assert off.tolist() == [0, 30, 31, 0, 31, 0]


@pytest.mark.parametrize("batch,window,total,max_tiles", SANITY_CASES)
def test_kv_trace_sanity_data(batch, window, total, max_tiles):
    kv = np.load(window_file(batch, window))
    assert kv.shape == (batch,)
    seq, _ = kv_metadata(kv, 32)
    assert (int(seq.sum()), int(seq.max())) == (total, max_tiles)
    # the spec's KV capacity holds every request of every experiment trace
    assert max_tiles * 32 <= spec_max_n(batch)


# --- §8.5 on-chip ------------------------------------------------------------------------------------------
def test_on_chip_published_convention(built):
    assert built["dynamic"].metrics()["on_chip_bytes"] == 189_728
    assert built["interleave"].metrics()["on_chip_bytes"] == 189_696


def test_on_chip_decomposition_per_region(built):
    for strategy in ("interleave", "dynamic"):
        w = built[strategy]
        values = w.op_values()
        per_region = []
        for r in range(4):
            ops = [op for op in w.graph if op.group == ("region", r)]
            by_kind = {}
            for op in ops:
                by_kind.setdefault(op.kind, []).append(values[op.name][1])
            # K/V cache loads, K/V write-back stores (buffer depth 4) + output store, q ExpandRef,
            # P.V accumulator, tile-wise row-sum accumulator
            assert sorted(by_kind["RandomOffChipLoad"]) == [4096, 4096]
            assert sorted(by_kind["RandomOffChipStore"]) == [1024, 4096 * 4, 4096 * 4]
            assert by_kind["Expand"] == [2048] and by_kind["MapAccum"] == [2048]
            accums = sorted(by_kind["Accum"])
            assert accums == ([8, 1024] if strategy == "dynamic" else [1024])  # + SignalReqAllRead (dynamic)
            per_region.append(w.group_on_chip_bytes(("region", r)))
        extra = 8 if strategy == "dynamic" else 0
        assert per_region == [47_104 + extra] * 4
        assert w.metrics()["on_chip_bytes"] == 4 * 47_104 + 4 * extra + 1_280  # + q/k/v load tiles (1024+128+128)


# --- §8.5 off-chip -----------------------------------------------------------------------------------------
def test_dynamic_off_chip_symbolic_form(built):
    w = built["dynamic"]
    syms = region_symbols(w)
    assert [r for r, _ in syms] == [make_symbol(f"num_req_region{i}") for i in range(4)]
    expected = 20480 + sum(8192 * t * r + 9216 * r for r, t in syms)
    off = w.symbolic()["off_chip_bytes"]
    assert sp.expand(off - expected) == 0
    assert off.free_symbols == {s for pair in syms for s in pair}
    # spot-substitute arbitrary values: the form is exactly this polynomial
    vals = {s: v for s, v in zip([s for pair in syms for s in pair], [3, 7, 5, 11, 2, 13, 6, 17])}
    assert off.xreplace(vals) == 20480 + sum(8192 * vals[t] * vals[r] + 9216 * vals[r] for r, t in syms)


def test_interleave_off_chip_symbolic_form(built):
    w = built["interleave"]
    syms = region_symbols(w)
    assert [r for r, _ in syms] == [4, 4, 4, 4]  # static B/4 requests per region
    off = w.symbolic()["off_chip_bytes"]
    assert sp.expand(off - (167_936 + sum(32768 * t for _, t in syms))) == 0
    assert off.free_symbols == {t for _, t in syms}
    assert off.xreplace({t: 10 * (i + 1) for i, (_, t) in enumerate(syms)}) == 167_936 + 32768 * 100


@pytest.mark.parametrize("strategy", ["dynamic", "interleave", "coarse"])
def test_true_off_chip_traffic_with_real_tile_totals(built, strategy):
    m = built[strategy].metrics()
    assert m["off_chip_bytes"] == 5_115_904 == 604 * 8192 + 16 * 9216 + 20480


def test_bindings_are_exact_per_region_tile_means(built, kv16):
    seq, _ = kv_metadata(kv16, 32)
    w = built["interleave"]
    for r, (req, tiles) in enumerate(region_symbols(w)):
        assert w.bindings[tiles] == sp.Rational(int(seq[r::4].sum()), 4)
    w = built["dynamic"]  # metrics use the round-robin assignment
    for r, (req, tiles) in enumerate(region_symbols(w)):
        assert w.bindings[req] == 4 and w.bindings[tiles] == sp.Rational(int(seq[r::4].sum()), 4)


def test_dynamic_totals_do_not_depend_on_the_assignment(built, kv16):
    w = built["dynamic"]
    greedy_like = [[0, 4, 5, 6, 7, 8], [1, 9], [2, 10, 11, 12], [3, 13, 14, 15]]
    b = assignment_bindings(w, greedy_like, kv16)
    sym = w.symbolic()
    assert evaluate(sym["off_chip_bytes"], b) == 5_115_904
    assert evaluate(sym["on_chip_bytes"], b) == 189_728
    with pytest.raises(ArgumentError, match="exactly one region"):
        assignment_bindings(w, [[0, 1], [2], [3], [3]], kv16)


# --- graph structure -----------------------------------------------------------------------------------------
def test_node_and_edge_counts_match_the_artifact(built):
    # stepsim's graph is the artifact's operator for operator (ConsumerContext = Sink, MetadataGen =
    # MetadataSource, the MockStreamOps are replaced by placeholders that graph.connect removes).
    assert (len(built["dynamic"].graph), built["dynamic"].graph.num_edges()) == (208, 295)
    assert (len(built["interleave"].graph), built["interleave"].graph.num_edges()) == (194, 272)
    # coarse B=16 (one region; not listed in the spec): 6 loads/sources + 6 Flattens + 3 metadata
    # Broadcasts + 37 region ops + 4 inserted Broadcasts; edges 6 + 3 + 58 + 4
    assert (len(built["coarse"].graph), built["coarse"].graph.num_edges()) == (56, 71)
    kinds = built["interleave"].graph.count_by_kind()
    assert kinds["Broadcast"] == 12 + 4 * (2 + 2 + 4)  # metadata; append x2 + write-back x2; inserted x4
    assert kinds["Parallelize"] == 6 and kinds["Sink"] == 12 and kinds["CacheReadAddrGen"] == 8


@pytest.mark.parametrize("strategy", ["dynamic", "interleave", "coarse"])
def test_default_fifos_are_what_step_perf_simulates(built, strategy):
    # the artifact's config_dict overrides are dead in step-perf (STEP_TIMING §2): every FIFO has the run's depth
    g = built[strategy].graph
    assert [op.name for op in g if op.channel_depth is not None] == []
    assert built[strategy].channel_depth == 1
    stores = [op for op in g if op.kind == "RandomOffChipStore" and op.tensor.name in ("k_cache", "v_cache")]
    assert [s.buffer_depth for s in stores] == [4] * len(stores)  # a metric only (§8.5 on-chip bytes)


def test_cycles_match_the_artifacts_published_runs(kv16):
    # dynamic_par/batch16_sweep.csv of the artifact, window 3349-3364: coarse 52,236, interleave 20,361,
    # dynamic 17,494 cycles; stepsim ends 1 cycle earlier (the end-of-run tail, STEP_TIMING §1.3)
    from stepsim.simulation.simulate import simulate

    cycles = {s: simulate(build_attention(kv16, s)).cycles for s in ("coarse", "interleave", "dynamic")}
    assert cycles == {"coarse": 52_235, "interleave": 20_360, "dynamic": 17_493}
    # the artifact's intended FIFO depths (dead in step-perf) give coarse 2,536 cycles fewer than its CSV
    intended = build_attention(kv16, "coarse", metadata_fifo_depth=16, cache_write_back_channel_depth=4)
    assert simulate(intended).cycles == 52_236 - 2_536


@pytest.mark.parametrize("strategy", ["dynamic", "interleave"])
def test_fifo_overrides(kv16, strategy):
    g = build_attention(kv16, strategy, metadata_fifo_depth=16, cache_write_back_channel_depth=4).graph
    depths = sorted((op.channel_depth, op.group) for op in g if op.kind == "Broadcast" and op.channel_depth)
    # 3 metadata broadcasts at 16 and 2 cache write-back broadcasts at 4 per region
    assert depths == sorted([(16, ("region", r)) for r in range(4) for _ in range(3)]
                            + [(4, ("region", r)) for r in range(4) for _ in range(2)])
    fanouts = sorted(op.num_outputs for op in g if op.kind == "Broadcast" and op.channel_depth == 16)
    assert fanouts == [2] * 4 + [5] * 4 + [6] * 4  # offset x2, idx x5, seq_len x6 per region
    stores = [op for op in g if op.kind == "RandomOffChipStore" and op.tensor.name == "k_cache"]
    assert [s.buffer_depth for s in stores] == [4] * 4


def test_dynamic_dispatch_shapes(built):
    g = built["dynamic"].graph
    (merge,) = [op for op in g if op.kind == "EagerMerge"]
    assert merge.outputs[1].shape == (16,)
    assert len(merge.inputs) == 4 and all(ref.op.kind == "Accum" for ref in merge.inputs)
    parts = [op for op in g if op.kind == "Partition" and op.inputs[0].op.kind in ("LinearOffChipLoad",
                                                                                   "MetadataSource")]
    assert len(parts) == 6
    for p in parts:
        assert [s.shape[0] for s in p.outputs] == [make_symbol(f"num_req_region{i}") for i in range(4)]
    assert not any(op.kind == "Placeholder" for op in g)


def test_workload_fields_and_flops(built, kv16):
    w = built["dynamic"]
    assert (w.name, w.channel_depth, w.hardware) == ("attention", 1, "step-eval")
    p = w.params
    assert (p["batch"], p["max_n"], p["cache_row_offset_tiled"], p["regions"], p["compute_bw"]) == (16, 4672, 146, 4,
                                                                                                    2048)
    assert (p["metadata_fifo_depth"], p["cache_write_back_fifo_depth"], p["cache_write_back_channel_depth"],
            p["softmax"], p["tile_n"]) == (None, 4, None, "plain", 32)
    per_tile = 2 * 8 * 32 * 64 + 4 * 8 * 32 + 2 * 8 * 32 * 64 + 8 * 32
    expected = 604 * per_tile + 16 * (8 * 32 + 8 * 64)
    assert attention_algorithmic_flops(kv_metadata(kv16, 32)[0]) == expected == 40_369_152
    for strategy in ("dynamic", "interleave", "coarse"):
        m = built[strategy].metrics()
        assert m["flops"] == m["graph_flops"] == expected


def test_stable_softmax_graph_and_flops(kv16):
    """The stable form fuses Exp, the P V MapAccum, the row-sum Accum, RowSum and Div into one OnlineSoftmax
    MapAccum and a SoftmaxNormalize Map per region; same traffic, its own FLOPs."""
    plain, stable = (build_attention(kv16, "dynamic", softmax=f) for f in ("plain", "stable"))
    kinds = {f: [op.kind for op in w.graph] for f, w in (("plain", plain), ("stable", stable))}
    # per region: 5 compute nodes and the Broadcast of exp's output -> 2 compute nodes
    assert len(kinds["plain"]) - len(kinds["stable"]) == 4 * 4
    fused = [op for op in stable.graph if op.kind == "MapAccum"]
    assert len(fused) == 4 and all(repr(op.fn) == "OnlineSoftmax(head_dim=64)" for op in fused)
    assert all(op.stream.dtype.shape == (8, 66) for op in fused)  # [acc | l | m]
    per_tile = 2 * 8 * 32 * 64 + (2 * 8 * 32 * 64 + 8 * 8 * 32 + 2 * 8 * 64 + 6 * 8)
    expected = 604 * per_tile + 16 * 8 * 64
    assert attention_algorithmic_flops(kv_metadata(kv16, 32)[0], softmax="stable") == expected == 41_476_416
    m, mp = stable.metrics(), plain.metrics()
    assert m["flops"] == m["graph_flops"] == expected
    assert (m["off_chip_bytes"], m["on_chip_bytes"]) == (mp["off_chip_bytes"], mp["on_chip_bytes"] - 4 * 1_024
                                                         + 4 * 8 * 66 * 4 - 4 * 8 * 64 * 4)


# --- coarse strategy -----------------------------------------------------------------------------------------
def test_coarse_region_counts(built):
    assert built["coarse"].params["regions"] == 1
    assert built["coarse"].metrics()["on_chip_bytes"] == 47_104 + 1_280
    kv64 = np.load(window_file(64, (4007, 4070, 996)))
    w = build_attention(kv64, "coarse")
    assert w.params["regions"] == 4 and w.params["max_n"] == 6464
    assert [r for r, _ in region_symbols(w)] == [16] * 4
    assert w.metrics()["off_chip_bytes"] == 2147 * 8192 + 64 * 9216 + 64 * 1280


def test_coarse_b80_assignment():
    kv = (np.arange(80) * 53) % 3001  # synthetic lengths
    expected0 = list(range(16)) + list(range(64, 80))
    assign = region_assignment(80, "coarse")
    assert [a.tolist() for a in assign] == [expected0] + [list(range(16 * r, 16 * r + 16)) for r in (1, 2, 3)]
    w = build_attention(kv, "coarse")
    assert w.params["regions"] == 4 and w.params["max_n"] == 6528
    assert [r for r, _ in region_symbols(w)] == [32, 16, 16, 16]
    idx_sources = {}
    for op in w.graph:
        if op.kind == "MetadataSource":
            idx_sources.setdefault(op.group, op.values.tolist())  # the first source of a region is idx
    assert idx_sources[("region", 0)] == expected0
    seq, _ = kv_metadata(kv, 32)
    assert w.metrics()["off_chip_bytes"] == int(seq.sum()) * 8192 + 80 * (9216 + 1280)


def test_region_assignment_round_robin():
    assert [a.tolist() for a in region_assignment(8, "interleave")] == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert [a.tolist() for a in region_assignment(3, "dynamic")] == [[0], [1], [2], []]
    assert [len(a) for a in region_assignment(64, "coarse")] == [16] * 4


def test_small_dynamic_batch_leaves_regions_idle():
    w = build_attention([10, 50, 90], "dynamic")
    assert w.idle_groups == {("region", 3)}
    m = w.metrics()
    assert m["off_chip_bytes"] == (1 + 2 + 3) * 8192 + 3 * (9216 + 1280)
    assert m["on_chip_bytes_active"] == m["on_chip_bytes"] - (47_104 + 8)


def test_default_max_n_falls_back_to_the_longest_request():
    assert spec_max_n(16) == 4672 and spec_max_n(64) == 6464 and spec_max_n(80) == 6528 and spec_max_n(20) is None
    assert build_attention([5000] + [1] * 15, "interleave").params["max_n"] == 5024  # 4672 too small
    assert build_attention([100] * 8, "interleave").params["max_n"] == 128
    assert build_attention([100] * 8, "interleave", max_n=256).params["cache_row_offset_tiled"] == 8


# --- errors --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("args,kwargs,match", [
    (([1, 2, 3, 4], "diagonal"), {}, r"strategy .*'diagonal'"),
    (([],), {}, "kv_lengths is empty"),
    (([5, -3, 2, 1],), {}, r"kv_lengths\[1\] = -3 is negative"),
    (([[1, 2]],), {}, "kv_lengths must be 1-D"),
    (([1.5, 2],), {}, r"kv_lengths\[0\] = 1.5 is not an integer"),
    (([1, 2, 3, 4],), {"softmax": "online"}, r"softmax .*'online'"),
    (([1, 2, 3, 4],), {"tile_n": 0}, "tile_n must be a positive int"),
    (([1, 2, 3, 4],), {"regions": -1}, "regions must be a positive int"),
    (([1, 2, 3, 4],), {"metadata_fifo_depth": 0}, "metadata_fifo_depth must be a positive int"),
    (([1, 2, 3, 4],), {"cache_write_back_channel_depth": 1.5}, "cache_write_back_channel_depth must be a positive"),
    (([1, 2, 3, 4],), {"max_n": 48}, "max_n must be a multiple of tile_n=32"),
    (([1, 2, 3, 400],), {"max_n": 64}, r"max_n=64 cannot hold request 3"),
    (([1, 2, 3, 4, 5, 6],), {"strategy": "interleave"}, "not divisible by regions=4"),
])
def test_bad_arguments_raise_argument_error(args, kwargs, match):
    with pytest.raises(ArgumentError, match=match):
        build_attention(*args, **kwargs)
