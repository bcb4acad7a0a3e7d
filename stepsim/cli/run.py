"""``stepsim run``: build a workload from CLI flags, simulate it (timing or functional), print and write its record.

The flags are those of :mod:`stepsim.cli.args` plus the run's outputs (``--out``, ``--report``, ``--timeline``,
``--deadlock-report``); measuring and printing are shared with ``stepsim metrics`` (:mod:`stepsim.cli.record_output`).
"""

from __future__ import annotations

from stepsim.cli.args import add_fifo_depths_argument, add_force_argument, add_schedule_argument, add_workload_arguments
from stepsim.cli.record_output import record_command


def _run(args) -> int:
    if args.check and not args.functional:
        from stepsim.base.errors import ArgumentError

        raise ArgumentError("--check needs --functional (it compares the values a functional run stored)")
    # `is not None`, not truth: an empty path ('') is a mistake to say, not "no file" (it once ran and wrote nothing)
    if args.deadlock_report is not None:  # like --out: a bad destination fails before the run, not after a deadlock
        from stepsim.base.outputs import check_out_file

        check_out_file(args.deadlock_report, "--deadlock-report")
    if args.timeline is not None or args.timeline_limit is not None or args.timeline_min_dur is not None:
        from stepsim.simulation.timeline import check_timeline_args  # format, destination, writer extra: before the run

        args.timeline_limit = check_timeline_args(args.timeline, args.timeline_limit, args.timeline_min_dur)
    return record_command(args, "check" if args.check else "functional" if args.functional else "simulate")


def register(subparsers) -> None:
    p = subparsers.add_parser("run", help="simulate a workload on the compiled engine (timing or functional)",
                              description="Simulate a workload on a trace and print cycles and traffic.")
    add_workload_arguments(p)
    p.add_argument("--out", metavar="DIR|FILE.parquet",
                   help="also write the record (part-<id>.parquet) and its unit/channel tables into DIR, or the "
                        "record to FILE.parquet and the tables beside it (FILE_units.parquet, FILE_channels.parquet); "
                        "default: none, only printed")
    p.add_argument("--functional", action="store_true",
                   help="carry real tile values (seeded inputs); cycles equal a timing run of the same graph "
                        "(attention defaults to --softmax stable here; give --softmax plain for the artifact's)")
    p.add_argument("--check", action="store_true",
                   help="with --functional: compare the stored tensors with the NumPy reference "
                        "(check_max_rel_error, check_tolerance, check_passed)")
    add_fifo_depths_argument(p)
    add_schedule_argument(p)
    p.add_argument("--report", action="store_true",
                   help="after the run, print the bottleneck report (as `stepsim report` does)")
    p.add_argument("--deadlock-report", metavar="FILE",
                   help="if the run deadlocks, write the full diagnosis (every blocked unit, cycles, fix) as JSON "
                        "(default: none)")
    add_force_argument(p)
    p.add_argument("--timeline", metavar="PATH",
                   help="also write a Perfetto timeline of the run: PATH ending in .json or .json.gz (Chrome "
                        "trace-event JSON) or .pftrace / .perfetto-trace (Perfetto protobuf, extra 'timeline'); default: none")
    p.add_argument("--timeline-limit", type=int, default=None, metavar="RECORDS",
                   help="record at most this many engine records (default 4,000,000, 32 bytes each); past it the "
                        "trace is cut at the earliest cycle left out, and says so")
    p.add_argument("--timeline-min-dur", type=int, default=None, metavar="CYCLES",
                   help="merge intervals shorter than this many cycles in the trace (default: cycles / 200,000, "
                        "0 for runs under 200,000 cycles); the trace's metadata counts what was merged")
    p.set_defaults(handler=_run, out_kind="record")
    from stepsim.cli.help_topics import group_options

    group_options(p, "run")
