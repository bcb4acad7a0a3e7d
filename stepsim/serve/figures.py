"""The serve run's figure: ``latency_cdf.png``, the empirical CDFs of TTFT, TPOT and end-to-end latency (one
panel each, milliseconds on a log axis, the SLO as a dashed line when one is given), written beside the Parquet
files when matplotlib (the ``plot`` extra) is installed; the same run gives the same bytes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from stepsim.base.figures import require_matplotlib, save_figure

CDF_FILE = "latency_cdf.png"
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
