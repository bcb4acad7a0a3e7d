"""Pass 3: converter insertion. Where a consumer's layout differs from its producer's, a converter goes
between them, sized by :func:`stepsim.graph.layout.converter_buffer` (the least buffer, in bytes):

* ``retile``: column stripes (``tile_m x tn`` tiles, a MatMul's output) into row tiles, for a consumer that needs
  whole rows; its buffer is one row block, which the emitted ``Accum(RetileCol)`` holds exactly;
* ``reorder``: a Transpose of leading dims (one-row tiles) is the same tiles in another order, built by
  :func:`stepsim.graph.ops_convert.convert` (slots of depth-1 FIFOs, exactly the least buffer).

A Transpose of a graph input that keeps the last dim needs none: the load reads the input in the transposed order
(:func:`stepsim.frontend.layouts.read_transposed`).

A pair no converter can turn into the other raises LayoutError naming both nodes and layouts.
"""

from __future__ import annotations

from dataclasses import dataclass

from stepsim.base.errors import FrontendError
from stepsim.frontend.ir import Model
from stepsim.frontend.layouts import (
    Tiling,
    groups_rows_cols,
    head_merge,
    head_split,
    matmul_layout,
    needs_rows,
    read_transposed,
    row_layout,
    transpose_kind,
)
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
        if node.op_type == "Transpose" and not model.is_const(node.inputs[0]) and not read_transposed(model, node):
            conv = _transpose(model, node, tile_m)
            if conv is not None:
                out[node.name] = conv
    return out


def _transpose(model: Model, node, tile_m: int) -> Conversion | None:
    """The converter of a Transpose (None for a last-two-dims swap: its MatMul reads it transposed, or the memory
    does, :func:`stepsim.frontend.layouts.materialized_swap`)."""
    x, y = node.inputs[0], node.outputs[0]
    shape = model.shapes[x]
    kind = transpose_kind(model, node)
    producers, readers = model.producer(), model.consumers()
    if kind == "swap":  # a view its MatMuls read transposed, or read back transposed by the memory: no converter
        return None
    if kind == "heads":
        b, s_, h, hd = shape if x in producers and head_split(model, producers[x]) else (
            shape[0], shape[2], shape[1], shape[3])
        if s_ % tile_m:
            raise FrontendError(f"{node.describe()}: tile_m {tile_m} does not divide the sequence of {s_}")
        by_head = (Loop(0, b, 1), Loop(1, h, 1), Loop(2, s_ // tile_m, tile_m))  # [B, H, S, hd] row-major
        by_row = (Loop(0, b, 1), Loop(2, s_ // tile_m, tile_m), Loop(1, h, 1))  # row blocks, heads inside
        split = x in producers and head_split(model, producers[x]) is not None
        merge = all(head_merge(model, n) for n in readers.get(y, [])) and readers.get(y)
        if not (split or merge):
            raise FrontendError(f"{node.describe()}: a [B, S, H, hd] <-> [B, H, S, hd] Transpose streams on chip "
                                f"after a head-splitting Reshape or before a head-merging one")
        tensor, tile = (b, h, s_, hd), (1, 1, tile_m, hd)
        p, c = (Layout(tensor, tile, by_row), Layout(tensor, tile, by_head)) if split else (
            Layout(tensor, tile, by_head), Layout(tensor, tile, by_row))
        return Conversion(node.name, y, "reorder", p, c, converter_buffer(p, c, producer=node.name, consumer=y))
    if kind == "leading" and tile_m == 1:
        b, r, n = groups_rows_cols(shape)
        p = Layout((b, r, n), (1, 1, n), (Loop(0, b, 1), Loop(1, r, 1)))
        c = Layout((b, r, n), (1, 1, n), (Loop(1, r, 1), Loop(0, b, 1)))
        return Conversion(node.name, y, "reorder", p, c, converter_buffer(p, c, producer=node.name, consumer=y))
    perm = list(node.attrs.get("perm", range(len(shape) - 1, -1, -1)))
    raise FrontendError(f"{node.describe()}: perm {perm} of shape {list(shape)} does not stream on chip; supported: "
                        f"the last two dims (a MatMul's right operand), [B, S, H, hd] <-> [B, H, S, hd] around a head "
                        f"split or merge, the two leading dims of a 3-D value with tile_m=1")
