"""What ``stepsim optimize`` writes: the front (Parquet), every candidate (Parquet), a plot (PNG), the summary
(JSON), and the ``stepsim run`` command line of a configuration.

Files in the output folder (each written atomically: temp file, then rename)::

    pareto.parquet      the Pareto front over (cycles, on_chip_bytes, allocated_flops_per_cycle, chips)
    candidates.parquet  every candidate: knobs (always ``tp``, ``ep``, ``pp``, ``micro_batches``: null when unset), symbolic metrics,
                        cycle lower bound, status, cycles
    pareto.png          cycles against on-chip bytes and against compute (the front is over all three), every
                        simulated point, the front numbered and named (log axes, like the paper's Figs 9/10)
    optimize.json       the JSON summary (the keys of ``stepsim optimize --json``)
    metrics/, runs/     the symbolic-evaluation and simulation sweeps (sweep folder layout; resumable)
    systems/            with ``--max-chips`` and ``--system``: the system scaled to each chip count searched
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pyarrow as pa

from stepsim.base.files import atomic_output, published_together, write_parquet_atomic
from stepsim.base.ranges import json_text
from stepsim.optimize.stack import RECORDED_KNOBS

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
            "chips", "off_chip_bytes", "flops", "hbm_bytes_per_cycle", "error")
_TYPES = {"index": pa.int64(), "run_id": pa.string(), "status": pa.string(), "error": pa.string()}


def candidates_table(candidates: list, axes: list) -> pa.Table:
    """One row per candidate: the searched knobs (as strings for mixed types), its measures and status."""
    data = {}
    for key in axes:
        values = [c.config.get(key) for c in candidates]
        typed = {type(v) for v in values if v is not None}
        data[key] = pa.array(values if typed <= {int} or typed <= {str} else [None if v is None else str(v)
                                                                                  for v in values])
    for key in RECORDED_KNOBS:  # every candidate's tp / ep / pp / micro_batches, searched or not (null: unset)
        if key not in data:
            data[key] = pa.array([c.config.get(key) for c in candidates], type=pa.int64())
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
            tmp.write_text(json_text({**result.to_json(), "files": {k: str(v) for k, v in paths.items()}},
                                      indent=2) + "\n")
    return paths


#: front points listed by name under the Pareto plot (all are numbered on it)
LABELLED = 12


def plot_front(result, path: Path) -> Path:
    """Two panels sharing the cycles axis (log axes, like the paper's Figs 9/10): cycles against on-chip memory
    and against allocated compute. The front is over all three objectives, so a front point can look dominated
    in one panel (it wins on the other axis); both panels show every simulated point in grey and the front's
    points numbered 1..n in the order ``stepsim optimize`` lists them, named under the plot. The title's counts
    are the CLI's (``simulations`` counts failed simulations too). A search over chip counts marks each count's
    points with its own marker."""
    from stepsim.base.figures import require_matplotlib, save_figure, si_axis

    plt = require_matplotlib()
    simulated = [c for c in result.candidate_list if c.status == "simulated"]
    front = list(result.front)
    shown = front[:LABELLED]
    lines = [f"{i}{'*' if c is result.recommended else ''}: {c.label(result.axes)}" for i, c in
             enumerate(shown, 1)]
    if len(front) > len(shown):
        lines.append(f"... {len(front) - len(shown)} more front points in pareto.parquet")
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.2 + 0.14 * len(lines)), sharey=True)
    panels = ((axes[0], "on_chip_bytes", "on-chip memory", "B"),
              (axes[1], "allocated_flops_per_cycle", "allocated compute", ""))
    counts = sorted({c.chips for c in simulated})
    for ax, key, name, unit in panels:
        if len(counts) > 1:  # a search over chip counts (--max-chips): one marker per count, so the trade shows
            for n, marker in zip(counts, "osD^v<>ph*"):
                on_n = [c for c in simulated if c.chips == n]
                ax.scatter([getattr(c, key) for c in on_n], [c.cycles for c in on_n], color="0.65", s=18,
                           marker=marker, label=f"simulated, {n} chip{'s' if n > 1 else ''}", zorder=2)
        elif simulated:
            ax.scatter([getattr(c, key) for c in simulated], [c.cycles for c in simulated], color="0.65", s=16,
                       label="simulated", zorder=2)
        if front:
            ax.scatter([getattr(c, key) for c in front], [c.cycles for c in front], facecolors="none",
                       edgecolors="tab:red", s=70, linewidths=1.4, label=f"Pareto front ({4 if len(counts) > 1 else 3} objectives)", zorder=3)
            for (x, y), numbers in _coinciding([(getattr(c, key), c.cycles) for c in front]):
                ax.annotate(",".join(map(str, numbers)), (x, y), textcoords="offset points", xytext=(6, 5),
                            fontsize=8, color="tab:red")
        if result.recommended is not None:
            r = result.recommended
            ax.scatter([getattr(r, key)], [r.cycles], marker="*", color="black", s=120, zorder=4,
                       label=f"recommended ({result.objective})")
        if simulated:
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.margins(0.12)
        si_axis(ax.xaxis, unit)
        si_axis(ax.yaxis)
        ax.set_xlabel(f"{name} ({unit or 'FLOP/cycle'})")
        ax.grid(True, which="major", alpha=0.3)
        ax.yaxis.set_tick_params(labelleft=True)  # the shared cycles axis labelled on both panels: read at a glance
    axes[0].set_ylabel("cycles")
    axes[0].legend(loc="best", fontsize=8)
    fig.suptitle(f"stepsim optimize {result.workload}: {result.simulations:,} simulations of "
                 f"{result.candidates:,} candidates; front over "
                 f"{'cycles, on-chip memory, compute and chips' if len(counts) > 1 else 'cycles, on-chip memory and compute'}"
                 f" ({len(front)} points)", fontsize=10)
    caption = 0.0
    if lines:
        height = fig.get_size_inches()[1]
        caption = (0.14 * len(lines) + 0.05) / height  # 8 pt lines (11.2 pt apart), in figure fractions
        fig.text(0.01, 0.01, "\n".join(lines), fontsize=8, va="bottom", family="monospace")
    return save_figure(fig, path, rect=(0, caption, 1, 1))


def _coinciding(points: list[tuple[float, float]], within: float = 0.02) -> list[tuple[tuple, list[int]]]:
    """Points (numbered from 1) grouped when they fall on the same spot of a log-log plot (within ``within``
    decades on both axes), so their numbers share one label: ``[((x, y), [4, 5]), ...]``."""
    import math

    groups: list[tuple[tuple, list[int]]] = []
    for i, (x, y) in enumerate(points, 1):
        for (gx, gy), numbers in groups:
            if min(x, y, gx, gy) > 0 and abs(math.log10(x / gx)) < within and abs(math.log10(y / gy)) < within:
                numbers.append(i)
                break
        else:
            groups.append(((x, y), [i]))
    return groups
