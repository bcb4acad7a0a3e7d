"""The parallelization axes of ``stepsim optimize``: candidates on several chips under a chip-count budget.

``--max-chips N`` (``max_chips``) adds the parallel axes the workload kind declares
(:attr:`stepsim.workloads.kind.WorkloadKind.parallel`; the MoE layer: ``tp`` and ``ep``) to its search space and
makes the chip count a fourth objective of the front (with cycles, on-chip bytes and allocated compute: a
candidate on more chips must be faster or leaner to stay on the front). A candidate is a triple ``(tp, ep, pp)``
(1 = the axis unused) with ``tp x ep x pp <= N`` (:func:`parallel_combos`):

* ``ep``: the divisors of the expert count E from 2 up to N (each chip, or group of ``tp`` chips, holds E / ep
  experts), with every ``placement``: ``contiguous``, ``round-robin``, ``load-balanced``
  (:mod:`stepsim.workloads.moe.parallel`);
* ``tp``: the chip counts 2 .. N that divide the batch and the (shared) intermediate size: every expert's
  columns split over ``tp`` chips, an all-reduce after; each grid keeps only its ``tile_f`` values that split
  into ``tp`` blocks of whole tiles, and no time-multiplexed ``regions`` (the builder refuses both with ``tp``);
  with ``ep`` too, the batch must split into ``tp x ep`` equal parts (``--tp N --ep M``);
* ``pp``: the divisors of the fixed ``layers`` knob from 2 up to N, for a kind that declares it (``swiglu``,
  ``moe``, ``decoder``); a stack of ``layers > 1`` takes no ``tp`` (every stack refuses it) and ``ep`` where
  the stack builds it (``pp x ep``: each stage's layers expert-parallel over its ``ep`` chips;
  the MoE stack, :func:`stepsim.workloads.sharding.expert_parallel`, and an MoE model's decoder stack,
  ``decoder/many_chips.py``'s ``expert_parallel_decoder``, its ``ep`` constrained as the decoder layer's below; a dense
  decoder stack's candidates are pipelines alone), each with the
  stack's micro-batch counts (:mod:`stepsim.optimize.stack`); without ``--system`` each runs on the default
  fully connected chips written into ``OUT/systems/`` (:func:`default_pipeline_systems`);
* the decoder layer (``tp``, ``ep``): searched in its second stage (the FFN grid with the attention strategies the
  one-chip first stage keeps), ``tp`` also dividing its KV heads, ``ep`` and ``tp x ep`` dividing them or a
  multiple of them, ``ep`` dividing the batch (the attention's reduce-scatter cuts equal shards)
  (:mod:`stepsim.workloads.decoder.many_chips`);
* the tile axes of the single-chip space (:func:`stepsim.optimize.space.default_moe_grids`), its
  time-multiplexed ``regions`` kept where they are a multiple of ``ep`` (each chip time-multiplexes its experts
  on ``regions / ep`` regions, :func:`stepsim.workloads.moe.parallel.region_members`).

A candidate's chip count is the product of its parallel knobs (:data:`PARALLEL_KNOBS`).

The chips and links: with ``--system FILE`` (a preset or a system file, docs/system.md) a candidate on n chips
runs on that system scaled to n chips: same hardware, topology, link bandwidth and latency (a one-dimension
system; ``ring-8`` gives rings of 2 and 4). The scaled systems are written as system files into
``OUT/systems/`` (:func:`system_for`), so every candidate's ``stepsim run`` command line reproduces it. A
system of several dimensions or custom links cannot be scaled: its own chip count is the only one searched
besides one chip. Without ``--system`` the chips are fully connected with the default links of ``--ep``.
The single-chip candidates then run on the system's hardware (``hardware`` knob).

The search stays exact (:mod:`stepsim.optimize.search`): a multi-chip candidate's cycle bound is the roofline
over *all* its chips' HBMs (``ceil(off_chip_bytes / (chips x HBM bytes/cycle))``, since each chip has its own)
and compute units, the busiest chip's per-unit bounds (each HBM channel, load and compute unit is on one
chip), and the busiest link's elements back to back plus its latency
(:func:`stepsim.analysis.bounds.link_cycles`): each a bound that no run beats, so their maximum is one too.
"""

from __future__ import annotations

from pathlib import Path

from stepsim.base.errors import ConfigError

#: knobs whose product is a candidate's chip count (each unset knob counts 1)
PARALLEL_KNOBS = ("tp", "ep", "pp")
#: the expert placements searched
PLACEMENTS = ("contiguous", "round-robin", "load-balanced")
#: topologies a system can be scaled to another chip count in (one dimension)
SCALABLE_TOPOLOGIES = ("ring", "fully-connected", "switch")
#: sub-folder of the output folder that holds the scaled system files
SYSTEMS_DIR = "systems"


def chip_count(config: dict) -> int:
    """Chips a candidate runs on: the product of its :data:`PARALLEL_KNOBS` (1 when none is set)."""
    n = 1
    for knob in PARALLEL_KNOBS:
        value = config.get(knob)
        if value is not None:
            n *= int(value)
    return n


def chip_counts(experts: int, max_chips: int, system=None) -> list[int]:
    """The expert-parallel chip counts searched: divisors of ``experts`` in ``2 .. max_chips``; only the
    system's own chip count (if within the budget) for a system that cannot be scaled."""
    counts = [n for n in range(2, min(experts, max_chips) + 1) if experts % n == 0]
    if system is not None and not scalable(system):
        counts = [n for n in counts if n == system.chips]
    return counts


def scalable(system) -> bool:
    """Whether ``system`` can be scaled to another chip count: one dimension of a scalable topology."""
    return len(system.dimensions) == 1 and system.dimensions[0].topology in SCALABLE_TOPOLOGIES


def system_for(system, spec: str, chips: int, out: Path) -> str:
    """The system spec of a candidate on ``chips`` chips: ``spec`` itself (a preset name, or the file's absolute
    path) when the system has that many chips, else the path of ``OUT/systems/<name>-<chips>.toml``, the system
    scaled to ``chips`` (written atomically; same hardware, topology and link figures)."""
    if chips == system.chips:
        return spec if not Path(spec).is_file() else Path(spec).resolve().as_posix()
    if not scalable(system):  # chip_counts searched only the system's own count
        raise ConfigError(f"system {system.name!r} has several dimensions or custom links; it cannot be scaled "
                          f"to {chips} chips")
    return system_file(system, chips, out)


def system_for_default(chips: int, out: Path) -> str:
    """The path of ``OUT/systems/fully-connected-<chips>.toml``: the system ``--ep`` and ``--tp`` run on without
    ``--system`` (:func:`stepsim.workloads.chips.chips_system`), for a knob (``--pp``) that needs one named."""
    from stepsim.workloads.chips import chips_system

    return system_file(chips_system(chips, None, "--pp"), chips, out)


def system_file(system, chips: int, out: Path) -> str:
    """Write ``system`` with ``chips`` chips (one dimension: same hardware, topology and links) into
    ``OUT/systems/`` atomically, unless the same text is there; its absolute path. The system's name is free text
    (a file's ``name`` key): it becomes a file name only through :func:`~stepsim.base.files.safe_stem` (one path
    component inside ``OUT/systems/``) and TOML text only through :func:`~stepsim.base.files.toml_string`."""
    from stepsim.base.files import atomic_output, safe_stem, toml_string

    name = system.name if chips == system.chips else f"{system.name}-{chips}"
    dim = system.dimensions[0]
    path = (Path(out) / SYSTEMS_DIR / f"{safe_stem(name)}.toml").resolve()
    text = (f"# {toml_string(system.name)} scaled to {chips} chips by stepsim optimize --max-chips\n"
            f"name = {toml_string(name)}\nchips = {chips}\nhardware = {toml_string(system.hardware_spec)}\n"
            f"topology = {toml_string(dim.topology)}\nlink_bandwidth = {dim.link_bandwidth}\n"
            f"link_latency = {dim.link_latency}\n")
    if not path.is_file() or path.read_text() != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_output(path) as tmp:
            tmp.write_text(text)
    return path.as_posix()


def parallel_combos(axes, max_chips: int, *, experts: int, widths, batch: int, layers: int = 1, heads: int = 0,
                    system=None, stack_ep: bool = False) -> list[dict]:
    """The ``{axis: chips}`` of every multi-chip candidate (module docstring), fewest chips first (ties: ``ep``
    alone, then more ``tp``, then ``pp``). ``axes``: the kind's parallel axes; ``widths``: the column counts
    ``tp`` must divide (zero widths ignored); ``batch``: tokens; ``layers``: the stack's layers (``pp``);
    ``heads``: KV heads ``tp`` must divide too (the decoder's attention; 0: none, the MoE layer); with heads,
    ``ep`` and ``tp x ep`` divide the KV heads or are a multiple of them, and ``ep`` divides the batch (the
    decoder's ``--ep``, whose attention splits the KV heads over every chip). ``stack_ep``: a stack of ``layers``
    > 1 builds ``--ep`` (the MoE stack, :func:`stepsim.workloads.sharding.expert_parallel`; an MoE model's decoder stack,
    ``decoder/many_chips.py``'s ``expert_parallel_decoder``), so its candidates are ``pp x ep`` (never ``tp``: every stack
    refuses it); otherwise a stack's candidates are pipelines alone.

    >>> parallel_combos(("tp", "ep"), 4, experts=8, widths=(64,), batch=24)
    [{'ep': 2}, {'tp': 2}, {'ep': 4}, {'tp': 2, 'ep': 2}, {'tp': 4}]
    """
    values = {"ep": [n for n in chip_counts(experts, max_chips)
                     if not heads or ((heads % n == 0 or n % heads == 0) and batch % n == 0)]
              if "ep" in axes else [],
              "tp": [n for n in range(2, max_chips + 1)
                     if batch % n == 0 and (heads or n) % n == 0 and all(w % n == 0 for w in widths if w)]
              if "tp" in axes else [],
              "pp": [n for n in range(2, max_chips + 1) if layers % n == 0] if "pp" in axes else []}
    if layers > 1:  # a stack: every stack refuses --tp; --ep only where the stack builds it (stack_ep)
        values["tp"] = []
        if not stack_ep:
            values["ep"] = []
    combos = []
    for tp in [1, *values["tp"]]:
        for ep in [1, *values["ep"]]:
            for pp in [1, *values["pp"]]:
                chips = tp * ep * pp
                if chips == 1 or chips > max_chips or (tp > 1 and ep > 1 and (
                        batch % (tp * ep) or (heads and heads % chips and chips % heads))):
                    continue
                if system is not None and not scalable(system) and chips != system.chips:
                    continue
                combos.append({k: v for k, v in (("tp", tp), ("ep", ep), ("pp", pp)) if v > 1})
    return sorted(combos, key=lambda c: (chip_count(c), -c.get("ep", 1), c.get("pp", 1)))


def _fit(grid: dict, combo: dict, widths) -> dict | None:
    """``grid`` restricted to what ``combo`` can build (module docstring), with its parallel knobs; None if
    nothing is left."""
    grid = dict(grid)
    tp, ep = combo.get("tp", 1), combo.get("ep", 1)
    if "regions" in grid:
        if tp > 1:
            return None
        grid["regions"] = tuple(r for r in grid["regions"] if r % ep == 0)
        if not grid["regions"]:
            return None
    if tp > 1 and "tile_f" in grid:
        grid["tile_f"] = tuple(f for f in grid["tile_f"] if all(w % (tp * f) == 0 for w in widths if w))
        if not grid["tile_f"]:
            return None
    grid.update({k: (v,) for k, v in combo.items()})
    if ep > 1:
        grid["placement"] = PLACEMENTS
    return grid


def parallel_grids(tile_grids: list[dict], max_chips: int, *, axes=("ep",), experts: int, widths=(), batch: int = 1,
                   layers: int = 1, heads: int = 0, system=None, stack_ep: bool = False) -> list[dict]:
    """The space under a chip budget (module docstring): ``tile_grids`` on one chip, then for every combination of
    :func:`parallel_combos` the tile grids it can build, with its parallel knobs (and the placements with
    ``ep``)."""
    grids = [dict(g) for g in tile_grids]
    for combo in parallel_combos(axes, max_chips, experts=experts, widths=widths, batch=batch, layers=layers,
                                 heads=heads, system=system, stack_ep=stack_ep):
        grids += [g for g in (_fit(grid, combo, widths) for grid in tile_grids) if g is not None]
    return grids


def default_pipeline_systems(grids: list[dict], out: Path) -> list[dict]:
    """``grids`` without ``--system``: a grid with ``pp`` is split by its values, each on the default system of that
    many chips (``pp x ep`` with a MoE stack's ``ep``; :func:`system_for_default`; ``--pp`` itself has no default
    system, so the candidate's command names the file)."""
    placed = []
    for grid in grids:
        if "pp" not in grid or "system" in grid:
            placed.append(grid)
            continue
        ep = grid.get("ep", (1,))
        assert len(ep) == 1, "_fit gives one ep value per grid"
        placed += [{**grid, "pp": (pp,), "system": (system_for_default(pp * ep[0], out),)} for pp in grid["pp"]]
    return placed


def on_system(grids: list[dict], system, spec: str, out: Path) -> list[dict]:
    """``grids`` on ``system``: a grid without a parallel knob runs on one chip of the system's hardware; a grid
    with some is split by their values, each on the system scaled to their product (:func:`system_for`)."""
    import itertools

    placed = []
    for grid in grids:
        knobs = [k for k in PARALLEL_KNOBS if k in grid]
        if not knobs:
            placed.append({**grid, "hardware": (system.hardware_spec,)})
            continue
        for values in itertools.product(*(grid[k] for k in knobs)):
            combo = dict(zip(knobs, values))
            placed.append({**grid, **{k: (v,) for k, v in combo.items()},
                           "system": (system_for(system, spec, chip_count(combo), out),)})
    return placed
