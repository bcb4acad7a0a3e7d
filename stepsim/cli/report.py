"""``stepsim report RUN_DIR``: why a run is slow (bound, critical path, imbalance, full FIFOs;
:mod:`stepsim.insight.report`)."""

from __future__ import annotations

import sys

from stepsim.base.ranges import json_text


def _report_cmd(args) -> int:
    from stepsim.base.errors import ArgumentError
    from stepsim.base.outputs import check_out_file
    from stepsim.insight.report import format_report, report_run_dir, write_png

    if args.png is not None:  # before the report, which may simulate the run again for a minute
        if not args.png.lower().endswith(".png"):
            raise ArgumentError(f"--png {args.png}: give a file name ending in .png")
        check_out_file(args.png, "--png")
    from stepsim.insight.serve_layers import format_serve_report, is_serve_folder, serve_report

    if is_serve_folder(args.run_dir):  # `stepsim serve --out`: its utilisation and mapped layers
        if args.png is not None:
            raise ArgumentError("--png: a serve folder's figures are written by stepsim serve (roofline.png)")
        rep = serve_report(args.run_dir)
        print(json_text(rep) if args.json else format_serve_report(rep))
        return 0
    rep, timeline = report_run_dir(args.run_dir)
    print(json_text(rep) if args.json else format_report(rep))
    if args.png:
        path = write_png(rep, args.png, timeline)
        print(f"wrote png: {path}", file=sys.stderr if args.json else sys.stdout)
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("report", help="why a run is slow: bound, critical path, imbalance, full FIFOs",
                              description="Bottleneck report of a folder written by `stepsim run --out RUN_DIR`; of a "
                                          "folder of `stepsim serve --out`: its utilisation, and each mapped "
                                          "layer's cycles, HBM and compute utilisation and units.")
    p.add_argument("run_dir", metavar="RUN_DIR", help="folder written by stepsim run --out or stepsim serve --out")
    p.add_argument("--json", action="store_true",
                   help="one JSON object (keys bound, roofline, critical_path, top_units, imbalance, full_fifos)")
    p.add_argument("--png", metavar="FILE",
                   help="also draw busy / blocked shares per group and their busy share over time (matplotlib; "
                        "default: none)")
    p.set_defaults(handler=_report_cmd, out=None)
