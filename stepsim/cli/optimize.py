"""``stepsim optimize WORKLOAD [run flags] [--objective ...] [--max-on-chip BYTES] [--max-compute FLOPS] [--max-chips N] --out DIR``.

Prints the Pareto front, the recommended configuration and the ``stepsim run`` command line that reproduces
it (``--json``: one JSON object with the keys ``pareto``, ``recommended``, ``candidates``,
``pruned_symbolically``, ``simulations``); writes ``pareto.parquet``, ``candidates.parquet``, ``pareto.png``
and ``optimize.json`` into ``--out`` (:mod:`stepsim.optimize.output`). Running the same command again into
the same folder resumes (finished evaluations and simulations are read back). Exit status 2 on an error
(a budget no candidate fits names the smallest candidate).

``--max-chips N`` (MoE, decoder) adds the parallel axes the kind declares: tensor and expert parallelism
(``tp x ep <= N`` chips; ``ep`` on the divisors of the expert count, each with the three placements; the decoder:
``tp`` in its FFN stage; with ``--layers L``, pipeline stages alone: ``pp`` on the divisors of L), on ``--system``'s chips
scaled to that count (default: fully connected chips); the chip count becomes a fourth objective of the front
(stepsim/optimize/chips.py).
"""

from __future__ import annotations

import argparse

from stepsim.base.ranges import json_text
from stepsim.batch.executors import EXECUTORS


def register(subparsers) -> None:
    """Add ``stepsim optimize`` to the top-level subparsers."""
    from stepsim.cli.args import add_force_argument, add_jobs_argument, add_workload_arguments
    from stepsim.optimize.search import OBJECTIVES
    from stepsim.optimize.space import OPTIMIZE_WORKLOADS

    p = subparsers.add_parser(
        "optimize", help="search tilings, time-multiplexing and parallelization for the Pareto front",
        description="Evaluate every schedule of the search space symbolically, prune with exact on-chip / "
                    "compute figures and a roofline lower bound on cycles, simulate the rest in parallel, and "
                    "report the Pareto front over (cycles, on-chip bytes, allocated compute).",
        epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    add_workload_arguments(p, OPTIMIZE_WORKLOADS)
    p.add_argument("--objective", choices=tuple(OBJECTIVES), default="cycles",
                   help="what the recommendation minimizes first (default: cycles; ties by the other two)")
    p.add_argument("--max-on-chip", type=int, metavar="BYTES", help="on-chip memory budget (bytes; default: none)")
    p.add_argument("--max-compute", type=int, metavar="FLOPS_PER_CYCLE",
                   help="allocated compute budget (FLOPs/cycle; default: none)")
    p.add_argument("--max-chips", type=int, metavar="N",
                   help="chip-count budget: search tensor and expert parallelism and the placement up to N chips "
                        "in all (MoE; the decoder: tensor parallelism; default: one chip)")
    p.add_argument("--space", metavar="SPACE.toml",
                   help="search space file ([[axes]] tables as in a sweep file; default: the documented space)")
    add_jobs_argument(p, "the simulations", dask=True)
    add_force_argument(p)
    p.add_argument("--executor", choices=EXECUTORS, help="local worker processes (default) or dask")
    p.add_argument("--address", metavar="ADDR", help="Dask scheduler address (with --executor dask; default: a local cluster)")
    p.add_argument("--hierarchical", action="store_true",
                   help="an .onnx model: search tile_m with each MatMul's tile_n, then fusion per value "
                        "under each tiling, pruned soundly (the exhaustive front; "
                        "stepsim.optimize.onnx_hierarchy) instead of tile_m x one global tile_n")
    p.add_argument("--out", metavar="DIR", required=True, help="output folder (resumes a search found there)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(handler=_optimize, out_kind="dir")
    from stepsim.cli.help_topics import group_options

    group_options(p, "optimize")


#: the optimize flags an .onnx model's tile search has no use for, with why (each refused in one line)
ONNX_IGNORED = {
    "max_chips": "the tile search runs on one chip (no tensor or expert parallelism of a lowered model)",
    "space": "the tile search builds its own space from the model's shapes (tile_m x tile_n, fusion)",
    "max_compute": "every tiling of a lowered model allocates the same compute (compute_bw per node)",
    "jobs": "the tile search simulates in this process, one tiling after another",
    "executor": "the tile search simulates in this process",
    "address": "the tile search simulates in this process",
    "force": "the tile search never simulates past the run-size limit (10^9 engine events)",
}
#: the run flags (config knobs) it honours: the model, its routing trace, fusion off, the hardware
ONNX_KNOBS = {"workload", "program", "trace", "iteration", "layer", "no_fuse", "spill", "hardware"}


def onnx_search_flags(args):
    """The flags of ``stepsim optimize model.onnx`` checked before any work: the shared checks of every workload
    command (a run flag that does not apply to an .onnx model is named, as ``stepsim run`` names it), then each
    flag the tile search would ignore refused in one line naming it; returns the routing (``--trace``, or the
    routers' own choice)."""
    from stepsim.base.errors import ConfigError
    from stepsim.cli.args import config_from_args
    from stepsim.frontend import RoutingTrace
    from stepsim.workloads.config import COMMAND_LINE, normalize_config

    config = config_from_args(args)
    cfg = normalize_config(config, source=COMMAND_LINE)
    for key, why in ONNX_IGNORED.items():
        value = getattr(args, key)
        if value is not None and value is not False:  # `0 in (None, False)` is true: --max-compute 0 slipped by
            raise ConfigError(f"--{key.replace('_', '-')} does not apply to optimize of an .onnx model: {why}")
    for key in config:
        if key not in ONNX_KNOBS:
            raise ConfigError(f"--{key.replace('_', '-')} does not apply to optimize of an .onnx model: the tile "
                              f"search takes the model, --trace, --no-fuse and --hardware")
    if args.spill is not None:  # the search decides fusion per value; --no-fuse fixes it
        raise ConfigError("--spill does not apply to optimize: it searches which edges spill (--no-fuse fixes "
                          "every edge spilled)")
    if args.max_on_chip is not None and (args.max_on_chip < 1):
        raise ConfigError(f"--max-on-chip must be an integer >= 1, got {args.max_on_chip}")
    if cfg.get("trace") is None:
        return "teacher"
    return RoutingTrace(cfg["trace"], iteration=cfg.get("iteration"), layer=cfg.get("layer"))


def _optimize_onnx(args) -> int:
    """``stepsim optimize model.onnx``: the tile search of :mod:`stepsim.optimize.onnx_search`; prints the front
    and writes it to ``--out``/optimize.json."""
    from pathlib import Path

    from stepsim.base.files import atomic_output
    from stepsim.optimize.onnx_search import search

    routing = onnx_search_flags(args)
    fuse = not args.no_fuse
    if args.hierarchical:
        from stepsim.optimize.onnx_hierarchy import search as hierarchical

        result = hierarchical(args.workload, routing=routing, hardware=args.hardware, objective=args.objective,
                              max_on_chip=args.max_on_chip, fuse=fuse)
    else:
        result = search(args.workload, routing=routing, hardware=args.hardware, objective=args.objective,
                        max_on_chip=args.max_on_chip, fuse=fuse)
    doc = {"pareto": [dict(p.tiling, cycles=p.cycles, on_chip_bytes=p.on_chip_bytes,
                           allocated_flops_per_cycle=p.allocated_flops_per_cycle) for p in result.front],
           "recommended": None if result.recommended is None else result.recommended.tiling,
           "candidates": len(result.candidates), "simulations": result.simulations}
    if args.hierarchical:
        doc["fusion"] = result.fusion
        doc["pruned"] = result.pruned  # schedules never built: in subtrees a simulated point provably dominates
        doc["unbuilt"] = result.unbuilt  # schedules never built: below one the front end cannot build
        # every tile_m's level-1 decisions (a spill's gain depends on tile_m); JSON keys are strings
        doc["fusion_by_tile_m"] = {str(tm): decisions for tm, decisions in result.fusion_by_tile_m.items()}
    Path(args.out).mkdir(parents=True, exist_ok=True)
    with atomic_output(Path(args.out) / "optimize.json") as tmp:
        tmp.write_text(json_text(doc, indent=1))
    if args.json:
        print(json_text(doc))
        return 0
    print(f"optimize {args.workload} -> {args.out}: {doc['candidates']} tilings, {doc['simulations']} simulated")
    for p in doc["pareto"]:
        tiles = (f"tile_n {p['tile_n'] or 'rows'}" if "tile_n" in p else f"tile_n {p['per_node'] or 'rows'}")
        tiles += ", spilled all (--no-fuse)" if not fuse else f", spilled {p.get('spill') or 'none'}"
        print(f"  tile_m {p['tile_m']}, {tiles}: {p['cycles']:,} cycles, {p['on_chip_bytes']:,} B on chip")
    print(f"recommended ({args.objective}): {doc['recommended']}")
    return 0


def _optimize(args) -> int:
    import sys

    if args.workload.endswith(".onnx"):
        return _optimize_onnx(args)

    from stepsim.base.errors import ConfigError
    from stepsim.base.signals import stopped_status
    from stepsim.batch.executors import check_jobs
    from stepsim.batch.runner import SweepStopped
    from stepsim.cli.args import config_from_args
    from stepsim.optimize import optimize

    if args.hierarchical:
        raise ConfigError(f"--hierarchical applies to an .onnx model (fusion and per-MatMul tiles), got workload "
                          f"{args.workload!r}")
    executor = args.executor or ("dask" if args.address else "local")
    if args.address and executor != "dask":
        raise ConfigError("--address is only for --executor dask")
    if args.jobs is not None:
        check_jobs(args.jobs)
    knobs = {k: v for k, v in config_from_args(args).items() if k != "workload"}
    try:
        result = optimize(args.workload, out=args.out, objective=args.objective, max_on_chip=args.max_on_chip,
                          max_compute=args.max_compute, max_chips=args.max_chips, space=args.space, jobs=args.jobs,
                          executor=executor, address=args.address,
                          progress=not args.no_progress and sys.stderr.isatty(), force=args.force, **knobs)
    except SweepStopped as stop:  # Ctrl-C / SIGTERM inside a round: the finished results are saved
        if stop.reason in ("interrupted", "terminated"):
            status = stopped_status(stop.reason)
            print(f"stepsim: finished evaluations and simulations are saved in {args.out}; run the same command "
                  f"again to resume", file=sys.stderr)
            return status
        raise
    if args.json:
        print(json_text(result.to_json()))
        return 0
    print(format_result(result))
    return 0


def format_result(result) -> str:
    """The text summary: counts, the front (searched knobs, cycles, on-chip bytes, compute), recommendation."""
    lines = [f"optimize {result.workload} -> {result.out}",
             f"  candidates           {result.candidates:,}",
             f"  pruned symbolically  {result.pruned_symbolically:,}",
             f"  simulations          {result.simulations:,} ({result.simulated_now:,} run now, "
             f"{result.rounds} round(s), {result.wall_s:.1f} s)"]
    invalid, proven, failed = (sum(c.status == s for c in result.candidate_list)
                               for s in ("invalid", "deadlock", "failed"))
    if invalid or proven or failed:
        lines.append(f"  not buildable        {invalid:,}; proven to deadlock {proven:,}; "
                     f"failed simulations (e.g. deadlock) {failed:,}")
    chips = result.budgets.get("max_chips") is not None
    lines.append(f"  Pareto front ({len(result.front)} point(s)): cycles, on-chip bytes, FLOPs/cycle"
                 + (", chips" if chips else ""))
    for c in result.front:
        mark = "*" if c is result.recommended else " "
        lines.append(f"  {mark} {c.cycles:>12,} {c.on_chip_bytes:>14,} {c.allocated_flops_per_cycle:>10,}  "
                     + (f"{c.chips:>3}  " if chips else "") + c.label(result.axes))
    if chips:
        lines.append("  fastest per chip count: " + "; ".join(f"{n} chip(s) {p['cycles']:,} cycles"
                                                          for n, p in result.per_chips().items()))
    if result.recommended is not None:
        lines.append(f"  recommended ({result.objective}): {result.recommended.label(result.axes)}")
        lines.append(f"  reproduce: {result.command}")
    else:  # an empty front is an answer: say why, and where the candidates' statuses are
        first = next((c for c in result.candidate_list if c.error), None)
        why = f"; e.g. {first.label(result.axes)}: {first.error}" if first is not None else ""
        lines.append(f"  no candidate completed a simulation: the front is empty, no recommendation (every status "
                     f"is in {result.out / 'candidates.parquet'}{why})")
    if result.plot_skipped:
        lines.append(f"  pareto.png not drawn: {result.plot_skipped}")
    return "\n".join(lines)
