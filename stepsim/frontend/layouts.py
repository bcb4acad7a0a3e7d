"""Pass 2: layout assignment. Every activation streams as *row tiles*: ``tile_m`` rows by the whole last dim,
in row-major order (a 3-D value ``[B, S, N]`` as ``B`` groups of ``S / tile_m`` tiles); a MatMul produces
``tile_m x tile_n`` tiles, ``n`` innermost, which the converter pass retiles into rows.

Shape ops that keep the last dim and the row order (Reshape, Flatten, Squeeze, Unsqueeze merging or splitting
leading dims) are map rewrites: the stream is unchanged. A Transpose of leading dims with one-row tiles is a
reorder of the same tiles (a converter, :mod:`stepsim.frontend.converters`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from stepsim.base.errors import FrontendError
from stepsim.frontend.ir import Model
from stepsim.graph.layout import Layout, Loop

#: default compute bandwidth of every compute operator (FLOPs/cycle), as the workloads' FFNs use
DEFAULT_COMPUTE_BW = 1024


@dataclass(frozen=True)
class Tiling:
    """Tile sizes of a lowering.

    Attributes
    ----------
    tile_m : int or None
        Rows per activation tile (elements); it must divide the rows of every activation (the second-to-last dim
        of a 3-D one). Default: the gcd of those row counts.
    tile_n : int or None
        Columns per MatMul output tile (elements); default the whole N. ``per_node`` overrides it per MatMul.
    per_node : dict
        ``{node name: tile_n}``.
    compute_bw : int
        FLOPs per cycle of each compute operator.
    """

    tile_m: int | None = None
    tile_n: int | None = None
    per_node: dict = field(default_factory=dict)
    compute_bw: int = DEFAULT_COMPUTE_BW

    def n_tile(self, node_name: str, n: int) -> int:
        tn = self.per_node.get(node_name, self.tile_n) or n
        if n % tn:
            raise FrontendError(f"node {node_name!r} (MatMul): tile_n {tn} does not divide N = {n}")
        return tn


def groups_rows_cols(shape: tuple) -> tuple[int, int, int]:
    """``(groups, rows, cols)`` of an activation: ``[N]`` -> (1, 1, N), ``[R, N]`` -> (1, R, N), ``[B, S, N]`` ->
    (B, S, N); higher ranks with leading 1s are squeezed."""
    shape = tuple(shape)
    while len(shape) > 3 and shape[0] == 1:
        shape = shape[1:]
    if len(shape) == 1:
        return 1, 1, shape[0]
    if len(shape) == 2:
        return 1, shape[0], shape[1]
    if len(shape) == 3:
        return shape
    raise ValueError(f"rank {len(shape)}")


def row_layout(shape: tuple, tile_m: int) -> Layout:
    """The row-tile layout of an activation of ``shape`` (see the module docstring)."""
    b, r, n = groups_rows_cols(shape)
    return Layout((b, r, n), (1, tile_m, n), (Loop(0, b, 1), Loop(1, r // tile_m, tile_m)))


def matmul_layout(shape: tuple, tile_m: int, tile_n: int) -> Layout:
    """A MatMul's output layout: ``tile_m x tile_n`` tiles, rows outer, ``n`` inner."""
    b, r, n = groups_rows_cols(shape)
    return Layout((b, r, n), (1, tile_m, tile_n),
                  (Loop(0, b, 1), Loop(1, r // tile_m, tile_m), Loop(2, n // tile_n, tile_n)))


def choose_tile_m(model: Model, tiling: Tiling) -> int:
    """``tiling.tile_m``, checked against every activation's rows, or their gcd."""
    rows = {}
    for node in model.nodes:
        for v in node.inputs + node.outputs:
            if v and not model.is_const(v) and len(model.shapes[v]) >= 1:
                try:
                    rows[v] = groups_rows_cols(model.shapes[v])[1]
                except ValueError:
                    raise FrontendError(f"{node.describe()}: value {v!r} of shape {list(model.shapes[v])} has more "
                                        f"than 3 dims; supported are 1-D to 3-D activations") from None
    if tiling.tile_m is None:
        return math.gcd(*rows.values()) if rows else 1
    bad = next((v for v, r in rows.items() if r % tiling.tile_m), None)
    if bad is not None:
        raise FrontendError(f"tile_m {tiling.tile_m} does not divide the {rows[bad]} rows of {bad!r}")
    return tiling.tile_m
