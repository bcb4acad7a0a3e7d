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

Headline (``--json`` keys :data:`JSON_KEYS`):

* ``validation_pearson_cycles_vs_roofline``: the Pearson correlation between simulated cycles and
  ``roofline_bound_cycles`` over the sweep's points (details: with the memory bound alone, too);
* ``validation_pearson_cycles_vs_hdl``: the Pearson correlation between simulated cycles and the cycle counts of
  the HDL model at the five points published with the paper's validation artifact, :data:`HDL_CYCLES`
  (tile_m 16; null when the sweep leaves one of them out). Details list each point's simulated and HDL cycles.

Source of :data:`HDL_CYCLES`: ``dse_results.csv`` of the paper's hardware-validation artifact,
https://github.com/anonymous7484/step-artifact-eval (commit c2a42755b3a80d54f6be6cf515458c823982143c; Bluespec
model of the tiled accelerator with a Ramulator2 HBM2 model). Its columns ``tile_b, dim, tile_inter`` are this
sweep's ``tile_m``, D and ``tile_n``: tile_b 16, dim 256, tile_inter 16 / 32 / 64 / 128 / 256 -> 36,259 /
30,432 / 27,859 / 29,112 / 25,998 cycles. (The same artifact's ``step_reference.csv`` lists the reference
simulator's cycles for all 15 points.)
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
JSON_KEYS: tuple[str, ...] = ("validation_pearson_cycles_vs_roofline", "validation_pearson_cycles_vs_hdl")
#: HDL cycle counts published with the paper's validation artifact (module docstring): (tile_m, tile_n) -> cycles
HDL_CYCLES = {(16, 16): 36_259, (16, 32): 30_432, (16, 64): 27_859, (16, 128): 29_112, (16, 256): 25_998}
HDL_SOURCE = ("dse_results.csv, https://github.com/anonymous7484/step-artifact-eval "
              "(commit c2a42755b3a80d54f6be6cf515458c823982143c)")

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
    """``(headline, details)``: the Pearson correlations with the roofline bound and with the published HDL
    cycles (module docstring)."""
    cycles = table.column("cycles").to_pylist()
    by_tile = {(r["tile_m"], r["tile_n"]): r["cycles"] for r in table.select(["tile_m", "tile_n", "cycles"]).to_pylist()}
    hdl = [{"tile_m": m, "tile_n": n, "cycles": by_tile[(m, n)], "hdl_cycles": c,
            "cycles_over_hdl": by_tile[(m, n)] / c} for (m, n), c in HDL_CYCLES.items() if (m, n) in by_tile]
    vs_hdl = (pearson([p["cycles"] for p in hdl], [p["hdl_cycles"] for p in hdl]) if len(hdl) == len(HDL_CYCLES)
              else None)
    vs_roofline = pearson(cycles, table.column("roofline_bound_cycles").to_pylist())
    details = {"pearson_cycles_vs_roofline": vs_roofline,
               "pearson_cycles_vs_memory_bound": pearson(cycles, table.column("memory_bound_cycles").to_pylist()),
               "points": table.num_rows, "pearson_cycles_vs_hdl": vs_hdl, "hdl_points": hdl,
               "hdl_source": HDL_SOURCE}
    return {JSON_KEYS[0]: vs_roofline, JSON_KEYS[1]: vs_hdl}, details


def summary(table: pa.Table, json_headline: dict, details: dict) -> list[str]:
    """Human-readable lines: the sweep table and the correlations."""
    lines = format_rows(table, [("tile_m", None), ("tile_n", None), ("cycles", "{:,}"), ("off_chip_mb", "{:.2f}"),
                                ("operational_intensity", "{:.1f}"), ("roofline_bound_cycles", "{:,.0f}"),
                                ("cycles_over_roofline", "{:.3f}")])
    lines.append("")
    lines.append(f"Pearson r(simulated cycles, roofline bound) over {details['points']} points: "
                 f"{details['pearson_cycles_vs_roofline']:.4f} "
                 f"(memory bound alone: {details['pearson_cycles_vs_memory_bound']:.4f})")
    if details["pearson_cycles_vs_hdl"] is None:
        lines.append(f"Pearson r(simulated cycles, HDL cycles): - (the sweep leaves out some of the "
                     f"{len(HDL_CYCLES)} published HDL points, tile_m 16)")
        return lines
    lines.append(f"Pearson r(simulated cycles, HDL cycles) over the {len(HDL_CYCLES)} published HDL points: "
                 f"{details['pearson_cycles_vs_hdl']:.4f} (HDL: {HDL_SOURCE})")
    lines += [f"  tile_m {p['tile_m']} tile_n {p['tile_n']:>3}: simulated {p['cycles']:,} cycles, HDL "
              f"{p['hdl_cycles']:,} ({100 * (p['cycles_over_hdl'] - 1):+.1f} %)" for p in details["hdl_points"]]
    return lines
