"""The hierarchical schedule search of an ONNX model (issue 33): the tile size of each MatMul and fusion on or off
per value, searched level by level as StreamTensor does (tiles, then fusion under each tiling), with sound
symbolic pruning at both levels: its front is the exhaustive front of the whole space.

Space: ``tile_m`` over the powers of two dividing every activation's rows; for every MatMul its own ``tile_n``
(``Tiling.per_node``) over whole rows (None) and the powers of two from
:data:`~stepsim.optimize.onnx_search.MIN_TILE_N` below its N that divide it; for every value a node produces and
another reads, fused or spilled (``spill=``: all the edges of the value). The product is exponential in the
MatMuls and values (the two-MatMul MLP: 144 schedules; the Llama block: 786,432).

The search is a branch and bound over a tree: level 1 the tilings, each rooted at its all-fused schedule; level 2
the spill sets under a tiling, a set's children adding one later value each (every set once). A node is built
(lowered, not simulated) and gets

* its own optimistic vector: a lower bound on its cycles (the roofline and the per-unit bounds of
  :mod:`stepsim.analysis.bounds`, and :func:`stepsim.analysis.spill_bounds.spill_chain_cycles`, which follows the
  spills' whole-tensor waits), its exact on-chip bytes and its allocated compute;
* its *subtree's* optimistic vector, which holds for every spill set below it (its own and later values): cycles
  at least its spill-chain bound and its flops roofline (more spills only lengthen the chains and add no FLOPs or
  compute), on-chip bytes at least its own less the buffers of the converters a spill may still remove there
  (those of the later values, and those a materialized spill may reach: a reader of the value reads another
  activation too; a spill adds a store and a load of one tile each and a token, and removes at most the
  converter it replaces; a fused FIFO costs nothing in the published accounting), and the same allocated compute
  (a spill allocates none).

The walk is best first: every tiling's root is built, and the built schedule of the smallest optimistic vector is
taken next (so the fast schedules are simulated first, and prune the most); a subtree whose vector a simulated
point dominates (or whose on-chip bytes exceed ``max_on_chip``) is dropped whole, its schedules never built;
otherwise the schedule is simulated unless its own vector is dominated, and its children are built and queued. A
schedule the front end cannot build bounds nothing, and its subtree is left out (``unbuilt``): a tiling that does
not build all fused is not searched, nor a spill set whose tree parent does not build (on the models of the
tests, every schedule left out so is itself not buildable). A schedule left unsimulated
has cycles at least its bound, so it could not enter the front: the front of the simulated points is the
exhaustive front (tests/frontend/test_hierarchy.py checks it against enumerating every schedule of the MLP and
the head-Transpose model, with every bound against the engine, and against a recorded exhaustive run of a small
Llama block).

Schedules whose spills give the same lowering (a spill that materializes others) are one candidate, under the
first spill set that built it. ``fusion_by_tile_m`` says per ``tile_m`` which values the front's points there
spill; ``fusion`` is that at the default ``tile_m`` (the gcd of the rows).
"""

from __future__ import annotations

import heapq
import itertools
import math
import os
from dataclasses import dataclass, field

from stepsim.analysis.spill_bounds import spill_chain_cycles
from stepsim.base.errors import ConfigError, FrontendError, LayoutError
from stepsim.base.hardware import Hardware
from stepsim.frontend import from_onnx
from stepsim.frontend.fusion import NO_FUSE_REASON, edge_name
from stepsim.frontend.layouts import groups_rows_cols
from stepsim.optimize.onnx_search import MIN_TILE_N, Point, symbolic_point, tile_space
from stepsim.optimize.pareto import dominates, pareto_front
from stepsim.optimize.search import OBJECTIVES
from stepsim.simulation.simulate import simulate


@dataclass
class HierarchicalSearch:
    """The result: every ``candidates`` point built (its ``tiling`` holds ``tile_m``, ``per_node`` and ``spill``),
    the ``front`` of the simulated ones (by cycles), the ``recommended`` point for the objective, the number of
    ``simulations``, ``fusion`` (value -> which front points spill it, at the default tile_m), the tilings
    ``skipped`` as not buildable (tiling text -> the front end's error), ``fusion_by_tile_m`` (every tile_m's
    ``fusion``), ``pruned``: the schedules in dropped subtrees, never built, and ``built``: the others (tried)."""

    candidates: list
    front: list
    recommended: Point | None
    simulations: int
    fusion: dict
    skipped: dict = field(default_factory=dict)
    fusion_by_tile_m: dict = field(default_factory=dict)  # tile_m -> {value: decision}
    pruned: int = 0
    built: int = 0  # schedules lowered (not buildable ones and those sharing a lowering too)
    unbuilt: int = 0  # schedules below one not buildable, left out: built + pruned + unbuilt = the space


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


@dataclass
class Node:
    """A built schedule: its :class:`Point` (shared by spill sets that lower alike), the workload, and what bounds
    its subtree (module docstring): ``cycles`` (cycles), and ``converters``: ``(value, bytes, cascade)`` of each
    converter it still builds (the value whose spill replaces it, its buffer, and whether a spill of another value
    may spill that edge too, through materialization)."""

    point: Point
    workload: object
    cycles: int
    converters: tuple

    def subtree(self, decided: frozenset = frozenset()) -> tuple:
        """The optimistic vector of every schedule below this one whose spill set adds no value of ``decided``
        (the values the tree settled above it: its children add only later ones): the cycle bound, the on-chip
        bytes less the buffers of the converters a spill may still remove there, and the same compute."""
        removable = sum(b for v, b, cascade in self.converters if v not in decided or cascade)
        return (self.cycles, self.point.on_chip_bytes - removable, self.point.allocated_flops_per_cycle)


def bounded(tiling: dict, w) -> Node:
    """The :class:`Node` of the lowered schedule ``w`` (``tiling``: its tiling and spill set): its point with the
    cycle bound raised to the spill-chain bound, and what bounds its subtree (module docstring)."""
    p = symbolic_point(tiling, w)
    chain = spill_chain_cycles(w, Hardware.preset(w.hardware))
    p.cycle_bound = max(p.cycle_bound, chain)
    compute = p.allocated_flops_per_cycle
    flops = math.ceil(w.metrics()["graph_flops"] / compute) if compute else 0  # a spill adds no FLOPs
    report = w.frontend
    graph = report.proto.graph
    transposes = {n.name: n.input[0] for n in graph.node if n.op_type == "Transpose"}
    activations = {o for n in graph.node for o in n.output}

    def cascade(value: str) -> bool:  # a reader of value also reads another activation: materialize may spill it
        return any(len({i for i in n.input if i in activations}) > 1 for n in graph.node if value in n.input)

    converters = tuple((transposes.get(k, k), c.buffer.bytes, cascade(transposes.get(k, k)))
                       for k, c in report.converters.items() if k in report.converter_ops)
    return Node(p, w, max(chain, flops), converters)


class _Evaluator:
    """Builds and bounds schedules once each (by their lowering: tiling and spilled edges) and simulates them."""

    def __init__(self, source, kw: dict, max_on_chip: int | None):
        self.source, self.kw, self.max_on_chip = source, kw, max_on_chip
        self.built: dict = {}  # (tile_m, per_node, spill) -> Node or None (not buildable)
        self.lowerings: dict = {}  # (tile_m, per_node, spilled edges) -> Node
        self.simulated: list[Point] = []
        self.skipped: dict = {}

    def node(self, tile_m: int, per_node: dict, spill: tuple) -> Node | None:
        """The schedule's node (None when the front end cannot build it)."""
        per_node = {k: v for k, v in per_node.items() if v is not None}
        key = (tile_m, tuple(sorted(per_node.items())), spill)
        if key not in self.built:
            tiling = {"tile_m": tile_m, "per_node": per_node, "spill": list(spill)}
            try:
                w = from_onnx(self.source, tiling={"tile_m": tile_m, "per_node": per_node}, spill=spill, **self.kw)
            except (FrontendError, LayoutError) as exc:  # LayoutError: a tile_n the head split's tiles do not take
                self.skipped[str(tiling)] = str(exc)
                self.built[key] = None
                return None
            spilled = tuple(edge_name(e.value, e.consumer) for e in w.frontend.spilled())
            same = (key[0], key[1], spilled)
            if same not in self.lowerings:
                self.lowerings[same] = bounded(tiling, w)
            self.built[key] = self.lowerings[same]
        return self.built[key]

    def over_budget(self, vector: tuple) -> bool:
        return self.max_on_chip is not None and vector[1] > self.max_on_chip

    def dominated(self, vector: tuple) -> bool:
        """Whether a simulated point dominates ``vector`` (cycles, on-chip bytes, allocated compute)."""
        return any(dominates(q.vector(q.cycles), vector) for q in self.simulated)

    def visit(self, node: Node) -> None:
        """Simulate ``node`` unless done, over the budget or dominated by its optimistic vector."""
        p = node.point
        if p.cycles is not None or self.over_budget(p.vector(p.cycle_bound)) or self.dominated(
                p.vector(p.cycle_bound)):
            return
        p.cycles = simulate(node.workload).cycles
        self.simulated.append(p)


def search(source, *, values="seeded", routing="teacher", hardware: str | None = None, objective: str = "cycles",
           max_on_chip: int | None = None, fuse: bool = True) -> HierarchicalSearch:
    """Search each MatMul's ``tile_n`` with ``tile_m``, and fusion per value under each tiling (module docstring);
    ``fuse`` False (``--no-fuse``) fixes the fusion axis to every edge spilled, so only the tiles are searched.
    ConfigError when no schedule fits ``max_on_chip``."""
    if objective not in OBJECTIVES:
        raise ConfigError(f"objective must be one of {', '.join(OBJECTIVES)}, got {objective!r}")
    order = [k for k in OBJECTIVES[objective] if k != "chips"]  # one chip (as onnx_search)
    kw = dict(values=values, routing=routing, fuse=fuse, **({"hardware": hardware} if hardware else {}))
    report = from_onnx(source, **kw).frontend
    ev = _Evaluator(source, kw, max_on_chip)
    spillable = list(dict.fromkeys(e.value for e in report.edges))
    choices = list(spillable) if fuse else []  # --no-fuse: every edge spills already
    options = matmul_options(report)
    shapes = [groups_rows_cols(lay.shape) for lay in report.layouts.values()]
    tms = sorted({t["tile_m"] for t in tile_space([r for _, r, _ in shapes], 1)})
    tilings = [(tm, dict(zip(options, combo))) for tm in tms for combo in itertools.product(*options.values())]
    # every tiling's all-fused root, then best first: the schedule of the smallest optimistic vector is taken
    # next (the fast ones are simulated first, so that they prune), its spill-set children built and queued
    pruned, unbuilt, queue, seq = 0, 0, [], itertools.count()

    def push(t: tuple, spill: tuple, first: int) -> None:
        nonlocal unbuilt
        n = ev.node(*t, spill)
        if n is None:  # not buildable: nothing bounds its subtree, which is left out (module docstring)
            unbuilt += (1 << (len(choices) - first)) - 1
            return
        heapq.heappush(queue, (n.point.vector(n.point.cycle_bound), next(seq), t, spill, first, n))

    for t in tilings:
        push(t, (), 0)
    while queue:
        _, _, t, spill, first, n = heapq.heappop(queue)
        sub = n.subtree(frozenset(choices[:first]) - set(spill))
        if ev.over_budget(sub) or ev.dominated(sub):
            pruned += (1 << (len(choices) - first)) - 1  # the subtree's schedules below this one
            continue
        ev.visit(n)
        for j in range(first, len(choices)):
            push(t, spill + (choices[j],), j + 1)
    candidates = list({id(n.point): n.point for n in ev.built.values() if n is not None}.values())
    fitting = [p for p in candidates if max_on_chip is None or p.on_chip_bytes <= max_on_chip]
    if not fitting:
        what = os.fspath(source) if isinstance(source, str | os.PathLike) else f"model {report.proto.graph.name!r}"
        raise ConfigError(f"no schedule of {what} fits max_on_chip {max_on_chip} B")
    front = [ev.simulated[i] for i in pareto_front([p.vector(p.cycles) for p in ev.simulated])]
    front.sort(key=lambda p: (p.vector(p.cycles), p.tiling["tile_m"], sorted(p.tiling["per_node"].items()),
                              p.tiling["spill"]))
    recommended = min(front, key=lambda p: tuple(getattr(p, k) for k in order), default=None)
    by_tile_m = {tm: _fusion([p for p in front if p.tiling["tile_m"] == tm], spillable, fuse) for tm in tms}
    return HierarchicalSearch(fitting, front, recommended, len(ev.simulated), by_tile_m.get(report.tile_m, {}),
                              ev.skipped, by_tile_m, pruned, len(ev.built), unbuilt)


def _fusion(front: list, values: list, fuse: bool) -> dict:
    """``{value: decision}`` at one tile_m: which of its front points (``front``) spill the value."""
    if not fuse:
        return dict.fromkeys(values, NO_FUSE_REASON)
    out = {}
    for v in values:
        k = sum(v in p.tiling["spill"] for p in front)
        out[v] = (f"spilled: in {k} of the {len(front)} front points at this tile_m" if k else
                  "fused: no front point at this tile_m spills it" if front else
                  "fused: no point at this tile_m is on the front")
    return out
