"""The serve run's figures, written beside the Parquet files when matplotlib (the ``plot`` extra) is installed;
the same run gives the same bytes. Each is meant to be read at a glance:

* ``latency_cdf.png``: the empirical CDFs of TTFT, TPOT and end-to-end latency (one panel each, the SLO as a
  dashed line when one is given). The latency axis is logarithmic only when the values span at least a decade
  (:data:`LOG_SPAN`), and then labelled between the powers of ten too (``20 ms``, ``50 ms``), linear otherwise; a
  metric whose every value is the same is one vertical line at that value, labelled, not a staircase; a metric
  without values (TPOT of one-token outputs) says so in its panel.
* ``over_time.png``: tokens computed per second (prefill and decode, in 60 bins, a step's tokens in the bin where
  it ends), the waiting queue and the KV blocks in use over the run, from ``iterations.parquet``. A series that
  does not change over the run (no request ever waited) gets no panel: the caption under the figure gives its
  value instead. The usable KV blocks are drawn as a line only when the blocks in use reach a tenth of them (a
  line far above would flatten the data); the panel's title names them either way.

Ticks use the CLI's decimal prefixes (:func:`stepsim.base.figures.si_axis`: ``500 µs``, ``20k``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from stepsim.base.figures import require_matplotlib, save_figure, si_axis

CDF_FILE = "latency_cdf.png"
OVER_TIME_FILE = "over_time.png"
#: time bins of the throughput panel
THROUGHPUT_BINS = 60
#: (column, title, SLO key) of each panel
PANELS = (("ttft_s", "time to first token", "ttft"), ("tpot_s", "time per output token", "tpot"),
          ("e2e_s", "end-to-end latency", "e2e"))
#: largest / smallest value from which a latency axis is logarithmic (a decade)
LOG_SPAN = 10.0
#: the usable KV blocks are drawn when the blocks in use reach this share of them
USABLE_LINE_SHARE = 0.1
#: least distance between two labels of a panel's log axis, as a share of its width (a third of the figure's)
LOG_LABEL_GAP = 0.18
#: relative spread under which a metric's values count as one (a constant TPOT differs in float rounding only)
CONSTANT = 1e-6
#: width of one panel, height of a figure (inches at 100 dpi)
PANEL_WIDTH, HEIGHT = 4.0, 3.6


def latency_cdf(requests: pa.Table, path: Path, *, title: str, slo: dict | None = None) -> Path:
    """Draw the three CDFs of ``requests`` (requests.parquet's columns, seconds) into ``path``."""
    plt = require_matplotlib()
    fig, axes = plt.subplots(1, 3, figsize=(3 * PANEL_WIDTH, HEIGHT), dpi=100)
    for ax, (column, name, key) in zip(axes, PANELS):
        values = requests[column].drop_null().to_numpy(zero_copy_only=False).astype(np.float64)
        values = np.sort(values[values > 0])
        limit = slo.get(key) if slo else None
        ax.set_title(name, fontsize=10)
        ax.set_ylim(0, 1.02)
        ax.set_ylabel("fraction of requests")
        if not len(values):
            ax.text(0.5, 0.5, f"no data:\nno request has a {name}", ha="center", va="center",
                    transform=ax.transAxes, fontsize=9)
            ax.set_xticks([])
            ax.set_yticks([])
            ax.set_ylabel("")
            continue
        _cdf(ax, values, limit)
        ax.set_xlabel("latency")
        ax.grid(True, which="major", alpha=0.3)
    fig.suptitle(title, fontsize=10)
    return save_figure(fig, Path(path))


def _cdf(ax, values: np.ndarray, limit: float | None) -> None:
    """One latency CDF (``values`` sorted, seconds, all positive) with the SLO ``limit`` (seconds) if given."""
    lo, hi = float(values[0]), float(values[-1])
    if hi - lo <= CONSTANT * hi:
        lo = hi = float(np.median(values))
    shown = [lo, hi] + ([limit] if limit is not None else [])
    if hi == lo:  # every request the same: one line, the value written beside it
        ax.plot([lo, lo], [0.0, 1.0], color="#1f77b4")
        ax.annotate(f"all {len(values)}: {_seconds(lo)}", (lo, 0.5), xytext=(4, 0), textcoords="offset points",
                    fontsize=8, va="center")
    else:
        ax.step(np.concatenate([[lo], values]), np.arange(len(values) + 1) / len(values), where="post",
                color="#1f77b4")
    if limit is not None:
        ax.axvline(limit, color="#d62728", linestyle="--", linewidth=1, label=f"SLO {_seconds(limit)}")
        ax.legend(loc="lower right", fontsize=8)
    left, right = min(shown), max(shown)
    if right / left >= LOG_SPAN:
        ax.set_xscale("log")
        ax.set_xlim(left / 1.15, right * 1.15)
    else:
        pad = (right - left) * 0.08 or right * 0.1
        ax.set_xlim(max(left - pad, 0.0), right + pad)
    si_axis(ax.xaxis, "s", min_gap=LOG_LABEL_GAP)


def _seconds(value: float) -> str:
    """A latency as the axes write it (``1.1 ms``)."""
    from matplotlib.ticker import EngFormatter

    return EngFormatter(unit="s", places=None, sep=" ").format_data(value) if value else "0 s"


def over_time(iterations: pa.Table, path: Path, *, title: str, usable_blocks: int) -> Path:
    """Throughput, queue length and KV blocks in use over the run (``iterations`` as iterations.parquet); a
    series that never changes is a line of the caption instead of a panel."""
    plt = require_matplotlib()
    start = iterations["start_s"].to_numpy()
    end = start + iterations["duration_s"].to_numpy()
    series = []  # (title, unit, x, y, kind)
    if len(start):
        edges = np.linspace(0.0, float(end[-1]), THROUGHPUT_BINS + 1)
        tokens, _ = np.histogram(end, bins=edges, weights=iterations["tokens"].to_numpy())  # counted when it ends
        series.append(("tokens computed (prefill + decode)", "tokens/s", edges, tokens / np.diff(edges), "bins"))
        series.append(("waiting requests", "requests", start, iterations["waiting"].to_numpy(), "steps"))
        series.append((f"KV blocks in use (of {usable_blocks:,} usable)", "blocks", start,
                       iterations["kv_blocks_used"].to_numpy(), "steps"))
    drawn = [s for s in series if s[3].min() != s[3].max()]
    caption = [f"{name}: {_count(y[0])} {unit} throughout the run" for name, unit, _, y, _ in series
               if all(name != d[0] for d in drawn)]
    panels = max(len(drawn), 1)
    fig, axes = plt.subplots(1, panels, figsize=(panels * PANEL_WIDTH, HEIGHT), dpi=100, squeeze=False)
    for ax, (name, unit, x, y, kind) in zip(axes[0], drawn):
        if kind == "bins":
            ax.stairs(y, x, color="#1f77b4")
        else:
            ax.step(np.append(x, end[-1]), np.append(y, y[-1]), where="post",
                    color="#ff7f0e" if unit == "requests" else "#2ca02c")
        if unit == "blocks" and y.max() >= USABLE_LINE_SHARE * usable_blocks:
            ax.axhline(usable_blocks, color="#d62728", linestyle="--", linewidth=1, label=f"usable {usable_blocks:,}")
            ax.legend(loc="upper right", fontsize=8)
        ax.set_title(name, fontsize=10)
        ax.set_xlim(0.0, float(end[-1]))
        ax.set_ylim(bottom=0)
        ax.set_xlabel("time")
        ax.set_ylabel(unit)
        si_axis(ax.xaxis, "s")
        si_axis(ax.yaxis)
        if unit != "tokens/s":  # counts: whole ticks, never "500m" requests
            from matplotlib.ticker import MaxNLocator

            ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(True, alpha=0.3)
    if not drawn:
        ax = axes[0][0]
        ax.text(0.5, 0.5, "no data: the run has no steps" if not series else "nothing changes over the run",
                ha="center", va="center", transform=ax.transAxes, fontsize=9)
        ax.set_xticks([])
        ax.set_yticks([])
    fig.suptitle(title, fontsize=10)
    if caption:
        fig.text(0.5, 0.01, "; ".join(caption), ha="center", va="bottom", fontsize=8)
    return save_figure(fig, Path(path), rect=(0, 0.06, 1, 1) if caption else None)


def _count(value) -> str:
    """A count as the CLI writes it (``476,758``; ``1.5`` for a rate)."""
    value = float(value)
    return f"{value:,.0f}" if value == int(value) else f"{value:,.3g}"
