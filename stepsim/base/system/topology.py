"""Links of a multi-chip system and the routes transfers take over them (plain data, no engine).

A system's *nodes* are its chips ``0 .. chips-1`` followed by its switches (one per switch group). Every link
is directed and has its own bandwidth (bytes/cycle) and latency (cycles); a cable in both directions is two
links, because the two directions do not share bandwidth.

Topologies of one dimension of ``k`` chips (a *group*: the chips that differ only in that dimension's coordinate):

* ``ring``: ``i -> i+1`` and ``i+1 -> i`` (mod k); k = 2 gives one link each way, k = 1 none.
* ``fully-connected``: every ordered pair ``i -> j``, i != j.
* ``switch``: one switch per group; chip i has an up-link ``chip i -> switch`` and a down-link
  ``switch -> chip i``. A transfer through a switch crosses two links (store and forward: each link serializes
  and adds its latency).

Routes are shortest paths in links (breadth-first search over the links in index order, so ties go to the
route whose first differing link was created first); switches relay, chips never do (a chip is not a router:
a route never passes through a third chip unless the topology leaves no other way, as on a ring).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

TOPOLOGIES = ("ring", "fully-connected", "switch", "custom")


@dataclass(frozen=True)
class Link:
    """One directed link.

    Parameters
    ----------
    index : int
        Position in :attr:`System.links`.
    src, dst : int
        Nodes: chips are ``0 .. chips-1``, switches follow.
    bandwidth : int
        Bytes per cycle the link serializes (>= 1).
    latency : int
        Cycles (>= 2) an element takes from the sending operator's enqueue to its arrival at the receiving
        operator on an idle link, beyond its serialization ``ceil(bytes / bandwidth)``: the alpha of the
        alpha-beta model. It includes the one-cycle on-chip edge into the link (docs/system.md).
    name : str
        ``chip0->chip1``, ``chip2->switch0``, ...
    """

    index: int
    src: int
    dst: int
    bandwidth: int
    latency: int
    name: str


def node_name(node: int, chips: int) -> str:
    """``chipN`` for a chip, ``switchK`` for the k-th switch node."""
    return f"chip{node}" if node < chips else f"switch{node - chips}"


def group_members(sizes: tuple[int, ...], dim: int) -> list[list[int]]:
    """The chip groups of dimension ``dim``: lists of chips that differ only in coordinate ``dim``.

    Chip ids are mixed-radix numbers over ``sizes``, dimension 0 fastest (chip = c0 + s0*c1 + s0*s1*c2 ...).
    """
    stride = 1
    for s in sizes[:dim]:
        stride *= s
    total = 1
    for s in sizes:
        total *= s
    groups = []
    for base in range(total):
        if (base // stride) % sizes[dim] == 0:
            groups.append([base + i * stride for i in range(sizes[dim])])
    return groups


def topology_pairs(topology: str, k: int) -> list[tuple[int, int]]:
    """Directed ``(i, j)`` positions in a group of ``k`` chips linked by ``topology`` (not ``switch``)."""
    if topology == "ring":
        if k == 1:
            return []
        if k == 2:
            return [(0, 1), (1, 0)]
        return [(i, (i + 1) % k) for i in range(k)] + [((i + 1) % k, i) for i in range(k)]
    if topology == "fully-connected":
        return [(i, j) for i in range(k) for j in range(k) if i != j]
    raise ValueError(topology)


def routes(links: tuple[Link, ...], chips: int, n_nodes: int) -> dict[tuple[int, int], tuple[int, ...]]:
    """Shortest route (link indices) from every chip to every other reachable chip.

    Switches relay; a chip relays only when no route avoids it (rings). Unreachable pairs are absent.
    """
    out_links: list[list[Link]] = [[] for _ in range(n_nodes)]
    for link in links:
        out_links[link.src].append(link)
    table = {}
    for src in range(chips):
        prev: dict[int, Link | None] = {src: None}
        queue = deque([src])
        while queue:
            node = queue.popleft()
            for link in out_links[node]:
                if link.dst not in prev:
                    prev[link.dst] = link
                    queue.append(link.dst)
        for dst in range(chips):
            if dst == src or dst not in prev:
                continue
            path = []
            node = dst
            while node != src:
                link = prev[node]
                path.append(link.index)
                node = link.src
            table[(src, dst)] = tuple(reversed(path))
    return table
