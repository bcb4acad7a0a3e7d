"""The hierarchical schedule search of an ONNX model (issue 33): fusion on or off per value, then the tile size of
each MatMul, level by level as StreamTensor searches (fusion first, tiles under it), with the symbolic pruning of
:mod:`stepsim.optimize.onnx_search`.

Space: for every value a node produces and another reads, fused or spilled (``spill=``: all the edges of the value;
a value read once is one edge); ``tile_m`` over the powers of two dividing every activation's rows; for every
MatMul its own ``tile_n`` (``Tiling.per_node``) over whole rows (None) and the powers of two from
:data:`~stepsim.optimize.onnx_search.MIN_TILE_N` below its N that divide it. The full product is exponential in
the MatMuls and values; the search visits a path through it:

For each ``tile_m`` (a spill's gain depends on it: a reorder converter's buffer grows as ``tile_m`` shrinks):

1. *fusion*, at whole rows: the all-fused point is simulated; each value's spill is evaluated symbolically and
   simulated only when no simulated point dominates its optimistic vector (cycle bound, on-chip bytes, compute);
   the value stays spilled when its simulated point is not dominated (it is on the front so far). A spill moves
   its bytes through the HBM (:mod:`stepsim.frontend.spill`), so it costs cycles and gains on-chip bytes only where
   it replaces a converter (a fused FIFO costs no on-chip bytes in the published accounting).
2. *tiles*, under that fusion: the MatMuls in node order, coordinate by coordinate: every option of one MatMul
   with the others fixed is evaluated symbolically, pruned as above, the rest simulated; the MatMul keeps the
   option best for the objective and the next one starts from there.

``fusion`` reports level 1 at the default ``tile_m`` (the gcd of the rows), ``fusion_by_tile_m`` every level 1.
With ``max_on_chip``, points over it are neither simulated nor kept; when whole rows at a ``tile_m`` are over it,
fusion is not searched there (every value fused), and a ``tile_m`` whose whole-row start is over it starts from its first MatMul
option that fits.

Every simulated point is a candidate for the front (Pareto over cycles, on-chip bytes, allocated compute); every
point's cycles are at least its bound, so a pruned point could not have entered the front of the visited points.
The visited front is not the exhaustive front in general (coordinate descent); tests/frontend/test_hierarchy.py
compares the two on a small model.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from stepsim.base.errors import ConfigError, FrontendError, LayoutError
from stepsim.frontend import from_onnx
from stepsim.frontend.fusion import NO_FUSE_REASON
from stepsim.frontend.layouts import groups_rows_cols
from stepsim.optimize.onnx_search import MIN_TILE_N, Point, symbolic_point, tile_space
from stepsim.optimize.pareto import dominates, pareto_front
from stepsim.optimize.search import OBJECTIVES
from stepsim.simulation.simulate import simulate


@dataclass
class HierarchicalSearch:
    """The result: every ``candidates`` point evaluated (its ``tiling`` holds ``tile_m``, ``per_node`` and
    ``spill``), the ``front`` of the simulated ones (by cycles), the ``recommended`` point for the objective, the
    number of ``simulations``, ``fusion`` (value -> "fused" / "spilled" and why) and the tilings ``skipped`` as not
    buildable (tiling text -> the front end's error)."""

    candidates: list
    front: list
    recommended: Point | None
    simulations: int
    fusion: dict
    skipped: dict = field(default_factory=dict)
    fusion_by_tile_m: dict = field(default_factory=dict)  # tile_m -> {value: decision}


def matmul_options(report) -> dict:
    """``{MatMul node: [None, tile_n, ...]}``: each MatMul (by the ONNX node producing a streamed value) and its
    tile_n choices, whole rows first then the powers of two from MIN_TILE_N below and dividing its N."""
    out = {}
    for node in report.proto.graph.node:
        if node.op_type not in ("MatMul", "Gemm") or not node.output or node.output[0] not in report.layouts:
            continue
        n = groups_rows_cols(report.layouts[node.output[0]].shape)[2]
        out[node.name] = [None] + [1 << k for k in range(MIN_TILE_N.bit_length() - 1, n.bit_length())
                                   if (1 << k) < n and n % (1 << k) == 0]
    return out


class _Evaluator:
    """Builds, bounds and simulates candidates once each, keeping every point and the simulated ones."""

    def __init__(self, source, kw: dict, max_on_chip: int | None):
        self.source, self.kw, self.max_on_chip = source, kw, max_on_chip
        self.points: dict = {}  # key -> (Point, workload) or None (not buildable / over the budget)
        self.simulated: list[Point] = []
        self.skipped: dict = {}

    def point(self, tile_m, per_node: dict, spill: tuple) -> Point | None:
        """The candidate's symbolic point (None when it cannot be built or exceeds the on-chip budget)."""
        per_node = {k: v for k, v in per_node.items() if v is not None}
        key = (tile_m, tuple(sorted(per_node.items())), spill)
        if key not in self.points:
            tiling = {"tile_m": tile_m, "per_node": per_node, "spill": list(spill)}
            try:
                w = from_onnx(self.source, tiling={"tile_m": tile_m, "per_node": per_node}, spill=spill, **self.kw)
            except (FrontendError, LayoutError) as exc:  # LayoutError: a tile_n the head split's tiles do not take
                self.skipped[str(tiling)] = str(exc)
                self.points[key] = None
                return None
            p = symbolic_point(tiling, w)
            fits = self.max_on_chip is None or p.on_chip_bytes <= self.max_on_chip
            self.points[key] = (p, w) if fits else None
        got = self.points[key]
        return None if got is None else got[0]

    def simulate(self, p: Point, *, force: bool = False) -> bool:
        """Simulate ``p`` unless a simulated point dominates its optimistic vector (``force``: always); whether it
        was simulated (or already had been)."""
        if p.cycles is not None:
            return True
        if not force and any(dominates(q.vector(q.cycles), p.vector(p.cycle_bound)) for q in self.simulated):
            return False
        w = next(pw[1] for pw in self.points.values() if pw is not None and pw[0] is p)
        p.cycles = simulate(w).cycles
        self.simulated.append(p)
        return True


def search(source, *, values="seeded", routing="teacher", hardware: str | None = None, objective: str = "cycles",
           max_on_chip: int | None = None, fuse: bool = True) -> HierarchicalSearch:
    """Search fusion per value, then ``tile_m`` and each MatMul's ``tile_n`` (module docstring); ``fuse`` False
    (``--no-fuse``) fixes the fusion axis to every edge spilled, so only the tiles are searched. ConfigError when
    no candidate fits ``max_on_chip``."""
    if objective not in OBJECTIVES:
        raise ConfigError(f"objective must be one of {', '.join(OBJECTIVES)}, got {objective!r}")
    order = [k for k in OBJECTIVES[objective] if k != "chips"]  # one chip (as onnx_search)

    def rank(p: Point) -> tuple:
        return tuple(getattr(p, k) for k in order)

    kw = dict(values=values, routing=routing, fuse=fuse, **({"hardware": hardware} if hardware else {}))
    report = from_onnx(source, **kw).frontend
    ev = _Evaluator(source, kw, max_on_chip)
    values = list(dict.fromkeys(e.value for e in report.edges))
    options = matmul_options(report)
    shapes = [groups_rows_cols(lay.shape) for lay in report.layouts.values()]
    tms = sorted({t["tile_m"] for t in tile_space([r for _, r, _ in shapes], 1)})
    by_tile_m = {}
    for tm in tms:  # a spill's gain depends on tile_m (a reorder converter's buffer grows as tile_m shrinks)
        if fuse:
            spill, by_tile_m[tm] = _fusion(ev, tm, values)
        else:  # the fusion axis is fixed: every edge spills (from_onnx's fuse=False)
            spill, by_tile_m[tm] = (), {v: NO_FUSE_REASON for v in values}
        # 2: tiles under that fusion, coordinate-wise per MatMul
        current = {name: None for name in options}
        best = ev.point(tm, current, spill)  # None when whole rows do not fit the budget: the first fit leads
        if best is not None:
            ev.simulate(best, force=True)
        for name, choices in options.items():
            for tn in choices:
                p = ev.point(tm, {**current, name: tn}, spill)
                if p is not None and ev.simulate(p) and (best is None or rank(p) < rank(best)):
                    best, current = p, {**current, name: tn}
    fusion = by_tile_m.get(report.tile_m, {})
    candidates = [pw[0] for pw in ev.points.values() if pw is not None]
    if not candidates:
        what = os.fspath(source) if isinstance(source, str | os.PathLike) else f"model {report.proto.graph.name!r}"
        raise ConfigError(f"no schedule of {what} visited fits max_on_chip {max_on_chip} B")
    front = [ev.simulated[i] for i in pareto_front([p.vector(p.cycles) for p in ev.simulated])]
    front.sort(key=lambda p: p.vector(p.cycles))
    recommended = min(front, key=rank, default=None)
    return HierarchicalSearch(candidates, front, recommended, len(ev.simulated), fusion, ev.skipped, by_tile_m)


def _fusion(ev: _Evaluator, tm: int, values: list) -> tuple:
    """Level 1 at ``tile_m`` ``tm`` (module docstring): the values kept spilled and ``{value: decision}``."""
    base = ev.point(tm, {}, ())
    if base is None:  # whole rows (the default tiling at this tile_m) over the budget: fusion is not searched
        return (), {v: "fused: the default tiling exceeds max_on_chip; fusion not searched" for v in values}
    ev.simulate(base, force=True)
    spill, fusion = [], {}
    for value in values:
        p = ev.point(tm, {}, (value,))
        if p is None:
            fusion[value] = "fused: spilling it cannot be built or exceeds the budget"
        elif not ev.simulate(p):
            fusion[value] = "fused: a simulated point dominates its spill's bound"
        elif any(dominates(q.vector(q.cycles), p.vector(p.cycles)) for q in ev.simulated):
            fusion[value] = "fused: a simulated point dominates its spill"
        else:
            fusion[value] = "spilled: its spill is not dominated"
            spill.append(value)
    return tuple(spill), fusion
