"""Failed tasks become rows (typed error, config, status) without stopping the sweep; --fail-fast stops."""

from __future__ import annotations

import pytest
from sweep_helpers import SWIGLU_OFF_CHIP, files_under

from stepsim.batch import SweepStopped, expand, load_sweep, run_sweep
from stepsim.batch.rows import SWEEP_COLUMNS, first_line, read_sweep
from stepsim.batch.tasks import run_task
from stepsim.results.records import SCHEMA

# tile_n = 24 does not divide F = 512: the SwiGLU builder refuses it when the task runs
SWIGLU_WITH_A_BAD_TILE = """
workload = "swiglu"
out = "results"
[axes]
tile_n = [16, 24, 32]
"""
BAD_TILE_MESSAGE = "tile_n must be a positive divisor of 512, got 24"


def test_failed_task_is_a_row_with_its_typed_error_and_the_sweep_goes_on(sweep_file):
    spec = load_sweep(sweep_file(SWIGLU_WITH_A_BAD_TILE))
    tasks = expand(spec)
    report = run_sweep(spec, jobs=2, progress=False)
    assert report.ran == 3 and [t.index for t in report.failed] == [1]

    table = read_sweep(spec.out)
    assert table.schema.names == [*(n for n in SCHEMA.names if n != "workload"), *SWEEP_COLUMNS.names,
                                  "workload"]  # the partition column comes back last
    rows = {r["tile_n"]: r for r in table.to_pylist()}
    failed = rows[24]
    assert {k: failed[k] for k in ("status", "error_type", "error_message", "error_traceback")} == {
        "status": "failed", "error_type": "ConfigError", "error_message": BAD_TILE_MESSAGE, "error_traceback": None}
    # the failed row carries the task's identity and knobs; every measurement is null
    assert failed["run_id"] == tasks[1].run_id
    assert {k: failed[k] for k in ("workload", "mode", "tile_m", "tile_n", "convention")} == {
        "workload": "swiglu", "mode": "metrics", "tile_m": 16, "tile_n": 24, "convention": "published"}
    assert [failed[k] for k in ("cycles", "off_chip_bytes", "on_chip_bytes", "flops", "params")] == [None] * 5
    for tile_n in (16, 32):
        assert rows[tile_n]["status"] == "ok" and rows[tile_n]["error_type"] is None
        assert rows[tile_n]["off_chip_bytes"] == SWIGLU_OFF_CHIP[(16, tile_n)]
        assert rows[tile_n]["run_id"] == tasks[0 if tile_n == 16 else 2].run_id

    # a recorded failure counts as done; --retry-failed runs exactly the failed task again
    again = run_sweep(spec, jobs=2, progress=False)
    assert again.ran == 0 and [t.index for t in again.failed] == [1]
    retried = run_sweep(spec, jobs=2, progress=False, retry_failed=True)
    assert list(retried.outcomes) == [tasks[1].key] and sorted(retried.skipped) == sorted([tasks[0].key,
                                                                                           tasks[2].key])
    assert len(files_under(spec.out, "**/part-*.parquet")) == 3


def test_fail_fast_writes_the_failed_row_and_stops_before_the_other_tasks(sweep_file):
    spec = load_sweep(sweep_file(SWIGLU_WITH_A_BAD_TILE.replace("[16, 24, 32]", "[24, 16, 32, 64]")))
    tasks = expand(spec)
    with pytest.raises(SweepStopped) as info:
        run_sweep(spec, jobs=1, progress=False, fail_fast=True)
    stop = info.value
    assert stop.reason == "fail-fast"
    assert str(stop) == (f"stopped at the first failed task (--fail-fast): task 0 (tile_n=24): ConfigError: "
                         f"{BAD_TILE_MESSAGE}")
    # one worker: the failed task finished first; the task already queued behind it is dropped, not written
    assert list(stop.report.outcomes) == [tasks[0].key]
    assert files_under(spec.out, "**/part-*.parquet") == [f"workload=swiglu/part-{tasks[0].key}.parquet"]
    assert stop.report.not_run == 3

    # without --fail-fast the rest runs; the recorded failure is not run again
    report = run_sweep(spec, jobs=1, progress=False)
    assert sorted(report.outcomes) == sorted(t.key for t in tasks[1:])


def test_an_unexpected_exception_is_recorded_with_its_traceback(monkeypatch):
    def broken(config, force=False):
        raise ZeroDivisionError("boom")

    monkeypatch.setattr("stepsim.results.records.run_config", broken)
    outcome = run_task({"workload": "swiglu", "mode": "metrics"})
    assert {k: outcome[k] for k in ("status", "error_type", "error_message", "record")} == {
        "status": "failed", "error_type": "ZeroDivisionError", "error_message": "boom", "record": None}
    assert outcome["error_traceback"].rstrip().endswith("ZeroDivisionError: boom")
    assert outcome["wall_s"] >= 0


def test_summaries_show_the_first_line_of_long_error_messages():
    deadlock = "deadlock: no unit can make progress; blocked units:\n  Load_0 waits for a free slot\n  Sink_1 waits"
    assert first_line(deadlock) == "deadlock: no unit can make progress; blocked units: [...]"
    assert first_line("x" * 200) == "x" * 160 + " [...]"
    assert first_line(BAD_TILE_MESSAGE) == BAD_TILE_MESSAGE
    assert first_line(None) == ""
