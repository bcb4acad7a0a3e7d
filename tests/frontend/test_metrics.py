"""Off-chip bytes of a lowered model are exact (issue 33): the inputs, the initializers (a weight read once per
row tile of its MatMul's input, a row vector once), the outputs, and 2x the bytes of each spilled edge, all
computed here from the model's dims; fusing an edge removes exactly its spill traffic. The engine moves the same
bytes as the symbolic metric, spills included (stepsim.frontend.spill: each spilled tensor written once and read
back once through the HBM), and a spill costs cycles."""

import sys
from pathlib import Path

import numpy as np
from onnx import helper

from stepsim.frontend import from_onnx
from stepsim.graph.layout import converter_buffer
from stepsim.simulation.simulate import simulate

sys.path.insert(0, str(Path(__file__).parent))
from ort_check import check, model, rand  # noqa: E402

B, S, K, F, D = 2, 4, 16, 32, 8  # batch, rows per batch, in, hidden, out features
TILE_M, TILE_N = 2, 8


def mlp():
    """x [B, S, K] -> MatMul w1 [K, F] -> Relu -> MatMul w2 [F, D] -> Add b [D] -> y."""
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h1"], name="fc1"),
             helper.make_node("Relu", ["h1"], ["h2"], name="act"),
             helper.make_node("MatMul", ["h2", "w2"], ["h3"], name="fc2"),
             helper.make_node("Add", ["h3", "b"], ["y"], name="bias")]
    init = {"w1": rand((K, F), 1, K ** -0.5), "w2": rand((F, D), 2, F ** -0.5), "b": rand((D,), 3)}
    return model(nodes, {"x": [B, S, K]}, {"y": [B, S, D]}, init, name="mlp")


def expected_off_chip(spilled: set) -> int:
    row_tiles = B * S // TILE_M  # each weight is read once per row tile of its input
    fused = 4 * (B * S * K + row_tiles * K * F + row_tiles * F * D + D + B * S * D)
    edge_bytes = {"h1": B * S * F * 4, "h2": B * S * F * 4, "h3": B * S * D * 4}
    return fused + sum(2 * edge_bytes[v] for v in spilled)


def test_off_chip_bytes_are_exact_and_fusing_removes_exactly_the_spill():
    tiling = {"tile_m": TILE_M, "tile_n": TILE_N}
    x = rand((B, S, K), 4)
    runs = {}
    for spill in [(), ("h2",), ("h1", "h3")]:
        w = from_onnx(mlp(), tiling=tiling, spill=spill)
        assert {e.value for e in w.frontend.spilled()} == set(spill)
        off = w.metrics()["off_chip_bytes"]
        assert off == expected_off_chip(set(spill))
        r = simulate(w, functional=True, inputs={"x": x})
        spilled = expected_off_chip(set(spill)) - expected_off_chip(set())
        assert r.off_chip_bytes == off  # the engine's HBM counters: written once, read back once
        assert r.off_chip_bytes_written == 4 * B * S * D + spilled // 2
        runs[spill] = r
    assert runs[()].cycles < runs[("h2",)].cycles < runs[("h1", "h3")].cycles  # a spill costs HBM time
    w = from_onnx(mlp(), tiling=tiling, fuse=False)
    assert [(e.value, e.consumer, e.reason) for e in w.frontend.edges] == [
        (v, c, "spilled: fusion is off (--no-fuse; fuse=False in the API)")
        for v, c in (("h1", "act"), ("h2", "fc2"), ("h3", "bias"))]
    assert w.metrics()["off_chip_bytes"] == expected_off_chip({"h1", "h2", "h3"})
    # the values do not depend on where the edges live
    assert all(np.array_equal(r.outputs["y"], runs[()].outputs["y"]) for r in runs.values())


def test_values_match_onnxruntime_with_spills():
    check(mlp(), {"x": rand((B, S, K), 4)}, K + F + 1, tiling={"tile_m": TILE_M, "tile_n": TILE_N},
          spill=("h2",))


def test_stripes_feed_a_one_tile_matmul_directly_and_a_row_consumer_through_the_minimum_retile():
    w = from_onnx(mlp(), tiling={"tile_m": TILE_M, "tile_n": TILE_N})
    # h1 leaves fc1 as 2 x 8 stripes, passes Relu as stripes and enters fc2 (N = D, one tile) as its K chunks
    assert (w.frontend.tn["h1"], w.frontend.tn["h2"], w.frontend.tn["h3"]) == (TILE_N, TILE_N, D)
    assert w.frontend.converters == {}
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h1"], name="fc1"),
             helper.make_node("Softmax", ["h1"], ["y"], name="softmax", axis=-1)]
    m = model(nodes, {"x": [B, S, K]}, {"y": [B, S, F]}, {"w1": rand((K, F), 1, K ** -0.5)}, name="fc_softmax")
    w, _, _ = check(m, {"x": rand((B, S, K), 4)}, K + F + 4, tiling={"tile_m": TILE_M, "tile_n": TILE_N})
    conv = w.frontend.converters["h1"]
    assert conv.kind == "retile" and conv.buffer.bytes == TILE_M * F * 4  # one row block
    assert conv.buffer == converter_buffer(conv.producer, conv.consumer)
    assert w.frontend.converter_ops["h1"].on_chip_bytes() == conv.buffer.bytes


def test_fusion_under_an_on_chip_budget():
    tiling = {"tile_m": TILE_M, "tile_n": TILE_N}
    # FIFOs of 2 tiles: h1 and h2 stream 2 x 8 stripes (128 B), h3 2 x 8 rows (128 B); spilling h1 or h2 costs
    # 2 * 1024 B, h3 2 * 256 B: h1 and h2 save more per FIFO byte
    assert all(e.fused for e in from_onnx(mlp(), tiling=tiling).frontend.edges)
    assert [e.fifo_bytes for e in from_onnx(mlp(), tiling=tiling).frontend.edges] == [128, 128, 128]
    none = from_onnx(mlp(), tiling=tiling, budget=0)
    assert [e.reason for e in none.frontend.edges] == [
        "spilled: its FIFO (128 B) exceeds the on-chip budget left (0 B of 0 B)"] * 3
    assert none.metrics()["off_chip_bytes"] == expected_off_chip({"h1", "h2", "h3"})
    two = from_onnx(mlp(), tiling=tiling, budget=300)
    assert [(e.value, e.fused) for e in two.frontend.edges] == [("h1", True), ("h2", True), ("h3", False)]
    assert two.frontend.edges[2].reason == "spilled: its FIFO (128 B) exceeds the on-chip budget left (44 B of 300 B)"
    assert two.metrics()["off_chip_bytes"] == expected_off_chip({"h3"})


def test_the_report_shows_every_streams_layout_the_converters_and_the_edges():
    w = from_onnx(mlp(), tiling={"tile_m": TILE_M, "tile_n": TILE_N}, spill=("h3",))
    assert w.frontend.describe() == "\n".join([
        "layouts (tile_m 2):",
        "  x   Layout(tensor 2x4x16, tile 1x2x16, loops [d0:2x1, d1:2x2])",
        "  h1  Layout(tensor 2x4x32, tile 1x2x8, loops [d0:2x1, d1:2x2, d2:4x8])",
        "  h2  Layout(tensor 2x4x32, tile 1x2x8, loops [d0:2x1, d1:2x2, d2:4x8])",
        "  h3  Layout(tensor 2x4x8, tile 1x2x8, loops [d0:2x1, d1:2x2])",
        "  y   Layout(tensor 2x4x8, tile 1x2x8, loops [d0:2x1, d1:2x2])",
        "converters: none",
        "edges:",
        "  h1 -> act: fused: the consumer takes the producer's stream",
        "  h2 -> fc2: fused: the consumer takes the producer's stream",
        "  h3 -> bias: spilled: named in spill="])
