"""``roofline.png``: a serve run's steps against the chips' two ceilings, written beside the Parquet files when the
latency provider prices layers (iterations.parquet has the roofline columns, :data:`~stepsim.serve.latency.WORK_COLUMNS`)
and matplotlib is installed.

Each step is a point at its arithmetic intensity (FLOPs it must do / HBM bytes it must read) and the FLOP/s its
duration achieves; the ceilings are ``min(peak FLOP/s, intensity x HBM bandwidth)`` of the chips the run uses. A
step on the sloped ceiling reads its bytes at the HBM's peak; the distance below is what the schedule leaves.
Prefill-carrying and decode-only steps are told apart by colour.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from stepsim.base.figures import require_matplotlib, save_figure

ROOFLINE_FILE = "roofline.png"


def roofline(iterations: pa.Table, path: Path, *, title: str, peak_flops_per_s: float, hbm_bytes_per_s: float) -> Path:
    """Draw the steps of ``iterations`` (with its ``hbm_bytes`` and ``flops`` columns) against the ceilings of
    ``peak_flops_per_s`` (FLOP/s) and ``hbm_bytes_per_s`` (bytes/s) into ``path``."""
    plt = require_matplotlib()
    flops = iterations["flops"].to_numpy().astype(np.float64)
    intensity = flops / iterations["hbm_bytes"].to_numpy().astype(np.float64)
    achieved = flops / iterations["duration_s"].to_numpy()
    prefill = iterations["prefill_tokens"].to_numpy() > 0
    fig, ax = plt.subplots(figsize=(6.4, 4.4), dpi=100)
    ridge = peak_flops_per_s / hbm_bytes_per_s  # FLOPs/byte where the two ceilings meet
    low = min(float(intensity.min()), ridge) / 4
    high = max(float(intensity.max()), ridge) * 4
    x = np.geomspace(low, high, 200)
    ax.plot(x, np.minimum(peak_flops_per_s, x * hbm_bytes_per_s), color="#444444", linewidth=1.5,
            label=f"ceilings: {hbm_bytes_per_s / 1e12:g} TB/s, {peak_flops_per_s / 1e12:g} TFLOP/s")
    for mask, name, colour in ((~prefill, "decode-only steps", "#1f77b4"), (prefill, "steps with a prefill", "#ff7f0e")):
        if mask.any():
            ax.scatter(intensity[mask], achieved[mask], s=8, color=colour, alpha=0.6, label=f"{name} ({mask.sum()})")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOPs per HBM byte the step must read)")
    ax.set_ylabel("achieved FLOP/s")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    ax.set_title(title, fontsize=10)
    return save_figure(fig, Path(path))
