"""``stepsim compare`` on two plans (``stepsim plan --out`` folders): the recommended deployment's goodput per chip
is the gate. Exit 1 when the candidate's is lower than the baseline's by more than ``--threshold`` (a ratio: 0.05 =
5 %), or the candidate recommends nothing where the baseline did; 0 otherwise (docs/plan.md §5)."""

from __future__ import annotations

import json
from pathlib import Path

from stepsim.base.errors import ConfigError
from stepsim.insight.compare import check_threshold

PLAN_FILE = "plan.json"


def is_plan_folder(path) -> bool:
    """Whether ``path`` is a folder holding a ``plan.json``."""
    return Path(path).is_dir() and (Path(path) / PLAN_FILE).is_file()


def _recommended(folder) -> dict | None:
    path = Path(folder) / PLAN_FILE
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path}: not a plan's JSON ({str(exc).splitlines()[0]})") from None
    if not isinstance(data, dict) or "recommended" not in data:
        raise ConfigError(f"{path}: no 'recommended' key: not a stepsim plan output")
    rec = data["recommended"]
    if rec is not None and not (isinstance(rec, dict) and isinstance(rec.get("goodput_per_chip"), (int, float))):
        raise ConfigError(f"{path}: recommended.goodput_per_chip is not a number")
    return rec


def compare_plans(baseline, candidate, *, threshold: float) -> dict:
    """The gate (module docstring): ``{"metric", "baseline", "candidate", "baseline_deployment",
    "candidate_deployment", "change", "threshold", "regressed"}``."""
    check_threshold(threshold)
    b, c = _recommended(baseline), _recommended(candidate)
    bv = None if b is None else float(b["goodput_per_chip"])
    cv = None if c is None else float(c["goodput_per_chip"])
    change = None if bv in (None, 0.0) or cv is None else (cv - bv) / bv
    if bv is None:
        regressed = False  # nothing to hold the candidate to
    elif cv is None:
        regressed = True
    else:
        regressed = cv < bv * (1 - threshold)
    return {"metric": "recommended goodput_per_chip", "baseline": bv, "candidate": cv,
            "baseline_deployment": None if b is None else b["deployment"],
            "candidate_deployment": None if c is None else c["deployment"], "change": change,
            "threshold": threshold, "regressed": regressed}


def format_plan_compare(res: dict) -> str:
    """Two lines: the values and the verdict."""
    def v(x):
        return "none" if x is None else f"{x:.4g} requests/s a chip"

    change = "" if res["change"] is None else f" ({res['change'] * 100:+.2f} %)"
    verdict = (f"worse by more than {res['threshold'] * 100:g} %" if res["regressed"] else
               f"not worse by more than {res['threshold'] * 100:g} %")
    return (f"{res['metric']}: baseline {v(res['baseline'])} ({res['baseline_deployment']}), candidate "
            f"{v(res['candidate'])} ({res['candidate_deployment']}){change}\n{verdict}")
