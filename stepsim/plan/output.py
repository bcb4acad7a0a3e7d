"""A plan's files in ``--out`` (docs/plan.md §5), published together (:func:`stepsim.base.files.published_folder`):
``plan.json`` (the summary), ``deployments.parquet`` (one row per deployment of the space, how it was decided),
``replica-<k>.parquet`` (the recommended deployment's requests of replica k at its rate: the inputs of the
``stepsim serve`` commands in ``plan.json``) and ``plan.png`` (goodput per chip against chips, coloured by p99
TTFT, the front marked) when matplotlib is installed.

``plan.json`` lists the run's files (``outputs``); a run into a folder an earlier plan wrote retires the earlier
plan's files it does not write again (a ``replica-3.parquet`` of an earlier recommendation with more replicas),
with the new files, all or none (:func:`stepsim.base.files.retire`). Only names a plan writes are retired, and only
those the earlier ``plan.json`` lists: a user's other files in the folder stay."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pyarrow as pa

from stepsim.base.ranges import json_text

PLAN_FILE = "plan.json"
DEPLOYMENTS_FILE = "deployments.parquet"
FIGURE_FILE = "plan.png"
#: the names a plan writes (replica-<k>.parquet: one per replica of the recommended deployment)
_OWN_NAME = re.compile(r"(plan\.json|deployments\.parquet|plan\.png|replica-[0-9]+\.parquet)")


def earlier_outputs(folder: Path) -> list[str]:
    """The files an earlier plan wrote into ``folder`` (its plan.json's ``outputs``, the plan's own names only);
    none when there is no readable plan.json of a plan there."""
    try:
        earlier = json.loads((folder / PLAN_FILE).read_text())
    except (OSError, ValueError, UnicodeDecodeError):
        return []
    names = earlier.get("outputs") if isinstance(earlier, dict) else None
    if not isinstance(names, list):
        return []
    return [n for n in names if isinstance(n, str) and _OWN_NAME.fullmatch(n)]


def write_plan(out, summary: dict, table: list, replica_files: list) -> dict:
    """Write the plan's files into ``out``; returns their final paths by name."""
    from stepsim.base.files import atomic_output, published_folder, retire, write_parquet_atomic
    from stepsim.base.ranges import non_finite
    from stepsim.serve.api import matplotlib_available
    from stepsim.trace_io.requests import write_requests

    bad = non_finite(summary)
    if bad is not None:  # JSON has no NaN or infinity: say which, never write one
        raise ValueError(f"plan.json: {bad[0]} is {bad[1]}")
    figure_too = matplotlib_available()
    names = [PLAN_FILE, DEPLOYMENTS_FILE, *(name for name, _ in replica_files), *([FIGURE_FILE] if figure_too else [])]
    summary["outputs"] = names
    files = {}
    with published_folder(out) as folder:
        for name in earlier_outputs(folder):
            if name not in names:
                retire(folder / name)
        with atomic_output(folder / PLAN_FILE) as tmp:
            tmp.write_text(json_text(summary, indent=2, sort_keys=True) + "\n")  # NaN, inf: null
        files["plan"] = PLAN_FILE
        write_parquet_atomic(deployments_table(table), folder / DEPLOYMENTS_FILE)
        files["deployments"] = DEPLOYMENTS_FILE
        for name, trace in replica_files:
            write_requests(trace, folder / name)
            files[name.removesuffix(".parquet")] = name
        if figure_too:
            figure(table, folder / FIGURE_FILE, title=f"{Path(summary['model']).stem}: {summary['slo']} at "
                                                        f"p{summary['percentile']:g}")
            files["figure"] = FIGURE_FILE
    return {name: Path(out) / path for name, path in files.items()}


#: deployments.parquet's column types (the others are strings)
_TYPES = {"chips": pa.int64(), "chips_per_replica": pa.int64(), "replicas": pa.int64(), "prefill_chips": pa.int64(),
          "decode_chips": pa.int64(), "max_seqs": pa.int64(), "max_batch_tokens": pa.int64(),
          "chunk_tokens": pa.int64(), "probes": pa.int64(), "probes_proved": pa.int64(), "replays": pa.int64(),
          "replays_stopped": pa.int64(), "replays_unservable": pa.int64(), "on_front": pa.bool_(),
          "offered_meets_slo": pa.bool_()}


def deployments_table(table: list) -> pa.Table:
    """deployments.parquet: every row of ``table`` (:func:`stepsim.plan.api._summarize`'s), typed."""
    columns = {}
    for key in table[0]:
        values = [row[key] for row in table]
        if key in _TYPES:
            kind = _TYPES[key]
        elif all(v is None or isinstance(v, str) for v in values):
            kind = pa.string()
        else:
            kind = pa.float64()
        columns[key] = pa.array(values, kind)
    return pa.table(columns)


#: deployments.parquet's columns a reader relies on (the rest are the search's record)
_KEY_COLUMNS = ("deployment", "hardware", "chips", "chips_per_replica", "replicas", "router", "system",
                "prefill_chips", "decode_chips", "scheduler", "decided", "goodput_per_chip", "on_front")


def read_deployments(out) -> list[dict]:
    """The rows of a plan's ``deployments.parquet`` in ``out`` (a folder), one dict per deployment in the plan's
    order (``prefill_chips`` / ``decode_chips`` None for a colocated one); a one-line ConfigError naming the file
    when it is missing, unreadable, or lacks a column or type a plan writes."""
    import pyarrow.parquet as pq

    from stepsim.base.errors import ConfigError

    path = Path(out) / DEPLOYMENTS_FILE
    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowException) as exc:
        raise ConfigError(f"{path}: not a plan's deployments table ({str(exc).splitlines()[0]})") from None
    for name in _KEY_COLUMNS:
        if name not in table.column_names:
            raise ConfigError(f"{path}: no column {name!r}: not a stepsim plan's deployments table")
        want = _TYPES.get(name)
        if want is not None and table.schema.field(name).type != want:
            raise ConfigError(f"{path}: column {name!r} is {table.schema.field(name).type}, a plan writes {want}")
    return table.to_pylist()


def figure(table: list, path: Path, *, title: str) -> Path:
    """Goodput per chip against chips, one point per deployment that met the SLO at some rate, coloured by its
    p99 TTFT at that rate; the front ringed and joined."""
    from stepsim.base.figures import require_matplotlib, save_figure, si_axis

    plt = require_matplotlib()
    rows = [r for r in table if r["goodput_per_chip"] is not None]
    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=100)
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("chips")
    ax.set_ylabel("goodput per chip (requests/s)")
    if rows:
        chips = np.array([r["chips"] for r in rows], dtype=float)
        # a small seeded-free jitter: deployments of equal chips side by side, in table order
        offset = np.zeros(len(rows))
        for c in np.unique(chips):
            idx = np.flatnonzero(chips == c)
            offset[idx] = np.linspace(-0.15, 0.15, len(idx)) if len(idx) > 1 else 0.0
        good = np.array([r["goodput_per_chip"] for r in rows])
        ttft = np.array([r["ttft_p99_s"] for r in rows], dtype=float)
        points = ax.scatter(chips + offset, good, c=ttft, cmap="viridis", s=22, zorder=2)
        bar = fig.colorbar(points, ax=ax)
        bar.set_label("p99 TTFT at the sustainable rate")
        si_axis(bar.ax.yaxis, "s")
        front = [i for i, r in enumerate(rows) if r["on_front"]]
        if front:
            front.sort(key=lambda i: chips[i])
            ax.plot(chips[front] + offset[front], good[front], color="crimson", lw=1, zorder=1)
            ax.scatter(chips[front] + offset[front], good[front], s=90, facecolors="none", edgecolors="crimson",
                       lw=1.5, zorder=3, label="front")
            ax.legend(loc="best", fontsize=8)
        ax.set_xticks(sorted(set(int(c) for c in chips)))
        ax.set_ylim(0, max(good) * 1.1 if max(good) > 0 else 1)
    else:
        ax.text(0.5, 0.5, "no deployment met the SLO", ha="center", va="center", transform=ax.transAxes)
        ax.set_xticks([])
    si_axis(ax.yaxis)
    return save_figure(fig, path)
