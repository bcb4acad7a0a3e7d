"""``stepsim graph show WORKLOAD|MODEL.onnx [--layouts]`` and ``Stream.layout`` (issue 33): every stream's producer,
consumer, type and layout, pinned whole for a small model with a layout converter (a leading-dims Transpose:
its output carries the consumer's layout) and for the SwiGLU workload's loads."""

import sys
from pathlib import Path

import onnx
import pytest
from onnx import helper

from stepsim.base.errors import ArgumentError
from stepsim.cli import main
from stepsim.frontend import from_onnx
from stepsim.graph.layout import Layout, Loop

sys.path.insert(0, str(Path(__file__).parent))
from ort_check import model, rand  # noqa: E402


def tiny():
    """y = Transpose(Relu(x), [1, 0, 2]) @ w, x [2, 3, 4]: one-row tiles (tile_m 1), the Transpose a reorder
    converter (of a computed value: a graph input's Transpose is read transposed from memory)."""
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="a"),
             helper.make_node("Transpose", ["a"], ["t"], name="t", perm=[1, 0, 2]),
             helper.make_node("MatMul", ["t", "w"], ["y"], name="y")]
    return model(nodes, {"x": [2, 3, 4]}, {"y": [3, 2, 4]}, {"w": rand((4, 4), 1)}, name="tiny")


TINY = """\
graph tiny: 17 operators, 20 edges
producer              consumer               stream                                layout
LinearOffChipLoad_0   Map_1                  Stream<Tile[fp32](1, 4)>[1, 6]        Layout(tensor 2x3x4, tile 1x1x4, loops [d0:2x1, d1:3x1])
Map_1                 Reshape_2              Stream<Tile[fp32](1, 4)>[1, 6]        Layout(tensor 2x3x4, tile 1x1x4, loops [d0:2x1, d1:3x1])
Reshape_2[0]          Partition_4            Stream<Tile[fp32](1, 4)>[1, 2, 3]     -
Reshape_2[1]          -                      Stream<bool>[1, 2, 3]                 -
SelectorSource_3      Partition_4            Stream<MultiHot(3)>[1, 2, 3]          -
Partition_4[0]        Reassemble_6           Stream<Tile[fp32](1, 4)>[4]           -
Partition_4[1]        Reassemble_6           Stream<Tile[fp32](1, 4)>[1]           -
Partition_4[2]        Reassemble_6           Stream<Tile[fp32](1, 4)>[1]           -
SelectorSource_5      Reassemble_6           Stream<MultiHot(3)>[1, 3, 2]          -
Reassemble_6          Flatten_7              Stream<Tile[fp32](1, 4)>[1, 3, 2, 1]  -
Flatten_7             Flatten_8              Stream<Tile[fp32](1, 4)>[1, 3, 2]     Layout(tensor 2x3x4, tile 1x1x4, loops [d1:3x1, d0:2x1])
Flatten_8             Promote_9              Stream<Tile[fp32](1, 4)>[1, 6]        Layout(tensor 3x2x4, tile 1x1x4, loops [d0:3x1, d1:2x1])
Promote_9             Promote_10             Stream<Tile[fp32](1, 4)>[1, 6, 1]     Layout(tensor 3x2x4, tile 1x1x4, loops [d0:3x1, d1:2x1])
Promote_10            MapAccum_12            Stream<Tile[fp32](1, 4)>[1, 6, 1, 1]  Layout(tensor 3x2x4, tile 1x1x4, loops [d0:3x1, d1:2x1])
LinearOffChipLoad_11  MapAccum_12            Stream<Tile[fp32](4, 4)>[1, 6, 1, 1]  Layout(tensor 4x4, tile 4x4, loops [d1:6x0])
MapAccum_12           Flatten_13             Stream<Tile[fp32](1, 4)>[1, 6, 1]     -
Flatten_13            Reshape_14             Stream<Tile[fp32](1, 4)>[1, 6]        Layout(tensor 3x2x4, tile 1x1x4, loops [d0:3x1, d1:2x1])
Reshape_14[0]         Promote_15             Stream<Tile[fp32](1, 4)>[1, 3, 2]     -
Reshape_14[1]         -                      Stream<bool>[1, 3, 2]                 -
Promote_15            LinearOffChipStore_16  Stream<Tile[fp32](1, 4)>[1, 3, 2, 1]  -
"""


def test_a_small_model_with_a_converter(tmp_path, capsys):
    path = tmp_path / "tiny.onnx"
    onnx.save(tiny(), path)
    assert main(["graph", "show", str(path), "--layouts"]) == 0
    assert capsys.readouterr().out == TINY
    # the converter's output is the Transpose's consumer layout: the same tiles of x, its dim 1 outermost
    conv = from_onnx(path).frontend.converters["t"]
    assert conv.consumer == Layout((2, 3, 4), (1, 1, 4), (Loop(1, 3, 1), Loop(0, 2, 1)))
    assert main(["graph", "show", str(path)]) == 0
    plain = capsys.readouterr().out.splitlines()
    assert plain[1].split() == ["producer", "consumer", "stream"]
    cut = TINY.splitlines()[1].index("layout")  # without --layouts: the same lines up to the layout column
    assert [line.rstrip() for line in plain[2:]] == [line[:cut].rstrip() for line in TINY.splitlines()[2:]]


def test_a_workloads_loads_carry_their_view(capsys):
    assert main(["graph", "show", "swiglu", "--tile-m", "64", "--tile-n", "128", "--layouts"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "graph swiglu-m64-n128: 11 operators, 12 edges"
    by_edge = {tuple(line.split()[:2]): line.split("  ")[-1].strip() for line in out[2:]}
    assert by_edge["LinearOffChipLoad_0", "MapAccum_3"] == "Layout(tensor 64x256, tile 64x256, loops [d1:4x0])"
    assert by_edge["LinearOffChipLoad_1", "MapAccum_3"] == ("Layout(tensor 256x512, tile 256x128, loops "
                                                            "[d1:4x128])")
    assert by_edge["LinearOffChipLoad_8", "MapAccum_9"] == ("Layout(tensor 512x256, tile 128x256, loops "
                                                            "[d0:4x128])")
    assert by_edge["MapAccum_9", "LinearOffChipStore_10"] == "-"  # a MatMul's output: no shape rule sets it
    assert sum(v != "-" for v in by_edge.values()) == 5


def test_a_layout_that_does_not_fit_the_stream_is_refused():
    w = from_onnx(tiny())
    load = w.graph.ops[0]
    with pytest.raises(ArgumentError) as err:
        load.assume_layout(0, Layout.ordered((2, 4), (1, 4)))
    assert str(err.value) == ("LinearOffChipLoad_0: output 0 Stream<Tile[fp32](1, 4)>[1, 6] has 6 elements; layout "
                              "Layout(tensor 2x4, tile 1x4, loops [d0:2x1, d1:1x4]) carries 2 tiles")


def test_the_layout_is_not_part_of_the_stream_type():
    w = from_onnx(tiny())
    s = w.graph.ops[0].outputs[0]
    import dataclasses

    bare = dataclasses.replace(s, layout=None)
    assert s.layout is not None and s == bare and s.same_type(bare) and hash(s) == hash(bare)
