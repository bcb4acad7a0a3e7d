"""§5.5 dynamic parallelization of GQA decode attention (README Figs 14, 21): coarse vs interleave vs dynamic.

For every KV-length window found (each batch size; the paper's high / med / low variance windows, see
:mod:`stepsim.reproduce.layout`), the decode attention of one KV head (Qwen3-30B-A3B: head_dim 64, 8 queries
per KV head, KV tiles of 32 tokens, 2048 FLOPs/cycle per compute node, 1-element FIFOs) is simulated with the
three ways of spreading requests over 4 regions: ``coarse`` (contiguous blocks of 16 requests; B=16 has one
region), ``interleave`` (round-robin) and ``dynamic`` (greedy dispatch to the region that last finished reading
a request's K cache).

The table has one row per window (like the artifact's ``batch*_sweep_ae_raw.csv``): the window's KV statistics,
the cycles of each strategy, the off-chip traffic (the same for every strategy: the assignment only moves
tiles between regions), the best static strategy and ``speedup_vs_best_static`` =
``min(coarse, interleave) / dynamic`` cycles.

Headline: the geometric mean of ``speedup_vs_best_static`` over every window of every batch size (our
definition; the spec gives none, see README "Fidelity"). The details also give, per batch size and variance
class, the paper's Fig 21 quantities: geomean over the class's windows of cycles / dynamic cycles for coarse and
interleave.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa

from stepsim.reproduce.errors import TracesLayoutError
from stepsim.reproduce.execute import Point
from stepsim.reproduce.layout import VARIANCE_CLASSES, kv_windows
from stepsim.reproduce.stats import geomean
from stepsim.reproduce.tables import field, format_rows, group_rows
from stepsim.results.records import RunResult
from stepsim.workloads.attention.build import kv_metadata

NAME = "dynamic-parallelization"
STEM = "dynamic_parallelization"
STRATEGIES = ("coarse", "interleave", "dynamic")
STATIC_STRATEGIES = ("coarse", "interleave")
#: §5.5: KV-cache tile (tokens) used for the tile statistics of a window
TILE_N = 32
#: §5.5: parallel regions of the interleave and dynamic strategies (build_attention's default)
REGIONS = 4
JSON_KEYS = ("dynamic_parallelization_speedup_geomean",)

SCHEMA = pa.schema([
    field("batch", pa.int64(), "requests"), field("variance", pa.string()), field("trace", pa.string()),
    field("start", pa.int64(), "request"), field("end", pa.int64(), "request"),
    field("stdev", pa.float64(), "tokens"), field("kv_tiles", pa.int64(), "tiles"),
    field("max_kv_tiles", pa.int64(), "tiles"), field("max_n", pa.int64(), "tokens"),
    field("coarse_regions", pa.int64(), "regions"), field("coarse_cycles", pa.int64(), "cycles"),
    field("interleave_cycles", pa.int64(), "cycles"), field("dynamic_cycles", pa.int64(), "cycles"),
    field("off_chip_bytes", pa.int64(), "bytes"), field("best_static", pa.string()),
    field("speedup_vs_best_static", pa.float64(), "ratio"),
])


def plan(traces: str | Path) -> list[Point]:
    """Per KV window (batch, variance class, paper order): one point per strategy of :data:`STRATEGIES`.

    Raises
    ------
    TracesLayoutError
        The layout problems of :func:`~stepsim.reproduce.layout.kv_windows`, or a ``b<B>`` folder whose batch
        size is not a multiple of :data:`REGIONS` (static interleave deals requests round-robin in equal
        shares), so the experiment fails before simulating anything.
    """
    points = []
    windows = kv_windows(traces)
    for batch, folder in sorted({(w.batch, w.path.parent) for w in windows}):
        if batch % REGIONS:
            raise TracesLayoutError(f"{folder}: batch {batch} is not a multiple of {REGIONS}: static interleave "
                                    f"deals the requests round-robin in equal shares over {REGIONS} regions")
    for w in windows:
        labels = {"batch": w.batch, "variance": w.variance, "trace": w.name, "start": w.start, "end": w.end}
        points += [Point(labels, {"workload": "attention", "trace": str(w.path), "strategy": s})
                   for s in STRATEGIES]
    return points


def _window_stats(path: str) -> dict:
    """Sample stdev (ddof=1, tokens), total and largest KV tiles per request (new token's slot included)."""
    kv = np.load(path, allow_pickle=False)
    tiles, _ = kv_metadata(kv, TILE_N)
    stdev = float(np.std(kv.astype(np.float64), ddof=1)) if len(kv) > 1 else 0.0
    return {"stdev": stdev, "kv_tiles": int(tiles.sum()), "max_kv_tiles": int(tiles.max())}


def build_table(points: Sequence[Point], records: Sequence[RunResult]) -> pa.Table:
    """One row per window (schema :data:`SCHEMA`), from the three strategy runs of that window."""
    by_window: dict[str, dict] = {}
    for point, record in zip(points, records):
        params = json.loads(record.row["params"])
        entry = by_window.setdefault(point.labels["trace"], {"labels": point.labels, "path": point.config["trace"]})
        entry[params["strategy"]] = (record.row, params)
    rows = []
    for entry in by_window.values():
        cycles = {s: entry[s][0]["cycles"] for s in STRATEGIES}
        best = min(STATIC_STRATEGIES, key=lambda s: (cycles[s], STATIC_STRATEGIES.index(s)))
        rows.append({**entry["labels"], **_window_stats(entry["path"]), "max_n": entry["dynamic"][1]["max_n"],
                     "coarse_regions": entry["coarse"][1]["regions"],
                     **{f"{s}_cycles": cycles[s] for s in STRATEGIES},
                     "off_chip_bytes": entry["dynamic"][0]["off_chip_bytes"], "best_static": best,
                     "speedup_vs_best_static": cycles[best] / cycles["dynamic"]})
    return pa.Table.from_pylist(rows, schema=SCHEMA)


def headline(table: pa.Table) -> tuple[dict, dict]:
    """``(json headline, details)``: the geomean speedup over the best static strategy, and per batch size
    the geomeans vs each static strategy and the Fig 21 per-class values (``classes``)."""
    rows = table.to_pylist()
    json_headline = {JSON_KEYS[0]: geomean([r["speedup_vs_best_static"] for r in rows])}
    batches = []
    for (batch,), brows in group_rows(table, ("batch",)):
        classes = {}
        for variance in VARIANCE_CLASSES:
            crows = [r for r in brows if r["variance"] == variance]
            if crows:
                classes[variance] = {s: geomean([r[f"{s}_cycles"] / r["dynamic_cycles"] for r in crows])
                                     for s in STATIC_STRATEGIES}
        batches.append({"batch": batch, "windows": len(brows),
                        "speedup_vs_best_static": geomean([r["speedup_vs_best_static"] for r in brows]),
                        **{f"speedup_vs_{s}": geomean([r[f"{s}_cycles"] / r["dynamic_cycles"] for r in brows])
                           for s in STATIC_STRATEGIES},
                        "classes": classes})
    return json_headline, {"batches": batches}


def summary(table: pa.Table, json_headline: dict, details: dict) -> list[str]:
    """Human-readable lines: the table, per-batch geomeans, the headline."""
    lines = format_rows(table, [("batch", None), ("variance", None), ("stdev", "{:.1f}"), ("kv_tiles", None),
                                ("coarse_cycles", "{:,}"), ("interleave_cycles", "{:,}"),
                                ("dynamic_cycles", "{:,}"), ("speedup_vs_best_static", "{:.3f}")])
    lines.append("")
    for b in details["batches"]:
        per_class = "; ".join(f"{v}: coarse {c['coarse']:.2f}x, interleave {c['interleave']:.2f}x"
                              for v, c in b["classes"].items())
        lines.append(f"B={b['batch']} ({b['windows']} windows): dynamic vs best static {b['speedup_vs_best_static']:.2f}x, "
                     f"vs coarse {b['speedup_vs_coarse']:.2f}x, vs interleave {b['speedup_vs_interleave']:.2f}x "
                     f"[{per_class}]")
    lines.append(f"geomean speedup of dynamic over the best static strategy: {json_headline[JSON_KEYS[0]]:.2f}x "
                 f"(paper: 1.5x)")
    return lines
