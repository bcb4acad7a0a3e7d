"""``stepsim reproduce EXPERIMENT --traces DIR --out DIR [--jobs N] [--json]``.

Prints each experiment's table, its headline numbers and the files written, then when each experiment was done
(with ``--jobs`` above 1 the experiments share the workers and overlap). With
``--json`` stdout is one JSON object holding only the headline numbers of the experiments that ran (keys of
:data:`stepsim.reproduce.driver.JSON_KEYS`); progress lines go to stderr either way.
"""

from __future__ import annotations

import sys
import time

from stepsim.base.ranges import json_text
from stepsim.reproduce.names import CHOICES

#: not one of the paper's experiments (not in ``all``): serving runs, not engine points (stepsim/serve/validation.py)
SERVING_VALIDATION = "serving-validation"


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "reproduce", help="reproduce the paper's evaluation (tables, figures, headline numbers)",
        description="Reproduce the STeP paper's evaluation: " + ", ".join(CHOICES[:-1]) + " (or all); or "
                    f"{SERVING_VALIDATION}: stepsim's serving predictions beside SambaNova's published figures "
                    "(docs/validation.md).")
    # not argparse choices: an unknown name is a StepsimError like every other bad input (exit status 2)
    p.add_argument("experiment", metavar="EXPERIMENT", help=f"one of: {', '.join(CHOICES)}, {SERVING_VALIDATION}")
    p.add_argument("--traces", metavar="DIR",
                   help="folder laid out like ../shared/traces (expert_routing/, kv_lengths/); required by the "
                        f"paper's experiments, not by {SERVING_VALIDATION} (default: none)")
    p.add_argument("--out", required=True, metavar="DIR", help="output folder (tables, figures, headline JSON)")
    from stepsim.cli.args import add_force_argument, add_jobs_argument

    add_jobs_argument(p, "the simulations (the tables do not depend on N)")
    add_force_argument(p)
    p.add_argument("--json", action="store_true", help="print only the headline numbers, as one JSON object")
    p.add_argument("--fifo-depths", action="append", default=[], metavar="FILE",
                   help="stepsim size-fifos file; the points that build its workload use its depths (repeatable; "
                        "default: none, the experiments' depths)")
    p.set_defaults(handler=_reproduce, out_kind="dir")


def _serving_validation(args) -> int:
    from pathlib import Path

    from stepsim.base.errors import ConfigError
    from stepsim.serve import validation

    for flag, given in (("--traces", args.traces is not None), ("--jobs", args.jobs is not None),
                        ("--fifo-depths", bool(args.fifo_depths)), ("--force", args.force)):
        if given:  # each was ignored without a word (--jobs 0 too)
            raise ConfigError(f"{flag} does not apply to reproduce {SERVING_VALIDATION}: it serves one request per "
                              "published figure in this process, from the bundled model configs")
    Path(args.out).mkdir(parents=True, exist_ok=True)  # a new --out folder failed: "No such file or directory"
    rows = validation.validate(Path(args.out), progress=lambda line: print(f"[reproduce] {line}", file=sys.stderr,
                                                                           flush=True))
    files = validation.write(rows, Path(args.out))
    if args.json:
        print(json_text({"serving_validation_median_ratio_error": validation.median_ratio_error(rows)}))
        return 0
    print(validation.markdown(rows), end="")
    for kind, path in files.items():
        print(f"wrote {kind}: {path}")
    return 0


def _reproduce(args) -> int:
    from stepsim.base.errors import ConfigError
    from stepsim.cli.args import jobs_from_args

    if args.experiment == SERVING_VALIDATION:
        return _serving_validation(args)
    if args.traces is None:
        raise ConfigError(f"reproduce {args.experiment}: --traces DIR is required (a folder laid out like "
                          f"../shared/traces)")
    start = time.perf_counter()
    args.jobs = jobs_from_args(args)
    if args.jobs > 1:
        # the pool's fork server preloads stepsim and the kernels while this process imports the experiments
        from stepsim.base.forkserver import start_fork_server

        start_fork_server(warm_kernels=True)
    from stepsim.reproduce.driver import reproduce

    def progress(line: str) -> None:
        print(f"[reproduce] {line}", file=sys.stderr, flush=True)

    results = reproduce(args.experiment, args.traces, args.out, jobs=args.jobs, progress=progress,
                        fifo_depths=args.fifo_depths, force=args.force)
    total = time.perf_counter() - start
    if args.json:
        print(json_text({k: v for r in results for k, v in r.headline.items()}))
        return 0
    for r in results:
        print(f"== {r.name} ==")
        print("\n".join(r.summary))
        for kind, path in r.files.items():
            print(f"wrote {kind}: {path}")
        if r.figure_note:
            print(r.figure_note)
        print(f"{r.name}: {r.simulations} simulations, done {r.wall_s:.1f} s after the start\n")
    print(f"total wall time: {total:.1f} s (done after: {', '.join(f'{r.name} {r.wall_s:.1f} s' for r in results)})")
    return 0
