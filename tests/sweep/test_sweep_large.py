"""Large sweeps: --jobs checked first, grids over 10,000 points need --yes or max_tasks, --dry-run runs nothing,
expansion is lazy, rows are batched into part files and a batched sweep resumes exactly."""

from __future__ import annotations

import itertools

import pyarrow.parquet as pq
import pytest
from sweep_helpers import SWIGLU_OFF_CHIP, files_under

from stepsim.base.errors import ConfigError
from stepsim.batch import expand, load_sweep, run_sweep
from stepsim.batch import runner as sweep_runner
from stepsim.batch.grid import iter_tasks
from stepsim.batch.rows import WALL_TIME_COLUMNS, read_sweep
from stepsim.batch.store import batch_rows_for
from stepsim.cli import main

#: 1000 x 1000 = 1,000,000 SwiGLU points (compute_bw values: every one valid)
MILLION = """
workload = "swiglu"
out = "results"
[axes]
compute_bw = {start = 1, stop = 1001, step = 1}
channel_depth = {start = 1, stop = 1001, step = 1}
"""
#: 12 SwiGLU metrics points
TWELVE = """
workload = "swiglu"
out = "results"
[axes]
tile_m = [16, 32, 64]
tile_n = [16, 32, 64, 128]
"""


@pytest.mark.parametrize("flag, value", [("--jobs", "0"), ("--jobs", "-1"), ("-j", "0")])
def test_jobs_below_one_is_an_error_naming_the_flag_before_anything_runs(sweep_file, capsys, flag, value):
    path = sweep_file(TWELVE)
    assert main(["sweep", str(path), flag, value]) == 2  # progress bar on: it must not be drawn either
    captured = capsys.readouterr()
    assert captured.err == (f"stepsim: error: --jobs must be an int >= 1 (leave it out to use every CPU: "
                            f"{sweep_runner.default_jobs()}), got {int(value)}\n")
    assert captured.out == ""
    assert not (path.parent / "results").exists()
    with pytest.raises(ConfigError, match=r"^--jobs must be an int >= 1 .*got 0$"):
        run_sweep(load_sweep(path), jobs=0, progress=False)


def test_a_grid_over_10000_points_needs_yes_or_max_tasks(sweep_file, capsys):
    path = sweep_file(MILLION)
    assert main(["sweep", str(path), "--no-progress"]) == 2
    assert capsys.readouterr().err == (
        f"stepsim: error: {path}: the grid has 1,000,000 points, more than 10,000; pass --yes to run it (or set "
        f"max_tasks = 1000000 in the sweep file); --dry-run lists the first tasks\n")
    small_limit = sweep_file(MILLION.replace('out = "results"', 'out = "results"\nmax_tasks = 20000'), "m.toml")
    assert main(["sweep", str(small_limit), "--no-progress"]) == 2
    assert "the grid has 1,000,000 points, more than max_tasks = 20,000; pass --yes" in capsys.readouterr().err
    assert not (path.parent / "results").exists()  # refused before anything was written
    # a max_tasks at least the grid's size lets it run without --yes (checked here on a small grid)
    fits = load_sweep(sweep_file(TWELVE.replace('out = "results"', 'out = "results"\nmax_tasks = 12'), "f.toml"))
    assert fits.max_tasks == 12 and run_sweep(fits, jobs=1, progress=False).ran == 12
    too_small = load_sweep(sweep_file(TWELVE.replace('out = "results"', 'max_tasks = 11'), "s.toml"))
    with pytest.raises(ConfigError, match="the grid has 12 points, more than max_tasks = 11"):
        run_sweep(too_small, out=path.parent / "other", progress=False)
    with pytest.raises(ConfigError, match=r"max_tasks must be an int >= 1, got 0"):
        load_sweep(sweep_file(TWELVE.replace('out = "results"', "max_tasks = 0"), "z.toml"))


def test_dry_run_prints_the_count_and_the_first_tasks_of_a_million_point_grid_lazily(sweep_file, capsys):
    path = sweep_file(MILLION)
    spec = load_sweep(path)
    assert spec.points == 1_000_000
    assert main(["sweep", str(path), "--dry-run"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"sweep {path} -> {path.parent / 'results'}"
    assert out[1] == "  tasks      1,000,000 grid point(s) in 1 grid(s); mode metrics; more than 10,000: needs --yes"
    assert out[2] == "  first 10 task(s):"
    first = list(itertools.islice(iter_tasks(spec), 10))
    assert out[3:] == [f"  {t.index:>6}  {t.key}  compute_bw=1 channel_depth={t.index + 1}" for t in first]
    assert not (path.parent / "results").exists()
    # lazy: the iterator hands out tasks as they are asked for
    tasks = iter_tasks(spec)
    assert next(tasks).config["channel_depth"] == 1 and next(tasks).config["channel_depth"] == 2


def test_batched_part_files_hold_many_rows_and_resume_exactly(sweep_file, tmp_path, monkeypatch):
    assert [batch_rows_for(n) for n in (1, 12, 256, 257, 10_000, 1_000_000, 100_000_000)] == \
        [1, 1, 1, 2, 40, 3907, 20_000]
    spec = load_sweep(sweep_file(TWELVE))
    reference = run_sweep(spec, out=tmp_path / "one-per-task", jobs=1, progress=False)
    assert len(files_under(tmp_path / "one-per-task", "**/part-*.parquet")) == 12 == reference.ran

    monkeypatch.setattr(sweep_runner, "batch_rows_for", lambda n: 5)
    tasks = expand(spec)
    first = run_sweep(spec, jobs=1, progress=False)
    parts = files_under(spec.out, "**/part-*.parquet")
    assert len(parts) == 3 and len(first.files_written) == 3  # 5 + 5 + 2 rows
    assert sorted(read_sweep(spec.out)["tile_n"].to_pylist()) == sorted(t.config["tile_n"] for t in tasks)

    def comparable(out):
        t = read_sweep(out)
        return sorted(t.drop_columns([c for c in WALL_TIME_COLUMNS if c in t.column_names]).to_pylist(),
                      key=lambda r: r["run_id"])

    assert comparable(spec.out) == comparable(tmp_path / "one-per-task")
    rows = {(r["tile_m"], r["tile_n"]): r["off_chip_bytes"] for r in read_sweep(spec.out).to_pylist()}
    assert {p: rows[p] for p in SWIGLU_OFF_CHIP} == SWIGLU_OFF_CHIP

    # a lost part file: exactly its rows run again
    lost = sorted(spec.out.glob("**/part-*.parquet"))[0]
    lost_ids = set(pq.read_table(lost, columns=["run_id"])["run_id"].to_pylist())
    lost.unlink()
    again = run_sweep(spec, jobs=1, progress=False)
    assert {t.run_id for t in tasks if t.key in again.outcomes} == lost_ids
    assert len(again.skipped) == 12 - len(lost_ids)
    assert comparable(spec.out) == comparable(tmp_path / "one-per-task")
    # --retry-failed with nothing failed, and a third run: nothing to do
    assert run_sweep(spec, jobs=1, progress=False, retry_failed=True).ran == 0


def test_a_lazily_expanded_grid_runs_and_counts_its_tasks(sweep_file, monkeypatch):
    monkeypatch.setattr(sweep_runner, "EAGER_TASKS", 2)  # expand this 12-point grid lazily
    spec = load_sweep(sweep_file(TWELVE))
    report = run_sweep(spec, jobs=1, progress=False)
    assert (report.total, report.ran, report.not_run, len(report.head)) == (12, 12, 0, 12)
    again = run_sweep(spec, jobs=1, progress=False)
    assert (again.total, again.ran, len(again.skipped)) == (12, 0, 12)


def test_retrying_a_failed_task_rewrites_its_batch_without_the_old_row(sweep_file, monkeypatch):
    monkeypatch.setattr(sweep_runner, "batch_rows_for", lambda n: 3)
    # tile_n = 24 does not divide 512: that task fails; its row shares a part file with two others
    spec = load_sweep(sweep_file('workload = "swiglu"\nout = "r"\n[axes]\ntile_n = [16, 24, 32, 64, 128, 256]\n'))
    tasks = expand(spec)
    first = run_sweep(spec, jobs=1, progress=False)
    assert [t.index for t in first.failed] == [1] and len(files_under(spec.out, "**/part-*.parquet")) == 2
    retried = run_sweep(spec, jobs=1, progress=False, retry_failed=True)
    assert list(retried.outcomes) == [tasks[1].key] and len(retried.skipped) == 5
    rows = read_sweep(spec.out).to_pylist()
    assert sorted(r["tile_n"] for r in rows) == [16, 24, 32, 64, 128, 256]  # the failed row once, not twice
    assert [r["status"] for r in rows if r["tile_n"] == 24] == ["failed"]
    # the first file lost the old failed row, the new one holds the retried row alone
    assert sorted(pq.read_table(p).num_rows for p in spec.out.glob("**/part-*.parquet")) == [1, 2, 3]


def test_an_output_folder_that_cannot_be_written_is_refused_before_anything_runs(sweep_file, tmp_path, capsys):
    path = sweep_file(TWELVE)
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    for out in (blocker, blocker / "sub"):
        assert main(["sweep", str(path), "--out", str(out), "--no-progress"]) == 2
        assert capsys.readouterr().err == (
            f"stepsim: error: cannot write the sweep's output folder {out} (--out / the sweep file's out): a file "
            f"is in the way (the output is a folder)\n")
    assert blocker.read_text() == "not a folder"
