"""``stepsim compare BASELINE CANDIDATE``: compare two result sets; exit 1 when a metric got worse
(:mod:`stepsim.insight.compare`)."""

from __future__ import annotations

from stepsim.base.errors import ConfigError
from stepsim.base.ranges import json_text


def _compare_cmd(args) -> int:
    from pathlib import Path

    from stepsim.insight.compare import compare, format_markdown, format_text
    from stepsim.plan.compare import compare_plans, format_plan_compare, is_plan_folder

    plans = [is_plan_folder(p) for p in (args.baseline, args.candidate)]
    if any(plans):  # two plans: the recommended goodput per chip is the gate (docs/plan.md §5)
        if not all(plans):
            plan, other = (args.baseline, args.candidate) if plans[0] else (args.candidate, args.baseline)
            if not Path(other).exists():  # the records' reader says the same of a missing path (insight/compare)
                raise ConfigError(f"{other}: no such file or folder")
            raise ConfigError(f"{plan} is a stepsim plan folder and {other} is not: compare like with like")
        res = compare_plans(args.baseline, args.candidate, threshold=args.threshold)
        print(json_text(res) if args.json else format_plan_compare(res))
        return 1 if res["regressed"] else 0

    res = compare(args.baseline, args.candidate, metrics=args.metric, threshold=args.threshold,
                  allow_missing=args.allow_missing)
    print(json_text(res) if args.json else format_markdown(res) if args.markdown else format_text(res))
    return 1 if res["regressed"] else 0


def _threshold(text: str) -> float:
    """``--threshold``: a ratio (``0.05``) or a percentage (``5%``), as a ratio; compare() checks the range."""
    import argparse

    try:
        return float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a ratio (0.05) or a percentage (5%), got {text!r}") from None


def register(subparsers) -> None:
    p = subparsers.add_parser("compare", help="compare two result sets; exit 1 when a metric got worse",
                              description="Compare run records (run --out folders, sweep folders or Parquet files).")
    records = ("a run folder (stepsim run --out), a sweep or optimize folder, or a Parquet file of run records; "
               "or a stepsim serve --out folder, or a folder of them; records are paired by their configuration; or a "
               "stepsim plan --out folder (the recommended goodput per chip is compared)")
    p.add_argument("baseline", metavar="BASELINE", help=f"the reference results: {records}")
    p.add_argument("candidate", metavar="CANDIDATE", help="the results checked against BASELINE (same kinds)")
    p.add_argument("--metric", action="append", metavar="M",
                   help="metric column to compare (repeatable; default cycles, off_chip_bytes, on_chip_bytes, "
                        "compute_utilization, off_chip_bw_utilization; for serve runs ttft_s.p99, tpot_s.p99, "
                        "e2e_s.p99, throughput_tokens_per_s)")
    p.add_argument("--threshold", type=_threshold, default=0.01,
                   help="relative worsening that fails the comparison: a ratio (default 0.01 = 1 %%) or a "
                        "percentage with %% (5%%)")
    p.add_argument("--allow-missing", action="store_true",
                   help="baseline configurations the candidate lacks do not fail the comparison (they are listed)")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="one JSON object")
    fmt.add_argument("--markdown", action="store_true", help="a Markdown table (for a CI log or pull request)")
    p.set_defaults(handler=_compare_cmd)
