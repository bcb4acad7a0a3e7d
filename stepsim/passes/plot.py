"""A small PNG of FIFO bytes per group of equivalent channels: 1024-deep FIFOs (before) vs sized (after)."""

from __future__ import annotations

from pathlib import Path

#: groups drawn (the largest by bytes at 1024 deep; the rest are summed into one bar)
MAX_BARS = 14


def plot_fifo_bytes(result, path: str | Path) -> Path:
    """Draw ``result.groups`` (label, bytes at 1024, bytes sized) as paired horizontal bars on a log axis and
    write ``path`` atomically (same result, same bytes). Raises ConfigError when matplotlib is missing.

    Bytes read as in the CLI (``format_bytes``: ``4.19 GB``, ``8.39 MB``) in the title, on the axis and at the
    end of each bar; the bars start at a labelled decade below the smallest value (a log axis has no zero)."""
    import math

    from stepsim.base.display import format_bytes
    from stepsim.base.figures import require_matplotlib, save_figure, si_axis

    plt = require_matplotlib()
    groups = sorted(result.groups, key=lambda g: (-g[1], g[0]))
    shown, rest = groups[:MAX_BARS], groups[MAX_BARS:]
    if rest:
        shown.append((f"{len(rest)} other groups", sum(g[1] for g in rest), sum(g[2] for g in rest)))
    labels = [g[0] for g in shown][::-1]
    before = [max(g[1], 1) for g in shown][::-1]
    after = [max(g[2], 1) for g in shown][::-1]
    fig, ax = plt.subplots(figsize=(8, 0.32 * len(shown) + 1.4))
    ys = range(len(shown))
    base = 10.0 ** math.floor(math.log10(min(before + after)) - 0.3)  # a decade at least 2x below the smallest
    ax.barh([y + 0.2 for y in ys], [b - base for b in before], left=base, height=0.4, color="#bbbbbb",
            label="every FIFO 1024 deep")
    ax.barh([y - 0.2 for y in ys], [a - base for a in after], left=base, height=0.4, color="#1f77b4",
            label="sized")
    for y, b, a in zip(ys, before, after, strict=True):
        ax.annotate(format_bytes(b), (b, y + 0.2), xytext=(3, 0), textcoords="offset points", va="center",
                    fontsize=7, color="0.35")
        ax.annotate(format_bytes(a), (a, y - 0.2), xytext=(3, 0), textcoords="offset points", va="center",
                    fontsize=7, color="#1f77b4")
    ax.set_yticks(list(ys), labels, fontsize=8)
    ax.set_xscale("log")
    ax.set_xlim(base, max(before + after) * 8)  # room for the value labels
    si_axis(ax.xaxis, "B")
    ax.set_xlabel("FIFO bytes (depth x element bytes, summed over the group; log scale)", fontsize=9)
    ax.set_title(f"{result.graph_name}: FIFOs {format_bytes(result.unbounded_fifo_bytes)} at depth 1024 -> "
                 f"{format_bytes(result.total_fifo_bytes)} sized", fontsize=10)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=2, frameon=False)
    return save_figure(fig, Path(path))
