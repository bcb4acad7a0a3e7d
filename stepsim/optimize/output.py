"""What ``stepsim optimize`` writes: the front (Parquet), every candidate (Parquet), a plot (PNG), the summary
(JSON), and the ``stepsim run`` command line of a configuration.

Files in the output folder (each written atomically: temp file, then rename)::

    pareto.parquet      the Pareto front over (cycles, on_chip_bytes, allocated_flops_per_cycle)
    candidates.parquet  every candidate: knobs, symbolic metrics, cycle lower bound, status, cycles
    pareto.png          every simulated point, the front highlighted (log axes, like the paper's Figs 9/10)
    optimize.json       the JSON summary (the keys of ``stepsim optimize --json``)
    metrics/, runs/     the symbolic-evaluation and simulation sweeps (sweep folder layout; resumable)
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pyarrow as pa

from stepsim.base.files import atomic_output, published_together, write_parquet_atomic

#: knobs left out of a command line (not flags of stepsim run)
NOT_FLAGS = ("workload", "mode")


def run_command(config: dict) -> str:
    """The ``stepsim run`` command line that simulates ``config`` (same knobs, so the same run id)."""
    words = ["stepsim", "run", config["workload"]]
    for key, value in config.items():
        if key in NOT_FLAGS:
            continue
        words += [f"--{key.replace('_', '-')}", str(value)]
    return shlex.join(words)


_COLUMNS = ("index", "run_id", "status", "cycles", "lower_bound", "on_chip_bytes", "allocated_flops_per_cycle",
            "off_chip_bytes", "flops", "hbm_bytes_per_cycle", "error")
_TYPES = {"index": pa.int64(), "run_id": pa.string(), "status": pa.string(), "error": pa.string()}


def candidates_table(candidates: list, axes: list) -> pa.Table:
    """One row per candidate: the searched knobs (as strings for mixed types), its measures and status."""
    data = {}
    for key in axes:
        values = [c.config.get(key) for c in candidates]
        typed = {type(v) for v in values if v is not None}
        data[key] = pa.array(values if typed <= {int} or typed <= {str} else [None if v is None else str(v)
                                                                                  for v in values])
    for key in _COLUMNS:
        data[key] = pa.array([getattr(c, key) for c in candidates], type=_TYPES.get(key, pa.int64()))
    data["config"] = pa.array([json.dumps(c.config, sort_keys=True) for c in candidates], type=pa.string())
    return pa.table(data)


def write_outputs(out: Path, result) -> dict:
    """Write the files of the module docstring, together (a full disk leaves none of them); ``{kind: path}``.

    An empty front is an answer (no candidate completed): the tables and ``optimize.json`` say so, and the plot,
    which would have no point to draw (matplotlib refuses a log axis without data), is skipped with its reason in
    ``result.plot_skipped``."""
    paths = {"pareto": out / "pareto.parquet", "candidates": out / "candidates.parquet",
             "plot": out / "pareto.png", "json": out / "optimize.json"}
    if not any(c.status == "simulated" for c in result.candidate_list):
        del paths["plot"]
        result.plot_skipped = "no candidate completed a simulation, so there is no point to plot"
    with published_together():
        write_parquet_atomic(candidates_table(result.front, result.axes), paths["pareto"])
        write_parquet_atomic(candidates_table(result.candidate_list, result.axes), paths["candidates"])
        if "plot" in paths:
            plot_front(result, paths["plot"])
        with atomic_output(paths["json"]) as tmp:
            tmp.write_text(json.dumps({**result.to_json(), "files": {k: str(v) for k, v in paths.items()}},
                                      indent=2) + "\n")
    return paths


def plot_front(result, path: Path) -> None:
    """Cycles against on-chip bytes (log axes) of every simulated point, the front highlighted, the
    recommendation marked; the colour is the allocated compute."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    simulated = [c for c in result.candidate_list if c.status == "simulated"]
    fig, ax = plt.subplots(figsize=(6.4, 4.4), dpi=120)
    if simulated:
        sc = ax.scatter([c.on_chip_bytes for c in simulated], [c.cycles for c in simulated],
                        c=[c.allocated_flops_per_cycle for c in simulated], cmap="viridis", s=18, alpha=0.6,
                        norm=matplotlib.colors.LogNorm(), label="simulated")
        fig.colorbar(sc, ax=ax, label="allocated compute (FLOPs/cycle)")
    ax.scatter([c.on_chip_bytes for c in result.front], [c.cycles for c in result.front], facecolors="none",
               edgecolors="red", s=60, linewidths=1.4, label="Pareto front")
    if result.recommended is not None:
        r = result.recommended
        ax.scatter([r.on_chip_bytes], [r.cycles], marker="*", color="black", s=140,
                   label=f"recommended ({result.objective})")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("on-chip memory (bytes)")
    ax.set_ylabel("cycles")
    ax.set_title(f"stepsim optimize {result.workload}: {len(simulated)} simulated of {result.candidates}")
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    with atomic_output(path) as tmp:
        fig.savefig(tmp, format="png")
    plt.close(fig)
