"""Collectives as STeP graphs over link units: all-reduce, reduce-scatter, all-gather (ring and direct), all-to-all.

Data layout. ``nbytes`` (S) is the whole vector: each chip's input to an all-reduce / reduce-scatter /
all-to-all, each chip's output of an all-gather. It is cut into ``n`` chunks of ``S / n`` bytes (fp32, so S
must be a multiple of ``4 n``), one tile ``(1, S / (4 n))`` each; chunk k of chip c is the on-chip tensor
``x<c>.<k>`` (all-gather: chip c's chunk is ``x<c>``), held in on-chip memory (:class:`ResidentLoad`, so the
closed forms are not blurred by HBM contention: the engine has one HBM model). Results are resident tensors:

* all-reduce: ``y<c>.<k>`` on every chip c, every chunk k (= sum over chips of ``x<j>.<k>``);
* reduce-scatter: ``y<c>`` on chip c (= sum over chips of chunk c);
* all-gather: ``y<c>.<k>`` on every chip c (= ``x<k>``);
* all-to-all: ``y<c>.<j>`` on chip c (= ``x<j>.<c>``, what chip j sent to c).

Algorithms (transfers are routed over the system's links by :class:`~stepsim.graph.network.Network`):

* ``ring-chunked``: the logical ring ``c -> c+1``, whole chunks. Reduce-scatter: at step s = 0 .. n-2 chip c
  sends chunk ``(c - s - 1) mod n``: its own at s = 0, later the partial sum it received plus its own chunk (a
  Map add); after n - 1 steps chip c holds the sum of chunk c. All-gather: n - 1 steps forwarding what arrived.
  All-reduce = reduce-scatter then all-gather.
* ``ring`` (the default): the same steps with every chunk streamed in T equal tiles (as NCCL pipelines a
  chunk's slices): tile i of a step crosses the link and is reduced on arrival while tile i + 1 is on the wire,
  and the next step sends tile i as soon as it is reduced, so transfer and reduction overlap. A tile is at most
  ``tile_bytes`` (default :func:`default_tile_bytes`: a quarter of one on-chip memory unit, which
  double-buffers the tile arriving and the chip's own tile it is added to); T is the fewest equal tiles of at most that size
  (:func:`tiles_per_chunk`). The received tile comes straight from the link into the add (it is not read from
  on-chip memory); the chip's own chunk is (one PMU read per tile), and the sum goes on to the link or the store
  without a write-back. A resident chunk sent as it is (step 0, an all-gather's own chunk) passes a send stage
  that reads it from on-chip memory (a ``Pointwise mul_c 1`` Map: the value is unchanged, bit for bit).
* ``direct``: every chip sends straight to every other, to c+1 first, then c+2, ... (reduce-scatter: chunk k to
  chip k, which adds the contributions in the order they leave their senders, c = k-1, k-2, ...; all-gather:
  its chunk to every chip). All-to-all is direct only.

Reductions are ``Map(Add)`` with ``compute_bw`` FLOPs/cycle. Whole chunks (``ring-chunked``, ``direct``) are
added with ``write_back_mu=True`` (partials live in on-chip memory), so every add reads both operands from the
PMU: ``max(2 ceil(S / (n pmu_bw)), ceil(S / (4 n compute_bw)))`` cycles (docs/timing_model.md §6). A streamed
tile of t bytes is added in ``max(ceil(t / pmu_bw), ceil(t / (4 compute_bw)))`` cycles (its own chunk's read).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from stepsim.base.errors import ArgumentError
from stepsim.base.system import System
from stepsim.graph.dtypes import FP32
from stepsim.graph.functions import Add, Pointwise
from stepsim.graph.graph import Graph
from stepsim.graph.network import Network
from stepsim.graph.ops_chips import ResidentLoad, ResidentStore
from stepsim.graph.ops_compute import Map
from stepsim.graph.ops_memory import Tensor
from stepsim.workloads.base import Workload
from stepsim.workloads.collective import ALGORITHMS, OPS
from stepsim.workloads.collective.closed_form import tiles_per_chunk

#: bytes per element of the collectives' vectors (fp32)
ELEM_BYTES = 4
#: operators per chunk of every chip (so per chips**2) an op builds: loads, adds and stores or sends (all-reduce:
#: load, reduce-scatter send + add, all-gather send + store), besides at most one operator per link
OPERATORS_PER_CHUNK = {"all-reduce": 3, "reduce-scatter": 2, "all-to-all": 2, "all-gather": 1}
#: the most operators a collective may build: a 128-chip ring all-reduce is 49,408 and takes 45 s to build and
#: simulate on the 2-core reference machine (its cost grows faster than its operators: the engine's first slice
#: steps every unit), a 1,024-chip one would be 3.1 million (hours, and tens of GB)
MAX_OPERATORS = 2**16
#: FLOPs/cycle of the reduction adds (a Map's compute_bw; the PMU reads usually dominate)
DEFAULT_COMPUTE_BW = 1024


def default_tile_bytes(hardware) -> int:
    """Bytes of a streamed collective's tile (``ring``): a quarter of one on-chip memory unit
    (:attr:`stepsim.base.hardware.Hardware.memory_unit_bytes` // 4, 128 KiB on every preset: 512 KiB PMUs).
    The receiving unit double-buffers two tiles at once, the one arriving from the link and the chip's own tile
    it is added to, so four tiles share one PMU; at least one fp32 element."""
    return max(ELEM_BYTES, hardware.memory_unit_bytes // 4)


def check_tile_bytes(tile_bytes) -> int:
    """``tile_bytes`` must be an int of at least one fp32 element (4 bytes); raises ArgumentError (one line)."""
    if isinstance(tile_bytes, bool) or not isinstance(tile_bytes, int) or tile_bytes < ELEM_BYTES:
        raise ArgumentError(f"collective tile_bytes must be an int >= {ELEM_BYTES} (one fp32 element), "
                            f"got {tile_bytes!r}")
    return tile_bytes


@dataclass(frozen=True)
class Collective:
    """What was built: the graph, its network (links, per-link bytes) and the layout.

    ``inputs`` / ``outputs`` list the resident tensor names; ``chunk_elems`` is the fp32 elements per chunk;
    ``tiles`` the tiles a chunk streams in (``ring``; 1 for the whole-chunk algorithms).
    """

    graph: Graph
    network: object
    op: str
    algorithm: str
    chips: int
    nbytes: int
    chunk_elems: int
    inputs: tuple
    outputs: tuple
    tiles: int = 1


def check_request(op: str, nbytes, algorithm: str, chips: int) -> int:
    """Validate a collective request; returns the fp32 elements per chunk. Raises ArgumentError (one line)."""
    if op not in OPS:
        raise ArgumentError(f"collective op must be one of {', '.join(OPS)}, got {op!r}")
    if algorithm not in ALGORITHMS:
        raise ArgumentError(f"collective algorithm must be one of {', '.join(ALGORITHMS)}, got {algorithm!r}")
    if op == "all-to-all" and algorithm != "direct":
        raise ArgumentError("all-to-all is direct only (each chunk routed straight to its chip): use "
                            "--algorithm direct")
    if chips < 2:
        raise ArgumentError(f"a collective needs at least 2 chips, the system has {chips}")
    if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 1:
        raise ArgumentError(f"--bytes must be a positive int, got {nbytes!r}")
    if nbytes % (ELEM_BYTES * chips):
        raise ArgumentError(f"--bytes {nbytes} must be a multiple of {ELEM_BYTES * chips} ({chips} chunks of fp32 "
                            f"elements); e.g. {nbytes - nbytes % (ELEM_BYTES * chips) or ELEM_BYTES * chips}")
    return nbytes // (ELEM_BYTES * chips)


def operator_estimate(op: str, chips: int, links: int) -> int:
    """An upper bound on the operators :func:`build_collective` makes for ``op`` over ``chips`` chips joined by
    ``links`` links (exact for the ring algorithm on a ring: ``OPERATORS_PER_CHUNK[op] * chips**2`` plus the links
    used), counted without building."""
    return OPERATORS_PER_CHUNK[op] * chips * chips + links


def check_size(system: System, op: str, where: str | None = None) -> None:
    """Refuse a collective larger than :data:`MAX_OPERATORS` before building it: one line with the estimate, named
    by ``where`` (the flag and the file given; default ``--system <the system's name>``)."""
    if op not in OPERATORS_PER_CHUNK:
        return  # an unknown op is check_request's line
    estimate = operator_estimate(op, system.chips, len(system.links))
    if estimate > MAX_OPERATORS:
        raise ArgumentError(f"{where or f'--system {system.name}'}: {op} over {system.chips:,} chips builds about {estimate:,} "
                            f"operators ({OPERATORS_PER_CHUNK[op]} x {system.chips:,}^2 chunks, plus the links); the "
                            f"limit is {MAX_OPERATORS:,} (about a minute to build and simulate): use fewer chips")


class _Builder:
    def __init__(self, system: System, op: str, nbytes: int, algorithm: str, compute_bw: int, *, graph=None,
                 network=None, prefix: str = "", tile_bytes: int | None = None):
        self.n = system.chips
        self.tiles = 1
        self.streamed = False  # ring: chunks in tiles, adds without write-back, send stages
        if graph is None:
            self.m = check_request(op, nbytes, algorithm, self.n)
            check_size(system, op)
            self.g = Graph(f"{op}-{algorithm}-{self.n}chips-{nbytes}B")
            self.net = Network(self.g, system)
            if algorithm == "ring":
                tile_bytes = default_tile_bytes(system.hardware) if tile_bytes is None else \
                    check_tile_bytes(tile_bytes)
                self.tiles, self.streamed = tiles_per_chunk(self.m, tile_bytes), True
        else:  # inside another graph (all_reduce_streams): its chunks are streams, not resident tensors
            self.m, self.g, self.net = None, graph, network
        self.prefix = prefix
        self.compute_bw = compute_bw
        self.inputs: list[str] = []
        self.outputs: list[str] = []

    def load(self, name: str):
        self.inputs.append(name)
        t = self.tiles  # a chunk (1, m) as T tiles (1, m / T): stream (1, 1, T), stored back as (1, m)
        return ResidentLoad(self.g, Tensor(name, (1, self.m), FP32), tile=(1, self.m // t),
                            out_shape_tiled=(1, t) if self.streamed else (1,),
                            stride=(t, 1) if self.streamed else (1,), name=f"load.{name}")

    def store(self, stream, name: str) -> None:
        self.outputs.append(name)
        ResidentStore(self.g, stream, tensor_name=name, name=f"store.{name}")

    def add(self, a, b, name: str, chip: int):
        op = Map(self.g, [a, b], Add(), compute_bw=self.compute_bw, write_back_mu=not self.streamed,
                 name=self.prefix + name)
        op.chip = chip
        self.hold_chunk(op)
        return op

    def hold_chunk(self, op) -> None:
        """Streamed: ``op``'s outputs hold a whole chunk (T tiles), the on-chip buffer where a step's tiles wait
        while the link still sends the step before: the link then takes every transfer's tiles in the order they
        were made (a shallower FIFO re-stamps a waiting tile when its slot frees, and a later step's older tile
        overtakes it)."""
        if self.streamed:
            op.channel_depth = max(op.channel_depth or 0, self.tiles)

    def send_stage(self, stream, chip: int, name: str):
        """A resident chunk on its way to a link: streamed, a unit reads it from on-chip memory tile by tile (x * 1,
        bit for bit; ``ceil(t / pmu_bw)`` cycles a tile); whole chunks go as they are (the receiver's add pays)."""
        if not self.streamed:
            return stream
        op = Map(self.g, [stream], Pointwise("mul_c", 1.0), compute_bw=self.compute_bw, write_back_mu=False,
                 name=self.prefix + name)
        op.chip = chip
        self.hold_chunk(op)
        return op

    # ------------------------------------------------------------------------------------- reduce-scatter
    def reduce_scatter_ring(self, x=None):
        """Returns {chip: stream of its reduced chunk (chunk index = chip)}; ``x[(c, k)]`` is chunk k of chip c
        (default: the resident tensors ``x<c>.<k>``)."""
        n = self.n
        x = x or {(c, k): self.load(f"x{c}.{k}") for c in range(n) for k in range(n)}
        sent = {}  # (chip, step) -> the stream chip sends at that step
        for c in range(n):
            sent[(c, 0)] = self.send_stage(x[(c, (c - 1) % n)], c, f"chip{c}.rs.send")
        received = {}
        for s in range(n - 1):
            for c in range(n):
                received[(c, s)] = self.net.send((c - 1) % n, c, sent[((c - 1) % n, s)], name=f"{self.prefix}rs{s}@chip{c}")
            for c in range(n):
                k = (c - s - 2) % n  # the chunk chip c forwards at the next step (its own at the last step)
                sent[(c, s + 1)] = self.add(received[(c, s)], x[(c, k)], name=f"chip{c}.rs{s}.add", chip=c)
        return {c: sent[(c, n - 1)] for c in range(n)}

    def reduce_scatter_direct(self, x=None):
        n = self.n
        x = x or {(c, k): self.load(f"x{c}.{k}") for c in range(n) for k in range(n)}
        received = {}
        for step in range(1, n):  # send order: each chip to c+1 first, then c+2, ...
            for c in range(n):
                k = (c + step) % n
                received[(k, c)] = self.net.send(c, k, x[(c, k)], name=f"{self.prefix}rs.chip{c}@chip{k}")
        out = {}
        for k in range(n):
            acc = x[(k, k)]
            for step in range(1, n):  # in the order the chunks leave their senders: c = k-1 first (its 1st send)
                c = (k - step) % n
                acc = self.add(acc, received[(k, c)], name=f"chip{k}.rs.add{c}", chip=k)
            out[k] = acc
        return out

    # ----------------------------------------------------------------------------------------- all-gather
    def all_gather(self, own, algorithm: str, sink=None, resident: bool = False):
        """``own[c]``: chip c's chunk (index c; ``resident``: loaded from on-chip memory, so a streamed ring sends
        it through a send stage). Stores ``y<c>.<k>`` for every chip c and chunk k, or hands each to
        ``sink(stream, c, k)``."""
        n = self.n
        sink = sink or (lambda stream, c, k: self.store(stream, f"y{c}.{k}"))
        for c in range(n):
            sink(own[c], c, c)
        if algorithm in ("ring", "ring-chunked"):
            forward = {c: self.send_stage(own[c], c, f"chip{c}.ag.send") if resident else own[c] for c in range(n)}
            for t in range(n - 1):
                got = {}
                for c in range(n):
                    src = (c - 1) % n
                    got[c] = self.net.send(src, c, forward[src], name=f"{self.prefix}ag{t}@chip{c}")
                for c in range(n):
                    sink(got[c], c, (c - 1 - t) % n)
                forward = got
        else:
            for step in range(1, n):
                for c in range(n):
                    k = (c + step) % n
                    sink(self.net.send(c, k, own[c], name=f"{self.prefix}ag.chip{c}@chip{k}"), k, c)

    # ------------------------------------------------------------------------------------------ all-to-all
    def all_to_all(self):
        n = self.n
        x = {(c, k): self.load(f"x{c}.{k}") for c in range(n) for k in range(n)}
        for c in range(n):
            self.store(x[(c, c)], f"y{c}.{c}")
        for step in range(1, n):
            for c in range(n):
                k = (c + step) % n
                self.store(self.net.send(c, k, x[(c, k)], name=f"a2a.chip{c}@chip{k}"), f"y{k}.{c}")


def _check_stream_algorithm(algorithm: str) -> None:
    """Inside another graph the chunks are the caller's own tile streams, already crossing and reduced tile by
    tile: ``ring`` builds that ring as before (adds with write-back); ``ring-chunked`` has no meaning there."""
    if algorithm == "ring-chunked":
        raise ArgumentError("--algorithm ring-chunked applies to 'stepsim run collective' only: a tensor-parallel "
                            "layer's all-reduce streams its own tiles (use ring or direct)")
    if algorithm not in ALGORITHMS:
        raise ArgumentError(f"collective algorithm must be one of {', '.join(ALGORITHMS)}, got {algorithm!r}")


def all_reduce_streams(graph: Graph, network: Network, chunks: dict, algorithm: str = "ring", *,
                       compute_bw: int = DEFAULT_COMPUTE_BW, prefix: str = "") -> dict:
    """The all-reduce of this module, inside another graph: ``chunks[(c, k)]`` is chunk k of chip c's vector (a
    stream on chip c; for every chip c and chunk k < chips, chunks k of all chips of one shape), transfers go
    through ``network`` (not finished here). Returns ``{(c, k): stream}``, the sum over chips of chunk k, on chip
    c. Operator and transfer names start with ``prefix``. The ops are not placed on chips: a caller places every
    operator it made (the adds of chunk k at step s run on the chip that receives; see the module docstring).
    """
    _check_stream_algorithm(algorithm)
    b = _Builder(network.system, "all-reduce", None, algorithm, compute_bw, graph=graph, network=network,
                 prefix=prefix)
    reduced = b.reduce_scatter_ring(chunks) if algorithm == "ring" else b.reduce_scatter_direct(chunks)
    out = {}
    b.all_gather(reduced, algorithm, sink=lambda stream, c, k: out.__setitem__((c, k), stream))
    return out


def reduce_scatter_streams(graph: Graph, network: Network, chunks: dict, algorithm: str = "ring", *,
                           compute_bw: int = DEFAULT_COMPUTE_BW, prefix: str = "") -> dict:
    """The reduce-scatter of this module inside another graph, as :func:`all_reduce_streams` (same ``chunks``,
    network and placement rules): returns ``{c: stream}``, the sum over chips of chunk c, on chip c."""
    _check_stream_algorithm(algorithm)
    b = _Builder(network.system, "reduce-scatter", None, algorithm, compute_bw, graph=graph, network=network,
                 prefix=prefix)
    return b.reduce_scatter_ring(chunks) if algorithm == "ring" else b.reduce_scatter_direct(chunks)


def build_collective(system: System, op: str, nbytes: int, algorithm: str = "ring", *,
                     compute_bw: int = DEFAULT_COMPUTE_BW, tile_bytes: int | None = None) -> Collective:
    """Build collective ``op`` of ``nbytes`` (S) over ``system`` as a STeP graph (see the module docstring).

    ``tile_bytes``: the largest tile a ``ring`` collective streams a chunk in (default
    :func:`default_tile_bytes` of the system's hardware); the other algorithms move whole chunks.

    Example
    -------
    >>> c = build_collective(System.preset("ring-4"), "all-reduce", 4096)
    >>> c.chunk_elems, c.tiles, len(c.inputs), len(c.outputs), len(c.network.links)
    (256, 1, 16, 16, 4)
    >>> build_collective(System.preset("ring-4"), "all-reduce", 4096, tile_bytes=256).tiles
    4
    """
    b = _Builder(system, op, nbytes, algorithm, compute_bw, tile_bytes=tile_bytes)
    if op == "all-to-all":
        b.all_to_all()
    elif op == "all-gather":
        b.all_gather({c: b.load(f"x{c}") for c in range(b.n)}, algorithm, resident=True)
    else:
        reduced = b.reduce_scatter_ring() if algorithm != "direct" else b.reduce_scatter_direct()
        if op == "reduce-scatter":
            for c in range(b.n):
                b.store(reduced[c], f"y{c}")
        else:
            b.all_gather(reduced, algorithm)
    for link in b.net.finish():
        b.hold_chunk(link)  # a forwarded (all-gather) tile waits at its receiver for the next link
    return Collective(b.g, b.net, op, algorithm, b.n, nbytes, b.m, tuple(b.inputs), tuple(b.outputs), b.tiles)


def from_config(cfg: Mapping) -> Workload:
    """The collective workload of a normalized run config (:func:`stepsim.workloads.config.normalize_config`).

    The chips' hardware is the system's (``--hardware`` does not apply: the system file names it).
    """
    from stepsim.workloads.collective.closed_form import collective_cycles
    from stepsim.workloads.config import compute_bw_kwargs
    from stepsim.workloads.kinds import WORKLOAD_CHANNEL_DEPTH

    if cfg.get("hardware") is not None:
        raise ArgumentError("--hardware does not apply to workload 'collective': the system file names the "
                            "chips' hardware")
    system = System.load(cfg["system"])
    check_size(system, cfg["op"], f"--system {cfg['system']}")
    kw = compute_bw_kwargs(cfg)
    c = build_collective(system, cfg["op"], cfg["bytes"], cfg["algorithm"], **kw)
    topologies = {d.topology for d in system.dimensions}
    closed = None
    if len(system.dimensions) == 1 and topologies <= {"ring", "fully-connected", "switch"} and \
            len({(link.bandwidth, link.latency) for link in system.links}) == 1:
        try:
            closed = collective_cycles(c.op, c.algorithm, system.dimensions[0].topology, c.chips, c.nbytes,
                                       system.links[0].latency, system.links[0].bandwidth, system.hardware.pmu_bw,
                                       kw.get("compute_bw", DEFAULT_COMPUTE_BW),
                                       tile_bytes=default_tile_bytes(system.hardware))
        except ArgumentError:  # no closed form (direct collectives on a ring share links)
            closed = None
    params = {"op": c.op, "bytes": c.nbytes, "algorithm": c.algorithm, "system": system.name, "chips": c.chips,
              "chunk_bytes": c.nbytes // c.chips, "tiles_per_chunk": c.tiles, "links_used": len(c.network.links),
              "compute_bw": kw.get("compute_bw", DEFAULT_COMPUTE_BW), "closed_form_cycles": closed,
              "link_bytes": {name: int(b) for name, b in c.network.link_bytes().items()}}
    return Workload("collective", c.graph, params=params, hardware=system.hardware_spec,
                    channel_depth=cfg.get("channel_depth") or WORKLOAD_CHANNEL_DEPTH["collective"],
                    trace={})
