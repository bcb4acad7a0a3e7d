"""A serve run as one record row: its ``summary.json`` flattened, for ``stepsim compare`` and serving sweeps.

A ``stepsim serve --out`` folder holds ``summary.json`` and ``requests.parquet`` (docs/serving.md §7). Its row
(:func:`serve_row`) has ``record = "serve"``, ``requests_file`` (the request trace's file name), the
configuration columns of :data:`CONFIG_COLUMNS` and every
number of the summary under a dotted name: ``ttft_s.p99`` (seconds), ``throughput_tokens_per_s`` (tokens/s),
``slo_attainment`` (ratio), ``fidelity.error.iteration_p95`` (ratio) ... (:data:`DISTRIBUTIONS` x
:data:`STATISTICS` and :data:`SCALARS`). ``stepsim compare`` pairs serve rows by :func:`serve_config_key`.

Lives here, below ``serve`` and ``insight``, so that both (siblings that do not import each other) share it.
"""

from __future__ import annotations

import json
from pathlib import Path

#: the files a serve run's folder always has (stepsim.serve.output writes them)
SUMMARY_FILE, REQUESTS_FILE = "summary.json", "requests.parquet"
#: latency distributions of the summary (seconds) and the statistics of each
DISTRIBUTIONS = ("ttft_s", "tpot_s", "itl_s", "e2e_s")
STATISTICS = ("mean", "p50", "p90", "p99")
#: plain numbers of the summary
SCALARS = ("requests", "completed", "duration_s", "output_tokens", "throughput_tokens_per_s",
           "throughput_requests_per_s", "slo_attainment", "goodput_requests_per_s", "preemptions", "iterations",
           "wall_s")
#: knobs of a serve run as it was given them (not in the summary): shaping, constant latency, routing, HBM, and
#: ``long_requests`` (``drop`` / ``truncate`` for --drop-long / --truncate-long; null without)
KNOB_COLUMNS = ("arrival", "arrival_scale", "limit_requests", "duration", "iteration_latency", "routing",
                "hbm_bytes", "long_requests")
#: what pairs two serve records: the model, hardware, scheduler knobs, latency mode, SLOs, the request trace's
#: content, the seed and :data:`KNOB_COLUMNS`
CONFIG_COLUMNS = ("model", "hardware", "scheduler", "max_num_seqs", "max_num_batched_tokens", "chunk_tokens",
                  "block_size", "fidelity", "slo", "requests_sha256", "seed", *KNOB_COLUMNS)
#: metrics where more is better (the others, latencies and counts of trouble, are better lower)
HIGHER_IS_BETTER = ("completed", "throughput_tokens_per_s", "throughput_requests_per_s", "slo_attainment",
                    "goodput_requests_per_s")
#: what ``stepsim compare`` compares on serve records when no --metric is given
DEFAULT_METRICS = ("ttft_s.p99", "tpot_s.p99", "e2e_s.p99", "throughput_tokens_per_s")


def is_serve_folder(path) -> bool:
    """Whether ``path`` is a ``stepsim serve --out`` folder."""
    p = Path(path)
    return (p / SUMMARY_FILE).is_file() and (p / REQUESTS_FILE).is_file()


def incomplete_serve_folder(path) -> str | None:
    """What a folder holding one of a serve run's two files lacks (``"no summary.json"``), else None."""
    p = Path(path)
    has = [(p / name).is_file() for name in (SUMMARY_FILE, REQUESTS_FILE)]
    if any(has) and not all(has):
        return f"no {SUMMARY_FILE if not has[0] else REQUESTS_FILE}"
    return None


def serve_row(summary: dict, *, requests: str | None = None, requests_sha256: str | None = None,
              seed: int | None = None, knobs: dict | None = None) -> dict:
    """The record row of a serve run's ``summary`` (module docstring); the request file's name and SHA-256,
    the seed and the :data:`KNOB_COLUMNS` as the run was given them (the summary does not hold them; a routing
    file by its name)."""
    scheduler = summary.get("scheduler") or {}
    slo = summary.get("slo")
    row = {"record": "serve", "model": summary.get("model"), "hardware": (summary.get("hardware") or {}).get("name"),
           "scheduler": scheduler.get("policy"),
           **{k: scheduler.get(k) for k in ("max_num_seqs", "max_num_batched_tokens", "chunk_tokens", "block_size")},
           "fidelity": (summary.get("fidelity") or {}).get("mode"),
           "slo": None if slo is None else json.dumps(slo, sort_keys=True),
           "requests_file": None if requests is None else Path(requests).name, "requests_sha256": requests_sha256,
           "seed": seed}
    for k in KNOB_COLUMNS:
        value = (knobs or {}).get(k)
        row[k] = Path(value).name if k == "routing" and value not in (None, "synthetic") else value
    for name in DISTRIBUTIONS:
        dist = summary.get(name) or {}
        row.update({f"{name}.{s}": dist.get(s) for s in STATISTICS})
    row.update({k: summary.get(k) for k in SCALARS})
    error = (summary.get("fidelity") or {}).get("error")
    if isinstance(error, dict):
        row.update({f"fidelity.error.{k}": v for k, v in sorted(error.items())
                    if isinstance(v, (int, float)) and not isinstance(v, bool)})
    return row


def read_serve_folder(path) -> dict:
    """The record row of a ``stepsim serve --out`` folder (requests file and seed from the Parquet metadata)."""
    import pyarrow.parquet as pq

    from stepsim.base.errors import ConfigError

    p = Path(path)
    try:
        summary = json.loads((p / SUMMARY_FILE).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ConfigError(f"{p / SUMMARY_FILE}: not a readable serve summary ({type(exc).__name__}: {exc})") from None
    if not isinstance(summary, dict):
        raise ConfigError(f"{p / SUMMARY_FILE}: holds a JSON {type(summary).__name__}, not a serve summary object")
    try:
        meta = pq.read_schema(p / REQUESTS_FILE).metadata or {}
    except Exception as exc:  # pyarrow raises several types for a file that is not Parquet
        raise ConfigError(f"{p / REQUESTS_FILE}: not a readable Parquet file ({type(exc).__name__}: {exc})") from None
    text = {k.decode(): v.decode() for k, v in meta.items() if k.startswith(b"stepsim.")}
    seed = text.get("stepsim.seed")
    try:
        knobs = json.loads(text.get("stepsim.knobs", "{}"))
        seed = int(seed) if seed is not None else None
    except ValueError as exc:
        raise ConfigError(f"{p / REQUESTS_FILE}: its stepsim metadata does not parse ({exc})") from None
    return {**serve_row(summary, requests=text.get("stepsim.requests"),
                        requests_sha256=text.get("stepsim.requests_sha256"),
                        seed=seed, knobs=knobs), "run_id": str(p)}


#: the latency provider: what a comparison of serve runs measures (exact against fast, one iteration latency
#: against another), so it does not take part in pairing them
PROVIDER_COLUMNS = ("fidelity", "iteration_latency")


def serve_config_key(row: dict) -> tuple:
    """What pairs a serve record with another's (:data:`CONFIG_COLUMNS` but the :data:`PROVIDER_COLUMNS`, as
    text)."""
    return tuple((k, None if row.get(k) is None else str(row.get(k))) for k in CONFIG_COLUMNS
                 if k not in PROVIDER_COLUMNS)


def serve_label(row: dict) -> str:
    """``model=... scheduler=... max_num_seqs=...``: the configuration columns that are set, for a report line."""
    shown = {**row, "requests_sha256": None} if row.get("requests_file") else row  # the file's name says enough
    return " ".join(f"{k}={shown[k]}" for k in ("requests_file", *CONFIG_COLUMNS) if shown.get(k) is not None) \
        or "serve run"
