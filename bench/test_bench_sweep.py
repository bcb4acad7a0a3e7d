"""Sweep bookkeeping at scale: expanding a million-point grid, and reading back a folder of 100,000 rows.

* ``test_million_point_grid_starts_at_once``: a 1000 x 1000 SwiGLU grid. Reported: the time to the first task
  (``iter_tasks``) and to ``--dry-run``'s text (both independent of the grid size: expansion is lazy), and the
  expansion cost per task (what a running sweep pays as it streams tasks to workers), against the eager
  ``expand`` of a 2,000-point grid. The ratio first-task(1 M) / first-task(2 k) is the number to watch (~1).
* ``test_resume_index_of_100k_rows``: 100,000 rows in 100 part files (the batched layout of a large sweep): the
  time to index them for a resume (:class:`~stepsim.batch.store.ResultIndex`) and to ``read_sweep`` them.
"""

from __future__ import annotations

import itertools
import time

import pyarrow as pa
import pyarrow.parquet as pq

from stepsim.batch import load_sweep
from stepsim.batch.grid import expand, iter_tasks
from stepsim.batch.rows import read_sweep
from stepsim.batch.store import ResultIndex
from stepsim.cli.sweep import dry_run

GRID = """
workload = "swiglu"
out = "results"
[axes]
compute_bw = {{start = 1, stop = {n}, step = 1}}
channel_depth = {{start = 1, stop = 1001, step = 1}}
"""


def _spec(tmp_path, n: int, name: str):
    path = tmp_path / name
    path.write_text(GRID.format(n=n + 1))
    return load_sweep(path)


def test_million_point_grid_starts_at_once(tmp_path, benchmark, bench_summary, rounds):
    big, small = _spec(tmp_path, 1000, "big.toml"), _spec(tmp_path, 2, "small.toml")
    assert (big.points, small.points) == (1_000_000, 2_000)

    def first_task(spec) -> float:
        start = time.perf_counter()
        next(iter_tasks(spec))
        return time.perf_counter() - start

    first_big = min(first_task(big) for _ in range(rounds(5)))
    first_small = min(first_task(small) for _ in range(rounds(5)))
    start = time.perf_counter()
    text = benchmark.pedantic(dry_run, args=(big,), rounds=rounds(3), iterations=1)
    dry_s = (time.perf_counter() - start) / rounds(3)
    assert "1,000,000 grid point(s)" in text
    n = 20_000
    start = time.perf_counter()
    assert sum(1 for _ in itertools.islice(iter_tasks(big), n)) == n
    per_task_us = (time.perf_counter() - start) / n * 1e6
    start = time.perf_counter()
    assert len(expand(small)) == 2_000
    eager_s = time.perf_counter() - start
    bench_summary("sweep", f"1 M-point grid: first task {first_big * 1e6:.0f} us (2 k grid: {first_small * 1e6:.0f} "
                           f"us, ratio {first_big / first_small:.2f}); --dry-run text {dry_s * 1e3:.1f} ms")
    bench_summary("sweep", f"expansion {per_task_us:.0f} us/task streamed; eager expand of 2,000 points "
                           f"{eager_s:.2f} s (a 1 M grid eagerly: ~{per_task_us:.0f} s before the first task)")


def test_resume_index_of_100k_rows(tmp_path, bench_summary):
    from stepsim.batch.grid import Task, slot_key
    from stepsim.batch.rows import row_table
    from stepsim.results.records import run_config

    record = run_config({"workload": "swiglu"})
    task = Task(index=0, config={"workload": "swiglu", "mode": "metrics", "tile_m": 16, "tile_n": 16,
                                 "convention": "published"}, run_id=record.run_id)
    template = row_table(task, {"status": "ok", "error_type": None, "error_message": None, "error_traceback": None,
                                "wall_s": 0.1, "record": record}).drop_columns(["workload"])
    folder = tmp_path / "out" / "workload=swiglu"
    folder.mkdir(parents=True)
    files, per_file = 100, 1000
    for f in range(files):
        ids = [f"{f:03d}{i:013d}".ljust(64, "0") for i in range(per_file)]
        table = pa.concat_tables([template] * per_file)
        table = table.set_column(table.schema.get_field_index("run_id"), "run_id", pa.array(ids))
        slots = [slot_key({"mode": "metrics", "tile_m": i, "tile_n": f}) for i in range(per_file)]
        table = table.set_column(table.schema.get_field_index("task_slot"), "task_slot", pa.array(slots))
        pq.write_table(table, folder / f"part-{ids[0][:16]}.parquet")
    start = time.perf_counter()
    index = ResultIndex.load(tmp_path / "out")
    index_s = time.perf_counter() - start
    start = time.perf_counter()
    rows = read_sweep(tmp_path / "out").num_rows
    read_s = time.perf_counter() - start
    assert len(index.by_key) == rows == files * per_file
    bench_summary("sweep", f"100,000 rows in {files} part files: resume index {index_s:.2f} s, read_sweep "
                           f"{read_s:.2f} s")
