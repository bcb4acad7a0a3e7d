"""Small helpers shared by the experiment tables: unit-tagged fields, grouping rows, text rendering."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pyarrow as pa


def field(name: str, typ: pa.DataType, unit: str | None = None) -> pa.Field:
    """An Arrow field, with ``{"unit": unit}`` field metadata when a unit is given (as stepsim.results.records does)."""
    return pa.field(name, typ, metadata={"unit": unit} if unit else None)


def group_rows(table: pa.Table, keys: Sequence[str]) -> Iterator[tuple[tuple, list[dict]]]:
    """Yield ``(key values, rows)`` per distinct value of ``keys``; groups in first-appearance order."""
    groups: dict[tuple, list[dict]] = {}
    for row in table.to_pylist():
        groups.setdefault(tuple(row[k] for k in keys), []).append(row)
    yield from groups.items()


def _cell(value, fmt: str | None, unit: str | None) -> str:
    if value is None:
        return "-"
    if unit == "bytes" and isinstance(value, int):  # read as kB / MB / GB; the CSV and Parquet keep the integer
        from stepsim.base.display import format_bytes

        return format_bytes(value)
    if fmt is not None:
        return fmt.format(value)
    return str(value)


def _unit(table: pa.Table, column: str) -> str | None:
    metadata = table.schema.field(column).metadata or {}
    return metadata.get(b"unit", b"").decode() or None


def format_rows(table: pa.Table, columns: Sequence[tuple[str, str | None]]) -> list[str]:
    """A fixed-width text table (header, units, rule, one line per row) of ``(column, format or None)`` pairs.

    The units line shows each column's ``unit`` field metadata in brackets; byte counts are printed as
    kB / MB / GB (their cells carry the unit)."""
    names = [c for c, _ in columns]
    units = {c: _unit(table, c) for c in names}
    cells = [[_cell(row[c], fmt, units[c]) for c, fmt in columns] for row in table.select(names).to_pylist()]
    unit_line = ["" if units[c] in (None, "bytes") else f"[{units[c]}]" for c in names]
    widths = [max(len(name), len(unit_line[i]), *(len(r[i]) for r in cells)) for i, name in enumerate(names)]

    def line(values):
        return "  ".join(v.rjust(w) for v, w in zip(values, widths)).rstrip()

    return [line(names), line(unit_line), line(["-" * w for w in widths])] + [line(r) for r in cells]
