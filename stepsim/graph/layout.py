"""Layout types of tile streams (StreamTensor's iterative tensors) and the minimum buffer of a layout converter.

A :class:`Layout` says which tile of a tensor a stream carries at each step: the tensor's shape and the element
tile shape (elements), an iteration space of loops ``(dim, trips, step)`` (outermost first; ``step`` in elements
along tensor dimension ``dim``) and so the affine map ``f(i) = sum_k i_k * step_k * e_{dim_k}`` from iteration
indices to the origin of the tile (in elements). The stream carries the tile at ``f(i)`` for each ``i`` of the
iteration space in lexicographic order; its STeP stream shape is the trip counts.

Two layouts of the same tensor are *compatible* when they carry the same tiles in the same order
(:func:`compatible`). Otherwise a converter between them buffers tiles; :func:`converter_buffer` gives the least
buffer (elements and bytes) with which the converter never deadlocks.

The minimum buffer (our derivation, issue 33; checked by brute force in tests/graph/test_layout.py)
-----------------------------------------------------------------------------------------------------
Refine both layouts to a common grid of *cells* (per dimension the gcd of the two tile sizes). Let ``p(x)`` /
``c(x)`` be the producer's / consumer's tile number of cell ``x``, ``T_p`` / ``T_c`` the cells per tile. The
converter needs consumer tile ``j`` complete before it can emit it; producing later never needs less buffer, so
the least buffer is reached when the producer runs only as far as the consumer needs: before consumer tile
``j`` leaves, ``P_j = 1 + M(j)`` producer tiles have arrived, ``M(j) = max{p(x) : c(x) <= j}``, and the buffer
holds ``B(j) = P_j * T_p - j * T_c`` cells (every consumed cell was produced). So ``B_min = max_j B(j)``.

Closed form (when the two layouts' loop boundaries on every dimension divide one another, e.g. all sizes powers
of two): every cell coordinate splits into *digits* ``x_d`` of radix ``r_d`` such that ``p(x) = sum_d wp_d x_d``
and ``c(x) = sum_d wc_d x_d``. Let ``F = sum (r_d - 1) wp_d`` over the digits inside a consumer tile
(``wc_d = 0``), ``d_1 .. d_m`` the consumer's loop digits outermost first and ``a_i = wp_i T_p - wc_i T_c``.
``M(j)`` is the largest ``p`` over the consumer tiles lexicographically ``<= j``: either ``j`` itself or, for a
level ``l`` with ``j_l >= 1``, the same digits above ``l``, ``j_l - 1`` at ``l`` and every digit below at its top.
Maximizing ``B`` over ``j`` level by level (each term is linear in each digit) gives::

    B_min = T_p (1 + F) + max( S_0(m),
                               max_{l: r_l >= 2} S_0(l - 1) + max(a_l, a_l (r_l - 1)) - wp_l T_p
                                                 + T_p sum_{i > l} (r_i - 1) wp_i )
    S_0(l) = sum_{i <= l} max(0, (r_i - 1) a_i)

in cells; times the cell's elements gives elements, times the element bytes gives bytes. Pairs without a common
digit split (tile 4 against tile 6 of a 12-wide dim, say) are sized by the scan ``max_j B(j)`` above.

Examples (4 x 4 grid of 32 x 32 tiles): row-major to column-major needs ``(4-1)(4-1)+1 = 10`` tiles; re-tiling
to 64 x 64, both row-major, needs 6 tiles of 32 x 32 (``converter_buffer`` docstring).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from stepsim.base.errors import LayoutError


class Loop(NamedTuple):
    """One loop of a layout's iteration space: ``trips`` iterations of ``step`` elements along tensor ``dim``
    (``step`` 0 re-reads the same tiles)."""

    dim: int
    trips: int
    step: int


@dataclass(frozen=True)
class Layout:
    """The type of a tile stream over one tensor.

    Parameters
    ----------
    shape : tuple of int
        The tensor's shape (elements).
    tile : tuple of int
        The element tile shape (elements per dimension; the same rank as ``shape``, each dividing it).
    loops : tuple of Loop
        The iteration space, outermost first. The loops of positive step on one dimension must tile it: sorted
        by step, the first has the tile's size as step and each next one the previous step times its trips, the
        last reaching the dimension's size. A step-0 loop re-reads (the layout is then not injective).
    elem_bytes : int
        Bytes per element (the converter's buffer is counted in these).
    """

    shape: tuple
    tile: tuple
    loops: tuple
    elem_bytes: int = 4

    def __post_init__(self):
        shape, tile = tuple(int(d) for d in self.shape), tuple(int(t) for t in self.tile)
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "tile", tile)
        object.__setattr__(self, "loops", tuple(Loop(*map(int, lp)) for lp in self.loops))
        if not shape or len(tile) != len(shape) or any(d < 1 for d in shape) or any(
                t < 1 or d % t for d, t in zip(shape, tile)):
            raise LayoutError(f"layout of tensor {list(shape)}: tile {list(tile)} must have one positive divisor of "
                              f"each dimension")
        for lp in self.loops:
            if not 0 <= lp.dim < len(shape) or lp.trips < 1 or lp.step < 0:
                raise LayoutError(f"layout of tensor {list(shape)}: loop {tuple(lp)} needs 0 <= dim < {len(shape)}, "
                                  f"trips >= 1 and step >= 0")
        for d in range(len(shape)):
            reach = tile[d]
            for lp in sorted((lp for lp in self.loops if lp.dim == d and lp.step and lp.trips > 1),
                             key=lambda lp: lp.step):
                if lp.step != reach:
                    raise LayoutError(f"{self}: the loops on dim {d} do not tile it (a loop of step {lp.step} where "
                                      f"the tiles so far reach {reach} elements)")
                reach *= lp.trips
            if reach != shape[d]:
                raise LayoutError(f"{self}: the loops on dim {d} cover {reach} of its {shape[d]} elements")

    # --- constructors -----------------------------------------------------------------------------------
    @classmethod
    def ordered(cls, shape, tile, order=None, elem_bytes: int = 4) -> "Layout":
        """One loop per dimension over the tile grid, in ``order`` (tensor dims, outermost first; default
        row-major ``0, 1, ...``)."""
        shape, tile = tuple(shape), tuple(tile)
        order = tuple(range(len(shape))) if order is None else tuple(order)
        if sorted(order) != list(range(len(shape))):
            raise LayoutError(f"loop order {list(order)} must be a permutation of the dims 0..{len(shape) - 1}")
        return cls(shape, tile, tuple(Loop(d, shape[d] // tile[d], tile[d]) for d in order), elem_bytes)

    @classmethod
    def from_tile_view(cls, shape, tile, out_shape_tiled, stride, elem_bytes: int = 4) -> "Layout":
        """The layout of a LinearOffChipLoad's view: for each index ``i`` over ``out_shape_tiled``, tile number
        ``sum_k i_k stride_k`` of the row-major tiled tensor (tiles over the last two dims; leading dims are
        tiled by 1). A trip-1 loop is dropped; a stride must step along exactly one tile-grid dimension."""
        shape = tuple(shape)
        tile = (1,) * (len(shape) - 2) + tuple(tile)
        grid = tuple(d // t for d, t in zip(shape, tile))
        # the tile number's weight per grid dimension (row-major)
        weights = [math.prod(grid[k + 1:]) for k in range(len(grid))]
        loops = []
        for trips, s in zip(out_shape_tiled, stride):
            if trips == 1:
                continue
            if s == 0:
                loops.append(Loop(len(shape) - 1, trips, 0))
                continue
            dim = next((k for k in range(len(grid)) if s % weights[k] == 0 and s // weights[k] < grid[k]), None)
            if dim is None:
                raise LayoutError(f"view stride {s} of tensor {list(shape)} in tiles {list(tile)} does not step "
                                  f"along one tile-grid dimension (grid {list(grid)})")
            loops.append(Loop(dim, trips, (s // weights[dim]) * tile[dim]))
        return cls(shape, tile, tuple(loops), elem_bytes)

    def tile_view(self) -> tuple[tuple, tuple]:
        """``(out_shape_tiled, stride)`` of the LinearOffChipLoad that reads this layout (the inverse of
        :meth:`from_tile_view`; tiles over the last two dims, leading tile dims 1)."""
        if any(t != 1 for t in self.tile[:-2]):
            raise LayoutError(f"{self}: a load tiles only the last two dims (leading tile dims must be 1)")
        grid = tuple(d // t for d, t in zip(self.shape, self.tile))
        weights = [math.prod(grid[k + 1:]) for k in range(len(grid))]
        return self.trips, tuple(lp.step // self.tile[lp.dim] * weights[lp.dim] for lp in self.loops)

    # --- views --------------------------------------------------------------------------------------------
    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def trips(self) -> tuple:
        """The STeP stream shape of the tile stream (trip counts, outermost first)."""
        return tuple(lp.trips for lp in self.loops)

    @property
    def num_tiles(self) -> int:
        """Tiles the stream carries (re-reads included)."""
        return math.prod(self.trips)

    @property
    def tile_elements(self) -> int:
        return math.prod(self.tile)

    @property
    def injective(self) -> bool:
        """True if every tile of the tensor appears exactly once."""
        return self.num_tiles * self.tile_elements == math.prod(self.shape)

    def affine_map(self) -> tuple:
        """The map from iteration indices to tile origins as a matrix (rows: tensor dims, columns: loops;
        elements per iteration)."""
        return tuple(tuple(lp.step if lp.dim == d else 0 for lp in self.loops) for d in range(self.rank))

    def origins(self):
        """The tile origins (element coordinates) in stream order."""
        for idx in itertools.product(*(range(lp.trips) for lp in self.loops)):
            origin = [0] * self.rank
            for i, lp in zip(idx, self.loops):
                origin[lp.dim] += i * lp.step
            yield tuple(origin)

    def canonical(self) -> tuple:
        """The loops with trip-1 loops dropped and adjacent loops on one dimension merged where the outer one
        continues the inner one (``step_outer == step_inner * trips_inner``): equal for layouts carrying the
        same tiles in the same order."""
        out = []
        for lp in self.loops:
            if lp.trips == 1:
                continue
            if out and out[-1].dim == lp.dim and out[-1].step == lp.step * lp.trips:
                prev = out.pop()
                lp = Loop(lp.dim, prev.trips * lp.trips, lp.step)
            out.append(lp)
        return tuple(out)

    def __str__(self) -> str:
        loops = ", ".join(f"d{lp.dim}:{lp.trips}x{lp.step}" for lp in self.loops)
        return (f"Layout(tensor {'x'.join(map(str, self.shape))}, tile {'x'.join(map(str, self.tile))}, "
                f"loops [{loops}])")


def compatible(a: Layout, b: Layout) -> bool:
    """True if ``a`` and ``b`` carry the same tiles of the same tensor in the same order (no converter needed)."""
    return (a.shape == b.shape and a.tile == b.tile and a.elem_bytes == b.elem_bytes
            and a.canonical() == b.canonical())


class ConverterBuffer(NamedTuple):
    """The least buffer of a converter between two layouts: ``elements``, ``bytes`` (elements times the element
    bytes), ``cells`` of ``cell`` elements each (the common grid), and ``method``: ``"closed form"`` or
    ``"scan"`` (module docstring)."""

    elements: int
    bytes: int
    cells: int
    cell: tuple
    method: str


def _check_pair(p: Layout, c: Layout, producer: str, consumer: str) -> None:
    """LayoutError (one line naming both operators and layouts) if no converter can turn ``p`` into ``c``."""
    reason = None
    if p.shape != c.shape:
        reason = "they describe tensors of different shapes"
    elif p.elem_bytes != c.elem_bytes:
        reason = f"their elements differ in size ({p.elem_bytes} B and {c.elem_bytes} B)"
    elif not p.injective:
        reason = "the producer repeats tiles (a converter does not drop data)"
    elif not c.injective:
        reason = "the consumer re-reads tiles (that needs a reuse buffer, not a converter)"
    if reason:
        raise LayoutError(f"no converter from {producer} {p} to {consumer} {c}: {reason}")


def converter_buffer(p: Layout, c: Layout, *, producer: str = "producer", consumer: str = "consumer"
                     ) -> ConverterBuffer:
    """The least buffer with which a converter from layout ``p`` to layout ``c`` never deadlocks.

    0 for compatible layouts. Examples, a 128 x 128 fp32 tensor in 32 x 32 tiles: row-major to column-major is
    10 tiles (40960 B); re-tiling to 64 x 64 (both row-major) is 6 tiles of 32 x 32. LayoutError (naming
    ``producer``, ``consumer`` and both layouts) if no converter can do it: different tensors or element sizes,
    or a layout that repeats tiles.
    """
    _check_pair(p, c, producer, consumer)
    if compatible(p, c):
        return ConverterBuffer(0, 0, 0, tuple(math.gcd(a, b) for a, b in zip(p.tile, c.tile)), "compatible")
    cell = tuple(math.gcd(a, b) for a, b in zip(p.tile, c.tile))
    digits = _digits(p, c, cell)
    if digits is None:
        cells, method = _scan_cells(p, c, cell), "scan"
    else:
        cells, method = _closed_form_cells(p, c, cell, digits), "closed form"
    elements = cells * math.prod(cell)
    return ConverterBuffer(elements, elements * p.elem_bytes, cells, cell, method)


def _tile_weights(lay: Layout) -> list[int]:
    """Each loop's weight in the tile number (the product of the trips of the loops inside it)."""
    return [math.prod(lp.trips for lp in lay.loops[k + 1:]) for k in range(len(lay.loops))]


def _segments(lay: Layout, d: int, g: int) -> list[tuple[int, int, int]]:
    """The layout's split of dim ``d`` in cells of ``g`` elements: ``(lo, hi, weight)`` with coordinate range
    boundaries ``lo``, ``hi`` (cells) and the tile-number weight of one unit of ``coordinate // lo`` (0 inside
    the tile)."""
    segs = [(1, lay.tile[d] // g, 0)]
    weights = _tile_weights(lay)
    for k, lp in sorted(((k, lp) for k, lp in enumerate(lay.loops) if lp.dim == d and lp.step and lp.trips > 1),
                        key=lambda kl: kl[1].step):
        segs.append((lp.step // g, lp.step * lp.trips // g, weights[k]))
    return segs


def _digits(p: Layout, c: Layout, cell: tuple):
    """The common digit split of the cell grid, or None if the layouts' boundaries do not divide one another.

    Returns a list of ``(radix, wp, wc)``: digit radix and its weights in the producer's and the consumer's
    tile numbers.
    """
    digits = []
    for d, g in enumerate(cell):
        sp_, sc = _segments(p, d, g), _segments(c, d, g)
        bounds = sorted({b for lo, hi, _ in sp_ + sc for b in (lo, hi)})
        if any(hi % lo for lo, hi in zip(bounds, bounds[1:])):
            return None
        for lo, hi in zip(bounds, bounds[1:]):
            digits.append((hi // lo, _weight(sp_, lo), _weight(sc, lo)))
    return digits


def _weight(segs, lo: int) -> int:
    """The tile-number weight of the digit starting at boundary ``lo`` (cells) in one layout's split."""
    for s_lo, s_hi, w in segs:
        if s_lo <= lo < s_hi:
            return w * (lo // s_lo)
    raise AssertionError("unreachable: the segments cover the dimension")


def _closed_form_cells(p: Layout, c: Layout, cell: tuple, digits) -> int:
    """The module docstring's closed form, in cells."""
    tp = math.prod(t // g for t, g in zip(p.tile, cell))
    tc = math.prod(t // g for t, g in zip(c.tile, cell))
    free = sum((r - 1) * wp for r, wp, wc in digits if wc == 0)
    loop_digits = sorted(((r, wp, wc) for r, wp, wc in digits if wc and r > 1), key=lambda t: -t[2])
    a = [wp * tp - wc * tc for _, wp, wc in loop_digits]
    radix = [r for r, _, _ in loop_digits]
    wps = [wp for _, wp, _ in loop_digits]
    m = len(loop_digits)
    prefix = [0]
    for i in range(m):
        prefix.append(prefix[-1] + max(0, (radix[i] - 1) * a[i]))
    suffix = [0] * (m + 1)  # suffix[i] = T_p * sum_{i' >= i} (r - 1) wp
    for i in range(m - 1, -1, -1):
        suffix[i] = suffix[i + 1] + (radix[i] - 1) * wps[i] * tp
    best = prefix[m]
    for i in range(m):
        best = max(best, prefix[i] + max(a[i], a[i] * (radix[i] - 1)) - wps[i] * tp + suffix[i + 1])
    return tp * (1 + free) + best


def tile_numbers(lay: Layout, cell: tuple) -> np.ndarray:
    """The layout's tile number of every cell of the grid (cells of ``cell`` elements), an int64 array of the
    grid's shape."""
    grid = tuple(d // g for d, g in zip(lay.shape, cell))
    coords = np.indices(grid, dtype=np.int64)
    out = np.zeros(grid, np.int64)
    for w, lp in zip(_tile_weights(lay), lay.loops):
        if lp.step:
            out += ((coords[lp.dim] * cell[lp.dim] // lp.step) % lp.trips) * w
    return out


def _scan_cells(p: Layout, c: Layout, cell: tuple) -> int:
    """``max_j (1 + M(j)) T_p - j T_c`` by one scan over the consumer's tiles (cells)."""
    tp = math.prod(t // g for t, g in zip(p.tile, cell))
    tc = math.prod(t // g for t, g in zip(c.tile, cell))
    pn, cn = tile_numbers(p, cell).ravel(), tile_numbers(c, cell).ravel()
    last = np.full(c.num_tiles, -1, np.int64)
    np.maximum.at(last, cn, pn)  # the last producer tile each consumer tile needs
    frontier = np.maximum.accumulate(last)
    return int(((1 + frontier) * tp - np.arange(c.num_tiles) * tc).max())
