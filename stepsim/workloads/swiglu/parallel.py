"""Tensor parallelism of the SwiGLU FFN (``--tp N``): F's columns split over N chips, an all-reduce after.

Chip c computes the layer on its ``F / N`` columns (Megatron's column-parallel gate / up and row-parallel down
projections): tensors ``w_gate.<c>``, ``w_up.<c>`` (columns ``c F/N .. (c+1) F/N - 1`` of ``w_gate``, ``w_up``)
and ``w_down.<c>`` (those rows of ``w_down``) in its own HBM, ``x`` replicated (every chip reads it from its HBM).
Its output is a partial sum of y: the ``B / tile_m`` row tiles ``(tile_m, D)``. They are cut into N chunks of
consecutive row tiles (a Partition by a static selector; chunk k = row tiles ``k B/(tile_m N) ..``) and summed
over the chips by the all-reduce of :func:`stepsim.workloads.sharding.tp_layers` (the collectives' ring or
direct graphs over the system's links). Chip c stores the reduced chunk k of y in tensor
``y<c>.<k>`` (rows ``k B/N ..`` of y), so every chip ends with all of y, as after an all-reduce.
"""

from __future__ import annotations

from stepsim.base.errors import ArgumentError
from stepsim.graph import Flatten, Graph
from stepsim.workloads.sharding import Sharding, tp_layers


def check_tp(tp: int, batch: int, intermediate: int, tile_m: int, tile_n: int) -> None:
    """One-line ArgumentError unless F splits into N column blocks of whole ``tile_n`` tiles and the batch's
    row tiles into N chunks."""
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 2:
        raise ArgumentError(f"--tp must be an int >= 2 (chips), got {tp!r}")
    if intermediate % (tp * tile_n):
        raise ArgumentError(f"--tp {tp}: the intermediate size {intermediate} must split into {tp} column blocks of "
                            f"whole --tile-n {tile_n} tiles (a multiple of {tp * tile_n})")
    if (batch // tile_m) % tp:
        raise ArgumentError(f"--tp {tp}: the all-reduce cuts y's {batch // tile_m} row tiles (--tile-m {tile_m}) "
                            f"into {tp} chunks; their number must be a multiple of {tp}")


def build_tp(tp: int, system, *, stage, batch: int, hidden: int, intermediate: int, tile_m: int, tile_n: int,
             compute_bw: int, par_dispatch: int, algorithm: str = "ring") -> tuple[Graph, object]:
    """The tensor-parallel layer (module docstring). ``stage(g, f, suffix)`` builds one chip's share of the
    layer on ``f`` columns reading tensors ``<name><suffix>`` and returns its output row tiles. Returns the graph
    and the sharding pass's report of its links (``system``, ``links_used``, ``link_bytes``)."""
    check_tp(tp, batch, intermediate, tile_m, tile_n)
    g = Graph(f"swiglu-tp{tp}-m{tile_m}-n{tile_n}")
    sh = Sharding(g, system)
    tp_layers(sh, 1, tp=tp, pp=None, algorithm=algorithm, batch=batch // tile_m, compute_bw=compute_bw, bindings={},
              stack=False, store_kw={"par_dispatch": par_dispatch}, blocks=lambda i: [
                  ("allreduce", lambda t, rows: Flatten(g, stage(g, intermediate // tp, f".{t}"), 0, 1), False)])
    return g, sh.finish({})
