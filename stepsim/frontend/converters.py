"""Pass 3: converter insertion. Where a consumer's layout differs from its producer's, a converter goes
between them, sized by :func:`stepsim.graph.layout.converter_buffer` (the least buffer, in bytes):

* ``retile``: column stripes (``tile_m x tn`` tiles, a MatMul's output) into row tiles, for a consumer that needs
  whole rows; its buffer is one row block, which the emitted ``Accum(RetileCol)`` holds exactly;
* ``reorder``: a Transpose of leading dims (one-row tiles) is the same tiles in another order, built by
  :func:`stepsim.graph.ops_convert.convert` (slots of depth-1 FIFOs, exactly the least buffer).

A pair no converter can turn into the other raises LayoutError naming both nodes and layouts.
"""

from __future__ import annotations

from dataclasses import dataclass

from stepsim.base.errors import FrontendError
from stepsim.frontend.ir import Model
from stepsim.frontend.layouts import Tiling, groups_rows_cols, matmul_layout, needs_rows, row_layout
from stepsim.graph.layout import ConverterBuffer, Layout, Loop, converter_buffer


@dataclass(frozen=True)
class Conversion:
    """A converter on value ``value`` (produced by node ``node``): ``kind`` (retile / reorder), the layouts on
    both sides and its least buffer."""

    node: str
    value: str
    kind: str
    producer: Layout
    consumer: Layout
    buffer: ConverterBuffer


def plan(model: Model, tiling: Tiling, tile_m: int, tn: dict) -> dict:
    """``{value or node name: Conversion}``: a retile per activation streaming as stripes that some consumer needs
    as whole rows (keyed by the value), a reorder per Transpose (keyed by the node)."""
    out = {}
    producers = model.producer()
    for node in model.nodes:
        for i, v in enumerate(node.inputs):
            if not v or v not in tn or v in out or tn[v] == model.shapes[v][-1]:
                continue
            if needs_rows(model, tiling, tn, node, i):
                shape = model.shapes[v]
                p, c = matmul_layout(shape, tile_m, tn[v]), row_layout(shape, tile_m)
                name = producers[v].name if v in producers else v
                out[v] = Conversion(name, v, "retile", p, c, converter_buffer(p, c, producer=name, consumer=node.name))
        if node.op_type == "Transpose" and not model.is_const(node.inputs[0]):
            out[node.name] = _transpose(model, node, tile_m)
    return out


def transpose_perm(model: Model, node) -> list:
    shape = model.shapes[node.inputs[0]]
    return list(node.attrs.get("perm", range(len(shape) - 1, -1, -1)))


def _transpose(model: Model, node, tile_m: int) -> Conversion:
    x = node.inputs[0]
    shape = model.shapes[x]
    perm = transpose_perm(model, node)
    if len(shape) != 3 or perm[-1] != 2 or tile_m != 1:
        raise FrontendError(f"{node.describe()}: only a Transpose of the two leading dims of a 3-D activation with "
                            f"one-row tiles (tile_m=1) streams on chip; got perm {perm} of shape {list(shape)} with "
                            f"tile_m {tile_m}")
    b, r, n = groups_rows_cols(shape)
    p = Layout((b, r, n), (1, 1, n), (Loop(0, b, 1), Loop(1, r, 1)))
    c = p if perm == [0, 1, 2] else Layout((b, r, n), (1, 1, n), (Loop(1, r, 1), Loop(0, b, 1)))
    consumer = ", ".join(f"{v}" for v in node.outputs)
    return Conversion(node.name, node.outputs[0], "reorder", p, c,
                      converter_buffer(p, c, producer=node.name, consumer=consumer))


def row_layout_of(model: Model, value: str, tile_m: int) -> Layout:
    return row_layout(model.shapes[value], tile_m)
