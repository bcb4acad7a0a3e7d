"""Compare two sets of run records (``stepsim compare BASELINE CANDIDATE``), for performance checks in CI.

Each side is a ``stepsim run --out`` folder, a ``stepsim sweep`` output folder (rows in ``part-*.parquet``
files, hive sub-folders allowed) or one Parquet file of records. Records are matched by configuration: every
knob of :data:`stepsim.workloads.config.KNOBS` except the trace path, plus the trace's content hash, the
hardware and the mode (:func:`config_key`). When each side holds exactly one record the two are compared
whatever their configurations (the knobs that differ are listed), so a change of configuration can be judged.

Per metric and matched pair: baseline, candidate, relative change ``(candidate - baseline) / baseline``, and
whether it got *worse* by more than the threshold. Lower is better for cycles and bytes; higher is better for
utilizations (metrics whose name contains ``utilization``). Single runs with unit tables on both sides also get
per-unit busy-cycle changes (the largest ones).

Exit status of the command: 1 when any compared metric got worse by more than ``--threshold`` (a ratio,
default 0.01 = 1 %), else 0; 2 on errors (unreadable input, no matching records, unknown metric).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from stepsim.base.errors import ConfigError

#: metrics compared by default
DEFAULT_METRICS = ("cycles", "off_chip_bytes", "on_chip_bytes", "compute_utilization", "off_chip_bw_utilization")
#: per-unit changes listed for single runs
TOP_UNIT_CHANGES = 10


def higher_is_better(metric: str) -> bool:
    return "utilization" in metric


def _hive_values(root: Path, path: Path) -> dict:
    out = {}
    for part in path.relative_to(root).parts[:-1]:
        if "=" in part:
            k, v = part.split("=", 1)
            out[k] = v
    return out


def load_records(path: str | os.PathLike) -> tuple[list[dict], dict]:
    """``(rows, units by run_id)`` of one side (see the module docstring); ConfigError when unreadable."""
    import pyarrow.parquet as pq

    p = Path(path)
    if p.is_file():
        files, root = [p], p.parent
    elif p.is_dir():
        files, root = sorted(p.rglob("part-*.parquet")), p
        if not files:
            raise ConfigError(f"{p}: no records (part-*.parquet) in this folder; give a `stepsim run --out` or "
                              f"`stepsim sweep` folder or a Parquet file")
    else:
        raise ConfigError(f"{p}: no such file or folder")
    rows = []
    for f in files:
        try:
            table = pq.read_table(f)
        except Exception as exc:  # pyarrow raises several types for a non-Parquet file
            raise ConfigError(f"{f}: not a Parquet file of records ({type(exc).__name__}: {exc})") from None
        if "cycles" not in table.column_names and "run_id" not in table.column_names:
            raise ConfigError(f"{f}: not a table of stepsim records (no run_id / cycles column)")
        extra = _hive_values(root, f)
        rows += [{**extra, **r} for r in table.to_pylist()]
    rows = [r for r in rows if r.get("status", "ok") in (None, "ok")]
    units: dict = {}
    unit_files = sorted(p.rglob("_units-*.parquet")) if p.is_dir() else [
        f for f in [p.with_name(f"{p.stem}_units.parquet")] if f.is_file()]  # run --out NAME.parquet
    if unit_files:
        for f in unit_files:
            for u in pq.read_table(f).to_pylist():
                units.setdefault(u.get("run_id"), []).append(u)
    return rows, units


def config_key(row: dict) -> tuple:
    """What identifies a record's configuration across two result sets (see the module docstring)."""
    from stepsim.workloads.config import KNOBS

    # values as text: hive folder levels of a sweep give them back as strings
    def text(v):
        return None if v is None else str(v)

    return tuple((k, text(row.get(k))) for k in KNOBS if k != "trace") + (
        ("trace_sha256", text(row.get("trace_sha256"))), ("hardware_name", text(row.get("hardware_name"))),
        ("mode", text(row.get("mode"))))


def _label(row: dict) -> str:
    from stepsim.workloads.config import KNOBS

    return " ".join(f"{k}={row[k]}" for k in KNOBS if row.get(k) is not None and k != "trace") or "run"


def _change(metric: str, base, cand, threshold: float) -> dict:
    entry = {"metric": metric, "baseline": base, "candidate": cand, "change": None, "worse": False}
    if base is None or cand is None:
        return entry
    if base == 0:  # no relative change (kept JSON-valid: no infinities); any growth from 0 is worse
        entry["change"] = 0.0 if cand == 0 else None
        entry["worse"] = bool(cand < 0 if higher_is_better(metric) else cand > 0)
        return entry
    entry["change"] = (cand - base) / abs(base)
    worse = -entry["change"] if higher_is_better(metric) else entry["change"]
    entry["worse"] = bool(worse > threshold)
    return entry


def _unit_changes(base_units: list[dict], cand_units: list[dict]) -> list[dict]:
    before = {u["name"]: u for u in base_units}
    out = []
    for u in cand_units:
        b = before.get(u["name"])
        if b is None:
            continue
        delta = u["busy_cycles"] - b["busy_cycles"]
        if delta:
            out.append({"unit": u["name"], "kind": u.get("kind"), "baseline_busy_cycles": b["busy_cycles"],
                        "candidate_busy_cycles": u["busy_cycles"], "change_cycles": delta})
    out.sort(key=lambda e: (-abs(e["change_cycles"]), e["unit"]))
    return out[:TOP_UNIT_CHANGES]


def compare(baseline: str | os.PathLike, candidate: str | os.PathLike, *, metrics=None,
            threshold: float = 0.01) -> dict:
    """Compare two result sets (Python entry point of ``stepsim compare``).

    Returns
    -------
    dict
        ``{"threshold", "metrics", "pairs": [{"config", "differs", "changes": [...], "units": [...]}],
        "unmatched_baseline", "unmatched_candidate", "worse": [metric names], "regressed": bool}``.
    """
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or threshold < 0:
        raise ConfigError(f"--threshold must be a ratio >= 0 (0.01 = 1 %), got {threshold!r}")
    metrics = list(metrics or DEFAULT_METRICS)
    base_rows, base_units = load_records(baseline)
    cand_rows, cand_units = load_records(candidate)
    for m in metrics:
        for side, rows in (("baseline", base_rows), ("candidate", cand_rows)):
            if rows and m not in rows[0]:
                raise ConfigError(f"--metric {m}: not a column of the {side}'s records")
    if len(base_rows) == 1 and len(cand_rows) == 1:
        pairs = [(base_rows[0], cand_rows[0])]
        unmatched_b, unmatched_c = [], []
    else:
        cand_by_key: dict = {}
        for r in cand_rows:
            cand_by_key.setdefault(config_key(r), r)
        pairs, unmatched_b = [], []
        for r in base_rows:
            c = cand_by_key.pop(config_key(r), None)
            if c is None:
                unmatched_b.append(_label(r))
            else:
                pairs.append((r, c))
        unmatched_c = [_label(r) for r in cand_by_key.values()]
    if not pairs:
        raise ConfigError(f"no record of {candidate} matches a configuration of {baseline} "
                          f"({len(base_rows)} vs {len(cand_rows)} records)")
    out_pairs, worse = [], []
    for b, c in pairs:
        changes = [_change(m, b.get(m), c.get(m), threshold) for m in metrics]
        ck = dict(config_key(c))
        differs = {k: [b.get(k), c.get(k)] for k, v in config_key(b) if ck[k] != v}
        units = []
        if len(pairs) == 1 and b.get("run_id") in base_units and c.get("run_id") in cand_units:
            units = _unit_changes(base_units[b["run_id"]], cand_units[c["run_id"]])
        out_pairs.append({"config": _label(b), "differs": differs, "changes": changes, "units": units})
        worse += [ch["metric"] for ch in changes if ch["worse"] and ch["metric"] not in worse]
    return {"threshold": threshold, "metrics": metrics, "pairs": out_pairs, "unmatched_baseline": unmatched_b,
            "unmatched_candidate": unmatched_c, "worse": worse, "regressed": bool(worse)}


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    return f"{v:,}"


def _pct(ch) -> str:
    return "-" if ch is None else f"{100 * ch:+.2f} %"


def format_text(res: dict) -> str:
    lines = []
    for p in res["pairs"]:
        lines.append(f"{p['config']}" + (f"  (differs: {', '.join(f'{k} {a} -> {b}' for k, (a, b) in p['differs'].items())})"
                                         if p["differs"] else ""))
        for ch in p["changes"]:
            flag = "  WORSE" if ch["worse"] else ""
            lines.append(f"  {ch['metric']:<24} {_fmt(ch['baseline']):>16} -> {_fmt(ch['candidate']):>16}  "
                         f"{_pct(ch['change'])}{flag}")
        for u in p["units"]:
            lines.append(f"  unit {u['unit']} ({u['kind']}): busy {u['baseline_busy_cycles']:,} -> "
                         f"{u['candidate_busy_cycles']:,} cycles ({u['change_cycles']:+,})")
    for side in ("baseline", "candidate"):
        if res[f"unmatched_{side}"]:
            lines.append(f"only in the {side}: {len(res[f'unmatched_{side}'])} record(s)")
    lines.append(f"worse by more than {100 * res['threshold']:g} %: {', '.join(res['worse'])}" if res["worse"]
                 else f"no metric worse by more than {100 * res['threshold']:g} %")
    return "\n".join(lines)


def format_markdown(res: dict) -> str:
    lines = ["| configuration | metric | baseline | candidate | change | |", "|---|---|---:|---:|---:|---|"]
    for p in res["pairs"]:
        for ch in p["changes"]:
            lines.append(f"| {p['config']} | {ch['metric']} | {_fmt(ch['baseline'])} | {_fmt(ch['candidate'])} | "
                         f"{_pct(ch['change'])} | {':x: worse' if ch['worse'] else ''} |")
    units = [u for p in res["pairs"] for u in p["units"]]
    if units:
        lines += ["", "| unit | busy before | busy after | change |", "|---|---:|---:|---:|"]
        lines += [f"| {u['unit']} | {u['baseline_busy_cycles']:,} | {u['candidate_busy_cycles']:,} | "
                  f"{u['change_cycles']:+,} |" for u in units]
    lines += ["", f"**worse by more than {100 * res['threshold']:g} %: {', '.join(res['worse'])}**" if res["worse"]
              else f"No metric worse by more than {100 * res['threshold']:g} %."]
    return "\n".join(lines)


def to_json(res: dict) -> str:
    return json.dumps(res)
