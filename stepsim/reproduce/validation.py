"""§5.6 simulator validation (README Fig 8): the 15-point SwiGLU tile sweep and its roofline correlation.

The single-expert SwiGLU layer (B=64, D=256, F=512, fp32) runs on the HDL-validation hardware (8 HBM channels,
256 bytes/cycle; 256 bytes/cycle on chip; 4096 FLOPs/cycle per compute node; loads dispatch 4 requests per
cycle) for tile_m in {16, 32, 64} x tile_n in {16, 32, 64, 128, 256}. The HDL cycle counts of the paper come from
a separate repository and are not reproduced; instead each simulated point is compared with the roofline bound
of the layer, in cycles:

* ``memory_bound_cycles`` = off-chip bytes / HBM peak bytes per cycle (256);
* ``compute_bound_cycles`` = algorithmic FLOPs / ``PEAK_FLOPS_PER_CYCLE`` (4 x 4096 = 16384, the peak behind the
  validation script's ``ridge_point = 4*4096/256 = 64`` FLOPs/byte);
* ``roofline_bound_cycles`` = the larger of the two.

Headline (printed; not part of ``--json``): the Pearson correlation between simulated cycles and
``roofline_bound_cycles`` over the 15 points (and, for reference, with the memory bound alone).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa

from stepsim.reproduce.execute import Point
from stepsim.reproduce.stats import pearson
from stepsim.reproduce.tables import field, format_rows
from stepsim.results.records import RunResult
from stepsim.workloads.swiglu.build import HDL_COMPUTE_BW

NAME = "validation"
STEM = "validation"
TILE_M = (16, 32, 64)
TILE_N = (16, 32, 64, 128, 256)
#: §5.6: the validation script's ridge point 4*4096/256 FLOPs/byte implies 4 compute nodes' worth of peak
PEAK_FLOPS_PER_CYCLE = 4 * HDL_COMPUTE_BW
JSON_KEYS: tuple[str, ...] = ()

SCHEMA = pa.schema([
    field("tile_m", pa.int64(), "rows"), field("tile_n", pa.int64(), "columns"),
    field("cycles", pa.int64(), "cycles"), field("off_chip_bytes", pa.int64(), "bytes"),
    field("off_chip_mb", pa.float64(), "MB"), field("on_chip_bytes", pa.int64(), "bytes"),
    field("flops", pa.int64(), "FLOP"), field("operational_intensity", pa.float64(), "FLOP/byte"),
    field("memory_bound_cycles", pa.float64(), "cycles"), field("compute_bound_cycles", pa.float64(), "cycles"),
    field("roofline_bound_cycles", pa.float64(), "cycles"), field("cycles_over_roofline", pa.float64(), "ratio"),
    field("run_id", pa.string()),
])


def plan(traces: str | Path | None = None, *, tile_m: Sequence[int] = TILE_M,
         tile_n: Sequence[int] = TILE_N) -> list[Point]:
    """The sweep's points, tile_m outer, tile_n inner (the artifact's order). ``traces`` is not needed."""
    return [Point({}, {"workload": "swiglu", "tile_m": int(m), "tile_n": int(n)}) for m in tile_m for n in tile_n]


def build_table(points: Sequence[Point], records: Sequence[RunResult]) -> pa.Table:
    """One row per point (schema :data:`SCHEMA`)."""
    rows = []
    for record in records:
        r, params = record.row, json.loads(record.row["params"])
        memory = r["off_chip_bytes"] / r["hbm_bytes_per_cycle"]
        compute = r["flops"] / PEAK_FLOPS_PER_CYCLE
        roofline = max(memory, compute)
        rows.append({"tile_m": params["tile_m"], "tile_n": params["tile_n"], "cycles": r["cycles"],
                     "off_chip_bytes": r["off_chip_bytes"], "off_chip_mb": r["off_chip_bytes"] / 1e6,
                     "on_chip_bytes": r["on_chip_bytes"], "flops": r["flops"],
                     "operational_intensity": r["flops"] / r["off_chip_bytes"], "memory_bound_cycles": memory,
                     "compute_bound_cycles": compute, "roofline_bound_cycles": roofline,
                     "cycles_over_roofline": r["cycles"] / roofline, "run_id": r["run_id"]})
    return pa.Table.from_pylist(rows, schema=SCHEMA)


def headline(table: pa.Table) -> tuple[dict, dict]:
    """``({}, details)``: the Pearson correlations (validation has no ``--json`` key)."""
    cycles = table.column("cycles").to_pylist()
    details = {"pearson_cycles_vs_roofline": pearson(cycles, table.column("roofline_bound_cycles").to_pylist()),
               "pearson_cycles_vs_memory_bound": pearson(cycles, table.column("memory_bound_cycles").to_pylist()),
               "points": table.num_rows}
    return {}, details


def summary(table: pa.Table, json_headline: dict, details: dict) -> list[str]:
    """Human-readable lines: the sweep table and the correlations."""
    lines = format_rows(table, [("tile_m", None), ("tile_n", None), ("cycles", "{:,}"), ("off_chip_mb", "{:.2f}"),
                                ("operational_intensity", "{:.1f}"), ("roofline_bound_cycles", "{:,.0f}"),
                                ("cycles_over_roofline", "{:.3f}")])
    lines.append("")
    lines.append(f"Pearson r(simulated cycles, roofline bound) over {details['points']} points: "
                 f"{details['pearson_cycles_vs_roofline']:.4f} "
                 f"(memory bound alone: {details['pearson_cycles_vs_memory_bound']:.4f})")
    return lines
