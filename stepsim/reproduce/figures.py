"""PNG figures of the four experiments, drawn like the paper's (matplotlib, from the ``plot`` extra).

Each ``plot_<experiment>(table, details, path)`` draws from the experiment's table (and headline details) and
writes ``path`` atomically. :func:`~stepsim.base.figures.require_matplotlib` raises a clear error when
matplotlib is missing; the driver turns that into a "figure skipped" message instead of failing the experiment.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from stepsim.base.figures import require_matplotlib, save_figure, si_axis
from stepsim.reproduce.tables import group_rows

_MODEL_TITLES = {"mixtral-8x7b": "Mixtral-8x7B", "qwen3-30b-a3b": "Qwen3-30B-A3B"}


def plot_dynamic_tiling(table: pa.Table, details: dict, path: Path) -> Path:
    """Fig 9/10: per routing batch, on-chip memory (plotted accounting: published for static tiles, active for
    dynamic tiling) vs cycles, log-log; static tiles form a line, each point labelled with its tile, dynamic
    tiling is one star."""
    plt = require_matplotlib()
    groups = list(group_rows(table, ("model", "batch", "trace")))
    fig, axes = plt.subplots(1, len(groups), figsize=(5.2 * len(groups), 4.2), squeeze=False)
    for ax, ((model, batch, trace), rows) in zip(axes[0], groups):
        static = [r for r in rows if r["tiling"] == "static"]
        dynamic = [r for r in rows if r["tiling"] == "dynamic"]
        ax.plot([r["on_chip_bytes_plotted"] for r in static], [r["cycles"] for r in static], "o-",
                color="tab:blue", label="static tiles (published on-chip)")
        right = max((r["on_chip_bytes_plotted"] for r in static), default=0)
        for r in static:  # the rightmost label sits left of its point, inside the axes
            last = r["on_chip_bytes_plotted"] == right
            ax.annotate(f"tile {r['tile_n']}", (r["on_chip_bytes_plotted"], r["cycles"]),
                        textcoords="offset points", xytext=(-6, 6) if last else (6, 6),
                        ha="right" if last else "left", fontsize=8)
        ax.plot([r["on_chip_bytes_plotted"] for r in dynamic], [r["cycles"] for r in dynamic], "*",
                color="tab:red", markersize=15, label="dynamic tiling (active on-chip)")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.margins(x=0.08, y=0.1)
        si_axis(ax.xaxis, "B")
        si_axis(ax.yaxis)
        ax.set_xlabel("on-chip memory")
        ax.set_ylabel("cycles")
        ax.set_title(f"{_MODEL_TITLES.get(model, model)}, B={batch} ({trace})", fontsize=10)
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize=8)
    return save_figure(fig, path)


def _region_labels(rows) -> list[str]:
    return [f"{r['regions']}\n({r['experts_per_region']})" for r in rows]


def _utilization_panel(ax, rows, title: str) -> None:
    """Fig 12: compute utilization bars with the performance overhead line on a second axis."""
    x = range(len(rows))
    ax.bar(x, [r["compute_utilization_pct"] for r in rows], color="tab:green", label="compute utilization")
    ax.set_xticks(list(x), _region_labels(rows), fontsize=8)
    ax.set_xlabel("parallel regions (experts per region)")
    ax.set_ylabel("compute utilization (%)")
    twin = ax.twinx()
    twin.plot(list(x), [r["performance_overhead_pct"] for r in rows], "o-", color="tab:red",
              label="performance overhead")
    twin.axhline(0, color="grey", linewidth=0.6)
    twin.set_ylabel("performance overhead (%)")
    ax.set_title(title, fontsize=10)
    _legend(ax, twin, loc="upper left")


def _legend(ax, twin, **kwargs) -> None:
    """One legend for a panel and its twin axis."""
    handles, labels = ax.get_legend_handles_labels()
    more, more_labels = twin.get_legend_handles_labels()
    twin.legend(handles + more, labels + more_labels, fontsize=8, **kwargs)


def plot_time_multiplexing(table: pa.Table, details: dict, path: Path) -> Path:
    """Fig 12 and Fig 13, a 2 x 2 block per routing batch: compute utilization and overhead for static and
    dynamic tiling; allocated FLOPs/cycle with on-chip kB; off-chip bandwidth utilization."""
    plt = require_matplotlib()
    traces = list(group_rows(table, ("trace",)))
    fig, axes = plt.subplots(2 * len(traces), 2, figsize=(12, 8.4 * len(traces)), dpi=100, squeeze=False)
    for i, ((trace,), rows) in enumerate(traces):
        (util_static, util_dynamic), (resources, bandwidth) = axes[2 * i], axes[2 * i + 1]
        by_tiling = {t: [r for r in rows if r["tiling"] == t] for t in ("static", "dynamic")}
        for ax, tiling in ((util_static, "static"), (util_dynamic, "dynamic")):
            if by_tiling[tiling]:
                tile = "static tile 32" if tiling == "static" else "dynamic tiling"
                _utilization_panel(ax, by_tiling[tiling], f"{trace}: {tile} (Fig 12)")
        ref = by_tiling["static"] or by_tiling["dynamic"]
        x = list(range(len(ref)))
        resources.bar(x, [r["allocated_flops_per_cycle"] for r in ref], color="lightgrey",
                      label="allocated compute")
        resources.set_ylabel("allocated compute (FLOP/cycle)")
        si_axis(resources.yaxis)  # 800k, not 800000
        twin = resources.twinx()
        for tiling, marker in (("static", "o-"), ("dynamic", "s--")):
            rs = by_tiling[tiling]
            # the table's kB are 1,000 bytes: drawn in bytes with decimal prefixes (80 MB, not 80000 kB)
            twin.plot(range(len(rs)), [r["on_chip_kb"] * 1000 for r in rs], marker, label=f"on-chip ({tiling})")
        twin.set_ylabel("on-chip memory")
        twin.set_ylim(bottom=0)
        si_axis(twin.yaxis, "B")
        _legend(resources, twin, loc="upper right")
        resources.set_title(f"{trace}: resources (Fig 13a)", fontsize=10)
        for tiling, marker in (("static", "o-"), ("dynamic", "s--")):
            rs = by_tiling[tiling]
            bandwidth.plot(range(len(rs)), [r["off_chip_bw_utilization_pct"] for r in rs], marker, label=tiling)
        bandwidth.set_ylabel("off-chip bandwidth utilization (%)")
        bandwidth.set_ylim(0, 100)
        bandwidth.legend(fontsize=8)
        bandwidth.set_title(f"{trace}: off-chip bandwidth (Fig 13b)", fontsize=10)
        for ax in (resources, bandwidth):
            ax.set_xticks(x, _region_labels(ref), fontsize=8)
            ax.set_xlabel("parallel regions (experts per region)")
    return save_figure(fig, path)


def plot_dynamic_parallelization(table: pa.Table, details: dict, path: Path) -> Path:
    """Fig 14/21: per batch size, each window's coarse and interleave cycles normalized to dynamic (= 1)."""
    plt = require_matplotlib()
    batches = list(group_rows(table, ("batch",)))
    width_in = sum(max(5.0, 0.7 * len(rows)) for _, rows in batches)  # wide enough for every window's bars
    fig, axes = plt.subplots(1, len(batches), figsize=(width_in, 4.2), dpi=110, squeeze=False)
    width = 0.38
    for ax, ((batch,), rows) in zip(axes[0], batches):
        x = list(range(len(rows)))
        ax.bar([i - width / 2 for i in x], [r["coarse_cycles"] / r["dynamic_cycles"] for r in rows], width,
               label="static coarse", color="tab:orange")
        ax.bar([i + width / 2 for i in x], [r["interleave_cycles"] / r["dynamic_cycles"] for r in rows], width,
               label="static interleave", color="tab:blue")
        ax.axhline(1.0, color="tab:red", linewidth=1.2, label="dynamic (= 1)")
        ax.set_xticks(x, [f"{r['variance']}\n{r['stdev']:.0f}" for r in rows], fontsize=8)
        ax.set_xlabel("KV-length variance class / stdev (tokens)")
        ax.set_ylabel("cycles normalized to dynamic")
        ax.set_title(f"GQA decode attention, B={batch}", fontsize=10)
        top = max(max(r["coarse_cycles"], r["interleave_cycles"]) / r["dynamic_cycles"] for r in rows)
        ax.set_ylim(0, top * 1.18)  # room for the legend above the bars
        ax.legend(fontsize=8, loc="upper center", ncol=3)
    return save_figure(fig, path)


def plot_validation(table: pa.Table, details: dict, path: Path) -> Path:
    """Fig 8 counterpart: simulated cycles vs the roofline bound, and cycles / off-chip traffic per tile."""
    plt = require_matplotlib()
    rows = table.to_pylist()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2), dpi=110)
    bound = [r["roofline_bound_cycles"] for r in rows]
    left.scatter(bound, [r["cycles"] for r in rows], color="tab:orange", zorder=3)
    hi = max(max(bound), max(r["cycles"] for r in rows)) * 1.05
    left.plot([0, hi], [0, hi], "--", color="grey", label="cycles = roofline bound")
    si_axis(left.xaxis)
    si_axis(left.yaxis)
    left.set_xlabel("roofline bound (cycles)")
    left.set_ylabel("simulated cycles")
    left.set_title(f"SwiGLU tile sweep: Pearson r = {details['pearson_cycles_vs_roofline']:.4f}", fontsize=10)
    left.legend(fontsize=8)
    tile_n = sorted({r["tile_n"] for r in rows})
    for m in sorted({r["tile_m"] for r in rows}):
        rs = sorted((r for r in rows if r["tile_m"] == m), key=lambda r: r["tile_n"])
        line, = right.plot([r["tile_n"] for r in rs], [r["cycles"] for r in rs], "o-", label=f"tile_m {m}")
        right.plot([r["tile_n"] for r in rs], [r["roofline_bound_cycles"] for r in rs], ":", color=line.get_color())
    hdl = details.get("hdl_points") or []
    if hdl:
        right.plot([p["tile_n"] for p in hdl], [p["hdl_cycles"] for p in hdl], "x", color="black", markersize=8,
                   label=f"HDL, tile_m {hdl[0]['tile_m']} (published)")
    right.set_xscale("log", base=2)
    right.set_xticks(tile_n, [str(n) for n in tile_n])
    si_axis(right.yaxis)
    right.set_xlabel("tile_n")
    right.set_ylabel("cycles (dotted: roofline bound)")
    r_hdl = details.get("pearson_cycles_vs_hdl")
    right.set_title("cycles per tile configuration" + ("" if r_hdl is None else f"; r vs HDL = {r_hdl:.4f}"),
                    fontsize=10)
    right.legend(fontsize=8)
    return save_figure(fig, path)


PLOTTERS = {"dynamic_tiling": plot_dynamic_tiling, "time_multiplexing": plot_time_multiplexing,
            "dynamic_parallelization": plot_dynamic_parallelization, "validation": plot_validation}
