"""Spilled edges move real off-chip traffic in the engine (issue 33, stepsim.frontend.spill): each spilled tensor is
written through the HBM and read back once the whole tensor is stored. The engine's HBM counters equal the metric
and the bytes computed here from the dims; both engines agree on spilled graphs; values do not change (onnxruntime
checks); a spilled Transpose input needs no reorder converter, so spilling trades cycles for on-chip bytes, and
``optimize --hierarchical`` keeps spilled points on its front. A node that reads a spilled tensor waits for all of
it, so its other inputs from before the spill spill too (else the graph deadlocks, shown below)."""

import json
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper

from stepsim.base.defaults import UNSET, resolve_channel_depth
from stepsim.base.errors import DeadlockError
from stepsim.base.hardware import Hardware
from stepsim.cli import main
from stepsim.frontend import from_onnx, fusion
from stepsim.graph.lower import fp32_timing_bytes, lower
from stepsim.graph.ops_convert import ConverterPartition
from stepsim.kernels.api import run as fast_run
from stepsim.kernels.reference import run as ref_run
from stepsim.optimize.onnx_hierarchy import matmul_options, search
from stepsim.optimize.onnx_search import converter_values
from stepsim.simulation.simulate import simulate

sys.path.insert(0, str(Path(__file__).parent))
import test_onnx_attention as attn  # noqa: E402
from ort_check import check, model, rand  # noqa: E402
from test_bf16 import BLOCKS, to_bf16  # noqa: E402
from test_hierarchy import exhaustive, front_vectors  # noqa: E402

B, S, D, H = 2, 8, 32, 4
HD = D // H


def heads():
    """x [B, S, D] -> MatMul w -> [B, S, H, hd] -> Transpose -> [B, H, S, hd] -> Relu -> y: one head Transpose,
    whose reorder converter holds ((S / tile_m - 1) (H - 1) + 1) tiles of tile_m x hd."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["p0"], name="proj"),
             helper.make_node("Reshape", ["p0", "shape"], ["p1"], name="split"),
             helper.make_node("Transpose", ["p1"], ["p2"], name="heads", perm=[0, 2, 1, 3]),
             helper.make_node("Relu", ["p2"], ["y"], name="act")]
    init = {"w": rand((D, D), 1, D ** -0.5), "shape": np.array([B, S, H, HD], np.int64)}
    return model(nodes, {"x": [B, S, D]}, {"y": [B, H, S, HD]}, init, name="heads")


def diamond():
    """x -> MatMul -> h; y = h + Relu(h): h is read twice."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="fc"),
             helper.make_node("Relu", ["h"], ["r"], name="act"),
             helper.make_node("Add", ["h", "r"], ["y"], name="res")]
    return model(nodes, {"x": [B, S, D]}, {"y": [B, S, D]}, {"w": rand((D, D), 1, D ** -0.5)}, name="diamond")


def engines_agree(w):
    """Lower ``w`` as simulate does and run both engines; they agree on every counter. Returns the numba result."""
    hw = Hardware.preset(w.hardware)
    program = lower(w.graph, hw, channel_depth=resolve_channel_depth(UNSET, hw, w.channel_depth))
    ref, fast = ref_run(program), fast_run(program)
    assert ref.cycles == fast.cycles
    np.testing.assert_array_equal(ref.unit_counters, fast.unit_counters)
    np.testing.assert_array_equal(ref.channel_counters, fast.channel_counters)
    assert (ref.off_chip_bytes_read, ref.off_chip_bytes_written) == (fast.bytes_read, fast.bytes_written)
    return fast


@pytest.mark.parametrize("tile_m", [1, 2])
def test_a_spilled_transpose_input_moves_its_bytes_and_drops_the_converter(tile_m):
    fused = from_onnx(heads(), tiling={"tile_m": tile_m})
    spilled, _, _ = check(heads(), {"x": rand((B, S, D), 4)}, D + 1, tiling={"tile_m": tile_m}, spill=("p1",))
    assert [(e.value, e.fused) for e in spilled.frontend.edges] == [("p0", True), ("p1", False), ("p2", True)]
    tensor = B * S * D * 4  # p1, fp32
    weights = (B * S // tile_m) * D * D * 4  # w, read once per row block of x
    io = 2 * tensor  # x in, y out
    assert fused.metrics()["off_chip_bytes"] == weights + io
    assert spilled.metrics()["off_chip_bytes"] == weights + io + 2 * tensor
    # the engine's HBM counters: the spill written once and read back once, on top of the fused traffic
    f, s = engines_agree(fused), engines_agree(spilled)
    assert (f.bytes_read, f.bytes_written) == (weights + tensor, tensor)
    assert (s.bytes_read, s.bytes_written) == (weights + 2 * tensor, 2 * tensor)
    assert s.cycles > f.cycles
    # on chip: the reorder converter's slots are gone; the spill holds one tile in its store and one in its load
    # and an 8-byte completion token
    sm, tile = S // tile_m, tile_m * HD * 4
    converter = ((sm - 1) * (H - 1) + 1) * tile
    assert [op.on_chip_bytes() for op in fused.graph if isinstance(op, ConverterPartition)] == [converter]
    assert not [op for op in spilled.graph if isinstance(op, ConverterPartition)]
    assert spilled.frontend.converter_ops == {} and spilled.frontend.spilled_converters == {"heads"}
    line = next(x for x in spilled.frontend.describe().splitlines() if x.startswith("  heads "))
    assert line.endswith(": replaced by a spill (read back in the consumer's order)")
    assert fused.frontend.spilled_converters == frozenset() and "replaced" not in fused.frontend.describe()
    assert spilled.metrics()["on_chip_bytes"] == fused.metrics()["on_chip_bytes"] - converter + 2 * tile + 8
    assert (fused.metrics()["on_chip_bytes"], spilled.metrics()["on_chip_bytes"]) == {
        1: (2048, 1416), 2: (2304, 1800)}[tile_m]


def test_spilled_or_fused_the_values_are_identical():
    x = rand((B, S, D), 4)
    outs = [simulate(from_onnx(heads(), tiling={"tile_m": 2}, **kw), functional=True, inputs={"x": x}).outputs["y"]
            for kw in ({}, {"spill": ("p1",)}, {"fuse": False})]
    assert all(np.array_equal(o, outs[0]) for o in outs)


def test_a_spill_read_back_as_rows_replaces_the_retile_converter():
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="fc"),
             helper.make_node("Softmax", ["h"], ["y"], name="softmax", axis=-1)]
    m = model(nodes, {"x": [B, S, D]}, {"y": [B, S, D]}, {"w": rand((D, D), 1, D ** -0.5)}, name="fc_softmax")
    tiling = {"tile_m": 2, "tile_n": 8}
    fused = from_onnx(m, tiling=tiling)
    w, _, _ = check(m, {"x": rand((B, S, D), 4)}, D + D + 6, tiling=tiling, spill=("h",))
    assert list(fused.frontend.converter_ops) == ["h"] and w.frontend.converter_ops == {}
    assert w.frontend.spilled_converters == {"h"}
    retile, stripe, row = 2 * D * 4, 2 * 8 * 4, 2 * D * 4  # the retile's row block; the store's and load's tiles
    assert w.metrics()["on_chip_bytes"] == fused.metrics()["on_chip_bytes"] - retile + stripe + row + 8
    s = engines_agree(w)
    assert s.bytes_written == 2 * B * S * D * 4 and w.metrics()["off_chip_bytes"] == s.bytes_read + s.bytes_written


def test_a_node_reading_a_spill_spills_its_other_inputs_from_before_it():
    w = from_onnx(diamond(), tiling={"tile_m": 1}, spill=("r",))
    assert [(e.value, e.consumer, e.reason) for e in w.frontend.edges] == [
        ("h", "act", "fused: the consumer takes the producer's stream"),
        ("h", "res", "spilled: res also reads a spilled tensor, whole; streamed, this edge would stall its producer "
                     "(deadlock)"),
        ("r", "res", "spilled: named in spill=")]
    tensor = B * S * D * 4
    r = engines_agree(w)
    assert r.bytes_written == tensor + 2 * tensor  # y, and the two spills
    assert w.metrics()["off_chip_bytes"] == r.bytes_read + r.bytes_written


def test_without_the_co_spill_the_diamond_deadlocks(monkeypatch):
    monkeypatch.setattr(fusion, "materialize", lambda model, edges: None)
    w = from_onnx(diamond(), tiling={"tile_m": 1}, spill=("r",))
    assert [e.fused for e in w.frontend.edges] == [True, True, False]
    with pytest.raises(DeadlockError):
        simulate(w)


def test_the_hierarchical_front_keeps_spilled_points_and_is_the_exhaustive_front():
    result = search(heads())
    front = [(p.tiling["tile_m"], p.tiling["spill"], p.vector(p.cycles)) for p in result.front]
    assert front == [(8, [], (466, 3584, 2048)), (4, [], (860, 2816, 2048)), (4, ["p1"], (1234, 2568, 2048)),
                     (2, [], (1744, 2304, 2048)), (2, ["p1"], (2313, 1800, 2048)), (1, ["p1"], (4485, 1416, 2048))]
    assert result.fusion_by_tile_m[1]["p1"] == "spilled: in 1 of the 1 front points at this tile_m"
    assert result.fusion_by_tile_m[4]["p1"] == "spilled: in 1 of the 2 front points at this tile_m"
    assert result.fusion["p1"] == "fused: no front point at this tile_m spills it"  # the default tile_m, 8
    # 4 tile_m x proj's tile_n (whole rows, 16: the head split's tiles do not take it) x 2^3 spill sets
    assert matmul_options(from_onnx(heads()).frontend) == {"proj": [None, 16]}
    # the 4 tilings with proj at 16 do not build all fused: their 28 other schedules are left out unbuilt
    assert (len(result.candidates), result.simulations, result.pruned, len(result.skipped)) == (25, 8, 7, 4)
    assert (result.built, result.unbuilt, result.built + result.pruned + result.unbuilt) == (29, 28, 64)
    every = exhaustive(heads(), ("p0", "p1", "p2"), [(tm, per_node) for tm in (1, 2, 4, 8)
                                                     for per_node in ({}, {"proj": 16})])
    assert len(every) == 32  # the other 32 are not buildable: the search left out no buildable schedule
    assert front_vectors([n.point for *_, n in every]) == [v for *_, v in front]


def test_the_tile_search_tries_each_tiling_with_its_converters_spilled(tmp_path, capsys):
    assert converter_values(from_onnx(heads(), tiling={"tile_m": 1}).frontend) == ["p1"]  # the head Transpose's
    assert converter_values(from_onnx(heads()).frontend) == []  # tile_m 8: one row block per sequence, no buffer
    path = tmp_path / "heads.onnx"
    onnx.save(heads(), path)
    assert main(["optimize", str(path), "--out", str(tmp_path / "opt"), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc == json.loads((tmp_path / "opt" / "optimize.json").read_text())
    # 4 tile_m x 2 tile_n (16: the head split's own tile), each of tile_m 1, 2, 4 also with p1 spilled
    assert (doc["candidates"], doc["simulations"]) == (14, 12)
    front = [(p["tile_m"], p["tile_n"], p.get("spill"), p["cycles"], p["on_chip_bytes"]) for p in doc["pareto"]]
    assert [f for f in front if f[1] is None] == [
        (8, None, None, 466, 3584), (4, None, None, 860, 2816), (4, None, ["p1"], 1234, 2568),
        (2, None, None, 1744, 2304), (2, None, ["p1"], 2313, 1800), (1, None, ["p1"], 4485, 1416)]
    assert doc["recommended"] == {"tile_m": 8, "tile_n": None}
    assert main(["optimize", str(path), "--out", str(tmp_path / "opt2"), "--objective", "on-chip"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "recommended (on-chip): {'tile_m': 1, 'tile_n': None, 'spill': ['p1']}"


def test_a_bf16_model_spills_fp32_tiles_and_keeps_its_2_byte_timing():
    m = to_bf16(BLOCKS["llama"](2, 8, 64, 128))
    x = np.random.default_rng(0).standard_normal((2, 8, 64)).astype(np.float32)
    fused, spilled = from_onnx(m), from_onnx(m, fuse=False)
    # the spills' read-backs are scratch fp32 tensors: the model's weights still say mock bf16 (2-byte fp32 tiles)
    assert fp32_timing_bytes(fused.graph) == fp32_timing_bytes(spilled.graph) == 2
    a = simulate(fused, functional=True, inputs={"x": x})
    b = simulate(spilled, functional=True, inputs={"x": x})
    assert np.array_equal(a.outputs["y"], b.outputs["y"])
    # every spill moves its fp32 tensor twice; x (bf16) is read by the norm's square, its scaling Mul (after the
    # spilled mean) and the residual Add (after the spilled MLP): once per phase, two reads more than fused
    extra = sum(2 * e.bytes for e in spilled.frontend.edges) + 2 * (2 * 8 * 64 * 2)
    assert spilled.metrics()["off_chip_bytes"] == fused.metrics()["off_chip_bytes"] + extra == b.off_chip_bytes
    assert a.off_chip_bytes == fused.metrics()["off_chip_bytes"] and b.cycles > a.cycles


def leading():
    """y = Transpose(Relu(x), [1, 0, 2]), x [3, 4, 16]: one-row tiles, a reorder of the (3, 4) grid."""
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="act"),
             helper.make_node("Transpose", ["r"], ["y"], name="t", perm=[1, 0, 2])]
    return model(nodes, {"x": [3, 4, 16]}, {"y": [4, 3, 16]}, name="leading")


def test_every_reordering_transpose_reads_its_spill_back_in_its_order():
    ab, as_, ad, ahd = attn.B, attn.S, attn.D, attn.HD
    # [B, S, D] row tiles <-> [B, H, S, hd] on q, k, v (splits) and o (the merge), where the residual's x is read
    # again after the spills (its own phase); leading dims with tile_m 1
    cases = [(attn.attention_block(True), {"x": rand((ab, as_, ad), 20)}, 2 * ad + ahd + 2 + as_ + 6 + as_ + 2 + 1,
              {"tile_m": 2}, ("q2", "k2", "v2", "o"), ab * as_ * ad * 4),
             (leading(), {"x": rand((3, 4, 16), 2)}, 1, {}, ("r",), 0)]
    for m, feeds, length, tiling, spill, reread in cases:
        fused = from_onnx(m, tiling=tiling)
        w, _, _ = check(m, feeds, length, tiling=tiling, spill=spill)
        assert {e.value for e in w.frontend.spilled()} == set(spill)
        converters = [op.on_chip_bytes() for op in fused.graph if isinstance(op, ConverterPartition)]
        assert len(converters) == len(spill) and w.frontend.converter_ops == {}
        assert not [op for op in w.graph if isinstance(op, ConverterPartition)]
        r = engines_agree(w)
        assert w.metrics()["off_chip_bytes"] == r.bytes_read + r.bytes_written
        assert w.metrics()["off_chip_bytes"] - fused.metrics()["off_chip_bytes"] == sum(
            2 * e.bytes for e in w.frontend.edges if not e.fused) + reread
