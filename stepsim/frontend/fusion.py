"""Pass 4: the fusion decision. Each edge between two nodes (an activation produced by one node and read by
another) either streams through an on-chip FIFO (fused) or spills: the producer's tiles go to off-chip memory in
its order and come back in the consumer's (twice the tensor's bytes of traffic, written and read).

After the converter pass every consumer can take its producer's stream, so an edge spills only by policy:

* ``fuse=False`` spills every edge; ``spill={value, ...}`` the edges of those values;
* ``budget`` (bytes of on-chip FIFO for fused edges): a fused edge costs its FIFO, ``depth`` tiles of the
  stream it carries; edges are fused greedily by off-chip bytes saved per on-chip byte (ties in node order)
  while their FIFOs fit in the budget, as StreamTensor's fusion search does (its summary; our rule).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from stepsim.base.errors import FrontendError
from stepsim.frontend.ir import Model


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
    spill = set(spill)
    producers = model.producer()
    unknown = sorted(spill - set(producers))
    if unknown:
        raise FrontendError(f"spill: {unknown[0]!r} is not a value produced by a node of model {model.name!r}")
    if budget is not None and (not isinstance(budget, int) or budget < 0):
        raise FrontendError(f"budget must be a non-negative int (bytes of on-chip FIFO), got {budget!r}")
    edges = []
    for node in model.nodes:
        for v in dict.fromkeys(node.inputs):
            if not v or v not in producers or model.is_const(v):
                continue
            nbytes, fifo = math.prod(model.shapes[v]) * elem_bytes, depth * tile_bytes[v]
            if not fuse:
                edges.append(Edge(v, node.name, False, "spilled: fusion is off (fuse=False)", nbytes, fifo))
            elif v in spill:
                edges.append(Edge(v, node.name, False, "spilled: named in spill=", nbytes, fifo))
            else:
                edges.append(Edge(v, node.name, True, "fused: the consumer takes the producer's stream", nbytes,
                                  fifo))
    if budget is None:
        return edges
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
    return edges
