"""What a chip's experts cost it with one spatial region per expert (``--ep N`` without ``--regions``).

Each expert with tokens makes one *pass* over its weights per token tile of ``tile_n`` rows (static tiling): its
up, gate and down loads (three memory units, one weight tile of ``D x tile_f`` or ``tile_f x D`` bf16 values in
flight each) fetch ``F / tile_f`` tiles apiece, and its matmuls consume them. All experts of a chip run at once
and share that chip's HBM; an expert's passes run one after another. Two figures, from the hardware and the
layer's dimensions (docs/system.md, "What sets a chip's time", gives the derivation and its measured error):

* ``shared`` (:func:`pass_cycles_shared`): the cycles one pass takes of the chip's HBM when the HBM is the limit,
  its requests over the HBM's peak request rate. ``n`` passes at once take ``n x shared``.
* ``alone`` (:func:`pass_cycles_alone`): the cycles one pass takes when it has the HBM to itself, paced by its own
  memory units (one tile in flight each, ``par_dispatch`` 1: one request per tick plus the round trip) or by
  its matmuls (a weight tile read from on-chip memory at ``pmu_bw``, or its FLOPs at ``compute_bw``).

A fluid model of the HBM (every running pass served at the same rate, none faster than alone) then gives a chip
whose experts hold ``t_1 >= t_2 >= ...`` tiles: in phase j the ``n_j`` experts with at least j tiles make their
j-th passes together and finish them together, so the chip's expert time is
``sum over j of max(n_j x shared, alone)`` (:func:`chip_cycles`). The all-to-alls, the token packing before and
the combine after are left out: they are about the same on every chip (under 5 % of the layer on the traces of
docs/system.md), so they do not change which placement is faster.

With dynamic tiling (:class:`RaggedCost`) every expert with tokens makes one pass with one ragged tile of all its
rows, and its FLOPs (its rows) may pace it alone; the rows go back over the reverse links after it. A placement
then takes the latest chip's ``max(n x shared, slowest alone)`` (:func:`ragged_chip_cycles`) plus the busiest
link's rows (:func:`dispatch_cycles`, :func:`ragged_cycles`; docs/system.md, "The cost model with dynamic
tiling").
"""

from __future__ import annotations

from dataclasses import dataclass

from stepsim.base.hardware import Hardware
from stepsim.models.presets import MoEModel

#: bytes an expert weight value takes in HBM and at the width the engine times it (bf16 storage)
WEIGHT_BYTES = 2


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def tile_requests(rows: int, cols: int, hw: Hardware) -> int:
    """HBM requests of one ``rows x cols`` bf16 weight tile: ``rows * ceil(cols * 2 / addr_offset)``
    (docs/timing_model.md §4.1)."""
    return rows * _ceil(cols * WEIGHT_BYTES, hw.addr_offset)


@dataclass(frozen=True)
class PassCost:
    """One expert pass's cycles on a chip: ``shared`` (cycles of the chip's HBM a pass takes when the HBM is the
    limit) and ``alone`` (cycles a pass takes with the HBM to itself); both in cycles."""

    shared: int
    alone: int


def pass_cycles_shared(model: MoEModel, tile_f: int, hw: Hardware) -> int:
    """Cycles of HBM one pass over an expert's weights takes at the HBM's peak (cycles): its requests (up and gate:
    ``F / tile_f`` tiles of ``D x tile_f``; down: as many of ``tile_f x D``) over the peak request rate of
    ``hbm_channels / hbm_init_interval`` requests per cycle (one request of ``addr_offset`` bytes per channel every
    ``hbm_init_interval`` cycles). Qwen3-30B-A3B on step-eval (D 2048, F 768, tile_f 64): 36 tiles of 4,096
    requests over 16 a cycle, 9,216 cycles.

    >>> from stepsim.base.hardware import Hardware
    >>> pass_cycles_shared(MoEModel("qwen", 2048, 768, 128, 8), 64, Hardware.preset("step-eval"))
    9216
    """
    d, n_f = model.hidden, model.intermediate // tile_f
    requests = n_f * (2 * tile_requests(d, tile_f, hw) + tile_requests(tile_f, d, hw))
    return _ceil(requests * hw.hbm_init_interval, hw.hbm_channels)


def pass_cycles_alone(model: MoEModel, tile_n: int, tile_f: int, compute_bw: int, hw: Hardware) -> int:
    """Cycles one pass takes with the HBM to itself (cycles): ``F / tile_f`` times the slowest of its per-tile
    paces, and never less than :func:`pass_cycles_shared` (the HBM's peak).

    * a load unit: one request per tick for the tile's requests, then the last one's round trip (taken at the
      next tick, ``hbm_start_up + hbm_latency`` on its channel, received a cycle later): ``requests + 2 +
      hbm_start_up + hbm_latency`` cycles a tile, one tile in flight;
    * a matmul: the larger of reading the weight tile from on-chip memory (``D x tile_f x 2`` bytes at ``pmu_bw``
      bytes/cycle) and its ``2 x tile_n x D x tile_f`` FLOPs at ``compute_bw`` FLOPs/cycle.

    Qwen3-30B-A3B on step-eval (tile_n 32, tile_f 64, 4,096 FLOPs/cycle): 12 x max(4,096 + 18, 4,096, 2,048) =
    49,368 cycles.

    >>> from stepsim.base.hardware import Hardware
    >>> pass_cycles_alone(MoEModel("qwen", 2048, 768, 128, 8), 32, 64, 4096, Hardware.preset("step-eval"))
    49368
    """
    d, n_f = model.hidden, model.intermediate // tile_f
    load = max(tile_requests(d, tile_f, hw), tile_requests(tile_f, d, hw)) + 2 + hw.hbm_start_up + hw.hbm_latency
    read = _ceil(d * tile_f * WEIGHT_BYTES, hw.pmu_bw)
    flops = _ceil(2 * tile_n * d * tile_f, compute_bw)
    return max(n_f * max(load, read, flops), pass_cycles_shared(model, tile_f, hw))


def pass_cost(model: MoEModel, tile_n: int, tile_f: int, compute_bw: int, hw: Hardware) -> PassCost:
    """Both figures of one pass (:func:`pass_cycles_shared`, :func:`pass_cycles_alone`)."""
    return PassCost(pass_cycles_shared(model, tile_f, hw), pass_cycles_alone(model, tile_n, tile_f, compute_bw, hw))


def chip_cycles(tiles, cost: PassCost) -> int:
    """Modelled cycles of a chip whose experts hold ``tiles`` token tiles each (module docstring):
    ``sum over j of max(n_j x cost.shared, cost.alone)``, ``n_j`` the experts with at least j tiles (cycles).

    Two one-tile experts share the HBM for a pass; a two-tile expert's second pass runs alone:

    >>> chip_cycles([2, 1, 0], PassCost(shared=9216, alone=49368))
    98736
    >>> chip_cycles([1] * 33, PassCost(shared=9216, alone=49368))
    304128
    """
    levels = [0] * (max((int(t) for t in tiles), default=0) + 1)
    for t in tiles:
        levels[int(t)] += 1
    total, running = 0, 0
    for j in range(len(levels) - 1, 0, -1):  # n_j = experts with at least j tiles
        running += levels[j]
        total += max(running * cost.shared, cost.alone)
    return total


def placement_cycles(tiles, chip_of: list[int], chips: int, cost: PassCost) -> list[int]:
    """Modelled cycles of every chip (:func:`chip_cycles` of its experts' ``tiles``); the placement's modelled
    time is the largest."""
    mine = [[] for _ in range(chips)]
    for e, chip in enumerate(chip_of):
        mine[chip].append(int(tiles[e]))
    return [chip_cycles(t, cost) for t in mine]


@dataclass(frozen=True)
class RaggedCost:
    """Dynamic tiling (``--tiling dynamic``): an expert with ``r`` token rows makes one pass over its weights with
    one ragged tile of ``r`` rows. ``shared`` is :func:`pass_cycles_shared` (the weights do not depend on ``r``);
    the pass alone is ``n_f`` weight tiles at the slower of ``pace`` (a load unit's tile or a matmul's on-chip
    read, cycles) and the tile's ``flops_per_row x r`` FLOPs at ``compute_bw`` FLOPs/cycle, never under
    ``shared`` (:meth:`alone`). All in cycles."""

    shared: int
    n_f: int
    pace: int
    flops_per_row: int
    compute_bw: int
    #: cycles a token row (``D`` values at 2 bytes) takes on the slowest link, and the largest link latency: the
    #: combine's rows wait for the last passes (:func:`ragged_cycles`)
    row_cycles: int = 0
    link_latency: int = 0

    def alone(self, rows: int) -> int:
        """Cycles the pass of an expert with ``rows`` token rows takes with the HBM to itself (0: no tokens, no
        pass)."""
        if rows <= 0:
            return 0
        return max(self.n_f * max(self.pace, _ceil(self.flops_per_row * rows, self.compute_bw)), self.shared)


def ragged_cost(model: MoEModel, tile_f: int, compute_bw: int, hw: Hardware, link_bandwidth: int = 0,
                link_latency: int = 0) -> RaggedCost:
    """:class:`RaggedCost` of ``model``'s experts: the figures of :func:`pass_cycles_alone` with the tile's rows
    left as a parameter, and a token row's cycles on a link of ``link_bandwidth`` bytes/cycle (0: links left
    out). Qwen3-30B-A3B on step-eval, dynamic tiling (6,400 FLOPs/cycle): shared 9,216 cycles, a
    weight tile paced by its load (4,114 cycles) up to 100 rows, by its FLOPs (40.96 a row) above.

    >>> from stepsim.base.hardware import Hardware
    >>> c = ragged_cost(MoEModel("qwen", 2048, 768, 128, 8), 64, 6400, Hardware.preset("step-eval"))
    >>> c.shared, c.alone(1), c.alone(100), c.alone(200)
    (9216, 49368, 49368, 98304)
    """
    d, n_f = model.hidden, model.intermediate // tile_f
    load = max(tile_requests(d, tile_f, hw), tile_requests(tile_f, d, hw)) + 2 + hw.hbm_start_up + hw.hbm_latency
    read = _ceil(d * tile_f * WEIGHT_BYTES, hw.pmu_bw)
    row = _ceil(d * WEIGHT_BYTES, link_bandwidth) if link_bandwidth else 0
    return RaggedCost(pass_cycles_shared(model, tile_f, hw), n_f, max(load, read), 2 * d * tile_f, compute_bw,
                      row, link_latency if link_bandwidth else 0)


def ragged_chip_cycles(alone, shared: int) -> int:
    """Modelled cycles of a chip's passes whose experts' single passes take ``alone`` cycles each by themselves (0:
    an expert without tokens): all share the HBM, so they take ``max(n x shared, max alone)`` with ``n`` passes
    (the fluid model of the module docstring with one phase; a pass slower alone than its share of the HBM keeps
    its own pace and the others use the rest).

    >>> ragged_chip_cycles([49368, 49368, 0], 9216), ragged_chip_cycles([98304] + [49368] * 11, 9216)
    (49368, 110592)
    """
    alone = [int(a) for a in alone]
    return max(sum(1 for a in alone if a) * shared, max(alone, default=0))


def dispatch_cycles(rows_from, chip: int, cost: RaggedCost) -> int:
    """Cycles a chip's busiest link takes with dynamic tiling: ``rows_from[i]`` token rows come from chip i's shard
    of the batch and go back after the passes, each shard over its own link (fully connected; a chip's own rows
    take none): the most rows of one link times ``cost.row_cycles`` plus ``cost.link_latency`` (0 when no row
    crosses a link).

    >>> c = RaggedCost(9216, 12, 4114, 262144, 6400, row_cycles=64, link_latency=500)
    >>> dispatch_cycles([30, 100, 12], 1, c), dispatch_cycles([0, 7, 0], 1, c)
    (2420, 0)
    """
    crossing = max((int(r) for i, r in enumerate(rows_from) if i != chip), default=0)
    return crossing * cost.row_cycles + cost.link_latency if crossing else 0


def _ragged_chips(tokens, rows, chip_of: list[int], chips: int, cost: RaggedCost) -> tuple[list[int], list[int]]:
    """Every chip's passes (:func:`ragged_chip_cycles`) and its busiest inbound link (:func:`dispatch_cycles`)."""
    alone = [[] for _ in range(chips)]
    inbound = [[0] * chips for _ in range(chips)]
    for e, chip in enumerate(chip_of):
        alone[chip].append(cost.alone(int(tokens[e])))
        for i in range(chips):
            inbound[chip][i] += int(rows[e][i])
    return ([ragged_chip_cycles(alone[c], cost.shared) for c in range(chips)],
            [dispatch_cycles(inbound[c], c, cost) for c in range(chips)])


def ragged_placement_cycles(tokens, rows, chip_of: list[int], chips: int, cost: RaggedCost) -> list[int]:
    """Every chip's modelled cycles with dynamic tiling, the search's figure: :func:`ragged_chip_cycles` of its
    experts' passes (alone cycles from their ``tokens``), then its busiest link's rows once
    (:func:`dispatch_cycles`; ``rows[e][i]``: rows chip i's shard sends expert e): the combine sends them back
    over the reverse link after the passes, while the dispatch runs under them (an expert's rows arrive in token
    order while the other experts' passes hold the HBM). The placement's modelled time is :func:`ragged_cycles`.

    >>> c = RaggedCost(10, 1, 30, 0, 1, row_cycles=2, link_latency=5)
    >>> ragged_placement_cycles([3, 2, 3], [[2, 1], [0, 2], [3, 0]], [0, 1, 1], 2, c)
    [37, 41]
    """
    passes, links = _ragged_chips(tokens, rows, chip_of, chips, cost)
    return [p + link for p, link in zip(passes, links)]


def ragged_cycles(tokens, rows, chip_of: list[int], chips: int, cost: RaggedCost) -> int:
    """A placement's modelled cycles with dynamic tiling: the latest chip's passes, then the busiest link's rows of
    any chip (each home chip's Reassemble takes its rows in token order, so the combine's rows wait for the last
    passes of every chip; docs/system.md, "The cost model with dynamic tiling").

    >>> c = RaggedCost(10, 1, 30, 0, 1, row_cycles=2, link_latency=5)
    >>> rows = [[1, 0]] * 4 + [[9, 0]]  # chip 0: four passes (40 cycles); chip 1: 9 rows of shard 0 (23)
    >>> chip_of = [0, 0, 0, 0, 1]
    >>> ragged_placement_cycles([1] * 5, rows, chip_of, 2, c), ragged_cycles([1] * 5, rows, chip_of, 2, c)
    ([40, 53], 63)
    """
    passes, links = _ragged_chips(tokens, rows, chip_of, chips, cost)
    return max(passes, default=0) + max(links, default=0)
