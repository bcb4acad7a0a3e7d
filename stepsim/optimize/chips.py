"""The parallelization axes of ``stepsim optimize``: candidates on several chips under a chip-count budget.

``--max-chips N`` (``max_chips``) adds expert parallelism to the MoE layer's search space and makes the chip
count a fourth objective of the front (with cycles, on-chip bytes and allocated compute: a candidate on more
chips must be faster or leaner to stay on the front):

* ``ep``: the divisors of the expert count E from 2 up to N (each chip holds E / ep experts), plus one chip
  (``ep`` unset, the single-chip layer);
* ``placement``: ``contiguous``, ``round-robin``, ``load-balanced`` (:mod:`stepsim.workloads.moe.parallel`);
* the tile axes of the single-chip space (:func:`stepsim.optimize.space.default_moe_grids`), its
  time-multiplexed ``regions`` kept where they are a multiple of ``ep`` (each chip time-multiplexes its experts
  on ``regions / ep`` regions, :func:`stepsim.workloads.moe.parallel.region_members`).

A candidate's chip count is the product of its parallel knobs (:data:`PARALLEL_KNOBS`: ``ep``, and ``tp``, which
the SwiGLU layer builds but no searched workload takes yet); ``tp`` and ``pp`` join the default axes once the
MoE or decoder layers build them.

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
PARALLEL_KNOBS = ("ep", "tp")
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
    from stepsim.base.files import atomic_output

    if chips == system.chips:
        return spec if not Path(spec).is_file() else Path(spec).resolve().as_posix()
    if not scalable(system):  # chip_counts searched only the system's own count
        raise ConfigError(f"system {system.name!r} has several dimensions or custom links; it cannot be scaled "
                          f"to {chips} chips")
    dim = system.dimensions[0]
    path = (Path(out) / SYSTEMS_DIR / f"{system.name}-{chips}.toml").resolve()
    text = (f"# {system.name} scaled to {chips} chips by stepsim optimize --max-chips\n"
            f"name = \"{system.name}-{chips}\"\nchips = {chips}\nhardware = \"{system.hardware_spec}\"\n"
            f"topology = \"{dim.topology}\"\nlink_bandwidth = {dim.link_bandwidth}\n"
            f"link_latency = {dim.link_latency}\n")
    if not path.is_file() or path.read_text() != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_output(path) as tmp:
            tmp.write_text(text)
    return path.as_posix()


def parallel_grids(tile_grids: list[dict], experts: int, max_chips: int, system=None) -> list[dict]:
    """The MoE space under a chip budget (module docstring): ``tile_grids`` on one chip, then for every chip
    count the tile grids (``regions`` only its multiples of the count) times the placements."""
    grids = [dict(g) for g in tile_grids]
    for n in chip_counts(experts, max_chips, system):
        for grid in tile_grids:
            grid = dict(grid)
            if "regions" in grid:
                grid["regions"] = tuple(r for r in grid["regions"] if r % n == 0)
                if not grid["regions"]:
                    continue
            grids.append({**grid, "ep": (n,), "placement": PLACEMENTS})
    return grids


def on_system(grids: list[dict], system, spec: str, out: Path) -> list[dict]:
    """``grids`` on ``system``: a grid without ``ep`` runs on one chip of the system's hardware; a grid with
    ``ep`` is split by its values, each on the system scaled to that many chips (:func:`system_for`)."""
    placed = []
    for grid in grids:
        if "ep" not in grid:
            placed.append({**grid, "hardware": (system.hardware_spec,)})
            continue
        for n in grid["ep"]:
            placed.append({**grid, "ep": (n,), "system": (system_for(system, spec, n, out),)})
    return placed
