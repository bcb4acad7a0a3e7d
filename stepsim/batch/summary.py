"""The end-of-sweep summary: counts, wall time, failures, and a small table of the key results."""

from __future__ import annotations

from stepsim.batch.grid import short_value
from stepsim.batch.rows import first_line
from stepsim.batch.runner import SweepReport, spec_axes

#: rows of the key-results table (the whole dataset is in the output folder)
MAX_TABLE_ROWS = 20
#: failed tasks listed by name
MAX_FAILURES_LISTED = 10


def format_summary(report: SweepReport) -> str:
    """Human-readable summary of ``report`` (several lines, no trailing newline)."""
    failed = report.failed
    failed_now = sum(1 for o in report.outcomes.values() if o["status"] == "failed")
    lines = [f"sweep {report.spec.source} -> {report.out}",
             (f"  tasks      {report.total}: {report.ran} run, {len(report.skipped)} skipped (result file "
              f"already there), {report.not_run} not run"),
             f"  failed     {len(failed)} ({failed_now} in this run)",
             f"  wall time  {report.wall_s:.1f} s" + (f" ({report.executor})" if report.executor else "")]
    if report.removed_temp_files:
        lines.append(f"  removed    {len(report.removed_temp_files)} temp file(s) left by an interrupted sweep")
    if report.superseded:
        lines.append(f"  replaced   {report.superseded} row(s) of an older generation of their task (its trace, "
                     f"hardware or model file, or the timing model, changed)")
    axes = spec_axes(report.spec)
    for task in failed[:MAX_FAILURES_LISTED]:
        row = report.row(task) or {}
        lines.append(f"  failed task {task.index} ({task.label(axes) or task.key}): {row.get('error_type')}: "
                     f"{first_line(row.get('error_message'))}")
    if len(failed) > MAX_FAILURES_LISTED:
        lines.append(f"  ... and {len(failed) - MAX_FAILURES_LISTED} more failed task(s) (status = 'failed')")
    table = results_table(report)
    if table:
        lines += ["", table]
    return "\n".join(lines)


def results_table(report: SweepReport, max_rows: int = MAX_TABLE_ROWS) -> str:
    """Aligned table of the first ``max_rows`` tasks in grid order: axis values, status, report columns."""
    axes = spec_axes(report.spec)
    columns = ["#", *axes, "status", *report.spec.report]
    rows = []
    for task in report.tasks[:max_rows]:
        row = report.row(task)
        if row is None:
            values = ["-"] * len(report.spec.report)
            status = "not run"
        else:
            values = [_cell(row.get(c), c) for c in report.spec.report]
            status = row.get("status") or "-"
        rows.append([str(task.index), *(short_value(task.config.get(a, "-")) for a in axes), status, *values])
    if not rows:
        return ""
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(columns)]
    # numbers right-aligned, text left-aligned, as a reader scans them
    numeric = [all(_is_number(r[i]) for r in rows) for i in range(len(columns))]
    out = ["  ".join(c.rjust(w) if n else c.ljust(w) for c, w, n in zip(columns, widths, numeric)).rstrip()]
    for r in rows:
        out.append("  ".join(v.rjust(w) if n else v.ljust(w) for v, w, n in zip(r, widths, numeric)).rstrip())
    if report.total > len(rows):
        out.append(f"... {report.total - len(rows)} more row(s): stepsim.batch.read_sweep({str(report.out)!r})")
    return "\n".join(out)


def _cell(value, column: str | None = None) -> str:
    """A record column's value as ``stepsim run`` prints it (``format_value`` with the column's unit: a ratio
    as ``4.72 %``, bytes as ``2.82 GB``, seconds rounded); other columns as plain numbers or short text."""
    from stepsim.base.display import format_value
    from stepsim.results.records import COLUMN_UNITS

    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value)
    unit = COLUMN_UNITS.get(column)
    if unit is not None and isinstance(value, (int, float)):
        return format_value(value, unit)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:.4g}"
    return short_value(value)


def _is_number(text: str) -> bool:
    """A number, with or without its unit (``17,096 cycles``, ``4.72 %``, ``2.82 GB``)."""
    if text == "-":
        return True
    try:
        float(text.split(" ")[0].replace(",", ""))
    except ValueError:
        return False
    return True
