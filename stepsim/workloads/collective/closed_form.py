"""Closed forms of the collectives' cycles on an idle system: exact for the whole-chunk algorithms
(``ring-chunked``, ``direct``: what the engine must reproduce to the cycle), an estimate for the streamed ``ring``
(:func:`streamed_ring_cycles`, below the table).

Notation: n chips, S bytes (the whole vector, :mod:`stepsim.workloads.collective.build`), alpha = ``link_latency``
(cycles, the alpha-beta model's per-message latency from the sending operator to the receiving one), B =
``link_bandwidth`` (bytes/cycle). A chunk is S / n bytes (exact: S is a multiple of 4 n) and crosses a link in

    sigma = ceil(S / (n B))   cycles   (S / (nB) rounded up: a link moves whole cycles; no fractional sharing)

A reduction add reads both chunks from on-chip memory and writes the sum back:
``mu = max(2 ceil(S / (n pmu_bw)), ceil(S / (4 n compute_bw)))`` cycles, and every STeP edge between two on-chip
operators takes one cycle.

One hop H of the logical ring ``c -> c+1``: ``alpha + sigma`` on a ring or fully-connected system (one link),
``2 alpha + 2 sigma - 1`` through a switch (two links; the relay from the up-link to the down-link has no
operator edge, so the second link adds ``alpha - 1 + sigma``).

=================  ==========================================  =============================================
collective         ring-chunked algorithm                      direct algorithm (fully connected / switch)
=================  ==========================================  =============================================
all-gather         (n-1) H + 1                                 alpha + sigma + 1  /  2 alpha + n sigma
reduce-scatter     (n-1) (H + mu) + 1                          alpha + sigma + (n-1)(mu+1)  /
                                                               2 alpha - 1 + max(2 sigma + (n-1)(mu+1),
                                                               n sigma + mu + 1)
all-reduce         2 (n-1) H + (n-1) mu + 1                    reduce-scatter + alpha + sigma  /
                                                               reduce-scatter + 2 alpha + n sigma - 1
all-to-all         (direct only)                               alpha + sigma  /  2 alpha + n sigma - 1
=================  ==========================================  =============================================

So a ring all-reduce on a ring is the textbook ``2 (n-1) (alpha + S / (n B))`` plus the reductions
``(n-1) mu`` and one cycle (the edge of the last chunk into the chip's on-chip memory); all-gather and
reduce-scatter are half of the network term. The ``+1`` of all-gather is the edge into the Broadcast that
keeps the chip's own chunk and sends it. Direct collectives on a switch are bounded by each chip's up-link,
which sends its n - 1 chunks one after the other.

The streamed ``ring`` (the default) cuts a chunk into T equal tiles of t bytes
(:func:`tiles_per_chunk`). A tile occupies a link tau = ``ceil(t / B)``
cycles; a send stage or an add takes rho = ``max(ceil(t / pmu_bw), ceil(t / (4 compute_bw)))`` per tile (one
PMU read: the received tile comes from the link); a step's tiles leave a chip every p = ``max(tau, rho)`` and
hold the link W = ``(T-1) p + tau``. Step s starts on the link when its first tile is ready (h_s after step
s-1's first tile: the hop alpha + tau, plus rho where the chip adds, plus one where a sum also goes to the
store) and the step before has left the link, so it starts ``max(h_s, W)`` after the step before:

    all-reduce      rho + (n-2) max(alpha + tau + rho, W) + max(alpha + tau + rho + 1, W)
                        + (n-2) max(alpha + tau, W) + W + alpha + 1
    reduce-scatter  rho + (n-2) max(alpha + tau + rho, W) + W + alpha + rho + 2
    all-gather      rho + (n-2) max(alpha + tau, W) + W + alpha + 2

(through a switch a hop's alpha is ``2 alpha + tau - 1``). When the link is the bottleneck (W at least a hop
with its add) the all-reduce is ``2 (n-1) W + alpha + rho + 1``: with p = tau, ``2 (n-1) T tau`` on the wire, one
link latency and one tile's send stage, against the textbook ``2 (n-1) (alpha + S / (n B))`` of whole chunks,
whose n - 1 adds and 2 (n-1) - 1 latencies the tiles hide. With T = 1 it is whole chunks reduced without the
write-back. This is an estimate: it assumes each link sends the steps in order, which the link's first come,
first served arbitration does unless a later step's tile was made before an earlier step's tile that is still
waiting (then the two interleave and the last step can start later); tests/workloads/collective pins the
engine's cycles and how far from the estimate they fall.
"""

from __future__ import annotations

from stepsim.base.errors import ArgumentError


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def tiles_per_chunk(chunk_elems: int, tile_bytes: int) -> int:
    """T: the fewest equal tiles of at most ``tile_bytes`` a chunk of ``chunk_elems`` fp32 elements splits into
    (the smallest divisor of ``chunk_elems`` that is at least ``ceil(4 chunk_elems / tile_bytes)``).

    >>> tiles_per_chunk(1 << 19, 1 << 18), tiles_per_chunk(300, 1024), tiles_per_chunk(7, 4)
    (8, 2, 7)
    """
    least = max(1, -(-chunk_elems * 4 // tile_bytes))
    return next(t for t in range(least, chunk_elems + 1) if chunk_elems % t == 0)


def chunk_cycles(nbytes: int, chips: int, bandwidth: int) -> int:
    """sigma = ceil(S / (n B)): cycles one chunk of S / n bytes occupies a link of B bytes/cycle."""
    return _ceil(nbytes // chips, bandwidth)


def add_cycles(nbytes: int, chips: int, pmu_bw: int, compute_bw: int, elem_bytes: int = 4) -> int:
    """mu: cycles of one reduction add of two chunks (both read from, the sum written to on-chip memory)."""
    chunk = nbytes // chips
    return max(2 * _ceil(chunk, pmu_bw), _ceil(chunk // elem_bytes, compute_bw))


def streamed_ring_cycles(op: str, topology: str, chips: int, nbytes: int, alpha: int, bandwidth: int, pmu_bw: int,
                         compute_bw: int = 1024, *, tile_bytes: int) -> int:
    """The streamed ring's estimate (module docstring; cycles) with tiles of at most ``tile_bytes``."""
    n, m = chips, nbytes // (4 * chips)
    tiles = tiles_per_chunk(m, tile_bytes)
    t = nbytes // n // tiles
    tau = _ceil(t, bandwidth)
    rho = max(_ceil(t, pmu_bw), _ceil(t // 4, compute_bw))
    w = (tiles - 1) * max(tau, rho) + tau
    if topology == "switch":  # up-link then down-link: the relay adds alpha - 1 and the tile's serialization
        alpha = 2 * alpha + tau - 1
    if op == "all-gather":
        return rho + (n - 2) * max(alpha + tau, w) + w + alpha + 2
    if op == "reduce-scatter":
        return rho + (n - 2) * max(alpha + tau + rho, w) + w + alpha + rho + 2
    if op == "all-reduce":
        return (rho + (n - 2) * max(alpha + tau + rho, w) + max(alpha + tau + rho + 1, w)
                + (n - 2) * max(alpha + tau, w) + w + alpha + 1)
    raise ArgumentError(f"no ring closed form for {op!r}")


def collective_cycles(op: str, algorithm: str, topology: str, chips: int, nbytes: int, alpha: int, bandwidth: int,
                      pmu_bw: int, compute_bw: int = 1024, *, tile_bytes: int | None = None) -> int:
    """The closed form of the table above (cycles; algorithm ``ring``: :func:`streamed_ring_cycles`, an estimate,
    with tiles of ``tile_bytes``, required). Raises ArgumentError where there is none (a direct collective on a
    ring, whose routes share links)."""
    n = chips
    if topology not in ("ring", "fully-connected", "switch"):
        raise ArgumentError(f"no closed form for topology {topology!r}")
    if algorithm == "ring":
        if tile_bytes is None:
            raise ArgumentError("the streamed ring's closed form needs tile_bytes")
        return streamed_ring_cycles(op, topology, n, nbytes, alpha, bandwidth, pmu_bw, compute_bw,
                                    tile_bytes=tile_bytes)
    sigma = chunk_cycles(nbytes, n, bandwidth)
    mu = add_cycles(nbytes, n, pmu_bw, compute_bw)
    switch = topology == "switch"
    if algorithm == "ring-chunked":
        hop = 2 * alpha + 2 * sigma - 1 if switch else alpha + sigma
        if op == "all-gather":
            return (n - 1) * hop + 1
        if op == "reduce-scatter":
            return (n - 1) * (hop + mu) + 1
        if op == "all-reduce":
            return 2 * (n - 1) * hop + (n - 1) * mu + 1
        raise ArgumentError(f"no ring closed form for {op!r}")
    if topology == "ring" and n > 2:
        raise ArgumentError("direct collectives on a ring share links (multi-hop routes): no closed form")
    if not switch:  # fully connected (a ring of 2 is fully connected)
        rs = alpha + sigma + (n - 1) * (mu + 1)
        table = {"all-gather": alpha + sigma + 1, "reduce-scatter": rs, "all-reduce": rs + alpha + sigma,
                 "all-to-all": alpha + sigma}
    else:
        rs = 2 * alpha - 1 + max(2 * sigma + (n - 1) * (mu + 1), n * sigma + mu + 1)
        table = {"all-gather": 2 * alpha + n * sigma, "reduce-scatter": rs,
                 "all-reduce": rs + 2 * alpha + n * sigma - 1, "all-to-all": 2 * alpha + n * sigma - 1}
    return table[op]
