"""What ``stepsim metrics`` and ``stepsim run`` share: measure one run config and print (and write) its record.

Both print the :class:`stepsim.results.records.RunResult` row (``--json``: one JSON object with every column of
:data:`stepsim.results.records.SCHEMA`); ``--out DIR`` writes it as Parquet (``stepsim run`` adds the per-unit and
per-channel counter tables). Two flags of ``stepsim run`` are served here too:

* ``--report``: after the run, print the bottleneck report (:mod:`stepsim.insight.report`); with ``--json`` the
  output is one object ``{"record": <row>, "report": <report>}``.
* ``--deadlock-report FILE``: when the run deadlocks, write the whole diagnosis as JSON (every blocked unit,
  the cycles, the fix). On a deadlock the run also checks the suggested FIFO depth by rerunning the program
  when the run itself was quick (:data:`VERIFY_IF_RUN_UNDER_S`), within :data:`VERIFY_BUDGET_S` seconds.
"""

from __future__ import annotations

import json
import sys
import time

from stepsim.base.errors import DeadlockError
from stepsim.base.ranges import json_text
from stepsim.cli.args import config_from_args
from stepsim.workloads.config import COMMAND_LINE

#: a deadlocked run that took less than this (s) gets its suggested depth checked by reruns
VERIFY_IF_RUN_UNDER_S = 20.0
#: wall-time budget (s) of those reruns
VERIFY_BUDGET_S = 60.0



def print_record(record, as_json: bool, verbose: bool = False) -> None:
    """One JSON object (exact numbers), or aligned ``column  value unit`` lines of the row's set columns
    (bytes in MB / GB, times rounded; ``verbose`` adds the params and provenance columns and exact byte counts;
    :mod:`stepsim.base.display`)."""
    if as_json:
        print(json_text(record.row))
        return
    from stepsim.base.display import record_lines
    from stepsim.results.records import COLUMN_UNITS

    print("\n".join(record_lines(record.row, COLUMN_UNITS, verbose=verbose) + chip_lines(record.row)
                    + spill_lines(record.row) + schedule_lines(record.row)))


def schedule_lines(row) -> list[str]:
    """A mapped run's schedule (from the record's params: ``schedule``, :mod:`stepsim.mapping.runs`): where it came
    from, its kind and knobs, the compute units it uses; none for a paper run."""
    params = json.loads(row.get("params") or "{}")
    if "schedule" not in params:
        return []
    from stepsim.mapping.schedule import KNOBS

    s = params["schedule"]
    knobs = ", ".join(f"{k} {s['knobs'][k]}" for k in KNOBS[s["kind"]])
    return [f"{'schedule':35s}{s['source']}: {s['kind']} {knobs} ({s['compute_units']:,} compute units)"]


def spill_lines(row) -> list[str]:
    """An ONNX model's spilled edges and why, the converters spills replaced and the patterns recognised (from
    the record's params: ``spill_reasons``, ``spilled_converters``, ``patterns``; :class:`stepsim.frontend.lower.FrontendReport`); none for other
    runs."""
    params = json.loads(row.get("params") or "{}")
    if "spill_reasons" not in params:
        return []
    reasons, replaced = params["spill_reasons"], params["spilled_converters"]
    lines = [f"{'spilled_edges':35s}{len(reasons)}" + ("" if reasons else " (every edge fused)")]
    lines += [f"  {edge}: {why}" for edge, why in reasons.items()]
    lines += [f"  converter {key} ({what}): replaced by a spill" for key, what in replaced.items()]
    # the patterns the front end recognised (stepsim.frontend.attention), named by their node
    lines += [f"{'pattern ' + node:35s}{what}" for node, what in params.get("patterns", {}).items()]
    return lines


def chip_lines(row) -> list[str]:
    """Expert parallelism's per-chip summary (from the record's params): token rows per chip, the busiest chip
    and the imbalance (max / mean); none for other runs."""
    params = json.loads(row.get("params") or "{}")
    if "chip_tokens" not in params:
        return []
    tokens, busiest = params["chip_tokens"], params["busiest_chip"]
    return [f"{'chip_tokens':35s}{', '.join(f'{t:,}' for t in tokens)} token rows (chips 0..{len(tokens) - 1})",
            f"{'busiest_chip':35s}chip {busiest}: {tokens[busiest]:,} token rows, imbalance "
            f"{params['imbalance']:.3f} (max / mean)"]


def write_record(record, out: str | None, as_json: bool) -> None:
    """``--out``: write the record's files (into a folder, or ``NAME.parquet`` with its tables beside it);
    report them on stderr when stdout carries JSON."""
    if out is None:
        return
    from stepsim.base.outputs import is_record_file

    paths = _write_record_file(record, out) if is_record_file(out) else record.write(out)
    for kind, path in paths.items():
        print(f"wrote {kind}: {path}", file=sys.stderr if as_json else sys.stdout)


def _write_record_file(record, out: str) -> dict:
    """``--out NAME.parquet``: the row (with provenance metadata) at that path; a simulation's unit and channel
    tables as ``NAME_units.parquet`` / ``NAME_channels.parquet`` (each written to a temporary name; all renamed
    into place at the end, so a full disk or an interrupt leaves none of them)."""
    from stepsim.base.files import published_together, write_parquet_atomic
    from stepsim.base.outputs import record_file_paths

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


def record_command(args, mode: str) -> int:
    from stepsim.base.progress import engine_progress
    from stepsim.mapping.runs import run_scheduled, schedule_argument

    start = time.perf_counter()
    schedule = None if args.schedule is None else schedule_argument(args.schedule)
    try:
        with engine_progress() as progress:  # a bar on a terminal once a simulation takes more than 2 s
            # --schedule paper (the default off serving hardware) is exactly run_config's run
            record = run_scheduled({**config_from_args(args), "mode": mode}, schedule, source=COMMAND_LINE,
                                   progress=progress, timeline=_timeline_records(args),
                                   force=getattr(args, "force", False))
    except DeadlockError as exc:  # say which FIFO to deepen (checked by reruns when cheap), see stepsim.insight
        if getattr(args, "timeline", None) and exc.timeline is not None:  # how the run got stuck, before the fix
            from stepsim.simulation.timeline import write_deadlock_timeline

            write_deadlock_timeline(exc.timeline, args.timeline, args.timeline_min_dur)

        raise deadlock_with_fix(exc, time.perf_counter() - start, getattr(args, "deadlock_report", None)) from None
    if getattr(args, "report", False):  # run --report: the record, then the bottleneck report
        print_record_and_report(record, args.json, lambda: print_record(record, False, args.verbose))
    else:
        print_record(record, args.json, getattr(args, "verbose", False))
    write_record(record, args.out, args.json)
    if getattr(args, "timeline", None):
        from stepsim.simulation.timeline import write_run_timeline

        write_run_timeline(record, args.timeline, args.timeline_min_dur, sys.stderr if args.json else sys.stdout)
    return 0


def _timeline_records(args) -> int:
    """The record limit of the run's timeline: --timeline's (checked), else the default for --report (which
    reads the time each FIFO spent full from it), else 0 (none)."""
    if getattr(args, "timeline", None):
        return args.timeline_limit
    if getattr(args, "report", False):
        from stepsim.simulation.timeline import DEFAULT_RECORDS

        return DEFAULT_RECORDS
    return 0


def deadlock_with_fix(exc: DeadlockError, elapsed: float, report_file: str | None) -> DeadlockError:
    """The error re-rendered with a checked (or, for a slow run, unchecked) fix; the JSON file written."""
    from stepsim.analysis.deadlock import Fix, format_message, full_list, suggest_fix
    from stepsim.base.files import atomic_output

    diag = exc.diagnosis
    if diag is None:
        return exc
    if exc.program is not None and elapsed < VERIFY_IF_RUN_UNDER_S:
        fix = suggest_fix(exc.program, diag, budget_s=VERIFY_BUDGET_S)
    else:
        fix = Fix(channels={}, depth=None, verified=False,
                  note=f"not verified: the run took {elapsed:.0f} s; stepsim.analysis.deadlock.suggest_fix checks it")
    message = format_message(diag, diag.unit_lines, fix)
    if report_file:
        doc = {"message": message, "n_blocked": diag.n_blocked, "diagnosis": diag.as_dict(), "fix": fix.as_dict(),
               "blocked": full_list(exc)}
        with atomic_output(report_file) as tmp:
            tmp.write_text(json_text(doc, indent=1))
        message += f"\n(full diagnosis written to {report_file})"
    return DeadlockError(message, exc.blocked, diagnosis=diag, program=exc.program, unit_lines=exc.unit_lines)


def print_record_and_report(record, as_json: bool, print_record) -> None:
    """``stepsim run --report``: the record (``print_record()``) then the bottleneck report, or with ``--json``
    one object ``{"record": <row>, "report": <report>}``."""
    from stepsim.insight.report import format_report, report_record

    rep = report_record(record)
    if as_json:
        print(json_text({"record": record.row, "report": rep}))
        return
    print_record()
    print()
    print(format_report(rep))
