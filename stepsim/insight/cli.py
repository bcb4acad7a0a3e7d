"""``stepsim report``, ``stepsim compare``, and the ``--report`` / ``--deadlock-report`` flags of ``stepsim run``.

``stepsim run`` (:mod:`stepsim.workloads.cli`) calls two functions of this module for its flags:

* ``--report``: after the run, print the bottleneck report (:mod:`stepsim.insight.report`); with ``--json`` the
  output is one object ``{"record": <row>, "report": <report>}``.
* ``--deadlock-report FILE``: when the run deadlocks, write the whole diagnosis as JSON (every blocked unit,
  the cycles, the fix). On a deadlock the run also checks the suggested FIFO depth by rerunning the program
  when the run itself was quick (:data:`VERIFY_IF_RUN_UNDER_S`), within :data:`VERIFY_BUDGET_S` seconds.
"""

from __future__ import annotations

import json
import sys

from stepsim.errors import DeadlockError

#: a deadlocked run that took less than this (s) gets its suggested depth checked by reruns
VERIFY_IF_RUN_UNDER_S = 20.0
#: wall-time budget (s) of those reruns
VERIFY_BUDGET_S = 60.0


def _report_cmd(args) -> int:
    from stepsim.insight.report import format_report, report_run_dir, write_png

    rep, timeline = report_run_dir(args.run_dir)
    print(json.dumps(rep) if args.json else format_report(rep))
    if args.png:
        path = write_png(rep, args.png, timeline)
        print(f"wrote png: {path}", file=sys.stderr if args.json else sys.stdout)
    return 0


def _compare_cmd(args) -> int:
    from stepsim.insight.compare import compare, format_markdown, format_text

    res = compare(args.baseline, args.candidate, metrics=args.metric, threshold=args.threshold)
    print(json.dumps(res) if args.json else format_markdown(res) if args.markdown else format_text(res))
    return 1 if res["regressed"] else 0


def deadlock_with_fix(exc: DeadlockError, elapsed: float, report_file: str | None) -> DeadlockError:
    """The error re-rendered with a checked (or, for a slow run, unchecked) fix; the JSON file written."""
    from stepsim.insight.deadlock import Fix, format_message, full_list, suggest_fix
    from stepsim.results import atomic_output

    diag = exc.diagnosis
    if diag is None:
        return exc
    if exc.program is not None and elapsed < VERIFY_IF_RUN_UNDER_S:
        fix = suggest_fix(exc.program, diag, budget_s=VERIFY_BUDGET_S)
    else:
        fix = Fix(channels={}, depth=None, verified=False,
                  note=f"not verified: the run took {elapsed:.0f} s; stepsim.insight.deadlock.suggest_fix checks it")
    message = format_message(diag, diag.unit_lines, fix)
    if report_file:
        doc = {"message": message, "n_blocked": diag.n_blocked, "diagnosis": diag.as_dict(), "fix": fix.as_dict(),
               "blocked": full_list(exc)}
        with atomic_output(report_file) as tmp:
            tmp.write_text(json.dumps(doc, indent=1))
        message += f"\n(full diagnosis written to {report_file})"
    return DeadlockError(message, exc.blocked, diagnosis=diag, program=exc.program)


def print_record_and_report(record, as_json: bool, print_record) -> None:
    """``stepsim run --report``: the record (``print_record()``) then the bottleneck report, or with ``--json``
    one object ``{"record": <row>, "report": <report>}``."""
    from stepsim.insight.report import format_report, report_record

    rep = report_record(record)
    if as_json:
        print(json.dumps({"record": record.row, "report": rep}))
        return
    print_record()
    print()
    print(format_report(rep))


def register(subparsers) -> None:
    p = subparsers.add_parser("report", help="why a run is slow: bound, critical path, imbalance, full FIFOs",
                              description="Bottleneck report of a folder written by `stepsim run --out RUN_DIR`.")
    p.add_argument("run_dir", metavar="RUN_DIR", help="folder written by stepsim run --out")
    p.add_argument("--json", action="store_true",
                   help="one JSON object (keys bound, roofline, critical_path, top_units, imbalance, full_fifos)")
    p.add_argument("--png", metavar="FILE",
                   help="also draw busy / blocked shares per group and their busy share over time (matplotlib)")
    p.set_defaults(handler=_report_cmd, out=None)
    p = subparsers.add_parser("compare", help="compare two result sets; exit 1 when a metric got worse",
                              description="Compare run records (run --out folders, sweep folders or Parquet files).")
    p.add_argument("baseline", metavar="BASELINE")
    p.add_argument("candidate", metavar="CANDIDATE")
    p.add_argument("--metric", action="append", metavar="M",
                   help="metric column to compare (repeatable; default cycles, off_chip_bytes, on_chip_bytes, "
                        "compute_utilization, off_chip_bw_utilization)")
    p.add_argument("--threshold", type=float, default=0.01,
                   help="relative worsening that fails the comparison (ratio; default 0.01 = 1 %%)")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="one JSON object")
    fmt.add_argument("--markdown", action="store_true", help="a Markdown table (for a CI log or pull request)")
    p.set_defaults(handler=_compare_cmd)
