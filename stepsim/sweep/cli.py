"""``stepsim sweep SWEEP.toml``: run every point of a sweep file in parallel, resumably.

Exit status: 0 when every task of the sweep has an ok row; 1 when the sweep completed but some tasks failed
(their errors are rows of the dataset, ``status = 'failed'``); 2 on an error (bad sweep file, a worker that
died, a ``--fail-fast`` stop); 130 on Ctrl-C. After a stop, running the same command again resumes.
"""

from __future__ import annotations

import argparse
import sys

from stepsim.sweep.executors import EXECUTORS


def register(subparsers) -> None:
    """Add ``stepsim sweep`` to the top-level subparsers."""
    p = subparsers.add_parser(
        "sweep", help="run a parameter sweep from a TOML file (parallel, resumable)",
        description="Expand a sweep file into tasks, skip those whose result file exists, run the rest in "
                    "parallel and write one Parquet row per task into a hive-partitioned folder. "
                    "Sweep file format: see stepsim.sweep.config.",
        epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("sweep_file", metavar="SWEEP.toml", help="the sweep file")
    p.add_argument("--jobs", "-j", type=int, metavar="N",
                   help="worker processes (default: the CPUs available); local executor and local Dask cluster")
    p.add_argument("--executor", choices=EXECUTORS,
                   help="local worker processes (default) or a dask.distributed cluster (default with --address)")
    p.add_argument("--address", metavar="ADDR",
                   help="Dask scheduler address (tcp://host:8786); without it --executor dask starts a local "
                        "cluster on 127.0.0.1")
    p.add_argument("--out", metavar="DIR", help="output folder (default: the sweep file's 'out')")
    p.add_argument("--fail-fast", action="store_true",
                   help="stop at the first failed task (its row is written) with exit status 2")
    p.add_argument("--retry-failed", action="store_true",
                   help="run again the tasks whose recorded row says failed (default: they count as done)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(handler=_sweep)


def _sweep(args) -> int:
    from stepsim.errors import ConfigError
    from stepsim.sweep.config import load_sweep
    from stepsim.sweep.runner import SweepStopped, run_sweep
    from stepsim.sweep.summary import format_summary

    executor = args.executor or ("dask" if args.address else "local")
    if args.address and executor != "dask":
        raise ConfigError("--address is only for --executor dask")
    spec = load_sweep(args.sweep_file)
    try:
        report = run_sweep(spec, out=args.out, executor=executor, jobs=args.jobs, address=args.address,
                           fail_fast=args.fail_fast, retry_failed=args.retry_failed,
                           progress=not args.no_progress)
    except KeyboardInterrupt:  # before any task ran (expanding, hashing traces, starting workers)
        print("stepsim: interrupted before any task finished", file=sys.stderr)
        return 130
    except SweepStopped as stop:
        print(format_summary(stop.report))
        if stop.reason == "interrupted":
            print(f"stepsim: {stop}", file=sys.stderr)
            return 130
        raise  # printed by stepsim.cli as "stepsim: error: ..." with exit status 2
    print(format_summary(report))
    return 1 if report.failed else 0
