"""``stepsim demo``: the README's main job (:mod:`stepsim.demo.moe_tiling`): a table, Parquet and a PNG."""

from __future__ import annotations

from pathlib import Path

from stepsim.demo.moe_tiling import format_table, plot, run_demo
from stepsim.models.presets import canonical_model_name


def _demo(args) -> int:
    out_dir = Path(args.out)
    table = run_demo(out_dir, args.model, not args.metrics_only)
    print(format_table(table))
    print(f"\nwrote {out_dir / 'results.parquet'}")
    if plot(table, out_dir / "moe_tiling.png"):
        print(f"wrote {out_dir / 'moe_tiling.png'}")
    else:
        print("plot skipped: matplotlib is missing; install it with: pip install 'stepsim[plot]'")
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("demo", help="MoE static vs dynamic tiling on the bundled synthetic trace",
                              description="``stepsim demo``: the README's main job, on the bundled synthetic "
                                          "routing trace.")
    p.add_argument("--out", default="stepsim-out/demo", help="output folder (default: stepsim-out/demo)")
    p.add_argument("--model", default="mixtral-8x7b", type=canonical_model_name,
                   choices=("mixtral-8x7b", "qwen3-30b-a3b"), help="mixtral-8x7b (default, alias mixtral) or "
                   "qwen3-30b-a3b (alias qwen): the models with a bundled trace")
    p.add_argument("--metrics-only", action="store_true",
                   help="skip the engine: symbolic metrics only (no cycles)")
    p.set_defaults(handler=_demo, out_kind="dir")
