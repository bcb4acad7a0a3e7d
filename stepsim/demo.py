"""``stepsim demo``: the README's main job, on the bundled synthetic routing trace.

Builds the Mixtral-8x7B MoE layer with static tiles of 8, 16, 32, 64 tokens and with dynamic tiling, measures
every configuration, prints a comparison table, and writes ``results.parquet`` (with provenance metadata and
units) and ``moe_tiling.png`` into the output folder. ``--simulate`` adds cycle counts from the compiled engine
(off by default until MoE simulation is verified against the reference engine).
"""

from __future__ import annotations

import time
from pathlib import Path

import pyarrow as pa

from stepsim.results import provenance_metadata, write_parquet_atomic
from stepsim.workloads.cli import bundled_trace
from stepsim.workloads.models import moe_model
from stepsim.workloads.moe import build_moe
from stepsim.workloads.traces import load_routing

TILES = (8, 16, 32, 64, "dynamic")
UNITS = {"off_chip_bytes": "bytes", "on_chip_bytes": "bytes", "on_chip_bytes_active": "bytes", "flops": "FLOP",
         "graph_flops": "FLOP", "cycles": "cycles", "sim_wall_s": "s"}


def run_demo(out_dir: Path, model_name: str = "mixtral-8x7b", with_cycles: bool = False) -> pa.Table:
    """Run the demo sweep and write its outputs; returns the results table."""
    model = moe_model(model_name)
    trace = bundled_trace(model_name)
    routing = load_routing(trace, model.experts)
    simulate = None
    if with_cycles:
        from stepsim.simulate import simulate
    rows = []
    for tile in TILES:
        tiling = "dynamic" if tile == "dynamic" else "static"
        workload = build_moe(model, routing, tiling=tiling, tile_n=None if tiling == "dynamic" else tile)
        row = {"model": model.name, "tiling": tiling, "tile_n": None if tiling == "dynamic" else tile,
               **workload.metrics()}
        if simulate is not None:
            start = time.perf_counter()
            result = simulate(workload)
            row["cycles"] = result.cycles
            row["sim_wall_s"] = round(time.perf_counter() - start, 3)
        rows.append(row)
    table = pa.Table.from_pylist(rows)
    out_dir.mkdir(parents=True, exist_ok=True)
    meta = provenance_metadata(config={"demo": "moe-tiling", "model": model.name, "tiles": [str(t) for t in TILES]},
                               trace=trace)
    write_parquet_atomic(table, out_dir / "results.parquet", meta,
                         units={k: v for k, v in UNITS.items() if k in table.column_names})
    return table


def format_table(table: pa.Table) -> str:
    """A fixed-width text table of the demo results."""
    cols = [c for c in ("tiling", "tile_n", "cycles", "off_chip_bytes", "on_chip_bytes", "flops")
            if c in table.column_names]
    rows = table.select(cols).to_pylist()
    cells = [[("-" if r[c] is None else f"{r[c]:,}" if isinstance(r[c], int) else str(r[c])) for c in cols]
             for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    line = lambda vals: "  ".join(v.rjust(w) for v, w in zip(vals, widths))  # noqa: E731
    return "\n".join([line(cols), line(["-" * w for w in widths])] + [line(r) for r in cells])


def plot(table: pa.Table, path: Path) -> bool:
    """Write the on-chip memory vs off-chip traffic (and cycles) plot; False when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    rows = table.to_pylist()
    y_key = "cycles" if "cycles" in table.column_names else "off_chip_bytes"
    fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
    static = [r for r in rows if r["tiling"] == "static"]
    ax.plot([r["on_chip_bytes"] for r in static], [r[y_key] for r in static], "o-", label="static tiles")
    for r in static:
        ax.annotate(f"tile {r['tile_n']}", (r["on_chip_bytes"], r[y_key]), textcoords="offset points",
                    xytext=(4, 4), fontsize=8)
    dyn = [r for r in rows if r["tiling"] == "dynamic"]
    ax.plot([r["on_chip_bytes"] for r in dyn], [r[y_key] for r in dyn], "*", markersize=14, label="dynamic tiling")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("on-chip memory (bytes)")
    ax.set_ylabel("cycles" if y_key == "cycles" else "off-chip traffic (bytes)")
    ax.set_title(f"MoE layer, {rows[0]['model']}, bundled synthetic trace")
    ax.legend()
    fig.tight_layout()
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp)
    plt.close(fig)
    tmp.replace(path)
    return True


def _demo(args) -> int:
    out_dir = Path(args.out)
    table = run_demo(out_dir, args.model, args.simulate)
    print(format_table(table))
    print(f"\nwrote {out_dir / 'results.parquet'}")
    if plot(table, out_dir / "moe_tiling.png"):
        print(f"wrote {out_dir / 'moe_tiling.png'}")
    else:
        print("plot skipped: matplotlib is missing; install it with: pip install 'stepsim[plot]'")
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("demo", help="MoE static vs dynamic tiling on the bundled synthetic trace",
                              description=__doc__.splitlines()[0])
    p.add_argument("--out", default="stepsim-out/demo", help="output folder (default: stepsim-out/demo)")
    p.add_argument("--model", default="mixtral-8x7b", choices=("mixtral-8x7b", "qwen3-30b-a3b"))
    p.add_argument("--simulate", action="store_true", help="also simulate cycles on the compiled engine")
    p.set_defaults(handler=_demo)
