"""``stepsim plan``: the deployment with the most goodput per chip under an SLO (argparse and handler; the work is
:mod:`stepsim.plan.api`, the rules docs/plan.md).

Example (the conversation trace's first 300 requests, a 4-layer Qwen3-30B-A3B shape, up to 4 SN40L sockets):

  stepsim plan --model examples/qwen3-30b-a3b-4layers.json \\
      --requests ../shared/traces/azure/AzureLLMInferenceTrace_conv.csv --limit-requests 300 \\
      --slo ttft=2s,tpot=100ms --max-chips 4 --out plan-out
"""

from __future__ import annotations

import argparse


def _number(kind, text_name):
    def parse(text: str):
        try:
            return kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {text_name}, got {text!r}") from None
    return parse


def register(subparsers) -> None:
    """Add ``stepsim plan`` to the top-level subparsers."""
    from stepsim.plan.api import DEFAULT_MAX_CHIPS, DEFAULT_PERCENTILE

    p = subparsers.add_parser(
        "plan", help="capacity planning: the deployment (chips, replicas, router, scheduler) with the most goodput "
                     "per chip under an SLO",
        description="Search deployments of a model (chips per replica, replicas behind a router, scheduler knobs) "
                    "for the highest arrival rate at which a request trace meets an SLO at a percentile; prune those "
                    "that cannot reach the front; recommend the one with the most goodput per chip.",
        epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, metavar="M", help="preset name or Hugging Face config.json")
    p.add_argument("--requests", required=True, metavar="TRACE", help="request trace (.csv, .parquet, .arrow)")
    p.add_argument("--limit-requests", type=_number(int, "an integer"), metavar="N",
                   help="plan on the first N requests (default: all)")
    rate = p.add_mutually_exclusive_group()
    rate.add_argument("--arrival-scale", type=_number(float, "a number"), metavar="X",
                      help="the offered rate: every arrival time multiplied by X (default 1, the trace's rate)")
    rate.add_argument("--rate", type=_number(float, "a number"), metavar="R",
                      help="the offered rate: arrivals scaled to R requests/s (default: the trace's rate)")
    p.add_argument("--slo", required=True, metavar="ttft=2s,tpot=100ms",
                   help="the SLO (ttft, tpot, e2e; units s or ms) met at --percentile")
    p.add_argument("--percentile", type=_number(float, "a number"), default=DEFAULT_PERCENTILE, metavar="P",
                   help=f"each SLO metric's P-th percentile must be at most its limit, P in (0, 100] (default "
                        f"{DEFAULT_PERCENTILE:g})")
    p.add_argument("--hardware", nargs="+", metavar="H",
                   help="chips to plan for: presets or .toml files, one or more (default sn40l)")
    p.add_argument("--max-chips", type=_number(int, "an integer"), default=DEFAULT_MAX_CHIPS, metavar="N",
                   help=f"deployments of at most N chips, 1..4096 (default {DEFAULT_MAX_CHIPS})")
    p.add_argument("--space", metavar="FILE",
                   help="the deployment space, TOML or JSON (docs/plan.md §1; default: 1-16 chips per replica, 1-16 "
                        "replicas, three routers, seven scheduler settings)")
    workers = p.add_mutually_exclusive_group()
    workers.add_argument("--jobs", type=_number(int, "an integer"), metavar="N",
                         help="run the plan's tasks (the shapes' calibrations, then each deployment's search, one wave "
                              "per chip count) on N local worker processes (docs/plan.md §4; default: in this "
                              "process)")
    workers.add_argument("--executor", choices=("dask",),
                         help="run them on a dask.distributed cluster (a local one of one worker per CPU; default: "
                              "in this process)")
    p.add_argument("--no-verify", action="store_true",
                   help="do not re-serve the recommended deployment with its own fast calibration (default: re-serve)")
    p.add_argument("--out", required=True, metavar="DIR",
                   help="output folder: plan.json, deployments.parquet, plan.png, replica-<k>.parquet")
    p.add_argument("--json", action="store_true", help="print plan.json's object to stdout")
    p.set_defaults(handler=_plan, out_kind="dir")
    from stepsim.cli.help_topics import group_options

    group_options(p, "plan")


def _plan(args) -> int:
    from stepsim.base.display import format_seconds
    from stepsim.base.ranges import json_text
    from stepsim.plan.api import plan

    result = plan(args.model, args.requests, slo=args.slo, out=args.out, arrival_scale=args.arrival_scale,
                  rate=args.rate, limit_requests=args.limit_requests, percentile=args.percentile,
                  hardware=args.hardware, max_chips=args.max_chips, space=args.space, jobs=args.jobs,
                  executor=args.executor, verify=not args.no_verify, progress=True)
    s = result.summary
    if args.json:
        print(json_text(s, indent=2, sort_keys=True))
        return 0
    print(f"plan        {s['deployments']} deployments: {s['simulated']} searched, {s['cut']} cut during their "
          f"search, {s['pruned']} pruned by a bound, {s['infeasible']} infeasible; {s['replays']} full replays, "
          f"{s['replays_stopped']} stopped early")
    rec = s["recommended"]
    if rec is None:
        print("recommended none: no deployment meets the SLO at any rate searched")
    else:
        print(f"recommended {rec['deployment']}: {rec['rate_requests_per_s']:.3f} requests/s sustained, goodput "
              f"{rec['goodput_per_chip']:.3f} requests/s a chip, p99 TTFT {format_seconds(rec['ttft_p99_s'])}")
        for lost in s["front_lost"]:
            print(f"front       {lost['deployment']}: {lost['why']}")
        for command in s["commands"]:
            print(f"serve with  {command}")
        v = s.get("verification")
        if v is not None:  # the recommended deployment re-served with its own calibration, at the user's limits
            tpot = "" if v["tpot_p"] is None else f", TPOT {format_seconds(v['tpot_p'])}"
            print(f"verified    re-served with its own calibration: p{s['percentile']:g} TTFT "
                  f"{format_seconds(v['ttft_p'])}"
                  f"{tpot}: {'meets' if v['meets_slo'] else 'misses'} the SLO (searched with a "
                  f"{s['slo_margin'] * 100:.1f} % margin)")
    work = result.work
    print(f"tasks       {work['ran']} deployment search(es) run ({work['executor']}), {work['skipped']} read back "
          f"from {work['folder']} (an earlier run of the same plan)")
    print(f"wrote       {', '.join(str(p) for p in result.files.values())}; wall {s['wall_s']:.1f} s "
          f"({_by_phase(s['phase_wall_s'])}); tasks ran {sum(s['phase_task_s'].values()):.1f} s "
          f"({_by_phase(s['phase_task_s'])})")
    return 0


def _by_phase(seconds: dict) -> str:
    """``{phase: seconds}`` as ``calibrations 1.0, searches 2.0, ...``."""
    return ", ".join(f"{name.replace('_', ' ')} {value:.1f}" for name, value in seconds.items())
