"""``stepsim metrics``: the symbolic off-chip / on-chip / FLOP totals of a workload with a trace's values."""

from __future__ import annotations

from stepsim.cli.args import add_schedule_argument, add_workload_arguments
from stepsim.cli.record_output import record_command


def _metrics(args) -> int:
    return record_command(args, "metrics")


def register(subparsers) -> None:
    p = subparsers.add_parser("metrics", help="symbolic off-chip / on-chip / FLOP totals of a workload on a trace",
                              description="Print the symbolic metrics of a workload with a trace's values.")
    add_workload_arguments(p)
    add_schedule_argument(p)
    p.add_argument("--out", metavar="DIR|FILE.parquet",
                   help="also write the record into DIR (part-<id>.parquet) or to FILE.parquet (default: none, only "
                        "printed)")
    p.set_defaults(handler=_metrics, out_kind="record")
    from stepsim.cli.help_topics import group_options

    group_options(p, "metrics")
