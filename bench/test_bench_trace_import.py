"""Benchmark: import + validate a 10-million-token routing trace (Parquet and Arrow IPC), streaming.

Run with ``python -m pytest bench/test_bench_trace_import.py --benchmark-enable`` (the project's default
``--benchmark-disable`` still runs every benchmark once). Each benchmark records ``rows_per_s`` and the peak
Arrow memory held while streaming in ``benchmark.extra_info``. The trace is generated once per module into a
temp folder (Qwen-like shapes would take minutes to generate; Mixtral shapes, 8 experts top-2, keep setup
around 5 s).

Streaming is checked two ways: the Arrow memory pool never holds more than a few batches at once, and a
subprocess that validates the whole file has a peak RSS far below the size of the decoded trace.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pytest

from stepsim.trace_io import open_trace, validate_trace, write_trace
from stepsim.trace_io.synthetic import iter_synthetic_routing, routing_schema_for

pytest.importorskip("pytest_benchmark")

TOKENS = 10_000_000
EXPERTS, TOP_K = 8, 2
#: bytes of the decoded trace: 3 int32 columns + top_k int16 ids per row (160 MB)
DECODED_BYTES = TOKENS * (3 * 4 + TOP_K * 2)
#: Arrow memory allowed to be live at once while streaming (a few 64 Ki-row batches + one 1 Mi-row group)
STREAM_BUDGET = 48 * 2**20


@pytest.fixture(scope="module")
def big_traces(tmp_path_factory) -> dict[str, Path]:
    """The same 10 M-token trace as Parquet and as Arrow IPC."""
    d = tmp_path_factory.mktemp("bench_traces")
    schema = routing_schema_for(
        EXPERTS, TOP_K, model="mixtral", seed=1, skew="dirichlet", alpha=1.0, gate_weights=False
    )
    paths = {"parquet": d / "routing.parquet", "arrow": d / "routing.arrow"}
    write_trace(
        iter_synthetic_routing(TOKENS, EXPERTS, TOP_K, 1, model="mixtral", batch=64), paths["parquet"], schema=schema
    )
    src = open_trace(paths["parquet"])
    write_trace(src.batches(), paths["arrow"], schema=src.schema)
    return paths


def _peak_tracking(batches):
    """Pass batches through while recording the peak of live Arrow allocations."""
    state = {"peak": pa.total_allocated_bytes()}

    def gen():
        for b in batches:
            state["peak"] = max(state["peak"], pa.total_allocated_bytes())
            yield b

    return gen(), state


def _record(benchmark, rows: int, seconds: list[float], peak: int, src: Path) -> None:
    best = min(seconds)
    benchmark.extra_info.update(
        rows=rows,
        seconds=round(best, 3),
        rows_per_s=round(rows / best),
        peak_arrow_bytes=peak,
        source_bytes=src.stat().st_size,
    )


@pytest.mark.parametrize(("src_fmt", "out_suffix"), [("parquet", ".arrow"), ("arrow", ".parquet")])
def test_bench_import(benchmark, big_traces, tmp_path, src_fmt, out_suffix):
    """``stepsim trace import``: read, validate every row, write the other format; one streaming pass."""
    src = big_traces[src_fmt]
    out = tmp_path / f"imported{out_suffix}"
    seconds, peaks = [], []

    def run():
        base = pa.total_allocated_bytes()
        t0 = time.perf_counter()
        stream = open_trace(src)
        batches, state = _peak_tracking(stream.batches())
        rows = write_trace(batches, out, schema=stream.schema)
        seconds.append(time.perf_counter() - t0)
        peaks.append(state["peak"] - base)
        return rows

    rows = benchmark.pedantic(run, rounds=2, iterations=1)
    assert rows == TOKENS
    _record(benchmark, rows, seconds, max(peaks), src)
    assert max(peaks) < STREAM_BUDGET, f"held {max(peaks) / 2**20:.1f} MiB of Arrow memory while streaming"
    assert validate_trace(out).rows == TOKENS


@pytest.mark.parametrize("src_fmt", ["parquet", "arrow"])
def test_bench_validate(benchmark, big_traces, src_fmt):
    """``stepsim trace inspect`` / :func:`validate_trace`: streaming validation + per-expert counts."""
    src = big_traces[src_fmt]
    seconds = []

    def run():
        t0 = time.perf_counter()
        summary = validate_trace(src)
        seconds.append(time.perf_counter() - t0)
        return summary

    summary = benchmark.pedantic(run, rounds=2, iterations=1)
    assert summary.rows == TOKENS
    assert int(summary.counts.sum()) == TOKENS * TOP_K
    _record(benchmark, TOKENS, seconds, 0, src)


def _peak_rss_mib(code: str) -> float:
    script = code + "\nimport resource; print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)"
    out = subprocess.run([sys.executable, "-c", script], check=True, capture_output=True, text=True).stdout
    return int(out.split()[-1]) / 1024  # Linux reports KiB


@pytest.mark.parametrize("src_fmt", ["parquet", "arrow"])
def test_validation_memory_is_bounded(big_traces, src_fmt):
    """Peak RSS of validating the whole file grows by far less than the decoded trace (160 MB)."""
    baseline = _peak_rss_mib("import stepsim.trace_io")
    peak = _peak_rss_mib(f"from stepsim.trace_io import validate_trace; validate_trace({str(big_traces[src_fmt])!r})")
    growth = peak - baseline
    assert growth < DECODED_BYTES / 2**20 / 2, f"validation grew RSS by {growth:.0f} MiB"
