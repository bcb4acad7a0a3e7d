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

from array import array
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


class Routes:
    """Shortest routes between chips, found when first asked (a breadth-first search per source chip, kept as
    one predecessor array of ``n_nodes`` ints), so a system of thousands of chips costs memory in the sources a
    workload uses, not ``chips**2`` routes up front (a ring of 4,096 chips has routes of 1,024 links on average:
    17 billion link indices if tabled). Same routes as the table :func:`routes` returns.

    Switches relay; a chip relays only when no route avoids it (rings). ``route(src, dst)`` is None when ``dst``
    is unreachable from ``src``.
    """

    def __init__(self, links: tuple[Link, ...], chips: int, n_nodes: int):
        self.chips = chips
        self.n_nodes = n_nodes
        self._links = links
        self._out: list[list[Link]] = [[] for _ in range(n_nodes)]
        for link in links:
            self._out[link.src].append(link)
        self._trees: dict[int, array] = {}
        self._paths: dict[tuple[int, int], tuple[int, ...] | None] = {}

    def __getstate__(self):  # sent to worker processes without the caches (they are rebuilt there on use)
        return {"links": self._links, "chips": self.chips, "n_nodes": self.n_nodes}

    def __setstate__(self, state):
        self.__init__(state["links"], state["chips"], state["n_nodes"])

    def _tree(self, src: int) -> array:
        """The link each node is reached over from ``src`` (-1: ``src`` itself or unreachable)."""
        tree = self._trees.get(src)
        if tree is None:
            tree = array("q", [-1]) * self.n_nodes
            seen = bytearray(self.n_nodes)
            seen[src] = 1
            queue = deque([src])
            while queue:
                for link in self._out[queue.popleft()]:
                    if not seen[link.dst]:
                        seen[link.dst] = 1
                        tree[link.dst] = link.index
                        queue.append(link.dst)
            self._trees[src] = tree
        return tree

    def route(self, src: int, dst: int) -> tuple[int, ...] | None:
        """Link indices from chip ``src`` to chip ``dst`` in order (``()`` if equal, None if unreachable)."""
        if src == dst:
            return ()
        key = (src, dst)
        if key not in self._paths:
            tree = self._tree(src)
            path = []
            node = dst
            while node != src:
                index = tree[node]
                if index < 0:
                    path = None
                    break
                path.append(index)
                node = self._links[index].src
            self._paths[key] = None if path is None else tuple(reversed(path))
        return self._paths[key]

    def _reaches_all(self, start: int, reverse: bool) -> bool:
        ends = [[] for _ in range(self.n_nodes)]
        for link in self._links:
            a, b = (link.dst, link.src) if reverse else (link.src, link.dst)
            ends[a].append(b)
        seen = bytearray(self.n_nodes)
        seen[start] = 1
        queue = deque([start])
        while queue:
            for node in ends[queue.popleft()]:
                if not seen[node]:
                    seen[node] = 1
                    queue.append(node)
        return all(seen[:self.chips])

    def first_unreachable(self) -> tuple[int, int] | None:
        """The first ``(src, dst)`` (by src, then dst) with no route, or None when every chip reaches every other.
        Linear in the links when all are reachable (chip 0 reaches every chip and every chip reaches chip 0)."""
        if self.chips < 2 or (self._reaches_all(0, False) and self._reaches_all(0, True)):
            return None
        for src in range(self.chips):
            tree = self._tree(src)
            for dst in range(self.chips):
                if dst != src and tree[dst] < 0:
                    return src, dst
        return None


def routes(links: tuple[Link, ...], chips: int, n_nodes: int) -> dict[tuple[int, int], tuple[int, ...]]:
    """Shortest route (link indices) from every chip to every other reachable chip, as a table (small systems;
    :class:`Routes` finds them on demand). Unreachable pairs are absent."""
    found = Routes(links, chips, n_nodes)
    table = {}
    for src in range(chips):
        for dst in range(chips):
            if dst != src and (path := found.route(src, dst)) is not None:
                table[(src, dst)] = path
    return table
