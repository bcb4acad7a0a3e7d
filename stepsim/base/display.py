"""What a person reads: CLI values with their units (cycles, MB / GB, GFLOP, %, s), rounded; ``--json`` keeps the
exact numbers.

:func:`format_value` turns one value and its unit (:data:`stepsim.results.records.COLUMN_UNITS`, also the ``unit``
metadata of the Parquet columns) into text; :func:`record_lines` is the ``stepsim run`` / ``stepsim metrics`` view
of one record (concise by default, every column with ``--verbose``). Byte and FLOP counts use decimal prefixes
(1 MB = 10**6 bytes, as disk and bandwidth figures do); the exact integer is in ``--json``, the Parquet files, and
(``--verbose``) in parentheses.
"""

from __future__ import annotations

from collections.abc import Mapping

#: decimal prefixes, largest first
_PREFIXES = ((10**12, "T"), (10**9, "G"), (10**6, "M"), (10**3, "k"))

#: columns the concise view leaves out (``--verbose`` shows them): provenance and the per-phase timings
VERBOSE_ONLY = frozenset({"params", "stepsim_version", "trace_sha256", "build_s", "metrics_s", "lower_s",
                          "compile_s"})


def format_bytes(n: int) -> str:
    """``8454144`` -> ``"8.45 MB"`` (three significant digits; below 1 kB the exact count, ``"512 B"``)."""
    return _si(n, "B")


def _si(n: int, unit: str) -> str:
    """``n`` with a decimal prefix: ``_si(2820145408, "B")`` -> ``"2.82 GB"``, ``_si(2e11, "FLOP")`` ->
    ``"200 GFLOP"``."""
    for scale, prefix in _PREFIXES:
        if abs(n) >= scale * 0.9995:  # 999,999 B is "1.00 MB", not "1,000 kB"
            return f"{_three_digits(n / scale)} {prefix}{unit}"
    return f"{n:,} {unit}"


def _three_digits(x: float) -> str:
    """Three significant digits without an exponent: 8.454 -> 8.45, 84.54 -> 84.5, 845.4 -> 845."""
    return f"{x:.2f}" if abs(x) < 10 else f"{x:.1f}" if abs(x) < 100 else f"{x:,.0f}"


def format_seconds(s: float) -> str:
    """Wall time to three significant digits: ``0.000394`` -> ``"394 us"``, ``0.80176`` -> ``"802 ms"``,
    ``1.2051`` -> ``"1.21 s"`` (from 1,000 s on, whole seconds)."""
    if s < 0.9995e-3:  # the thresholds keep 0.99996 s from printing as "1,000 ms"
        return f"{_three_digits(s * 1e6)} us"
    if s < 0.9995:
        return f"{_three_digits(s * 1e3)} ms"
    return f"{_three_digits(s)} s"


def format_value(value, unit: str | None, *, exact: bool = False) -> str:
    """One value with its unit. ``exact``: byte counts also show the exact integer, ``"8.45 MB (8,454,144 B)"``."""
    if value is None:
        return "-"
    if isinstance(value, bool) or unit is None or isinstance(value, str):
        return str(value) if not isinstance(value, int) or isinstance(value, bool) else f"{value:,}"
    if unit in ("bytes", "FLOP") and isinstance(value, int):
        text = _si(value, "B" if unit == "bytes" else unit)
        exact_text = f" ({value:,} {'B' if unit == 'bytes' else unit})"
        return text + exact_text if exact and abs(value) >= 1000 else text
    if unit == "s":
        return format_seconds(value)
    if unit == "ratio":  # a tiny ratio (a relative error of 6e-07) keeps its digits instead of "0.00 %"
        return f"{value * 100:.2f} %" if value == 0 or abs(value) >= 1e-3 else f"{value:.3g}"
    if unit == "count":
        return f"{value:,}"
    number = f"{value:,}" if isinstance(value, int) else f"{value:,.4g}"
    return f"{number} {unit}"


def record_lines(row: Mapping, units: Mapping[str, str], *, verbose: bool = False) -> list[str]:
    """Aligned ``column  value unit`` lines of a record's set (non-null) columns; ``units``: {column: unit}
    (:data:`stepsim.results.records.COLUMN_UNITS`).

    The concise view (default) leaves out :data:`VERBOSE_ONLY`; ``verbose`` shows every column and the exact
    byte counts next to the rounded ones.
    """
    shown = {k: v for k, v in row.items() if v is not None and (verbose or k not in VERBOSE_ONLY)}
    width = max(map(len, shown), default=0)
    return [f"{key:<{width}}  {format_value(value, units.get(key), exact=verbose)}" for key, value in shown.items()]
