"""Traces in: read, validate, normalize, batch and synthesize MoE-routing and KV-length traces.

Modules: :mod:`~stepsim.trace_io.schemas` (versioned Arrow schemas), :mod:`~stepsim.trace_io.readers`
(npz / npy / Azure CSV / Arrow IPC / Parquet), :mod:`~stepsim.trace_io.validate` (streaming checks),
:mod:`~stepsim.trace_io.writers`, :mod:`~stepsim.trace_io.batches` (decode-batch windows, attention
metadata), :mod:`~stepsim.trace_io.synthetic` (seeded generators), :mod:`~stepsim.trace_io.summary`
(statistics for ``stepsim trace inspect``) and :mod:`~stepsim.cli.trace`.
"""

from stepsim.trace_io.batches import (
    KVWindow,
    attention_metadata,
    decode_batches_table,
    kv_lengths,
    paper_windows,
    request_window,
    select_windows,
    window_stats,
    window_stdevs,
)
from stepsim.trace_io.readers import (
    FORMATS,
    TraceStream,
    detect_format,
    expert_counts,
    open_trace,
    parse_kv_name,
    read_trace,
    routing_matrix,
    validate_trace,
)
from stepsim.trace_io.schemas import SCHEMA_VERSION, TraceInfo, make_schema, trace_info
from stepsim.trace_io.summary import TraceSummary
from stepsim.trace_io.synthetic import (
    iter_synthetic_routing,
    sample_kv_lengths,
    synthetic_kv_batches,
    synthetic_routing,
)
from stepsim.trace_io.validate import conform_batches, validate_table
from stepsim.trace_io.writers import write_trace

__all__ = [
    "FORMATS",
    "SCHEMA_VERSION",
    "KVWindow",
    "TraceInfo",
    "TraceStream",
    "TraceSummary",
    "attention_metadata",
    "conform_batches",
    "decode_batches_table",
    "detect_format",
    "expert_counts",
    "iter_synthetic_routing",
    "kv_lengths",
    "make_schema",
    "open_trace",
    "paper_windows",
    "parse_kv_name",
    "read_trace",
    "request_window",
    "routing_matrix",
    "sample_kv_lengths",
    "select_windows",
    "synthetic_kv_batches",
    "synthetic_routing",
    "trace_info",
    "validate_table",
    "validate_trace",
    "window_stats",
    "window_stdevs",
    "write_trace",
]
