"""Pass 4: the fusion decision. Each edge between two nodes (an activation produced by one node and read by
another) either streams through an on-chip FIFO (fused) or spills: the producer's tiles go to off-chip memory in
its order and come back in the consumer's (twice the tensor's bytes of traffic, written and read).

Every edge here can be fused (after the converter pass every consumer takes row tiles), so an edge spills only
when the policy says so: ``fuse=False`` spills every edge, ``spill={value, ...}`` the edges of those values.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from stepsim.base.errors import FrontendError
from stepsim.frontend.ir import Model


@dataclass(frozen=True)
class Edge:
    """Value ``value`` read by node ``consumer``: ``fused`` or not, ``reason`` (one line) and ``bytes`` (the
    tensor's bytes; a spilled edge moves twice that off chip)."""

    value: str
    consumer: str
    fused: bool
    reason: str
    bytes: int


def decide(model: Model, *, fuse: bool = True, spill=(), elem_bytes: int = 4) -> list:
    """The :class:`Edge` of every node-to-node edge, in node order."""
    spill = set(spill)
    producers = model.producer()
    unknown = sorted(spill - set(producers))
    if unknown:
        raise FrontendError(f"spill: {unknown[0]!r} is not a value produced by a node of model {model.name!r}")
    edges = []
    for node in model.nodes:
        for v in dict.fromkeys(node.inputs):
            if not v or v not in producers or model.is_const(v):
                continue
            nbytes = math.prod(model.shapes[v]) * elem_bytes
            if not fuse:
                edges.append(Edge(v, node.name, False, "spilled: fusion is off (fuse=False)", nbytes))
            elif v in spill:
                edges.append(Edge(v, node.name, False, "spilled: named in spill=", nbytes))
            else:
                edges.append(Edge(v, node.name, True, "fused: the consumer takes the producer's row tiles", nbytes))
    return edges
