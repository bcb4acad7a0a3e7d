"""The serve run's figures, written beside the Parquet files when matplotlib (the ``plot`` extra) is installed;
the same run gives the same bytes:

* ``latency_cdf.png``: the empirical CDFs of TTFT, TPOT and end-to-end latency (one panel each, milliseconds on
  a log axis, the SLO as a dashed line when one is given);
* ``over_time.png``: tokens computed per second (prefill and decode, in 60 bins, a step's tokens in the bin where
  it ends), the waiting queue and the KV blocks in use (against the usable blocks) over the run, from
  ``iterations.parquet``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from stepsim.base.figures import require_matplotlib, save_figure

CDF_FILE = "latency_cdf.png"
OVER_TIME_FILE = "over_time.png"
#: time bins of the throughput panel
THROUGHPUT_BINS = 60
#: (column, title, SLO key) of each panel
PANELS = (("ttft_s", "time to first token", "ttft"), ("tpot_s", "time per output token", "tpot"),
          ("e2e_s", "end-to-end latency", "e2e"))


def latency_cdf(requests: pa.Table, path: Path, *, title: str, slo: dict | None = None) -> Path:
    """Draw the three CDFs of ``requests`` (requests.parquet's columns) into ``path``."""
    plt = require_matplotlib()
    from matplotlib.ticker import NullFormatter

    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6), dpi=100)
    for ax, (column, name, key) in zip(axes, PANELS):
        values = requests[column].drop_null().to_numpy(zero_copy_only=False) * 1000.0
        values = np.sort(values[values > 0])
        if len(values):
            ax.step(values, np.arange(1, len(values) + 1) / len(values), where="post", color="#1f77b4")
            ax.set_xscale("log")
            ax.xaxis.set_minor_formatter(NullFormatter())  # decade labels only: minor ones overlap
        if slo and slo.get(key) is not None:
            ax.axvline(slo[key] * 1000.0, color="#d62728", linestyle="--", linewidth=1, label=f"SLO {slo[key] * 1000:g} ms")
            ax.legend(loc="lower right", fontsize=8)
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("ms")
        ax.set_ylim(0, 1.02)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("fraction of requests")
    fig.suptitle(title, fontsize=10)
    return save_figure(fig, Path(path))


def over_time(iterations: pa.Table, path: Path, *, title: str, usable_blocks: int) -> Path:
    """Throughput, queue length and KV blocks in use over the run (``iterations`` as iterations.parquet)."""
    plt = require_matplotlib()
    start = iterations["start_s"].to_numpy()
    end = start + iterations["duration_s"].to_numpy()
    computed = iterations["tokens"].to_numpy()
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6), dpi=100)
    if len(start):
        edges = np.linspace(0.0, float(end[-1]), THROUGHPUT_BINS + 1)
        tokens, _ = np.histogram(end, bins=edges, weights=computed)  # a step's tokens count when it ends
        axes[0].step(edges[:-1], tokens / np.diff(edges), where="post", color="#1f77b4")
        axes[1].step(start, iterations["waiting"].to_numpy(), where="post", color="#ff7f0e")
        axes[2].step(start, iterations["kv_blocks_used"].to_numpy(), where="post", color="#2ca02c")
    axes[2].axhline(usable_blocks, color="#d62728", linestyle="--", linewidth=1, label=f"usable {usable_blocks}")
    axes[2].legend(loc="upper right", fontsize=8)
    for ax, name, unit in zip(axes, ("tokens computed (prefill + decode)", "waiting requests", "KV blocks in use"),
                              ("tokens/s", "requests", "blocks")):
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("s")
        ax.set_ylabel(unit)
        ax.grid(True, alpha=0.3)
    fig.suptitle(title, fontsize=10)
    return save_figure(fig, Path(path))
