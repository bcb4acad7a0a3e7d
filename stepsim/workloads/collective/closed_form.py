"""Closed forms of the collectives' cycles on an idle system (what the engine must reproduce to the cycle).

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
collective         ring algorithm                              direct algorithm (fully connected / switch)
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
"""

from __future__ import annotations

from stepsim.base.errors import ArgumentError


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def chunk_cycles(nbytes: int, chips: int, bandwidth: int) -> int:
    """sigma = ceil(S / (n B)): cycles one chunk of S / n bytes occupies a link of B bytes/cycle."""
    return _ceil(nbytes // chips, bandwidth)


def add_cycles(nbytes: int, chips: int, pmu_bw: int, compute_bw: int, elem_bytes: int = 4) -> int:
    """mu: cycles of one reduction add of two chunks (both read from, the sum written to on-chip memory)."""
    chunk = nbytes // chips
    return max(2 * _ceil(chunk, pmu_bw), _ceil(chunk // elem_bytes, compute_bw))


def collective_cycles(op: str, algorithm: str, topology: str, chips: int, nbytes: int, alpha: int, bandwidth: int,
                      pmu_bw: int, compute_bw: int = 1024) -> int:
    """The closed form of the table above (cycles). Raises ArgumentError where there is none (a direct
    collective on a ring, whose routes share links)."""
    n = chips
    sigma = chunk_cycles(nbytes, n, bandwidth)
    mu = add_cycles(nbytes, n, pmu_bw, compute_bw)
    if topology not in ("ring", "fully-connected", "switch"):
        raise ArgumentError(f"no closed form for topology {topology!r}")
    switch = topology == "switch"
    if algorithm == "ring":
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
