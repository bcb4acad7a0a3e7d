"""The files of a serve run, written atomically into ``--out`` and read back.

* ``requests.parquet``: one row per request (:data:`REQUEST_COLUMNS`; times in seconds, ``tpot_s`` null for an
  output of one token);
* ``iterations.parquet``: one row per scheduler step (:data:`ITERATION_COLUMNS`, then ``cycles_<kind>`` columns
  when the latency provider simulates layer kinds, and the step's roofline, :data:`~stepsim.serve.latency.WORK_COLUMNS`:
  the HBM bytes and FLOPs it must read and do, and the HBM and compute utilisation its cycles achieve);
* ``summary.json``: the ``--json`` object.

Each file is written to a hidden temporary name in ``--out`` and renamed into place
(:func:`stepsim.base.files.atomic_output`), so an interrupted run never leaves half a file. The same inputs give
byte-identical Parquet files and a ``summary.json`` that differs only in ``wall_s``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from stepsim.base.errors import SimulationError
from stepsim.base.files import atomic_output, write_parquet_atomic
from stepsim.base.ranges import non_finite
from stepsim.serve.latency import WORK_COLUMNS

REQUESTS_FILE, ITERATIONS_FILE, SUMMARY_FILE = "requests.parquet", "iterations.parquet", "summary.json"
#: every file a run writes into ``--out`` (the figures only with matplotlib; names as stepsim.serve.figures)
OUTPUT_FILES = (REQUESTS_FILE, ITERATIONS_FILE, SUMMARY_FILE, "latency_cdf.png", "over_time.png")
#: requests.parquet columns and units
REQUEST_COLUMNS = {
    "request_id": None, "arrival_s": "s", "first_scheduled_s": "s", "first_token_s": "s", "finish_s": "s",
    "prompt_tokens": "tokens", "output_tokens": "tokens", "ttft_s": "s", "tpot_s": "s", "e2e_s": "s",
    "preemptions": None,
}
#: iterations.parquet columns and units (before any cycles_<kind> columns, which are in cycles)
ITERATION_COLUMNS = {
    "iteration": None, "start_s": "s", "duration_s": "s", "tokens": "tokens", "sequences": None,
    "prefill_tokens": "tokens", "decode_tokens": "tokens", "kv_blocks_used": "blocks", "preemptions": None,
    "waiting": None,
}


def _units(table: pa.Table) -> dict[str, str]:
    known = {**REQUEST_COLUMNS, **ITERATION_COLUMNS, **WORK_COLUMNS}
    return {c: (known.get(c) or "cycles") for c in table.column_names
            if known.get(c) or c.startswith("cycles_")}


def write_outputs(out: str | Path, requests: pa.Table, iterations: pa.Table, summary: dict,
                  metadata: dict[str, str]) -> dict[str, Path]:
    """Write the three files into folder ``out`` (created if needed). Returns their paths by name."""
    bad = non_finite(summary)
    if bad is not None:  # before any file: JSON has no NaN or infinity (stepsim.base.ranges)
        raise SimulationError(f"summary.json: {bad[0]} is {bad[1]!r}; a serve run's figures are finite numbers "
                              "(nothing written)")
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    paths = {"requests": folder / REQUESTS_FILE, "iterations": folder / ITERATIONS_FILE,
             "summary": folder / SUMMARY_FILE}
    write_parquet_atomic(requests, paths["requests"], metadata, units=_units(requests))
    write_parquet_atomic(iterations, paths["iterations"], metadata, units=_units(iterations))
    with atomic_output(paths["summary"]) as tmp:
        tmp.write_text(json.dumps(summary, indent=2, allow_nan=False) + "\n", encoding="utf-8")
    return paths


def read_outputs(out: str | Path) -> tuple[pa.Table, pa.Table, dict]:
    """``(requests, iterations, summary)`` of a serve run's folder."""
    folder = Path(out)
    summary = json.loads((folder / SUMMARY_FILE).read_text(encoding="utf-8"))
    return pq.read_table(folder / REQUESTS_FILE), pq.read_table(folder / ITERATIONS_FILE), summary
