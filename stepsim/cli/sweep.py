"""``stepsim sweep SWEEP.toml``: run every point of a sweep file in parallel, resumably.

Exit status: 0 when every task of the sweep has an ok row; 1 when the sweep completed but some tasks failed
(their errors are rows of the dataset, ``status = 'failed'``); 2 on an error (bad sweep file or flag, a worker
that died, a ``--fail-fast`` stop); 130 on Ctrl-C (SIGINT), 143 on SIGTERM, each after writing the rows of the
finished tasks. After a stop, running the same command again resumes.

A sweep file with ``workload = "serve"`` runs ``stepsim serve`` over a grid of serving knobs instead
(:mod:`stepsim.serve.sweep`): one row per task with the run's summary metrics, resumable the same way.

A grid of more than 10,000 points (or the sweep file's ``max_tasks``) runs only with ``--yes``; ``--dry-run``
prints the task count and the first tasks and runs nothing.
"""

from __future__ import annotations

import argparse

from stepsim.batch.executors import EXECUTORS


def register(subparsers) -> None:
    """Add ``stepsim sweep`` to the top-level subparsers."""
    p = subparsers.add_parser(
        "sweep", help="run a parameter sweep from a TOML file (parallel, resumable)",
        description="Expand a sweep file into tasks, skip those whose result file exists, run the rest in "
                    "parallel and write one Parquet row per task into a hive-partitioned folder. "
                    "Sweep file format: see stepsim.batch.config; workload = \"serve\" sweeps stepsim serve's "
                    "knobs (stepsim.serve.sweep).",
        epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("sweep_file", metavar="SWEEP.toml", help="the sweep file")
    from stepsim.cli.args import add_force_argument, add_jobs_argument

    add_jobs_argument(p, "the runs", dask=True)
    add_force_argument(p)
    p.add_argument("--executor", choices=EXECUTORS,
                   help="local worker processes (default) or a dask.distributed cluster (default with --address)")
    p.add_argument("--address", metavar="ADDR",
                   help="Dask scheduler address (tcp://host:8786); without it --executor dask starts a local "
                        "cluster on 127.0.0.1 (default: none)")
    p.add_argument("--out", metavar="DIR", help="output folder (default: the sweep file's 'out')")
    p.add_argument("--fail-fast", action="store_true",
                   help="stop at the first failed task (its row is written) with exit status 2")
    p.add_argument("--retry-failed", action="store_true",
                   help="run again the tasks whose recorded row says failed (default: they count as done)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--yes", "-y", action="store_true",
                   help="run a grid of more than 10,000 points (or more than the sweep file's max_tasks)")
    p.add_argument("--dry-run", action="store_true",
                   help="print the task count and the first tasks, run nothing, write nothing")
    p.set_defaults(handler=_sweep)  # checks its own output folder (--out or the sweep file's out)


def _sweep(args) -> int:
    from stepsim.base.errors import ConfigError
    from stepsim.base.signals import reason, stopped_status
    from stepsim.batch.config import load_sweep
    from stepsim.batch.executors import check_jobs
    from stepsim.batch.runner import SweepStopped, run_sweep
    from stepsim.batch.summary import format_summary

    executor = args.executor or ("dask" if args.address else "local")
    if args.address and executor != "dask":
        raise ConfigError("--address is only for --executor dask")
    if args.jobs is not None:
        check_jobs(args.jobs)  # before anything is read, expanded or drawn
    from stepsim.serve.sweep import is_serve_sweep, read_toml

    data = read_toml(args.sweep_file)
    if is_serve_sweep(data):
        return _serve_sweep(args, data, executor)
    try:
        spec = load_sweep(args.sweep_file)
        if args.dry_run:
            print(dry_run(spec, args.out))
            return 0
        if (args.out or spec.out) is not None:  # the runner checks the folder; /proc etc. fail here, clearly
            from stepsim.base.outputs import check_not_pseudo

            check_not_pseudo(args.out or spec.out, "--out" if args.out else f"{spec.source}: out")
        report = run_sweep(spec, out=args.out, executor=executor, jobs=args.jobs, address=args.address,
                           fail_fast=args.fail_fast, retry_failed=args.retry_failed,
                           progress=not args.no_progress, yes=args.yes, force=args.force)
    except KeyboardInterrupt as exc:  # before any task ran (expanding, hashing traces, starting workers)
        return stopped_status(reason(exc))
    except SweepStopped as stop:
        if stop.reason in ("interrupted", "terminated"):
            print(format_summary(stop.report))
            print(f"  stopped    {stop}")
            return stopped_status(stop.reason)
        print(format_summary(stop.report))
        raise  # printed by stepsim.cli as "stepsim: error: ..." with exit status 2
    print(format_summary(report))
    return 1 if report.failed else 0


def _serve_sweep(args, data: dict, executor: str) -> int:
    """``workload = "serve"``: a grid of stepsim serve runs (:mod:`stepsim.serve.sweep`)."""
    from stepsim.base.signals import reason, stopped_status
    from stepsim.serve.sweep import format_report, iter_tasks, parse_serve_sweep, run_serve_sweep

    spec = parse_serve_sweep(data, source=args.sweep_file)
    from stepsim.base.errors import ConfigError

    if args.fail_fast:
        raise ConfigError("--fail-fast is not supported by serving sweeps (every task runs; failures are rows)")
    if getattr(args, "force", False):
        raise ConfigError("--force lifts the run-size limit of workload sweeps; a serving sweep has none")
    if args.dry_run:
        from itertools import islice

        folder = args.out if args.out is not None else spec.out
        lines = [f"sweep {spec.source} -> {folder if folder is not None else '(no out: pass --out)'}",
                 f"  tasks      {spec.points:,} grid point(s) in {len(spec.grids)} grid(s); serving"]
        first = list(islice(iter_tasks(spec), DRY_RUN_TASKS))
        lines.append(f"  first {len(first)} task(s):")
        lines += [f"  {t.index:>6}  {t.key}  {t.label(spec.axes) or '(fixed knobs only)'}" for t in first]
        print("\n".join(lines))
        return 0
    if (args.out or spec.out) is not None:
        from stepsim.base.outputs import check_not_pseudo

        check_not_pseudo(args.out or spec.out, "--out" if args.out else f"{spec.source}: out")
    try:
        report = run_serve_sweep(spec, out=args.out, executor=executor, jobs=args.jobs, address=args.address,
                                 retry_failed=args.retry_failed, yes=args.yes, progress=not args.no_progress)
    except KeyboardInterrupt as exc:  # the rows of finished tasks are written; a re-run resumes
        return stopped_status(reason(exc))
    print(format_report(report, spec.axes))
    return 1 if report.failed else 0


#: tasks a dry run lists
DRY_RUN_TASKS = 10


def dry_run(spec, out=None) -> str:
    """The ``--dry-run`` text: grid size, output folder, and the first tasks (index, key, knobs)."""
    from itertools import islice

    from stepsim.batch.config import DEFAULT_MAX_TASKS
    from stepsim.batch.grid import iter_tasks
    from stepsim.batch.runner import spec_axes

    limit = spec.max_tasks if spec.max_tasks is not None else DEFAULT_MAX_TASKS
    folder = out if out is not None else spec.out
    lines = [f"sweep {spec.source} -> {folder if folder is not None else '(no out: pass --out)'}",
             f"  tasks      {spec.points:,} grid point(s) in {len(spec.grids)} grid(s); mode {spec.mode}"
             + (f"; more than {limit:,}: needs --yes" if spec.points > limit else "")]
    axes = spec_axes(spec)
    first = list(islice(iter_tasks(spec), DRY_RUN_TASKS))
    lines.append(f"  first {len(first)} task(s):")
    for task in first:
        lines.append(f"  {task.index:>6}  {task.key}  {task.label(axes) or '(fixed knobs only)'}")
    return "\n".join(lines)
