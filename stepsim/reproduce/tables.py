"""Small helpers shared by the experiment tables: unit-tagged fields, grouping rows, text rendering."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pyarrow as pa


def field(name: str, typ: pa.DataType, unit: str | None = None) -> pa.Field:
    """An Arrow field, with ``{"unit": unit}`` field metadata when a unit is given (as stepsim.records does)."""
    return pa.field(name, typ, metadata={"unit": unit} if unit else None)


def group_rows(table: pa.Table, keys: Sequence[str]) -> Iterator[tuple[tuple, list[dict]]]:
    """Yield ``(key values, rows)`` per distinct value of ``keys``; groups in first-appearance order."""
    groups: dict[tuple, list[dict]] = {}
    for row in table.to_pylist():
        groups.setdefault(tuple(row[k] for k in keys), []).append(row)
    yield from groups.items()


def _cell(value, fmt: str | None) -> str:
    if value is None:
        return "-"
    if fmt is not None:
        return fmt.format(value)
    return str(value)


def format_rows(table: pa.Table, columns: Sequence[tuple[str, str | None]]) -> list[str]:
    """A fixed-width text table (header, rule, one line per row) of ``(column, format or None)`` pairs."""
    names = [c for c, _ in columns]
    cells = [[_cell(row[c], fmt) for c, fmt in columns] for row in table.select(names).to_pylist()]
    widths = [max(len(name), *(len(r[i]) for r in cells)) if cells else len(name) for i, name in enumerate(names)]

    def line(values):
        return "  ".join(v.rjust(w) for v, w in zip(values, widths)).rstrip()

    return [line(names), line(["-" * w for w in widths])] + [line(r) for r in cells]
