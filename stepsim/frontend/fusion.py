"""Pass 4: the fusion decision. Each edge between two nodes (an activation produced by one node and read by
another) either streams through an on-chip FIFO (fused) or spills: the producer's tiles go to off-chip memory in
its order and come back in the consumer's (twice the tensor's bytes of traffic, written and read).

After the converter pass every consumer can take its producer's stream, so an edge spills only by policy:

* ``fuse=False`` spills every edge (``--no-fuse``); ``spill={name, ...}`` the edges named: a value (all its
  edges) or one edge ``VALUE->CONSUMER`` (``--spill``; the names the report prints, spaces around ``->`` allowed);
* ``budget`` (bytes of on-chip FIFO for fused edges): a fused edge costs its FIFO, ``depth`` tiles of the
  stream it carries; edges are fused greedily by off-chip bytes saved per on-chip byte (ties in node order)
  while their FIFOs fit in the budget, as StreamTensor's fusion search does (its summary; our rule).

A spill materializes its tensor (:mod:`stepsim.frontend.spill`): the consumer starts only once the whole tensor is
stored. So a node's *phase* is the most spills on a path to it (:func:`phases`), and an edge between phases
spills too (``materialized``): streamed, it would hold its producer back (two tiles of FIFO) while the consumer
waits for the other, spilled tensor, whose production needs that producer to go on: a deadlock. Loads shared
by several readers are shared only within a phase for the same reason (:mod:`stepsim.frontend.emit`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from stepsim.base.errors import FrontendError
from stepsim.frontend.ir import Model
from stepsim.frontend.layouts import materialized_swap

# one text for the CLI and the API: the record (``spill_reasons``) is the same whichever way the run was asked for
NO_FUSE_REASON = "spilled: fusion is off (--no-fuse; fuse=False in the API)"
#: a swap of the last two dims that is not read transposed by its MatMul: the memory transposes it
SWAP_REASON = ("spilled: a Transpose of the last two dims, read back from memory element by element in the "
               "transposed order (no on-chip operator transposes a tile)")


@dataclass(frozen=True)
class Edge:
    """Value ``value`` read by node ``consumer``: ``fused`` or not, ``reason`` (one line), ``bytes`` (the
    tensor's bytes; a spilled edge moves twice that off chip) and ``fifo_bytes`` (its FIFO when fused)."""

    value: str
    consumer: str
    fused: bool
    reason: str
    bytes: int
    fifo_bytes: int = 0


def decide(model: Model, tile_bytes: dict, *, fuse: bool = True, spill=(), budget: int | None = None,
           depth: int = 2, elem_bytes: int = 4) -> list:
    """The :class:`Edge` of every node-to-node edge, in node order. ``tile_bytes``: value -> bytes of one tile
    of its stream; ``depth``: FIFO depth (tiles) a fused edge is charged."""
    spill = {canonical_name(n) for n in spill}
    producers = model.producer()
    check_spill_names(model, spill)
    if budget is not None and (not isinstance(budget, int) or budget < 0):
        raise FrontendError(f"budget must be a non-negative int (bytes of on-chip FIFO), got {budget!r}")
    edges = []
    for node in model.nodes:
        for v in dict.fromkeys(node.inputs):
            if not v or v not in producers or model.is_const(v):
                continue
            nbytes, fifo = math.prod(model.shapes[v]) * elem_bytes, depth * tile_bytes[v]
            if not fuse:
                edges.append(Edge(v, node.name, False, NO_FUSE_REASON, nbytes, fifo))
            elif materialized_swap(model, node):
                edges.append(Edge(v, node.name, False, SWAP_REASON, nbytes, fifo))
            elif v in spill or edge_name(v, node.name) in spill:
                edges.append(Edge(v, node.name, False, "spilled: named in spill=", nbytes, fifo))
            else:
                edges.append(Edge(v, node.name, True, "fused: the consumer takes the producer's stream", nbytes,
                                  fifo))
    if budget is not None:
        _fit_budget(edges, budget)
    materialize(model, edges)
    return edges


class UnknownSpillError(FrontendError):
    """A name given to spill is neither an edge's value nor ``VALUE->CONSUMER``; ``detail`` says which and lists
    the valid names (the caller prefixes where the name came from: ``--spill``, ``spill=``)."""

    def __init__(self, detail: str):
        super().__init__(f"spill: {detail}")
        self.detail = detail


def edge_name(value: str, consumer: str) -> str:
    """An edge as ``--spill`` and the record's ``spilled`` list name it: ``VALUE->CONSUMER``."""
    return f"{value}->{consumer}"


def canonical_name(name: str) -> str:
    """A spill name as :func:`edge_name` spells it: ``"h -> up"`` (as :meth:`FrontendReport.describe` prints an
    edge) is ``"h->up"``; a value name is itself."""
    return "->".join(part.strip() for part in str(name).split("->"))


def edge_values(model: Model) -> dict:
    """``{value: [consumer, ...]}`` of every node-to-node edge (:func:`decide`'s edges), in node order."""
    producers = model.producer()
    out: dict = {}
    for node in model.nodes:
        for v in dict.fromkeys(node.inputs):
            if v and v in producers and not model.is_const(v):
                out.setdefault(v, []).append(node.name)
    return out


def check_spill_names(model: Model, names) -> None:
    """UnknownSpillError (one line) for the first name in ``names`` (sorted) that is neither a value carried by an
    edge (all its edges spill) nor one edge ``VALUE->CONSUMER``; the message lists the valid values."""
    edges = edge_values(model)
    valid = set(edges) | {edge_name(v, c) for v, cs in edges.items() for c in cs}
    unknown = sorted(set(names) - valid)
    if unknown:
        raise UnknownSpillError(f"{unknown[0]!r} is no edge of model {model.name!r}; its edges' values: "
                                f"{', '.join(edges) or 'none'} (a value spills all its edges, VALUE->CONSUMER one)")


def phases(model: Model, edges: list) -> dict:
    """``{node: phase}``: 0 for a node whose inputs are graph inputs and constants, else the largest of its
    producers' phases, plus one through a spilled edge."""
    producers = model.producer()
    spilled = {(e.value, e.consumer) for e in edges if not e.fused}
    edge_values = {(e.value, e.consumer) for e in edges}
    out = {}
    for node in model.nodes:
        out[node.name] = max((out[producers[v].name] + ((v, node.name) in spilled) for v in dict.fromkeys(node.inputs)
                              if (v, node.name) in edge_values), default=0)
    return out


def materialize(model: Model, edges: list) -> None:
    """Spill (in place) every fused edge whose producer is in an earlier phase than its consumer (module
    docstring). Node order is topological, so one pass settles every phase."""
    producers = model.producer()
    index = {(e.value, e.consumer): i for i, e in enumerate(edges)}
    phase = {}
    for node in model.nodes:
        ins = [v for v in dict.fromkeys(node.inputs) if (v, node.name) in index]
        spilled = {v for v in ins if not edges[index[(v, node.name)]].fused}
        ph = max((phase[producers[v].name] + (v in spilled) for v in ins), default=0)
        for v in ins:
            e = edges[index[(v, node.name)]]
            if e.fused and phase[producers[v].name] < ph:
                edges[index[(v, node.name)]] = replace(
                    e, fused=False, reason=f"spilled: {node.name} also reads a spilled tensor, whole; streamed, this "
                    f"edge would stall its producer (deadlock)")
        phase[node.name] = ph


def _fit_budget(edges: list, budget: int) -> None:
    """Spill (in place) the fused edges whose FIFOs do not fit in ``budget`` (module docstring)."""
    left = budget
    order = sorted((i for i, e in enumerate(edges) if e.fused),
                   key=lambda i: (-2 * edges[i].bytes / max(edges[i].fifo_bytes, 1), i))
    for i in order:
        e = edges[i]
        if e.fifo_bytes <= left:
            left -= e.fifo_bytes
        else:
            edges[i] = Edge(e.value, e.consumer, False, f"spilled: its FIFO ({e.fifo_bytes} B) exceeds the on-chip "
                            f"budget left ({left} B of {budget} B)", e.bytes, e.fifo_bytes)
