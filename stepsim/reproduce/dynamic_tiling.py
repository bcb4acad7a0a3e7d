"""§5.3 dynamic tiling (README Fig 9 / Fig 10): static tile sweeps vs dynamic tiling of the MoE layer.

For every routing batch found (each model, each batch size B), the MoE layer is simulated with every static
tile of :func:`static_tiles` (tokens per expert tile; B=64: 8, 16, 32, 64; B=1024: 16 ... 1024) and with
dynamic tiling (one packed tile per expert). Each row records cycles, measured off-chip traffic and the
on-chip footprint in three accountings (bytes):

* ``on_chip_bytes``: the symbolic total (the artifact's published accounting, every expert allocated);
* ``on_chip_bytes_active``: minus the footprint of experts that received no token (the spec's
  "unselected-expert correction", which assumes on-demand allocation);
* ``on_chip_bytes_plotted``: what the paper's Pareto plot draws (§5.3): the raw value for static tiles and
  the corrected one for dynamic tiling. (Mixtral's B=64 script draws dynamic raw too; no Mixtral expert is
  idle in the shipped trace, so both are equal there.)

Headline (our definition; the spec gives none; see README "Fidelity"). For each routing batch, with
``TOLERANCE`` = 5 % as "comparable":

* on-chip reduction = plotted on-chip bytes of the *smallest-memory static tile whose cycles are within 5 % of
  dynamic's* (if none is that fast: the fastest static tile) / dynamic's plotted on-chip bytes;
* speedup = cycles of the *fastest static tile whose plotted on-chip bytes are within 5 % of dynamic's* (if
  none is that small: the smallest-memory static tile) / dynamic's cycles.

Both are reported as the geometric mean over the routing batches. For comparison with the paper's arXiv v1
numbers, :func:`headline` also computes the v1 pairing (B=64 only): memory of tile 64 and cycles of tile 16,
both against dynamic, with the corrected (active) on-chip accounting for every row.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import pyarrow as pa

from stepsim.base import defaults
from stepsim.base.errors import ConfigError
from stepsim.models.presets import moe_model
from stepsim.reproduce.execute import Point
from stepsim.reproduce.fifos import DEFAULT as DEFAULT_FIFO_DEPTH
from stepsim.reproduce.fifos import fifo_depth, fifo_note
from stepsim.reproduce.layout import MODEL_ORDER, routing_files
from stepsim.reproduce.stats import geomean
from stepsim.reproduce.tables import field, format_rows, group_rows
from stepsim.results.records import RunResult

NAME = "dynamic-tiling"
STEM = "dynamic_tiling"
#: the spec's static tile lists per batch size (§5.3)
SPEC_TILES = {64: (8, 16, 32, 64), 1024: (16, 32, 64, 128, 256, 512, 1024)}
#: "comparable" performance / memory: within 5 %
TOLERANCE = 0.05
#: §5.3 quirk 8: the Qwen B=1024 sweep runs with unbounded FIFOs (step-perf's None = 1024 elements)
UNBOUNDED_CHANNEL_DEPTH = defaults.UNBOUNDED_CHANNEL_DEPTH
JSON_KEYS = ("dynamic_tiling_onchip_reduction_geomean", "dynamic_tiling_speedup_geomean")

SCHEMA = pa.schema([
    field("model", pa.string()), field("batch", pa.int64(), "tokens"), field("trace", pa.string()),
    field("tiling", pa.string()), field("tile_n", pa.int64(), "tokens"), field("tile_f", pa.int64(), "columns"),
    field("compute_bw", pa.int64(), "FLOP/cycle"), field("channel_depth", pa.int64(), "elements"),
    field("cycles", pa.int64(), "cycles"), field("off_chip_bytes", pa.int64(), "bytes"),
    field("on_chip_bytes", pa.int64(), "bytes"), field("on_chip_bytes_active", pa.int64(), "bytes"),
    field("on_chip_bytes_plotted", pa.int64(), "bytes"), field("flops", pa.int64(), "FLOP"),
    field("run_id", pa.string()),
])


def static_tiles(batch: int) -> tuple[int, ...]:
    """Static tile sizes (tokens) swept for a batch of ``batch`` tokens.

    The spec's lists for B = 64 and 1024; for other batch sizes (not in the paper) the powers of two from 8
    up to B (just B when B < 8).
    """
    if batch in SPEC_TILES:
        return SPEC_TILES[batch]
    tiles = tuple(1 << k for k in range(3, batch.bit_length()) if 1 << k <= batch)
    return tiles or (batch,)


def _model_config(model: str, dims: Mapping[str, int] | None) -> dict:
    """The config keys naming ``model``: the preset, or a ``custom`` model with the preset's experts and
    top-k and ``dims`` (``hidden`` and/or ``intermediate``) replacing its sizes."""
    if not dims:
        return {"model": model}
    unknown = sorted(set(dims) - {"hidden", "intermediate"})
    if unknown:
        raise ConfigError(f"model_dims[{model!r}]: unknown key(s) {', '.join(unknown)}; "
                          f"expected hidden, intermediate")
    preset = moe_model(model)
    return {"model": "custom", "hidden": int(dims.get("hidden", preset.hidden)),
            "intermediate": int(dims.get("intermediate", preset.intermediate)),
            "experts": preset.experts, "top_k": preset.top_k}


def plan(traces: str | Path, *, tiles: Mapping[int, Sequence[int]] | None = None,
         models: Sequence[str] | None = None,
         model_dims: Mapping[str, Mapping[str, int]] | None = None) -> list[Point]:
    """The experiment's points: per routing batch, each static tile (ascending), then dynamic.

    Parameters
    ----------
    traces : path
        Folder laid out like ``../shared/traces``.
    tiles : mapping batch -> tile sizes, optional
        Override :func:`static_tiles` (reduced configurations for tests).
    models : sequence of str, optional
        Model presets to run (default: every model with a routing folder).
    model_dims : mapping preset -> {"hidden": D, "intermediate": F}, optional
        Run that preset's routing with a smaller layer (reduced configurations for tests): a ``custom``
        model with the preset's experts and top-k. Tables still name the preset.
    """
    unknown = sorted(set(model_dims or {}) - set(MODEL_ORDER))
    if unknown:
        raise ConfigError(f"model_dims: unknown model(s) {', '.join(unknown)}; expected {', '.join(MODEL_ORDER)}")
    points = []
    for f in routing_files(traces, tuple(models) if models else MODEL_ORDER):
        labels = {"model": f.model, "batch": f.batch, "trace": f.name}
        base = {"workload": "moe", **_model_config(f.model, (model_dims or {}).get(f.model)),
                "trace": str(f.path)}
        if fifo_depth(NAME, f.model, f.batch) != DEFAULT_FIFO_DEPTH:  # Qwen at B=1024 and unrun batch sizes
            base["channel_depth"] = fifo_depth(NAME, f.model, f.batch)
        chosen = (tiles or {}).get(f.batch) or static_tiles(f.batch)
        points += [Point(labels, {**base, "tiling": "static", "tile_n": int(t)}) for t in sorted(chosen)]
        points.append(Point(labels, {**base, "tiling": "dynamic"}))
    return points


def build_table(points: Sequence[Point], records: Sequence[RunResult]) -> pa.Table:
    """One row per point (schema :data:`SCHEMA`, units in field metadata)."""
    rows = []
    for point, record in zip(points, records):
        r, params = record.row, json.loads(record.row["params"])
        plotted = r["on_chip_bytes"] if params["tiling"] == "static" else r["on_chip_bytes_active"]
        rows.append({**point.labels, "tiling": params["tiling"], "tile_n": params["tile_n"],
                     "tile_f": params["tile_f"], "compute_bw": params["compute_bw"],
                     "channel_depth": params["channel_depth"], "cycles": r["cycles"],
                     "off_chip_bytes": r["off_chip_bytes"], "on_chip_bytes": r["on_chip_bytes"],
                     "on_chip_bytes_active": r["on_chip_bytes_active"], "on_chip_bytes_plotted": plotted,
                     "flops": r["flops"], "run_id": r["run_id"]})
    return pa.Table.from_pylist(rows, schema=SCHEMA)


def compare(static: Sequence[dict], dynamic: dict, tolerance: float = TOLERANCE) -> dict:
    """Reference static tiles and ratios for one routing batch (the rule in the module docstring).

    Returns a dict with ``memory_reference_tile``, ``onchip_reduction``, ``speed_reference_tile``,
    ``speedup`` and, for each reference, whether a static tile was within the tolerance (``*_comparable``).
    """
    mem_key, cyc_key = "on_chip_bytes_plotted", "cycles"
    fast = [s for s in static if s[cyc_key] <= dynamic[cyc_key] * (1 + tolerance)]
    if fast:
        mem_ref = min(fast, key=lambda s: (s[mem_key], s["tile_n"]))
    else:
        mem_ref = min(static, key=lambda s: (s[cyc_key], s["tile_n"]))
    small = [s for s in static if s[mem_key] <= dynamic[mem_key] * (1 + tolerance)]
    if small:
        speed_ref = min(small, key=lambda s: (s[cyc_key], s["tile_n"]))
    else:
        speed_ref = min(static, key=lambda s: (s[mem_key], s["tile_n"]))
    return {"memory_reference_tile": mem_ref["tile_n"], "memory_reference_comparable": bool(fast),
            "onchip_reduction": mem_ref[mem_key] / dynamic[mem_key],
            "speed_reference_tile": speed_ref["tile_n"], "speed_reference_comparable": bool(small),
            "speedup": speed_ref[cyc_key] / dynamic[cyc_key]}


def _v1_pairs(static: Sequence[dict], dynamic: dict) -> dict | None:
    """arXiv v1's pairing at B=64: tile 64 for memory, tile 16 for speed, corrected on-chip for all rows."""
    by_tile = {s["tile_n"]: s for s in static}
    if dynamic["batch"] != 64 or 16 not in by_tile or 64 not in by_tile:
        return None
    return {"onchip_reduction": by_tile[64]["on_chip_bytes_active"] / dynamic["on_chip_bytes_active"],
            "speedup": by_tile[16]["cycles"] / dynamic["cycles"]}


def headline(table: pa.Table) -> tuple[dict, dict]:
    """``(json headline, details)``.

    The JSON headline holds :data:`JSON_KEYS`: geometric means over the routing batches of
    :func:`compare`'s ``onchip_reduction`` and ``speedup``. ``details`` has the per-batch comparisons
    (``groups``) and the v1-pairing geomeans (``v1_pairs_b64``, None without B=64 batches holding tiles 16
    and 64).
    """
    groups, v1 = [], []
    for key, rows in group_rows(table, ("model", "batch", "trace")):
        static = [r for r in rows if r["tiling"] == "static"]
        dynamic = [r for r in rows if r["tiling"] == "dynamic"]
        if not static or len(dynamic) != 1:
            continue
        groups.append({**dict(zip(("model", "batch", "trace"), key)), **compare(static, dynamic[0])})
        if (pair := _v1_pairs(static, dynamic[0])) is not None:
            v1.append(pair)
    json_headline = {
        JSON_KEYS[0]: geomean([g["onchip_reduction"] for g in groups]),
        JSON_KEYS[1]: geomean([g["speedup"] for g in groups]),
    }
    v1_summary = None
    if v1:
        v1_summary = {"onchip_reduction_geomean": geomean([p["onchip_reduction"] for p in v1]),
                      "speedup_geomean": geomean([p["speedup"] for p in v1])}
    return json_headline, {"groups": groups, "v1_pairs_b64": v1_summary, "tolerance": TOLERANCE}


#: which on-chip accounting the table and figure show (``stepsim demo`` says the same of its columns)
ACCOUNTING_NOTE = ("on_chip_bytes_plotted: the paper's Fig 9/10 accounting, published (every expert allocated) for "
                   "static tiles and active (experts without tokens left out) for dynamic tiling; the parquet has "
                   "both, on_chip_bytes and on_chip_bytes_active")


def summary(table: pa.Table, json_headline: dict, details: dict) -> list[str]:
    """Human-readable lines: the table, each batch's comparison, the headline."""
    lines = format_rows(table, [("model", None), ("batch", None), ("tiling", None), ("tile_n", None),
                                ("cycles", "{:,}"), ("off_chip_bytes", "{:,}"), ("on_chip_bytes_plotted", "{:,}")])
    lines.append(ACCOUNTING_NOTE)
    lines.append("")
    for g in details["groups"]:
        mem_why = "" if g["memory_reference_comparable"] else " (none within 5% of dynamic's cycles: fastest)"
        speed_why = "" if g["speed_reference_comparable"] else " (none within 5% of dynamic's memory: smallest)"
        lines.append(f"{g['model']} B={g['batch']}: on-chip {g['onchip_reduction']:.2f}x less than tile "
                     f"{g['memory_reference_tile']}{mem_why}; {g['speedup']:.2f}x faster than tile "
                     f"{g['speed_reference_tile']}{speed_why}; {fifo_note(NAME, g['model'], g['batch'])}")
    lines.append(f"geomean on-chip memory reduction: {json_headline[JSON_KEYS[0]]:.2f}x (paper: 2.18x)")
    lines.append(f"geomean speedup: {json_headline[JSON_KEYS[1]]:.2f}x (paper: 1.45x)")
    if details["v1_pairs_b64"]:
        v1 = details["v1_pairs_b64"]
        lines.append(f"arXiv v1 pairing (B=64: tile 64 memory, tile 16 cycles, corrected on-chip): "
                     f"{v1['onchip_reduction_geomean']:.2f}x memory, {v1['speedup_geomean']:.2f}x speedup")
    return lines
