"""Transfers between chips as graph edges: route each over a system's links, one graph Link per physical link.

A collective (or any multi-chip graph) calls :meth:`Network.send` for every transfer of a stream from one chip
to another and gets back a stand-in for the stream as delivered at the destination (a placeholder, so a later
transfer may depend on an earlier delivery and deliveries may feed back around a ring). :meth:`Network.finish`
then routes every transfer (:meth:`stepsim.base.system.System.route`), creates one :class:`~stepsim.graph.Link` per
physical link used, whose input k is the k-th transfer crossing it in send order (first come, first served in
the engine; ties between equal arrival times go to the earlier send), and connects the stand-ins.

Timing of one hop: the system's ``link_latency`` alpha is the alpha of the alpha-beta model, the cycles from the
sending operator's enqueue to the arrival at the receiving operator beyond the serialization ``ceil(b / B)``.
The on-chip edge from the operator into the link takes one cycle (as every STeP edge), so the Link unit gets
latency ``alpha - 1``: a transfer sent at cycle t over an idle link arrives at ``t + alpha + ceil(b / B)``. A
relayed hop (a switch, or a chip on a multi-hop route) goes from link to link without an operator edge and
adds ``alpha - 1 + ceil(b / B)``.

Example
-------
>>> from stepsim.graph import Graph, ResidentLoad, ResidentStore, Tensor
>>> from stepsim.base.system import System
>>> g = Graph("hop")
>>> x = ResidentLoad(g, Tensor("x", (1, 64)), tile=(1, 64), out_shape_tiled=(1,), stride=(1,))
>>> net = Network(g, System.preset("ring-4"))
>>> y = net.send(0, 2, x)                    # two hops: chip0->chip1->chip2
>>> _ = ResidentStore(g, y, tensor_name="y")
>>> [link.name for link in net.finish()]
['chip0->chip1', 'chip1->chip2']
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

from stepsim.base.defaults import UNBOUNDED_CHANNEL_DEPTH
from stepsim.base.errors import ArgumentError
from stepsim.base.system import System
from stepsim.graph.dims import is_static
from stepsim.graph.graph import Graph, OutputRef
from stepsim.graph.ops_chips import Link

_SENDER = SimpleNamespace(name="Network.send", kind="Network")


@dataclass
class _Transfer:
    src: int
    dst: int
    source: OutputRef
    delivered: object  # the Placeholder standing for the stream at dst


class Network:
    """The transfers of one graph over one system.

    Parameters
    ----------
    graph : Graph
    system : System
        Chips and links; routes come from :meth:`System.route`.
    prefix : str
        Prefix of the Link operators' names (``<prefix><src>-><dst>``; default none: ``chip0->chip1``).
    """

    def __init__(self, graph: Graph, system: System, prefix: str = ""):
        self.graph = graph
        self.system = system
        self.prefix = prefix
        self.transfers: list[_Transfer] = []
        self.links: dict[int, Link] = {}
        self._finished = False

    def send(self, src: int, dst: int, stream, name: str | None = None):
        """The stream ``stream`` of chip ``src`` as delivered at chip ``dst`` (a placeholder until :meth:`finish`).

        Raises ArgumentError for a chip outside the system or ``src == dst`` (no transfer needed).
        """
        if self._finished:
            raise ArgumentError("Network.send: the network is finished")
        for what, chip in (("src", src), ("dst", dst)):
            if not isinstance(chip, int) or not 0 <= chip < self.system.chips:
                raise ArgumentError(f"Network.send: {what} = {chip!r} names no chip of system "
                                    f"{self.system.name!r} (chips 0..{self.system.chips - 1})")
        if src == dst:
            raise ArgumentError(f"Network.send: chip {src} to itself is not a transfer")
        ref = self.graph._resolve(stream, _SENDER)  # the sender only names the caller in error messages
        label = name or f"{ref.op.name}@chip{dst}"
        delivered = self.graph.placeholder(ref.stream, name=label)
        self.transfers.append(_Transfer(src, dst, ref, delivered))
        return delivered

    def finish(self) -> list[Link]:
        """Create the Link operators and connect every delivery; returns the Links in system link order."""
        if self._finished:
            raise ArgumentError("Network.finish: called twice")
        self._finished = True
        g = self.graph
        hops: dict[int, list[tuple[object, int, int]]] = {}  # link -> [(input, transfer, hop)]
        hop_inputs: dict[tuple[int, int], object] = {}  # (transfer, hop) -> placeholder of a later hop's input
        for t, tr in enumerate(self.transfers):
            route = self.system.route(tr.src, tr.dst)
            for h, link in enumerate(route):
                if h == 0:
                    inp = tr.source
                else:
                    inp = g.placeholder(tr.source.stream, name=f"{tr.delivered.name}.hop{h}")
                    hop_inputs[(t, h)] = inp
                hops.setdefault(link, []).append((inp, t, h))
        where: dict[tuple[int, int], tuple[Link, int]] = {}
        for link_index in sorted(hops):
            spec = self.system.links[link_index]
            entries = hops[link_index]
            # the system's latency counts the one-cycle on-chip edge into the link; the Link unit adds the rest
            op = Link(g, [e[0] for e in entries], bandwidth=spec.bandwidth, latency=spec.latency - 1,
                      src=spec.src, dst=spec.dst, name=f"{self.prefix}{spec.name}")
            op.channel_depth = window(spec, op.outputs)
            self.links[link_index] = op
            for k, (_, t, h) in enumerate(entries):
                where[(t, h)] = (op, k)
        pairs = []
        for t, tr in enumerate(self.transfers):
            n_hops = len(self.system.route(tr.src, tr.dst))
            for h in range(1, n_hops):
                op, k = where[(t, h - 1)]
                pairs.append((hop_inputs[(t, h)], op[k]))
            op, k = where[(t, n_hops - 1)]
            pairs.append((tr.delivered, op[k]))
        g.connect_all(pairs)
        return [self.links[i] for i in sorted(self.links)]

    def link_bytes(self, fp32_bytes: int = 4) -> dict[str, object]:
        """Bytes over each used link (by Link name), after :meth:`finish`: an int, or a symbolic sum not put in
        canonical form, for substituting every symbol at once (``xreplace``; ``.doit()`` gives the canonical form);
        ``fp32_bytes`` as in :meth:`stepsim.graph.ops_chips.Link.link_bytes`."""
        return {op.name: op.link_bytes(fp32_bytes, canonical=False) for _, op in sorted(self.links.items())}


def window(link, streams) -> int | None:
    """FIFO depth (elements) of a link's outputs: enough slots to keep the link busy over a round trip.

    A receiver's slot is held from the element's send until its credit is back, at least ``latency`` cycles, while
    the link sends an element every ``ceil(b / B)`` cycles; so ``ceil(latency / that) + 2`` slots. ``b`` is the
    smallest element of the link's streams at half its stream dtype's width (an fp32 stream may be timed at 2
    bytes per element, see :func:`stepsim.graph.lower.fp32_timing_bytes`); None (the run's default) when no
    element size is static.
    """
    sizes = [s.dtype.size_in_bytes() for s in streams]
    sizes = [int(b) for b in sizes if is_static(b)]
    if not sizes:
        return None
    sigma = max(1, -(-max(1, min(sizes) // 2) // link.bandwidth))
    return min(UNBOUNDED_CHANNEL_DEPTH, -(-link.latency // sigma) + 2)


def place_on_chips(graph: Graph, system: System, chip_of, network: Network | None = None) -> Network:
    """Place every operator of ``graph`` on a chip and turn each edge between two chips into a transfer.

    ``chip_of(op)`` gives an operator's chip (it is stored as ``op.chip``). An operator output read on another
    chip is sent there once per destination chip (a second reader on that chip shares the delivered stream),
    routed over ``system``'s links; transfers are created in operator order, so a link serves them first come,
    first served with ties in that order. Call before the graph is lowered (broadcasts are inserted after).

    ``network``: an unfinished :class:`Network` of ``graph`` over ``system`` that already holds explicit
    transfers (a collective's steps, which must not be shortcut into direct edges); the edges' transfers come
    after them and one Link per physical link carries both. Its delivered placeholders must be placed on their
    destination chips by ``chip_of``.

    Returns the finished :class:`Network` (its links and per-link bytes). Raises ArgumentError for a chip
    outside the system or a placeholder (a feedback edge) that would cross chips.
    """
    net = Network(graph, system) if network is None else network
    ops = [op for op in graph.ops]
    for op in ops:
        chip = chip_of(op)
        if isinstance(chip, bool) or not isinstance(chip, int) or not 0 <= chip < system.chips:
            raise ArgumentError(f"{op.name}: placed on chip {chip!r}, but system {system.name!r} has chips "
                                f"0..{system.chips - 1}")
        op.chip = chip
    delivered: dict[tuple[int, int, int], object] = {}  # (producer id, output, chip) -> its stream on that chip
    for op in ops:
        for pos, ref in enumerate(op.inputs):
            src = ref.op.chip
            if src == op.chip:
                continue
            if ref.op.kind == "Placeholder":
                raise ArgumentError(f"{op.name}: a feedback edge from {ref.op.name} cannot cross chips")
            key = (ref.op.id, ref.index, op.chip)
            if key not in delivered:
                delivered[key] = net.send(src, op.chip, ref, name=f"{ref.op.name}[{ref.index}]@chip{op.chip}")
            op.inputs[pos] = delivered[key].out(0)
    graph._consumers = None  # the inputs changed under the graph's cache
    graph._broadcasts_inserted = False
    net.finish()
    return net
