"""``stepsim size-fifos WORKLOAD [run flags] [--slack 0.01] --out depths.toml [--json]``.

Sizes every FIFO of the workload the flags describe (:func:`stepsim.passes.size_fifos`), writes the depths
file (:mod:`stepsim.graph.depths_file`) and a PNG of FIFO bytes per group beside it (``depths.png`` for
``depths.toml``; skipped with a note when matplotlib is missing), and prints the report: text lines, or with
``--json`` one object with the keys of :data:`stepsim.passes.sizing.REPORT_KEYS` (``cycles``,
``unbounded_cycles``, ``total_fifo_bytes``, ``uniform_fifo_bytes``, ``uniform_depth``, ``lp_fifo_bytes``,
``unbounded_fifo_bytes``, ``simulations``, ``uniform_simulations``, ``channels_changed``). Progress goes to
stderr. Apply the file with ``stepsim run ... --fifo-depths depths.toml`` (or the sweep key ``fifo_depths``).
"""

from __future__ import annotations

import sys
from pathlib import Path

from stepsim.base.errors import ConfigError
from stepsim.base.ranges import json_text


def _size(args) -> int:
    from stepsim.base.files import published_together
    from stepsim.cli.args import config_from_args, jobs_from_args
    from stepsim.passes.depths_writer import write_depths_file
    from stepsim.passes.sizing import size_fifos
    from stepsim.workloads.config import normalize_config

    jobs = jobs_from_args(args)
    if not 0 <= args.slack < 1:
        raise ConfigError(f"--slack must be in [0, 1) (0.01 = 1 %), got {args.slack}")
    if not 1 <= args.min_depth <= 1024:
        raise ConfigError(f"--min-depth must be in 1..1024, got {args.min_depth}")
    config = config_from_args(args)
    normalize_config(config)  # bad flags fail here, before any simulation
    say = None if args.json else (lambda line: print(f"size-fifos: {line}", file=sys.stderr, flush=True))
    result = size_fifos(config, slack=args.slack, jobs=jobs, min_depth=args.min_depth, progress=say)
    # --out was checked before this handler ran (out_kind "file", stepsim.base.outputs); create its folder
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with published_together():  # the depths file and its PNG appear together (a full disk leaves neither)
        out = write_depths_file(result, args.out)
        png = out.with_suffix(".png")
        try:
            from stepsim.passes.plot import plot_fifo_bytes

            plot_fifo_bytes(result, png)
        except ConfigError as exc:  # matplotlib missing: the depths are what matters
            print(f"size-fifos: no PNG: {exc}", file=sys.stderr)
            png = None
    if args.json:
        print(json_text(result.report()))
    else:
        print("\n".join(result.text()))
        print(f"wrote {out}" + (f" and {png}" if png else ""))
    return 0


def register(subparsers) -> None:
    from stepsim.cli.args import add_jobs_argument, add_workload_arguments

    p = subparsers.add_parser(
        "size-fifos", help="size every FIFO: finishes, within --slack of unbounded FIFOs, fewest bytes",
        description="Size each FIFO of a workload on its trace: an LP over start-time offsets (StreamTensor's "
                    "formulation) refined by simulation. Writes a depths file for --fifo-depths.")
    add_workload_arguments(p)
    p.add_argument("--slack", type=float, default=0.01,
                   help="allowed cycle overhead over 1024-deep FIFOs (default 0.01 = 1 %%)")
    p.add_argument("--out", required=True, metavar="FILE", help="depths file to write (e.g. depths.toml)")
    add_jobs_argument(p, "candidate depths simulated at once")
    p.add_argument("--min-depth", type=int, default=1, help="smallest depth of any FIFO (default 1)")
    p.set_defaults(handler=_size, out_kind="file")
    from stepsim.cli.help_topics import group_options

    group_options(p, "size-fifos")


__all__ = ["register"]
