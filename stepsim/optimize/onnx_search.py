"""``stepsim optimize model.onnx``: the Pareto front of an ONNX model's tilings, with few simulations.

Space, searched in StreamTensor's order (tiles, then fusion; issue 33):

1. *tiles*: ``tile_m`` over the powers of two that divide every activation's rows (row blocks of the streams),
   crossed with a global ``tile_n`` (the MatMuls' column stripes) over ``None`` (whole rows) and the powers of two
   from 16 up to the widest MatMul's N (a MatMul narrower than ``tile_n`` keeps its N; a point a MatMul's N does
   not split into is not buildable and is left out);
2. *fusion*, one choice per tiling: every edge fused, or (when the tiling builds layout converters) the values
   that feed a converter spilled (``spill``: :func:`converter_values`). stepsim's published accounting gives a
   fused edge's FIFO no on-chip bytes, so a spill gains only where it replaces a converter: read back from
   off-chip memory in the consumer's order, it needs no converter buffer, and costs its HBM traffic in cycles
   (:mod:`stepsim.frontend.spill`). Spills per value are ``--hierarchical``'s space
   (:mod:`stepsim.optimize.onnx_hierarchy`); an on-chip ``budget`` is :func:`stepsim.frontend.from_onnx`'s knob.

Pruning, as :mod:`stepsim.optimize.search` does for the built-in workloads: every candidate is evaluated
symbolically (exact on-chip bytes and allocated compute, and a lower bound on cycles: the roofline and the
per-unit bounds of :mod:`stepsim.analysis.bounds`); candidates are simulated in order of their bound, and one
whose optimistic vector (bound, on-chip bytes, compute) a simulated point dominates is dropped unsimulated: its
cycles are at least its bound, so it cannot enter the front. The front is the exhaustive front, point for point.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from stepsim.analysis.bounds import cycle_bounds
from stepsim.base.errors import ConfigError, FrontendError
from stepsim.base.hardware import Hardware
from stepsim.frontend import from_onnx
from stepsim.frontend.layouts import groups_rows_cols
from stepsim.optimize.pareto import dominates, pareto_front, roofline_lower_bound
from stepsim.optimize.search import OBJECTIVES
from stepsim.results.records import allocated_compute_flops
from stepsim.simulation.simulate import simulate

#: the smallest column stripe searched (elements): narrower tiles leave a compute node mostly idle
MIN_TILE_N = 16


@dataclass
class Point:
    """One candidate: its tiling, its symbolic figures (bytes, FLOPs/cycle, a cycle bound) and, once simulated,
    its cycles."""

    tiling: dict
    on_chip_bytes: int
    off_chip_bytes: int
    allocated_flops_per_cycle: int
    cycle_bound: int
    cycles: int | None = None

    def vector(self, cycles: int) -> tuple:
        return (cycles, self.on_chip_bytes, self.allocated_flops_per_cycle)


@dataclass
class OnnxSearch:
    """The result: every buildable ``candidates`` point (simulated or pruned), the Pareto ``front`` (simulated
    points, by cycles), the ``recommended`` one for the objective and the number of ``simulations``."""

    candidates: list
    front: list
    recommended: Point | None
    simulations: int
    skipped: dict = field(default_factory=dict)  # tiling (as text) -> why it is not buildable


def symbolic_point(tiling: dict, w) -> Point:
    """A lowered candidate's :class:`Point` before simulation: its exact on-chip and off-chip bytes, allocated
    compute and a lower bound on its cycles (the roofline and the per-unit bounds)."""
    hw = Hardware.preset(w.hardware)
    met = w.metrics()
    compute = allocated_compute_flops(w)
    bound = roofline_lower_bound(met["off_chip_bytes"], hw.hbm_peak_bytes_per_cycle, met["graph_flops"], compute)
    bound = max([bound, *cycle_bounds(w, hw).values()])
    return Point(tiling, met["on_chip_bytes"], met["off_chip_bytes"], compute, bound)


def tile_space(model_rows: list[int], widest_n: int) -> list[dict]:
    """The tile grid of the module docstring: ``[{"tile_m": m, "tile_n": n}]``."""
    g = math.gcd(*model_rows) if model_rows else 1
    tms = [1 << k for k in range(g.bit_length()) if g % (1 << k) == 0]
    tns = [None] + [1 << k for k in range(MIN_TILE_N.bit_length() - 1, widest_n.bit_length()) if 1 << k < widest_n]
    return [{"tile_m": m, "tile_n": n} for m in tms for n in tns]


def converter_values(report) -> list:
    """The values whose spill replaces a converter the lowering built (``report.converter_ops``): a retiled value
    itself, a reordering Transpose's input; sorted."""
    inputs = {n.name: n.input[0] for n in report.proto.graph.node if n.op_type == "Transpose"}
    return sorted({inputs.get(key, key) for key in report.converter_ops})


def search(source, *, values="seeded", routing="teacher", hardware: str | None = None, objective: str = "cycles",
           max_on_chip: int | None = None, space: list[dict] | None = None, fuse: bool = True) -> OnnxSearch:
    """Search the tilings of an ONNX model (module docstring). ``space``: the tilings to try (default
    :func:`tile_space` of the model); ``fuse`` False (``--no-fuse``) fixes fusion to every edge spilled (the
    tiles alone are searched). ConfigError when no candidate fits ``max_on_chip``."""
    if objective not in OBJECTIVES:
        raise ConfigError(f"objective must be one of {', '.join(OBJECTIVES)}, got {objective!r}")
    if objective == "chips":  # an ONNX model's tile search runs on one chip
        raise ConfigError("objective 'chips' applies to a search over chip counts (--max-chips), not to an ONNX "
                          "model's tile search")
    kw = dict(values=values, routing=routing, fuse=fuse, **({"hardware": hardware} if hardware else {}))
    if space is None:
        layouts = from_onnx(source, **kw).frontend.layouts  # every streamed activation's layout
        shapes = [groups_rows_cols(lay.shape) for lay in layouts.values()]
        space = tile_space([r for _, r, _ in shapes], max((n for _, _, n in shapes), default=1))
    points, skipped = [], {}
    for tiling in space:
        try:
            w = from_onnx(source, tiling=tiling, **kw)
        except FrontendError as exc:  # a tile that does not divide some dim: not buildable
            skipped[str(tiling)] = str(exc)
            continue
        points.append((symbolic_point(tiling, w), w))
        spill = converter_values(w.frontend)
        if spill and fuse:  # the same tiling with its converters' inputs spilled (module docstring)
            spilled = from_onnx(source, tiling=tiling, spill=spill, **kw)
            points.append((symbolic_point({**tiling, "spill": spill}, spilled), spilled))
    if max_on_chip is not None:
        fitting = [(p, w) for p, w in points if p.on_chip_bytes <= max_on_chip]
        if not fitting and points:
            least = min(points, key=lambda pw: pw[0].on_chip_bytes)[0]
            raise ConfigError(f"no tiling fits max_on_chip {max_on_chip} B; the smallest needs "
                              f"{least.on_chip_bytes} B ({least.tiling})")
        points = fitting
    simulated: list[Point] = []
    for p, w in sorted(points, key=lambda pw: (pw[0].cycle_bound, pw[0].on_chip_bytes,
                                               pw[0].allocated_flops_per_cycle)):
        if any(dominates(q.vector(q.cycles), p.vector(p.cycle_bound)) for q in simulated):
            continue  # its real cycles are at least its bound: a simulated point dominates it
        p.cycles = simulate(w).cycles
        simulated.append(p)
    front = [simulated[i] for i in pareto_front([p.vector(p.cycles) for p in simulated])]
    front.sort(key=lambda p: p.vector(p.cycles))
    order = [k for k in OBJECTIVES[objective] if k != "chips"]  # one chip
    recommended = min(front, key=lambda p: tuple(getattr(p, k) for k in order), default=None)
    return OnnxSearch([p for p, _ in points], front, recommended, len(simulated), skipped)
