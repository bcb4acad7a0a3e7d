"""make_inputs against the tensors of scaled-down MoE and attention graphs built from the real traces, and the
whole-workload references (tiling / strategy invariance, the graph's KV append and unmasked last tile,
check_outputs)."""

import dataclasses

import numpy as np
import pytest

from stepsim.base.errors import ArgumentError
from stepsim.workloads.attention.build import build_attention, kv_metadata
from stepsim.workloads.moe.build import build_moe
from stepsim.workloads.reference import (
    check_outputs,
    gqa_decode_reference,
    make_inputs,
    max_rel_error,
    moe_reference,
    round_to_bf16,
    small_moe_model,
    workload_reference,
)

pytestmark = pytest.mark.traces  # every test here builds from ../shared/traces

LOADS = ("LinearOffChipLoad", "RandomOffChipLoad")
D, F = 32, 96  # scaled-down MoE dims (F divisible by the tile_f values below)
KV16 = "b16/conv_stdev0987_3349_3364.npy"  # the spec's §8.5 trace


def loaded_tensors(workload):
    """{name: (shape, storage dtype)} of the tensors the graph's load operators read, walked here directly."""
    found = {}
    for op in workload.graph.ops:
        if op.kind in LOADS:
            found.setdefault(op.tensor.name, (tuple(op.tensor.shape), op.tensor.dtype.name))
    return found


def assert_inputs_match_graph(workload, inputs):
    tensors = loaded_tensors(workload)
    assert set(inputs) == set(tensors)
    for name, (shape, dtype) in tensors.items():
        a = inputs[name]
        assert a.shape == shape, name
        assert a.dtype == np.float32, name
        if dtype == "bf16":
            assert np.array_equal(round_to_bf16(a), a), f"{name} is not bf16-representable"


@pytest.fixture(scope="module")
def routing(shared_traces):
    def load(rel):
        return np.load(shared_traces / "expert_routing" / rel)["data"]
    return {"mixtral-8x7b": load("mixtral_b64/008_010.npz"), "qwen3-30b-a3b": load("qwen_b64/032_012.npz")}


@pytest.fixture(scope="module")
def kv16(shared_traces):
    return np.load(shared_traces / "kv_lengths" / KV16)


@pytest.fixture(scope="module")
def mixtral(routing):
    model = small_moe_model("mixtral-8x7b", hidden=D, intermediate=F)
    variants = {"static8": {"tile_n": 8, "tile_f": 32}, "static32": {"tile_n": 32, "tile_f": 48},
                "dynamic": {"tiling": "dynamic", "tile_f": 32}, "regions2": {"regions": 2, "tile_f": 48},
                "regions4-dynamic": {"regions": 4, "tiling": "dynamic", "tile_f": 32}}
    return {k: build_moe(model, routing["mixtral-8x7b"], **kw) for k, kw in variants.items()}


# --- MoE --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("variant", ["static8", "dynamic", "regions2", "regions4-dynamic"])
def test_moe_inputs_match_the_graph_tensors_mixtral(mixtral, variant):
    w = mixtral[variant]
    inputs = make_inputs(w, seed=1)
    assert_inputs_match_graph(w, inputs)
    assert inputs["x"].shape == (64, D) and inputs["routing_weights"].shape == (64, 2)


def test_moe_inputs_match_the_graph_tensors_qwen(routing):
    model = small_moe_model("qwen3-30b-a3b", hidden=16, intermediate=48)
    for kw in ({"tile_n": 32, "tile_f": 48}, {"regions": 16, "tiling": "dynamic", "tile_f": 48}):
        w = build_moe(model, routing["qwen3-30b-a3b"], **kw)
        inputs = make_inputs(w, seed=2)
        assert_inputs_match_graph(w, inputs)
        assert inputs["routing_weights"].shape == (64, 8)
    assert inputs["region015_down"].shape == (8 * 48, 16)  # 8 experts of [F, D] per region


def test_moe_routing_weights_are_a_softmax_over_the_slots(mixtral):
    rw = make_inputs(mixtral["static8"], seed=1)["routing_weights"]
    assert (rw > 0).all()
    assert np.abs(rw.sum(axis=1) - 1).max() <= 2 * 2 ** -8  # exact before the bf16 rounding of each weight


def test_region_tensors_stack_the_same_expert_weights(mixtral):
    per_expert = make_inputs(mixtral["static8"], seed=4)
    regions = make_inputs(mixtral["regions2"], seed=4)
    for part, rows in (("gate", D), ("up", D), ("down", F)):
        for e in range(8):
            r, i = divmod(e, 4)
            block = regions[f"region{r:03d}_{part}"][i * rows:(i + 1) * rows]
            assert np.array_equal(block, per_expert[f"expert{e:03d}_{part}"])


def test_make_inputs_is_deterministic_per_seed(mixtral):
    a, b, c = (make_inputs(mixtral["dynamic"], seed=s) for s in (5, 5, 6))
    assert all(np.array_equal(a[n], b[n]) for n in a)
    assert not np.array_equal(a["x"], c["x"])


def test_moe_reference_is_the_same_for_every_tiling_and_region_count(mixtral, routing):
    ys = {k: workload_reference(w, make_inputs(w, seed=3))["y"] for k, w in mixtral.items()}
    first = ys["static8"]
    assert first.shape == (64, D) and first.dtype == np.float32
    for k, y in ys.items():
        assert np.array_equal(y, first), k
    # and it is moe_reference applied to the trace's routing (the graph's selector reproduces it)
    inputs = make_inputs(mixtral["static8"], seed=3)
    def stack(part):
        return np.stack([inputs[f"expert{e:03d}_{part}"] for e in range(8)])
    direct = moe_reference(inputs["x"], routing["mixtral-8x7b"], inputs["routing_weights"], stack("gate"),
                           stack("up"), stack("down"))
    assert np.array_equal(direct, first)


def test_check_outputs_passes_the_reference_and_flags_a_wrong_output(mixtral):
    w = mixtral["regions2"]
    inputs = make_inputs(w, seed=0)
    y = workload_reference(w, inputs)["y"]
    ok = check_outputs(w, inputs, {"y": y})["y"]
    assert (ok.error, ok.passed) == (0.0, True)
    nu = (D + F + 2) * 2 ** -24  # reductions over D, F and the top-2 sum; fp32 output
    assert ok.tolerance == 2 * (2 ** -24 + nu / (1 - nu))
    bad = y.copy()
    bad[7, 3] += 1e-3 * np.abs(y).max()
    res = check_outputs(w, inputs, {"y": bad})["y"]
    assert not res.passed and res.error == pytest.approx(1e-3, rel=1e-3)
    with pytest.raises(ArgumentError, match="outputs has no tensor 'y'"):
        check_outputs(w, inputs, {})


# --- attention --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def attention(kv16):
    return {s: build_attention(kv16, s, head_dim=16, query_per_kv_head=4) for s in ("dynamic", "interleave", "coarse")}


@pytest.mark.parametrize("strategy", ["dynamic", "interleave", "coarse"])
def test_attention_inputs_match_the_graph_tensors(attention, kv16, strategy):
    w = attention[strategy]
    inputs = make_inputs(w, seed=0)
    assert_inputs_match_graph(w, inputs)
    max_n = w.params["max_n"]
    assert max_n == 4672 and inputs["k_cache"].shape == (16 * max_n, 16)
    # cached rows are drawn, everything from the new token's row on is zero
    cache = inputs["v_cache"].reshape(16, max_n, 16)
    for b, length in enumerate(kv16):
        assert np.all(np.abs(cache[b, :length]).sum(axis=1) > 0) and not cache[b, length:].any()


def test_attention_b64_interleave_inputs(shared_traces):
    kv = np.load(shared_traces / "kv_lengths" / "b64" / "conv_stdev0477_0271_0334.npy")
    w = build_attention(kv, "interleave", head_dim=8, query_per_kv_head=2)
    inputs = make_inputs(w, seed=9)
    assert_inputs_match_graph(w, inputs)
    assert inputs["q"].shape == (64 * 2, 8)


def test_attention_reference_is_the_same_for_every_strategy(attention):
    refs = {s: workload_reference(w, make_inputs(w, seed=2)) for s, w in attention.items()}
    for s in ("interleave", "coarse"):
        for name in ("out", "k_cache", "v_cache"):
            assert np.array_equal(refs[s][name], refs["dynamic"][name]), (s, name)


def test_attention_reference_appends_and_leaves_the_tail_of_the_last_tile_unmasked(attention, kv16):
    w = attention["interleave"]
    inputs = make_inputs(w, seed=1)
    ref = workload_reference(w, inputs)
    max_n, d, g = w.params["max_n"], 16, 4
    rows = np.arange(16) * max_n + kv16
    expected_k = inputs["k_cache"].copy()
    expected_k[rows] = inputs["k"]
    assert np.array_equal(ref["k_cache"], expected_k)
    # the graph's plain softmax over whole tiles equals gqa_decode_reference with the padding included ...
    same = gqa_decode_reference(inputs["q"], inputs["k_cache"], inputs["v_cache"], kv16, inputs["k"], inputs["v"],
                                softmax="plain", tile_n=32, include_tile_padding=True)
    assert np.array_equal(ref["out"], same.out)
    # ... and differs from the masked attention exactly for requests whose last tile has rows after the new token
    masked = gqa_decode_reference(inputs["q"], inputs["k_cache"], inputs["v_cache"], kv16, inputs["k"],
                                  inputs["v"], softmax="plain", tile_n=32).out.reshape(16, g, d)
    seq_len_tiled, _ = kv_metadata(kv16, 32)
    padded = seq_len_tiled * 32 > kv16 + 1
    graph_out = ref["out"].reshape(16, g, d)
    for b in range(16):
        err = max_rel_error(graph_out[b], masked[b])
        assert (err > 1e-3) if padded[b] else (err == 0.0), b


def test_attention_check_outputs_tolerates_bf16_storage_of_the_output(attention, kv16):
    w = attention["coarse"]
    inputs = make_inputs(w, seed=4)
    ref = workload_reference(w, inputs)
    stored = {n: round_to_bf16(a) for n, a in ref.items()}  # an engine writing bf16 tensors
    checks = check_outputs(w, inputs, stored)
    assert all(c.passed for c in checks.values())
    assert checks["k_cache"].error == 0.0 and checks["k_cache"].tolerance == 2 ** -7  # data movement only
    assert 0 < checks["out"].error <= 2 ** -8
    seq_len_tiled, _ = kv_metadata(kv16, 32)
    n = 16 + int(seq_len_tiled.max()) * 32  # head_dim + rows read by the longest request
    assert checks["out"].tolerance == pytest.approx(2 * (2 ** -8 + n * 2 ** -24 / (1 - n * 2 ** -24)))


# --- errors -----------------------------------------------------------------------------------------------
def test_make_inputs_rejects_bad_seeds_and_unknown_workloads(mixtral):
    with pytest.raises(ArgumentError, match="seed must be a non-negative int"):
        make_inputs(mixtral["static8"], seed=-1)
    w = dataclasses.replace(mixtral["static8"], name="conv2d")
    with pytest.raises(ArgumentError, match="unknown workload kind 'conv2d'"):
        make_inputs(w, seed=0)
    with pytest.raises(ArgumentError, match="unknown workload kind 'conv2d'"):
        workload_reference(w, {})


def test_workload_reference_names_a_missing_input(mixtral):
    inputs = make_inputs(mixtral["static8"], seed=0)
    del inputs["expert003_down"]
    with pytest.raises(ArgumentError, match="inputs has no tensor 'expert003_down'"):
        workload_reference(mixtral["static8"], inputs)
