"""Expert placement: which chip runs each expert of the MoE layer under expert parallelism (``--ep N``; the graph:
:mod:`stepsim.workloads.moe.sharded`, placed by the sharding pass, :func:`stepsim.workloads.sharding.expert_parallel`).
A chip's experts receive one token row per (token, expert on that chip) pair.

Placements of E experts on N chips (at most ``ceil(E / N)`` a chip; docs/system.md, "Expert parallelism", gives
the measurements behind each rule): ``contiguous`` (expert e on chip ``e // ceil(E / N)``), ``round-robin``
(``e mod N``), and ``load-balanced``, from the trace, minimizing what a chip's time follows:

* with ``--regions`` (a chip's tiles are its time, whatever its token count): experts greedily, most tiles first,
  onto the chip with the fewest tiles so far, unless the contiguous blocks already reach the least busiest chip
  (``ceil(total tiles / N)``); with dynamic tiling, by tokens alone;
* without (one region per expert; a chip's HBM serves its experts' passes together, so a chip with more tiles can
  finish first): the least modelled busiest chip of :mod:`stepsim.workloads.moe.ep_cost` (static tiling's passes,
  dynamic tiling's ragged model with the busiest link's combine rows; :func:`_least_modelled`), contiguous or
  round-robin kept unless it is modelled at least one shared pass faster.

``--tp N --ep M`` places its expert groups by the same models of the shard (F / N columns a chip).
"""

from __future__ import annotations

from stepsim.base.errors import ArgumentError
from stepsim.base.system import System
from stepsim.workloads.moe.ep_cost import (
    PassCost,
    RaggedCost,
    chip_cycles,
    pass_cost,
    ragged_cost,
    ragged_cycles,
    ragged_placement_cycles,
)

PLACEMENTS = ("contiguous", "round-robin", "load-balanced")


def place_experts(counts, chips: int, placement: str, tile_n: int | None = None,
                  cost: PassCost | RaggedCost | None = None, shard_rows=None) -> list[int]:
    """The chip of every expert (see the module docstring); ``counts`` are the per-expert token counts,
    ``tile_n`` the rows of a static token tile (None: dynamic tiling, balance tokens), ``cost`` one expert
    pass's figures on a chip whose experts each keep their own region (:mod:`stepsim.workloads.moe.ep_cost`;
    None: the tile-first greedy of ``--regions``; a :class:`~stepsim.workloads.moe.ep_cost.RaggedCost` with
    dynamic tiling, ``shard_rows[e][i]`` then the rows chip i's shard sends expert e, None: no links modelled).

    Example
    -------
    >>> place_experts([5, 1, 1, 9], 2, "load-balanced")
    [1, 1, 0, 0]

    With tiles of 4 rows these experts are 2, 3, 2, 1, 2 and 2 tiles. Tokens alone put 20 tokens in 7 tiles on
    chip 0 and 17 in 5 on chip 1; by tiles each chip gets 6 (16 and 21 tokens):

    >>> place_experts([8, 9, 8, 1, 6, 5], 2, "load-balanced")
    [1, 0, 1, 1, 0, 0]
    >>> place_experts([8, 9, 8, 1, 6, 5], 2, "load-balanced", tile_n=4)
    [1, 0, 1, 0, 0, 1]

    Contiguous halves already at the least tiles a chip can have (5 of 9) are kept:

    >>> place_experts([5, 1, 1, 9, 4, 4], 2, "load-balanced", tile_n=4)
    [0, 0, 0, 1, 1, 1]

    With one region per expert (``cost``: a pass takes 10 cycles of a shared HBM, 30 alone) a chip's second
    passes cost 30 cycles for one two-tile expert as for two, so both go on one chip with a one-tile expert (60
    and 40 cycles modelled). Tile-first (five tiles each) splits them (70 and 60), contiguous (70 and 30) and
    round-robin (70 and 60) do too:

    >>> from stepsim.workloads.moe.ep_cost import PassCost
    >>> place_experts([5, 5, 2, 2, 2, 2, 1], 2, "load-balanced", tile_n=4, cost=PassCost(shared=10, alone=30))
    [1, 1, 0, 0, 0, 1, 0]
    >>> place_experts([5, 5, 2, 2, 2, 2, 1], 2, "load-balanced", tile_n=4)
    [0, 1, 0, 1, 0, 1, 0]
    """
    experts = len(counts)
    if placement not in PLACEMENTS:
        raise ArgumentError(f"placement must be one of {', '.join(PLACEMENTS)}, got {placement!r}")
    if isinstance(chips, bool) or not isinstance(chips, int) or chips < 1:
        raise ArgumentError(f"--ep must be a positive int, got {chips!r}")
    if chips > experts:
        raise ArgumentError(f"--ep {chips} places {experts} experts on more chips than experts: a chip without "
                            f"experts has nothing to do (use --ep {experts} or fewer)")
    per_chip = -(-experts // chips)
    if placement == "contiguous":
        return [e // per_chip for e in range(experts)]
    if placement == "round-robin":
        return [e % chips for e in range(experts)]
    tokens = [int(n) for n in counts]
    if tile_n is None:
        if isinstance(cost, RaggedCost):  # one ragged pass per expert with tokens, its own pace by its rows
            rows = [(0,) * chips] * experts if shard_rows is None else [tuple(int(r) for r in x) for x in shard_rows]
            items = [(n, rows[e]) for e, n in enumerate(tokens)]  # a chip's cycles: ragged_placement_cycles

            def ragged(mine, chip):
                chips_of = [chip] * len(mine)  # the chip's experts alone, on their chip
                return ragged_placement_cycles([n for n, _ in mine], [r for _, r in mine], chips_of, chips,
                                               cost)[chip]
            return _least_modelled(items, tokens, chips, per_chip, cost.shared, ragged,
                                   total=lambda chip_of: ragged_cycles(tokens, rows, chip_of, chips, cost))
        tiles = [0] * experts  # dynamic tiling with --regions: the tokens alone
    else:
        tiles = [-(-n // tile_n) for n in tokens]
        if cost is not None:
            return _least_modelled(tiles, tokens, chips, per_chip, cost.shared,
                                   lambda mine, chip: chip_cycles(mine, cost), cost)
        contiguous = [e // per_chip for e in range(experts)]
        if max(chip_tiles(tiles, contiguous, chips)) <= -(-sum(tiles) // chips):
            return contiguous
    load = [(0, 0)] * chips  # (tiles, tokens) so far
    held = [0] * chips
    chip_of = [0] * experts
    for e in sorted(range(experts), key=lambda e: (-tiles[e], -tokens[e], e)):
        chip = min((c for c in range(chips) if held[c] < per_chip), key=lambda c: (load[c], c))
        chip_of[e] = chip
        load[chip] = (load[chip][0] + tiles[e], load[chip][1] + tokens[e])
        held[chip] += 1
    return chip_of


def _least_modelled(tiles: list[int], tokens: list[int], chips: int, per_chip: int, shared: int, cycles_of,
                    cost: PassCost | None = None, total=None) -> list[int]:
    """``load-balanced`` with one region per expert: the placement of least modelled busiest-chip time
    (``cycles_of(items, chip)``: a chip's modelled cycles from its experts' ``tiles``;
    :func:`~stepsim.workloads.moe.ep_cost.chip_cycles` for static tiling, whose ``cost`` gives the blocks start;
    :func:`~stepsim.workloads.moe.ep_cost.ragged_placement_cycles` for dynamic tiling, the ``tiles`` then each
    expert's rows and rows from every shard), at most ``per_chip`` experts a chip; ``shared``: one pass's cycles
    of a shared HBM (the keep rule's margin); ``total(chip_of)``: a placement's modelled cycles where they are not
    its busiest chip's (dynamic tiling: :func:`~stepsim.workloads.moe.ep_cost.ragged_cycles`), for choosing
    between the starts and the keep rule.

    Experts go in the order of most tiles first (ties: more tokens, then lower id). Two starts of a search:

    1. Greedy, longest first: each expert in that order onto the chip whose modelled cycles it leaves least among
       those with room (ties: fewer tokens so far, then lower chip).
    2. Blocks: that order cut into consecutive blocks, block c on chip c, with the least modelled busiest chip
       (:func:`_blocks`). Experts of like tile counts so share a chip: a chip's lone passes cost the same for one
       multi-tile expert as for several.

    Each start is improved (:func:`_improve`); the one of less modelled busiest-chip cycles is taken (ties: the
    greedy). (A variant with contiguous and round-robin as further starts changed five placements of the B=1024
    traces of docs/system.md; the engine ran three faster and two 5-6 % slower, through the combine's tail, which
    the model leaves out.) Contiguous is returned instead when it is modelled less than one shared pass
    (``shared``) slower than the least of the three and no slower than round-robin; else round-robin when it
    is within a shared pass of the least: the model's phases end together, the engine's over thousands of cycles (its HBM
    serves memory units in registration order), so smaller differences are within the model's error
    (docs/system.md, "What sets a chip's time"). So load-balanced is never modelled slower than either.
    """
    experts = len(tiles)
    size = [t if isinstance(t, int) else t[0] for t in tiles]  # dynamic tiling: by rows
    order = sorted(range(experts), key=lambda e: (-size[e], -tokens[e], e))
    greedy = [0] * experts
    load = [0] * chips  # token rows so far (the greedy's tie rule)
    mine: list[list[int]] = [[] for _ in range(chips)]  # tiles of each chip's experts
    for e in order:
        chip = min((c for c in range(chips) if len(mine[c]) < per_chip),
                   key=lambda c: (cycles_of(mine[c] + [tiles[e]], c), load[c], c))
        greedy[e] = chip
        mine[chip].append(tiles[e])
        load[chip] += tokens[e]
    contiguous = [e // per_chip for e in range(experts)]
    round_robin = [e % chips for e in range(experts)]
    best, best_cycles = None, None

    def busiest(chip_of):
        if total is not None:
            return total(chip_of)
        return max(cycles_of([tiles[e] for e in range(experts) if chip_of[e] == c], c) for c in range(chips))

    # the blocks start with static tiling only: with dynamic tiling a block's cycles depend on its chip (its
    # busiest link), and the greedy already evens the passes a chip holds
    for start in (greedy, *(() if cost is None else (_blocks(tiles, order, chips, per_chip, cost),))):
        placed = _improve(tiles, start, chips, per_chip, cycles_of)
        cycles = busiest(placed)
        if best is None or cycles < best_cycles:
            best, best_cycles = placed, cycles
    kept = [busiest(p) for p in (contiguous, round_robin)]
    least = min(best_cycles, *kept)
    if kept[0] < least + shared and kept[0] <= kept[1]:
        return contiguous
    if kept[1] < least + shared:
        return round_robin
    return best


def _blocks(tiles: list[int], order: list[int], chips: int, per_chip: int, cost: PassCost) -> list[int]:
    """``order`` cut into ``chips`` consecutive blocks of at most ``per_chip`` experts (block c on chip c) with the
    least modelled busiest chip; ties: the earliest cut at every step (dynamic programming over the cuts)."""
    experts = len(order)
    block = {}  # (j, i): modelled cycles of order[j:i]
    for j in range(experts):  # extend each block by one expert: cycles as chip_cycles, incrementally
        levels: list[int] = []
        total = 0
        for i in range(j + 1, min(experts, j + per_chip) + 1):
            t = tiles[order[i - 1]]
            levels += [0] * (t - len(levels))
            for k in range(t):  # phase k + 1 gains an expert
                total += max((levels[k] + 1) * cost.shared, cost.alone) - (
                    max(levels[k] * cost.shared, cost.alone) if levels[k] else 0)
                levels[k] += 1
            block[j, i] = total
    inf = float("inf")
    best = [[inf] * (experts + 1) for _ in range(chips + 1)]
    cut = [[0] * (experts + 1) for _ in range(chips + 1)]
    best[0][0] = 0
    for c in range(1, chips + 1):
        for i in range(experts + 1):
            for j in range(max(0, i - per_chip), i + 1):
                value = max(best[c - 1][j], block[j, i] if i > j else 0)
                if value < best[c][i]:
                    best[c][i], cut[c][i] = value, j
    chip_of = [0] * experts
    i = experts
    for c in range(chips, 0, -1):
        j = cut[c][i]
        for e in order[j:i]:
            chip_of[e] = c - 1
        i = j
    return chip_of


def _improve(tiles: list[int], chip_of: list[int], chips: int, per_chip: int, cycles_of) -> list[int]:
    """Local improvement of a placement by the model: while moving one expert off the busiest chip (ties: the
    lowest), or swapping it with one of another chip, leaves both chips below the busiest's cycles, make the best
    such change (least larger cycles of the two chips; ties: lower other chip, a move before a swap, fewer tiles
    moved off, then fewer moved on; the expert moved is the lowest id of its tile count on its chip). Each change
    lowers the chips' cycles sorted largest first (lexicographically), so this ends."""
    chip_of = list(chip_of)
    while True:
        mine = [[tiles[e] for e in range(len(tiles)) if chip_of[e] == c] for c in range(chips)]
        cycles = [cycles_of(m, c) for c, m in enumerate(mine)]
        busiest = max(range(chips), key=lambda c: (cycles[c], -c))
        best = None  # (larger cycles of the two chips, other chip, swap?, tiles off, tiles on), expert off, on
        off = _by_tiles(tiles, chip_of, busiest)
        for other in range(chips):
            if other == busiest:
                continue
            on = _by_tiles(tiles, chip_of, other)
            changes = [(t, None) for t in off] if len(mine[other]) < per_chip else []
            changes += [(t, u) for t in off for u in on if u != t]
            for t, u in changes:
                gone, came = list(mine[busiest]), mine[other] + [t]
                gone.remove(t)
                if u is not None:
                    came.remove(u)
                    gone.append(u)
                larger = max(cycles_of(gone, busiest), cycles_of(came, other))
                key = (larger, other, u is not None, t, -1 if u is None else u)
                if larger < cycles[busiest] and (best is None or key < best[0]):
                    best = (key, off[t], None if u is None else on[u])
        if best is None:
            return chip_of
        (_, other, *_), e, f = best
        chip_of[e] = other
        if f is not None:
            chip_of[f] = busiest


def _by_tiles(tiles: list[int], chip_of: list[int], chip: int) -> dict[int, int]:
    """The lowest expert id of every tile count on ``chip``."""
    first: dict[int, int] = {}
    for e, c in enumerate(chip_of):
        if c == chip and tiles[e] not in first:
            first[tiles[e]] = e
    return first


def expert_cost(model, tile_n: int | None, tile_f: int, compute_bw: int, system: System) -> PassCost | RaggedCost:
    """The cost model of one region per expert for :func:`place_experts`: static tiling's
    :func:`~stepsim.workloads.moe.ep_cost.pass_cost`, dynamic tiling's (``tile_n`` None)
    :func:`~stepsim.workloads.moe.ep_cost.ragged_cost` with the system's slowest link bandwidth and largest
    latency."""
    if tile_n is None:
        links = system.links
        return ragged_cost(model, tile_f, compute_bw, system.hardware, min((ln.bandwidth for ln in links), default=0),
                           max((ln.latency for ln in links), default=0))
    return pass_cost(model, tile_n, tile_f, compute_bw, system.hardware)


def shard_rows(routing, experts: int, chips: int) -> list[list[int]]:
    """``rows[e][i]``: the token rows chip i's shard of the batch (:func:`~stepsim.workloads.moe.sharded.shard_bounds`)
    sends expert e, one per (token, expert) pair of the trace.

    >>> shard_rows([[0, 1], [1, 2], [0, 2], [2, 1]], 3, 2)
    [[1, 1], [2, 1], [1, 2]]
    """
    from stepsim.workloads.moe.sharded import shard_bounds

    bounds = shard_bounds(len(routing), chips)
    rows = [[0] * chips for _ in range(experts)]
    for i in range(chips):
        for token in routing[bounds[i]:bounds[i + 1]]:
            for e in token:
                rows[int(e)][i] += 1
    return rows


def chip_tiles(tiles, chip_of: list[int], chips: int) -> list[int]:
    """Token tiles each chip's experts receive (weight passes): the sum of its experts' ``tiles``."""
    per_chip = [0] * chips
    for e, chip in enumerate(chip_of):
        per_chip[chip] += int(tiles[e])
    return per_chip


def chip_tokens(counts, chip_of: list[int], chips: int) -> list[int]:
    """Token rows each chip's experts receive: the sum of its experts' token counts (from the trace)."""
    tokens = [0] * chips
    for e, chip in enumerate(chip_of):
        tokens[chip] += int(counts[e])
    return tokens


def region_members(chip_of: list[int], chips: int, regions: int) -> list[list[int]]:
    """Time-multiplexed regions with expert parallelism: ``regions / chips`` regions on every chip, numbered chip
    by chip, each taking the next ``experts / regions`` of its chip's experts in id order.

    >>> region_members([0, 1, 0, 1, 1, 0, 0, 1], 2, 4)
    [[0, 2], [5, 6], [1, 3], [4, 7]]
    """
    if regions % chips:
        raise ArgumentError(f"--regions {regions} must be a multiple of --ep {chips}: every chip time-multiplexes "
                            f"its experts on the same number of regions")
    per_chip = regions // chips
    per_region = len(chip_of) // regions
    members = []
    for chip in range(chips):
        mine = [e for e, c in enumerate(chip_of) if c == chip]
        members += [mine[i * per_region:(i + 1) * per_region] for i in range(per_chip)]
    return members
