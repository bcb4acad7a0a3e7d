"""``stepsim metrics`` and ``stepsim run``: build a workload from CLI flags, print (and write) its record.

Both print the :class:`stepsim.records.RunResult` row (``--json``: one JSON object with every column of
:data:`stepsim.records.SCHEMA`); ``--out DIR`` writes it as Parquet (``stepsim run`` adds the per-unit and
per-channel counter tables).

The flags are shared by every workload command; defaults reproduce the paper's experiments (spec §5). Flags map
one-to-one onto the config keys of :mod:`stepsim.workloads.config` (``--tile-n`` is ``tile_n``), which owns the
validation and the building; this module only translates ``argparse`` namespaces.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from stepsim.workloads.base import Workload
from stepsim.workloads.config import (
    BUNDLED_TRACES,
    COMMAND_LINE,
    KNOBS,
    WORKLOADS,
    bundled_trace,
    workload_from_config,
)

__all__ = ["BUNDLED_TRACES", "WORKLOADS", "add_workload_arguments", "build_workload", "bundled_trace",
           "config_from_args", "register"]


def add_workload_arguments(p: argparse.ArgumentParser) -> None:
    """The flags every workload command shares (unset flags are None; config.py applies the defaults)."""
    p.add_argument("workload", type=_workload_argument, metavar="WORKLOAD",
                   help="moe | swiglu | attention | decoder | path/to/file.py:function (a function returning a "
                        "stepsim Graph or Workload)")
    p.add_argument("--model", help="MoE: mixtral-8x7b (default, alias mixtral) | qwen3-30b-a3b (alias qwen) | "
                                   "a Hugging Face config.json path | custom (see stepsim models list)")
    for flag in ("--hidden", "--intermediate", "--experts", "--top-k"):
        p.add_argument(flag, type=int, help="custom MoE model dimension (with --model custom)")
    p.add_argument("--trace", help="routing trace (MoE) or KV-length batch (attention); default: bundled synthetic")
    p.add_argument("--routing", help="decoder: routing trace of the MoE block (expert ids per token)")
    p.add_argument("--kv-lengths", help="decoder: KV-cache lengths of the decode batch (a KV trace)")
    p.add_argument("--kv-heads", type=int, help="decoder: KV heads simulated (default: all of the model's)")
    p.add_argument("--one-head", dest="kv_heads", action="store_const", const=1,
                   help="decoder: simulate one KV head, as the paper's attention runs (same as --kv-heads 1)")
    p.add_argument("--iteration", type=int, help="routing traces with several batches: iteration to use")
    p.add_argument("--layer", type=int, help="routing traces with several batches: layer to use")
    p.add_argument("--batch-id", type=int, help="decode-batch traces with several batches: batch to use")
    p.add_argument("--tiling", choices=("static", "dynamic"), help="MoE token tiling (default: static)")
    p.add_argument("--tile-n", type=int, help="MoE: tokens per tile (static, default 32); SwiGLU: F tile (16)")
    p.add_argument("--tile-f", type=int, help="MoE: F columns per weight tile")
    p.add_argument("--tile-m", type=int, help="SwiGLU: batch rows per tile (default 16)")
    p.add_argument("--regions", type=int, help="MoE configuration time-multiplexing: parallel expert regions; "
                                                  "attention: parallel regions (default 4)")
    p.add_argument("--strategy", choices=("coarse", "interleave", "dynamic"),
                   help="attention parallelization (default: dynamic)")
    p.add_argument("--softmax", choices=("plain", "stable"),
                   help="attention softmax: plain (the artifact's exp-sum form, default) or stable (running max, "
                        "1/sqrt(head_dim); the default with --functional)")
    p.add_argument("--compute-bw", type=int, help="FLOPs/cycle of every compute node")
    p.add_argument("--channel-depth", type=int, help="default FIFO depth (elements)")
    p.add_argument("--hardware", help="hardware preset name or TOML file (default: the workload's experiment)")
    p.add_argument("--convention", choices=("published", "paper"),
                   help="on-chip accounting: published (artifact, default) or paper (double-buffered, FIFOs)")
    p.add_argument("--json", action="store_true", help="print the record as one JSON object (exact numbers)")
    p.add_argument("--verbose", "-v", action="store_true",
                   help="print every column (params, provenance, phase timings) and exact byte counts")


def add_fifo_depths_argument(p: argparse.ArgumentParser) -> None:
    """``--fifo-depths FILE``: per-channel FIFO depths written by ``stepsim size-fifos`` (config key
    ``fifo_depths``); a file made for another graph is refused."""
    p.add_argument("--fifo-depths", metavar="FILE",
                   help="per-channel FIFO depths from stepsim size-fifos (overrides --channel-depth per channel)")


def _workload_argument(value: str) -> str:
    """A workload kind, or a user program ``path/to/file.py:function`` (argparse type of the positional)."""
    from stepsim.workloads.program import is_program_spec

    if value in WORKLOADS[:-1] or is_program_spec(value):
        return value
    raise argparse.ArgumentTypeError(f"invalid choice: {value!r} (choose from {', '.join(WORKLOADS[:-1])} or "
                                     f"path/to/file.py:function)")


def config_from_args(args: argparse.Namespace) -> dict:
    """The config mapping of the knobs set on the command line (unset flags are left out); a user program's
    ``file.py:function`` becomes ``{"workload": "program", "program": "file.py:function"}``."""
    config = {key: getattr(args, key) for key in KNOBS if getattr(args, key, None) is not None}
    if config["workload"] not in WORKLOADS:
        config["program"] = config["workload"]
        config["workload"] = "program"
    return config


def build_workload(args: argparse.Namespace) -> Workload:
    """Build the workload the flags describe (see :func:`stepsim.workloads.config.workload_from_config`)."""
    return workload_from_config(config_from_args(args))


def _print_record(record, as_json: bool, verbose: bool = False) -> None:
    """One JSON object (exact numbers), or aligned ``column  value unit`` lines of the row's set columns
    (bytes in MB / GB, times rounded; ``verbose`` adds the params and provenance columns and exact byte counts;
    :mod:`stepsim.display`)."""
    if as_json:
        print(json.dumps(record.row))
        return
    from stepsim.display import record_lines
    from stepsim.records import COLUMN_UNITS

    print("\n".join(record_lines(record.row, COLUMN_UNITS, verbose=verbose)))


def _write_record(record, out: str | None, as_json: bool) -> None:
    """``--out``: write the record's files (into a folder, or ``NAME.parquet`` with its tables beside it);
    report them on stderr when stdout carries JSON."""
    if out is None:
        return
    from stepsim.outputs import is_record_file

    paths = _write_record_file(record, out) if is_record_file(out) else record.write(out)
    for kind, path in paths.items():
        print(f"wrote {kind}: {path}", file=sys.stderr if as_json else sys.stdout)


def _write_record_file(record, out: str) -> dict:
    """``--out NAME.parquet``: the row (with provenance metadata) at that path; a simulation's unit and channel
    tables as ``NAME_units.parquet`` / ``NAME_channels.parquet`` (each written to a temporary name; all renamed
    into place at the end, so a full disk or an interrupt leaves none of them)."""
    from stepsim.outputs import record_file_paths
    from stepsim.results import published_together, write_parquet_atomic

    targets = record_file_paths(out)
    meta = record.provenance()
    tables = {"run": record.to_arrow()}
    if record.simulated:
        tables.update(units=record.unit_table(), channels=record.channel_table())
    written = {}
    with published_together():  # the tables and the record appear together or not at all
        for kind in ("units", "channels", "run"):
            if kind in tables:
                written[kind] = write_parquet_atomic(tables[kind], targets[kind], meta)
    return {kind: written[kind] for kind in tables}


def _record_command(args, mode: str) -> int:
    from stepsim.errors import DeadlockError
    from stepsim.progress import engine_progress
    from stepsim.records import run_config

    start = time.perf_counter()
    try:
        with engine_progress() as progress:  # a bar on a terminal once a simulation takes more than 2 s
            record = run_config({**config_from_args(args), "mode": mode}, source=COMMAND_LINE, progress=progress,
                                timeline=_timeline_records(args))
    except DeadlockError as exc:  # say which FIFO to deepen (checked by reruns when cheap), see stepsim.insight
        from stepsim.insight.cli import deadlock_with_fix

        if getattr(args, "timeline", None) and exc.timeline is not None:  # how the run got stuck, before the fix
            from stepsim.timeline import write_deadlock_timeline

            write_deadlock_timeline(exc.timeline, args.timeline, args.timeline_min_dur)

        raise deadlock_with_fix(exc, time.perf_counter() - start, getattr(args, "deadlock_report", None)) from None
    if getattr(args, "report", False):  # run --report: the record, then the bottleneck report
        from stepsim.insight.cli import print_record_and_report

        print_record_and_report(record, args.json, lambda: _print_record(record, False, args.verbose))
    else:
        _print_record(record, args.json, getattr(args, "verbose", False))
    _write_record(record, args.out, args.json)
    if getattr(args, "timeline", None):
        from stepsim.timeline import write_run_timeline

        write_run_timeline(record, args.timeline, args.timeline_min_dur, sys.stderr if args.json else sys.stdout)
    return 0


def _timeline_records(args) -> int:
    """The record limit of the run's timeline: --timeline's (checked), else the default for --report (which
    reads the time each FIFO spent full from it), else 0 (none)."""
    if getattr(args, "timeline", None):
        return args.timeline_limit
    if getattr(args, "report", False):
        from stepsim.timeline import DEFAULT_RECORDS

        return DEFAULT_RECORDS
    return 0


def _metrics(args) -> int:
    return _record_command(args, "metrics")


def _run(args) -> int:
    if args.check and not args.functional:
        from stepsim.errors import ArgumentError

        raise ArgumentError("--check needs --functional (it compares the values a functional run stored)")
    if args.deadlock_report:  # like --out: a bad destination fails before the run, not after a deadlock
        from stepsim.outputs import check_out_file

        check_out_file(args.deadlock_report, "--deadlock-report")
    if args.timeline or args.timeline_limit is not None or args.timeline_min_dur is not None:
        from stepsim.timeline import check_timeline_args  # format, destination, writer extra: before the run

        args.timeline_limit = check_timeline_args(args.timeline, args.timeline_limit, args.timeline_min_dur)
    return _record_command(args, "check" if args.check else "functional" if args.functional else "simulate")


def register(subparsers) -> None:
    p = subparsers.add_parser("run", help="simulate a workload on the compiled engine (timing or functional)",
                              description="Simulate a workload on a trace and print cycles and traffic.")
    add_workload_arguments(p)
    p.add_argument("--out", metavar="DIR|FILE.parquet",
                   help="also write the record (part-<id>.parquet) and its unit/channel tables into DIR, or the "
                        "record to FILE.parquet and the tables beside it (FILE_units.parquet, FILE_channels.parquet)")
    p.add_argument("--functional", action="store_true",
                   help="carry real tile values (seeded inputs); cycles equal a timing run of the same graph "
                        "(attention defaults to --softmax stable here; give --softmax plain for the artifact's)")
    p.add_argument("--check", action="store_true",
                   help="with --functional: compare the stored tensors with the NumPy reference "
                        "(check_max_rel_error, check_tolerance, check_passed)")
    add_fifo_depths_argument(p)
    p.add_argument("--report", action="store_true",
                   help="after the run, print the bottleneck report (as `stepsim report` does)")
    p.add_argument("--deadlock-report", metavar="FILE",
                   help="if the run deadlocks, write the full diagnosis (every blocked unit, cycles, fix) as JSON")
    p.add_argument("--timeline", metavar="PATH",
                   help="also write a Perfetto timeline of the run: PATH ending in .json or .json.gz (Chrome "
                        "trace-event JSON) or .pftrace / .perfetto-trace (Perfetto protobuf, extra 'timeline')")
    p.add_argument("--timeline-limit", type=int, default=None, metavar="RECORDS",
                   help="record at most this many engine records (default 4,000,000, 32 bytes each); past it the "
                        "trace is cut at the earliest cycle left out, and says so")
    p.add_argument("--timeline-min-dur", type=int, default=None, metavar="CYCLES",
                   help="merge intervals shorter than this many cycles in the trace (default: cycles / 200,000, "
                        "0 for runs under 200,000 cycles); the trace's metadata counts what was merged")
    p.set_defaults(handler=_run, out_kind="record")
    p = subparsers.add_parser("metrics", help="symbolic off-chip / on-chip / FLOP totals of a workload on a trace",
                              description="Print the symbolic metrics of a workload with a trace's values.")
    add_workload_arguments(p)
    p.add_argument("--out", metavar="DIR|FILE.parquet",
                   help="also write the record into DIR (part-<id>.parquet) or to FILE.parquet")
    p.set_defaults(handler=_metrics, out_kind="record")
