"""Pareto dominance over (cycles, on-chip bytes, allocated compute), all minimized, and the roofline bound.

A point ``a`` *dominates* ``b`` when it is no worse in every objective and better in at least one. Two points
with equal objective vectors do not dominate each other: both are on the front (so the front found by the
pruned search and the exhaustive front can be compared point for point).
"""

from __future__ import annotations

from collections.abc import Sequence


def dominates(a: Sequence[int], b: Sequence[int]) -> bool:
    """Whether objective vector ``a`` dominates ``b`` (``<=`` everywhere, ``<`` somewhere)."""
    return all(x <= y for x, y in zip(a, b)) and any(x < y for x, y in zip(a, b))


def pareto_front(points: Sequence[Sequence[int]]) -> list[int]:
    """Indices of the non-dominated ``points`` (in input order)."""
    return [i for i, p in enumerate(points) if not any(dominates(q, p) for j, q in enumerate(points) if j != i)]


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def roofline_lower_bound(off_chip_bytes: int, hbm_bytes_per_cycle: int, flops: int,
                         allocated_flops_per_cycle: int) -> int:
    """A lower bound on the simulated cycles of a run (cycles).

    ``max(ceil(off_chip_bytes / hbm_bytes_per_cycle), ceil(flops / allocated_flops_per_cycle))``: the HBM
    moves at most its peak bytes per cycle, and each FLOP-based compute unit spends at least
    ``ceil(flops / compute_bw)`` cycles per firing (docs/timing_model.md §3.3), so all of them together retire at most
    ``sum(compute_bw)`` FLOPs per cycle. ``flops`` is the graph's FLOP count in the engine's convention
    (``graph_flops``, not the paper's algorithmic count, which over-counts SiLU). Checked against every
    simulated point by the tests.
    """
    bound = ceil_div(off_chip_bytes, hbm_bytes_per_cycle) if hbm_bytes_per_cycle else 0
    if allocated_flops_per_cycle:
        bound = max(bound, ceil_div(flops, allocated_flops_per_cycle))
    return bound
