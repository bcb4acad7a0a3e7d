"""``stepsim demo``: the README's main job (:mod:`stepsim.demo.moe_tiling`): a table, Parquet and a PNG."""

from __future__ import annotations

from pathlib import Path

from stepsim.demo.moe_tiling import demo_trace, describe, format_table, plot, run_demo
from stepsim.models.presets import canonical_model_name


def _demo(args) -> int:
    out_dir = Path(args.out)
    trace = demo_trace(args.model, args.trace)  # before any work: a model without a bundled trace needs --trace
    table = run_demo(out_dir, args.model, not args.metrics_only, args.trace)
    print("\n".join(describe(table, trace)) + "\n")
    print(format_table(table))
    print(f"\nwrote {out_dir / 'results.parquet'}")
    if plot(table, out_dir / "moe_tiling.png", trace):
        print(f"wrote {out_dir / 'moe_tiling.png'}")
    else:
        print("plot skipped: matplotlib is missing; install it with: pip install 'stepsim[plot]'")
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("demo", help="MoE static vs dynamic tiling on the bundled synthetic trace",
                              description="``stepsim demo``: the README's main job, on the bundled synthetic "
                                          "routing trace.")
    p.add_argument("--out", default="stepsim-out/demo", help="output folder (default: stepsim-out/demo)")
    from stepsim.cli.args import model_help

    p.add_argument("--model", default="mixtral-8x7b", type=canonical_model_name,
                   help=model_help("mixtral-8x7b") + "; mixtral-8x7b and qwen3-30b-a3b have a bundled routing "
                   "trace, other MoE models need --trace")
    p.add_argument("--trace", metavar="PATH",
                   help="routing trace (default: the model's bundled synthetic B=64 trace)")
    p.add_argument("--metrics-only", action="store_true",
                   help="skip the engine: symbolic metrics only (no cycles)")
    p.set_defaults(handler=_demo, out_kind="dir")
