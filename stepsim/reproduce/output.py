"""Write an experiment's outputs atomically: the raw table (Parquet with provenance + CSV) and its headline JSON."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv

from stepsim.base.files import atomic_output, provenance_metadata, write_parquet_atomic
from stepsim.base.ranges import json_text


def write_table(table: pa.Table, out_dir: Path, stem: str, provenance: dict) -> dict[str, Path]:
    """Write ``<stem>.parquet`` (units in field metadata, ``provenance`` in ``stepsim.*`` schema metadata) and
    ``<stem>.csv`` (same columns; empty cells are nulls) under ``out_dir``; return ``{"parquet": ..., "csv": ...}``."""
    out_dir = Path(out_dir)
    parquet = write_parquet_atomic(table, out_dir / f"{stem}.parquet", provenance_metadata(config=provenance))
    csv = out_dir / f"{stem}.csv"
    with atomic_output(csv) as tmp:
        pacsv.write_csv(table, tmp)
    return {"parquet": parquet, "csv": csv}


def write_headline(out_dir: Path, stem: str, experiment: str, headline: dict, details: dict) -> Path:
    """Write ``<stem>_headline.json``: ``{"experiment", "headline" (the --json keys), "details"}``, sorted keys."""
    path = Path(out_dir) / f"{stem}_headline.json"
    text = json_text({"experiment": experiment, "headline": headline, "details": details}, indent=2, sort_keys=True)
    with atomic_output(path) as tmp:
        tmp.write_text(text + "\n")
    return path
