"""A small PNG of FIFO bytes per group of equivalent channels: 1024-deep FIFOs (before) vs sized (after)."""

from __future__ import annotations

from pathlib import Path

#: groups drawn (the largest by bytes at 1024 deep; the rest are summed into one bar)
MAX_BARS = 14


def plot_fifo_bytes(result, path: str | Path) -> Path:
    """Draw ``result.groups`` (label, bytes at 1024, bytes sized) as paired horizontal bars on a log axis and
    write ``path`` atomically (same result, same bytes). Raises ConfigError when matplotlib is missing."""
    from stepsim.base.figures import require_matplotlib, save_figure

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
    ax.barh([y + 0.2 for y in ys], before, height=0.4, color="#bbbbbb", label="every FIFO 1024 deep")
    ax.barh([y - 0.2 for y in ys], after, height=0.4, color="#1f77b4", label="sized")
    ax.set_yticks(list(ys), labels, fontsize=7)
    ax.set_xscale("log")
    ax.set_xlabel("FIFO bytes (depth x element bytes, summed over the group)")
    ax.set_title(f"{result.graph_name}: {result.unbounded_fifo_bytes / 1e6:,.1f} MB -> "
                 f"{result.total_fifo_bytes / 1e6:,.2f} MB", fontsize=9)
    ax.legend(fontsize=7, loc="lower right")
    return save_figure(fig, Path(path))
