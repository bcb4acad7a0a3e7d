"""The demo (``stepsim demo``, :mod:`stepsim.cli.demo`): the README's main job, on the bundled synthetic routing trace.

Builds the Mixtral-8x7B MoE layer with static tiles of 8, 16, 32, 64 tokens and with dynamic tiling, measures
every configuration through :func:`stepsim.results.records.run_config`, prints a comparison table, and writes
``results.parquet`` (one :data:`stepsim.results.records.SCHEMA` row per configuration, with provenance metadata and
units) and ``moe_tiling.png`` into the output folder. Every configuration is simulated on the compiled engine
(cycles, measured traffic); ``--metrics-only`` skips the engine and reports the symbolic metrics alone.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from stepsim.base.files import provenance_metadata, write_parquet_atomic
from stepsim.results.records import COLUMN_UNITS, concat_runs, run_config
from stepsim.workloads.config import bundled_trace

TILES = (8, 16, 32, 64, "dynamic")


def demo_configs(model_name: str = "mixtral-8x7b", with_cycles: bool = False) -> list[dict]:
    """The demo's configurations: the MoE layer with each static tile size of :data:`TILES`, then dynamic."""
    mode = "simulate" if with_cycles else "metrics"
    return [{"workload": "moe", "model": model_name, "tiling": "dynamic", "mode": mode} if tile == "dynamic"
            else {"workload": "moe", "model": model_name, "tiling": "static", "tile_n": tile, "mode": mode}
            for tile in TILES]


def run_demo(out_dir: Path, model_name: str = "mixtral-8x7b", with_cycles: bool = False) -> pa.Table:
    """Run the demo sweep and write ``results.parquet`` (one :data:`stepsim.results.records.SCHEMA` row per point).

    Returns the results table; ``cycles`` is null unless ``with_cycles``.
    """
    runs = [run_config(config, source=f"demo point {i}")
            for i, config in enumerate(demo_configs(model_name, with_cycles))]
    table = concat_runs(runs)
    meta = provenance_metadata(config={"demo": "moe-tiling", "model": model_name, "tiles": [str(t) for t in TILES],
                                       "mode": runs[0].row["mode"]},
                               trace=bundled_trace(model_name))
    write_parquet_atomic(table, Path(out_dir) / "results.parquet", meta)
    return table


def _has_values(table: pa.Table, column: str) -> bool:
    return column in table.column_names and table.column(column).null_count < table.num_rows


def format_table(table: pa.Table) -> str:
    """A fixed-width text table of the demo results, each cell with its unit (cycles, MB / GB, FLOP; the exact
    integers are in results.parquet)."""
    from stepsim.base.display import format_value

    cols = [c for c in ("tiling", "tile_n", "cycles", "off_chip_bytes", "on_chip_bytes", "flops")
            if c in table.column_names and (c != "cycles" or _has_values(table, c))]
    rows = table.select(cols).to_pylist()
    cells = [[format_value(r[c], COLUMN_UNITS.get(c)) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    def line(vals):
        return "  ".join(v.rjust(w) for v, w in zip(vals, widths))
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
    y_key = "cycles" if _has_values(table, "cycles") else "off_chip_bytes"
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
