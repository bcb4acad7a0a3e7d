"""``stepsim sweep`` stopped by SIGINT, SIGTERM and kill -9 in a real process: exit status and message, no
partial or temp file left, and the resumed sweep equals an uninterrupted one cell for cell."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from sweep_helpers import files_under

from stepsim.batch import expand, load_sweep, run_sweep
from stepsim.batch.rows import WALL_TIME_COLUMNS, read_sweep

# 24 SwiGLU simulations with small tiles (0.01-0.2 s of engine time each): long enough to be stopped mid-way
SLOW_SWEEP = """
workload = "swiglu"
mode = "simulate"
out = "results"
[axes]
tile_m = [1, 2, 4]
tile_n = [1, 2, 4, 8, 16, 32, 64, 128]
"""
#: runs ``stepsim`` with part files of 4 rows (a grid this small would get one row per file)
BATCHED_MAIN = ("import sys; import stepsim.batch.runner as r; r.batch_rows_for = lambda n: 4; "
                "from stepsim.cli import main; raise SystemExit(main(sys.argv[1:]))")


def start(args: list, *, batched: bool = False) -> subprocess.Popen:
    code = BATCHED_MAIN if batched else "import sys; from stepsim.cli import main; raise SystemExit(main(sys.argv[1:]))"
    return subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def wait_for_rows(out: Path, proc: subprocess.Popen, timeout_s: float = 120.0) -> None:
    """Return once a part file exists under ``out`` (the sweep is past its start-up)."""
    deadline = time.monotonic() + timeout_s
    while not list(out.glob("**/part-*.parquet")):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "no row written in time"
        time.sleep(0.01)


def comparable(out: Path) -> list:
    table = read_sweep(out)
    rows = table.drop_columns([c for c in WALL_TIME_COLUMNS if c in table.column_names]).to_pylist()
    return sorted(rows, key=lambda r: r["run_id"])


def leftovers(out: Path) -> list:
    """Temp files, and counter files without their part file."""
    odd = files_under(out, "**/*.tmp")
    for counters in out.glob("**/_*-*.parquet"):
        part = counters.with_name("part-" + counters.name.split("-", 1)[1])
        if not part.exists():
            odd.append(counters.name)
    return odd


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The sweep run to the end without a stop: its rows (the reference of every resumed run)."""
    folder = tmp_path_factory.mktemp("reference")
    (folder / "sweep.toml").write_text(SLOW_SWEEP)
    spec = load_sweep(folder / "sweep.toml")
    report = run_sweep(spec, jobs=1, progress=False)
    assert report.ran == 24 and not report.failed
    return comparable(spec.out)


@pytest.mark.parametrize("signum, status, line", [(signal.SIGINT, 130, "stepsim: interrupted"),
                                                  (signal.SIGTERM, 143, "stepsim: terminated")])
def test_a_signal_stops_the_sweep_cleanly_and_the_rerun_completes_it(sweep_file, uninterrupted, signum, status,
                                                                     line):
    path = sweep_file(SLOW_SWEEP)
    out = path.parent / "results"
    proc = start(["sweep", str(path), "--jobs", "1", "--no-progress"])
    wait_for_rows(out, proc)
    proc.send_signal(signum)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == status, stderr
    assert stderr == line + "\n"  # one line, no traceback
    assert "  stopped    " in stdout and "run the same sweep again to resume" in stdout
    assert leftovers(out) == []
    done = read_sweep(out).num_rows
    assert 1 <= done < 24  # stopped mid-way, every finished row saved
    for part in out.glob("**/*.parquet"):
        pq.read_table(part)  # complete files only

    rerun = run_sweep(load_sweep(path), jobs=1, progress=False)
    assert rerun.ran == 24 - done and len(rerun.skipped) == done
    assert comparable(out) == uninterrupted
    assert leftovers(out) == []


def test_kill_9_loses_only_unwritten_batches_and_the_resumed_sweep_equals_an_uninterrupted_one(sweep_file,
                                                                                              uninterrupted):
    path = sweep_file(SLOW_SWEEP)
    out = path.parent / "results"
    proc = start(["sweep", str(path), "--jobs", "1", "--no-progress"], batched=True)
    wait_for_rows(out, proc)
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    rows = read_sweep(out).num_rows
    assert rows % 4 == 0 and 4 <= rows < 24  # whole batches of 4 rows, nothing of the batch being filled

    resumed = start(["sweep", str(path), "--jobs", "1", "--no-progress"], batched=True)
    stdout, stderr = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, stderr
    assert f"  tasks      24: {24 - rows} run, {rows} skipped" in stdout
    assert comparable(out) == uninterrupted
    assert leftovers(out) == []
    # 24 rows in batches of 4: 6 part files, each with its counter files
    assert len(files_under(out, "**/part-*.parquet")) == 6
    assert len(files_under(out, "**/_units-*.parquet")) == len(files_under(out, "**/_channels-*.parquet")) == 6
    tasks = expand(load_sweep(path))
    units = pq.read_table(next(out.glob("**/_units-*.parquet")))
    assert set(units["run_id"].to_pylist()) <= {t.run_id for t in tasks}
