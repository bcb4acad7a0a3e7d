"""The micro-batch axis of ``stepsim optimize`` over a stack of layers (``layers > 1``: the MoE and decoder stacks).

A stack's candidates gain ``micro_batches`` M (``stepsim run ... --micro-batches M``): every grid of the space is
followed by its micro-batched copies (:func:`micro_batch_grids`); the default space of a stack also leaves out the
time-multiplexed ``regions`` grids, which every stack refuses (:func:`stack_space`). M runs over the divisors of the batch from 2 up
to :data:`MAX_MICRO_BATCHES`; M = 1 is the grid itself with the knob unset (the stack's default, so those
candidates keep the run ids of a search without the axis). Only what the stack builds is kept:

* the tilings that take M > 1 (:data:`stepsim.workloads.moe.many_chips.MICRO_BATCH_TILINGS`, the MoE and decoder
  stacks': static and dynamic; a grid without a ``tiling`` axis has the kind's default);
* MoE with shared experts: the ``tile_n`` values whose shared tiles do not span micro-batches (``B / M`` a
  multiple of ``tile_n``; dynamic tiling's shared tile is the default 32 tokens,
  :func:`stepsim.workloads.moe.many_chips.check_pipeline`);
* decoder: micro-batches of ``B / M`` requests that the projection tile packs whole (at most
  :data:`stepsim.workloads.decoder.build.O_TILE` requests, or a multiple of it);
* with ``ep`` (expert-parallel stages, :mod:`stepsim.workloads.moe.sharded_micro`): M splitting every chip's
  shard (``B`` a multiple of ``ep x M``), the shared experts' tiles within a chip's micro-batch.

**The bound on M**: every micro-batch re-reads the weights of each expert its tokens visit, so off-chip bytes,
FLOPs (each micro-batch pads its own tiles) and on-chip bytes (each micro-batch packs its own tiles: one tile
buffer per expert and micro-batch) all grow with M, and M above a few times the stage count only adds pipeline
fill that is already hidden (docs/system.md, "MoE stacks"). Eight keeps the space small for the stacks searched.

**Symbolic pruning stays exact**: a candidate's metrics are those of its own graph, built at its M; the
per-micro-batch token counts are bound from the trace, so the off-chip bytes, FLOPs, on-chip bytes and the
per-unit cycle bounds (load units' tiles, compute units' firings, HBM requests, the pipeline bound) are the
M-dependent ones; the link bytes (``B D`` values per stage boundary) do not depend on M.
"""

from __future__ import annotations

#: the largest micro-batch count searched (module docstring)
MAX_MICRO_BATCHES = 8
#: knobs that every candidate of the JSON and Parquet outputs carries (1 / null when unset): the parallel axes
#: (chips each) and the micro-batch count
RECORDED_KNOBS = ("tp", "ep", "pp", "micro_batches")


def stack_space(grids: list[dict], *, workload: str, batch: int, layers: int, shared: int = 0) -> list[dict]:
    """The default space of a stack of ``layers`` layers from a layer's ``grids``: the grids with time-multiplexed
    ``regions`` left out (every stack refuses ``--regions``: one region per expert), each then followed by its
    micro-batched copies (:func:`micro_batch_grids`). One layer: ``grids`` unchanged."""
    if layers <= 1:
        return [dict(g) for g in grids]
    return micro_batch_grids([g for g in grids if "regions" not in g], workload=workload, batch=batch, layers=layers,
                             shared=shared)


def micro_batch_counts(batch: int, bound: int = MAX_MICRO_BATCHES) -> list[int]:
    """The micro-batch counts searched besides 1: divisors of ``batch`` (tokens, requests) in ``2 .. bound``.

    >>> micro_batch_counts(24)
    [2, 3, 4, 6, 8]
    """
    return [m for m in range(2, min(batch, bound) + 1) if batch % m == 0]


def micro_batch_grids(grids: list[dict], *, workload: str, batch: int, layers: int, shared: int = 0,
                      bound: int = MAX_MICRO_BATCHES) -> list[dict]:
    """``grids`` with the micro-batch axis of a stack of ``layers`` layers (module docstring): each grid, then
    its copies with ``micro_batches`` (consecutive counts that keep the same values share one copy).
    ``workload``: ``moe`` or ``decoder``; ``batch``: tokens (requests); ``shared``: the shared experts' width
    (0: none). A single layer (``layers`` 1) is no stack: ``grids`` unchanged."""
    if layers <= 1:
        return [dict(g) for g in grids]
    out = []
    for grid in grids:
        out.append(dict(grid))
        copies: list[tuple[dict, list[int]]] = []
        for m in micro_batch_counts(batch, bound):
            fitted = _fit(grid, m, workload=workload, batch=batch, shared=shared)
            if fitted is None:
                continue
            if copies and copies[-1][0] == fitted:
                copies[-1][1].append(m)
            else:
                copies.append((fitted, [m]))
        out += [{**fitted, "micro_batches": tuple(ms)} for fitted, ms in copies]
    return out


def _fit(grid: dict, m: int, *, workload: str, batch: int, shared: int) -> dict | None:
    """``grid`` restricted to what the stack builds with ``m`` micro-batches, or None."""
    from stepsim.workloads.decoder.build import O_TILE
    from stepsim.workloads.kinds import kind
    from stepsim.workloads.moe.build import DEFAULT_TILE_N
    from stepsim.workloads.moe.many_chips import MICRO_BATCH_TILINGS as tilings

    grid = dict(grid)
    rows = batch // m
    if "ep" in grid:  # each chip's shard splits into the M micro-batches (moe/sharded_micro.py)
        (ep,) = grid["ep"]  # one ep value per grid (stepsim.optimize.chips._fit)
        if batch % (ep * m):
            return None
        shard_rows = batch // (ep * m)
    if "tiling" in grid:
        grid["tiling"] = tuple(t for t in grid["tiling"] if t in tilings)
        if not grid["tiling"]:
            return None
    elif kind(workload).defaults.get("tiling") not in tilings:
        return None
    if workload == "decoder" and rows % min(O_TILE, rows):
        return None
    if shared and (workload == "moe" or "ep" in grid):
        # dynamic tiling's shared experts use the default tile (a grid's tile_n is for its static tiling); with ep
        # they tile a chip's micro-batch of its shard
        tile_ns = grid.get("tile_n", (DEFAULT_TILE_N,)) if grid.get("tiling") != ("dynamic",) else (DEFAULT_TILE_N,)
        kept = tuple(n for n in tile_ns if (shard_rows if "ep" in grid else rows) % n == 0)
        if not kept:
            return None
        if "tile_n" in grid:
            grid["tile_n"] = kept
    return grid
