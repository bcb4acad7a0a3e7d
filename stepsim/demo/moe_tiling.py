"""The demo (``stepsim demo``, :mod:`stepsim.cli.demo`): the README's main job, on the bundled synthetic routing trace.

Builds the Mixtral-8x7B MoE layer (or any MoE model: a preset, an alias or a Hugging Face ``config.json``) with
static tiles of 8, 16, 32, 64 tokens and with dynamic tiling, measures every configuration through
:func:`stepsim.results.records.run_config`, prints a comparison table, and writes ``results.parquet`` (one
:data:`stepsim.results.records.SCHEMA` row per configuration, with provenance metadata and units) and
``moe_tiling.png`` into the output folder. Every configuration is simulated on the compiled engine (cycles,
measured traffic); ``--metrics-only`` skips the engine and reports the symbolic metrics alone.

The routing trace is the model's bundled synthetic one (Mixtral-8x7B and Qwen3-30B-A3B, B=64), or ``trace``.
On-chip memory is given in both accountings, as ``stepsim metrics`` does: ``on_chip_bytes`` (published: every
expert allocated) and ``on_chip_bytes_active`` (minus the experts that received no token). The figure draws what
``stepsim reproduce dynamic_tiling`` plots (the paper's §5.3 accounting): static tiles published, dynamic tiling
active.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from stepsim.base.files import provenance_metadata, write_parquet_atomic
from stepsim.results.records import COLUMN_UNITS, concat_runs, run_config
from stepsim.workloads.config import bundled_trace

TILES = (8, 16, 32, 64, "dynamic")


def demo_trace(model_name: str, trace: str | None = None) -> str:
    """The routing trace the demo reads: ``trace``, else the model's bundled synthetic trace (a preset's, or a
    preset's own ``config.json``); ConfigError naming ``--trace`` for a model without one."""
    from stepsim.base.errors import ConfigError
    from stepsim.models.presets import canonical_model_name, is_model_file, resolve_model

    if trace is not None:
        return str(trace)
    name = canonical_model_name(model_name)
    if is_model_file(name):
        source = Path(resolve_model(name).source).resolve()
        presets = Path(bundled_trace("mixtral-8x7b")).parent / "models"  # stepsim/data/models: the presets' files
        name = source.stem if source.parent == presets.resolve() else name
    try:
        return bundled_trace(name)
    except ConfigError:
        raise ConfigError(f"demo --model {model_name}: no bundled routing trace for this model; give one with "
                          f"--trace PATH (stepsim trace synth routing writes one)") from None


def demo_configs(model_name: str = "mixtral-8x7b", with_cycles: bool = False, trace: str | None = None) -> list[dict]:
    """The demo's configurations: the MoE layer with each static tile size of :data:`TILES`, then dynamic
    (``trace``: a routing trace instead of the model's bundled one)."""
    mode = "simulate" if with_cycles else "metrics"
    extra = {} if trace is None else {"trace": str(trace)}
    return [{"workload": "moe", "model": model_name, "tiling": "dynamic", "mode": mode, **extra}
            if tile == "dynamic" else
            {"workload": "moe", "model": model_name, "tiling": "static", "tile_n": tile, "mode": mode, **extra}
            for tile in TILES]


def run_demo(out_dir: Path, model_name: str = "mixtral-8x7b", with_cycles: bool = False,
             trace: str | None = None) -> pa.Table:
    """Run the demo sweep and write ``results.parquet`` (one :data:`stepsim.results.records.SCHEMA` row per point).

    Returns the results table; ``cycles`` is null unless ``with_cycles``.
    """
    from stepsim.models.presets import is_model_file

    path = demo_trace(model_name, trace)
    # a preset's configs leave the trace out (its bundled one: the run ids of `stepsim run moe --model M`); a
    # config file has no bundled trace of its own, so its configs name the one the demo found
    given = trace if trace is not None or not is_model_file(str(model_name)) else path
    runs = [run_config(config, source=f"demo point {i}")
            for i, config in enumerate(demo_configs(model_name, with_cycles, given))]
    table = concat_runs(runs)
    meta = provenance_metadata(config={"demo": "moe-tiling", "model": model_name, "tiles": [str(t) for t in TILES],
                                       "mode": runs[0].row["mode"]},
                               trace=path)
    write_parquet_atomic(table, Path(out_dir) / "results.parquet", meta)
    return table


def describe(table: pa.Table, trace: str) -> list[str]:
    """The lines above the demo's table: which model, trace and on-chip accounting it shows."""
    from stepsim.workloads.config import BUNDLED_TRACES

    row = table.slice(0, 1).to_pylist()[0]
    name = Path(trace).name
    kind = "the bundled synthetic routing trace" if name in BUNDLED_TRACES.values() else "routing trace"
    return [f"MoE layer {row['model']}, {kind} {name}, static tiles {', '.join(map(str, TILES[:-1]))} and "
            f"dynamic tiling ({'simulated' if row['mode'] == 'simulate' else 'symbolic metrics only'})",
            "on_chip_bytes: published accounting (every expert allocated); on_chip_bytes_active: minus the "
            "experts that received no token (the figure, like `stepsim reproduce dynamic_tiling`, draws static "
            "tiles published and dynamic tiling active)"]


def _has_values(table: pa.Table, column: str) -> bool:
    return column in table.column_names and table.column(column).null_count < table.num_rows


def format_table(table: pa.Table) -> str:
    """A fixed-width text table of the demo results, each cell with its unit (cycles, MB / GB, FLOP; the exact
    integers are in results.parquet)."""
    from stepsim.base.display import format_value

    cols = [c for c in ("tiling", "tile_n", "cycles", "off_chip_bytes", "on_chip_bytes", "on_chip_bytes_active",
                        "flops")
            if c in table.column_names and (c != "cycles" or _has_values(table, c))]
    rows = table.select(cols).to_pylist()
    cells = [[format_value(r[c], COLUMN_UNITS.get(c)) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    def line(vals):
        return "  ".join(v.rjust(w) for v, w in zip(vals, widths))
    return "\n".join([line(cols), line(["-" * w for w in widths])] + [line(r) for r in cells])


def plot(table: pa.Table, path: Path, trace: str | None = None) -> bool:
    """Write the on-chip memory vs cycles (off-chip traffic without cycles) plot, in the accounting of
    ``stepsim reproduce dynamic_tiling`` (static tiles published, dynamic tiling active); False when matplotlib
    is missing."""
    from stepsim.base.errors import ConfigError
    from stepsim.base.figures import require_matplotlib, save_figure, si_axis

    try:
        plt = require_matplotlib()
    except ConfigError:
        return False
    rows = table.to_pylist()
    y_key = "cycles" if _has_values(table, "cycles") else "off_chip_bytes"
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    static = [r for r in rows if r["tiling"] == "static"]
    ax.plot([r["on_chip_bytes"] for r in static], [r[y_key] for r in static], "o-", color="tab:blue",
            label="static tiles (published on-chip)")
    right = max((r["on_chip_bytes"] for r in static), default=0)
    for r in static:  # the rightmost label sits left of its point, so it stays inside the axes
        last = r["on_chip_bytes"] == right
        ax.annotate(f"tile {r['tile_n']}", (r["on_chip_bytes"], r[y_key]), textcoords="offset points",
                    xytext=(-6, 6) if last else (6, 6), ha="right" if last else "left", fontsize=8)
    dyn = [r for r in rows if r["tiling"] == "dynamic"]
    ax.plot([r["on_chip_bytes_active"] for r in dyn], [r[y_key] for r in dyn], "*", color="tab:red",
            markersize=14, label="dynamic tiling (active on-chip)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.margins(x=0.08, y=0.1)
    si_axis(ax.xaxis, "B")
    si_axis(ax.yaxis, "" if y_key == "cycles" else "B")
    ax.set_xlabel("on-chip memory")
    ax.set_ylabel("cycles" if y_key == "cycles" else "off-chip traffic")
    ax.grid(True, which="major", alpha=0.3)
    trace_name = f", {Path(trace).name}" if trace else ""
    model = rows[0]["model"]
    if str(model).lower().endswith(".json"):  # a config file: its name (a full path would not fit the title)
        model = Path(model).name
    ax.set_title(f"MoE layer {model}{trace_name}", fontsize=10)
    ax.legend(fontsize=8)
    save_figure(fig, Path(path))
    return True
