"""Resume: a re-run runs exactly the tasks without a result file, and nothing half-written survives.

Two interruptions are simulated: result files deleted plus temp files left behind by a parent killed while
writing, and a worker process killed (SIGKILL) in the middle of a sweep.
"""

from __future__ import annotations

import multiprocessing
import os
import signal

import pyarrow.parquet as pq
import pytest
from sweep_helpers import SWIGLU_CYCLES, SWIGLU_OFF_CHIP, SWIGLU_SIMULATE, files_under

from stepsim.base.errors import ConfigError
from stepsim.batch import SweepStopped, expand, load_sweep, run_sweep
from stepsim.batch.rows import read_sweep


def cycles_by_point(out) -> dict:
    table = read_sweep(out)
    return {(r["tile_m"], r["tile_n"]): (r["status"], r["cycles"], r["off_chip_bytes"]) for r in table.to_pylist()}


def test_rerun_after_lost_files_and_stale_temp_files_runs_only_the_missing_tasks(sweep_file):
    spec = load_sweep(sweep_file(SWIGLU_SIMULATE))
    tasks = expand(spec)
    first = run_sweep(spec, jobs=2, progress=False)
    out = spec.out
    assert sorted(first.outcomes) == sorted(t.key for t in tasks) and not first.skipped
    assert cycles_by_point(out) == {p: ("ok", SWIGLU_CYCLES[p], SWIGLU_OFF_CHIP[p]) for p in SWIGLU_CYCLES}
    folder = out / "workload=swiglu"
    # a simulation row comes with its unit and channel counter files, named by the same key
    assert files_under(out, "**/*.parquet") == sorted(
        f"workload=swiglu/{kind}-{t.key}.parquet" for t in tasks for kind in ("part", "_units", "_channels"))

    # interrupt: two rows lost (one with its counters), and temp files of writes that never finished
    lost = [tasks[1], tasks[4]]
    for task in lost:
        (folder / f"part-{task.key}.parquet").unlink()
    (folder / f"_units-{lost[1].key}.parquet").unlink()
    stale = [folder / f".part-{lost[0].key}.parquet.k2j4h1.tmp", folder / f"._units-{lost[1].key}.parquet.x9.tmp"]
    for path in stale:
        path.write_bytes(b"PAR1 half a parquet file")
    untouched = {p: p.stat().st_mtime_ns for p in folder.glob("part-*.parquet")}

    second = run_sweep(spec, jobs=2, progress=False)
    assert sorted(second.outcomes) == sorted(t.key for t in lost)
    assert sorted(second.skipped) == sorted(t.key for t in tasks if t not in lost)
    assert sorted(second.removed_temp_files) == sorted(stale)
    assert {p: p.stat().st_mtime_ns for p in untouched} == untouched  # finished rows were not rewritten
    assert files_under(out, "**/*.tmp") == []
    assert len(files_under(out, "**/*.parquet")) == 18
    for path in out.glob("**/*.parquet"):
        pq.read_table(path)  # every file is complete
    assert cycles_by_point(out) == {p: ("ok", SWIGLU_CYCLES[p], SWIGLU_OFF_CHIP[p]) for p in SWIGLU_CYCLES}

    third = run_sweep(spec, jobs=2, progress=False)
    assert third.ran == 0 and len(third.skipped) == 6 and third.executor == ""  # no pool is even started


def test_killed_worker_stops_the_sweep_and_the_rerun_completes_only_what_was_lost(sweep_file):
    text = SWIGLU_SIMULATE.replace("tile_m = [16, 32]", "tile_m = [16, 32, 64]").replace(
        "tile_n = [16, 32, 64]", "tile_n = [16, 32, 64, 128]")
    spec = load_sweep(sweep_file(text))
    tasks = expand(spec)
    assert len(tasks) == 12

    def kill_a_worker(task, outcome):
        if len(killed) == 0:
            # the pool's workers are this process's multiprocessing children (forked by its fork server)
            workers = [p for p in multiprocessing.active_children()
                       if p.name.startswith(("ForkServerProcess", "SpawnProcess"))]
            victim = workers[0]
            os.kill(victim.pid, signal.SIGKILL)
            killed.append(victim.pid)

    killed: list = []
    with pytest.raises(SweepStopped) as info:
        run_sweep(spec, jobs=2, progress=False, on_outcome=kill_a_worker)
    stop = info.value
    assert stop.reason == "worker-lost"
    assert str(stop).startswith("a worker process died while the sweep ran (killed, out of memory or crashed)")
    assert str(stop).endswith("Finished tasks are saved: run the same sweep again to resume")
    done = set(stop.report.outcomes)
    # at most one task before the kill plus the 2 * jobs that were in flight can have finished
    assert 1 <= len(done) <= 5
    on_disk = {p.stem.removeprefix("part-") for p in spec.out.glob("**/part-*.parquet")}
    assert on_disk == done
    assert files_under(spec.out, "**/*.tmp") == []

    rerun = run_sweep(spec, jobs=2, progress=False)
    assert set(rerun.outcomes) == {t.key for t in tasks} - done
    assert set(rerun.skipped) == done
    rows = read_sweep(spec.out).to_pylist()
    assert len(rows) == 12 and {r["status"] for r in rows} == {"ok"}
    cycles = {(r["tile_m"], r["tile_n"]): r["cycles"] for r in rows}
    assert {p: cycles[p] for p in SWIGLU_CYCLES} == SWIGLU_CYCLES


def test_ctrl_c_keeps_the_finished_rows_and_the_rerun_runs_the_rest(sweep_file):
    spec = load_sweep(sweep_file('workload = "swiglu"\nout = "r"\n[axes]\ntile_n = [16, 32, 64, 128]\n'))
    tasks = expand(spec)

    def press_ctrl_c(task, outcome):
        raise KeyboardInterrupt

    with pytest.raises(SweepStopped) as info:
        run_sweep(spec, jobs=1, progress=False, on_outcome=press_ctrl_c)
    assert info.value.reason == "interrupted"
    assert str(info.value) == "interrupted; 1 of 4 task(s) finished and saved; run the same sweep again to resume"
    assert list(info.value.report.outcomes) == [tasks[0].key]
    assert files_under(spec.out, "**/part-*.parquet") == [f"workload=swiglu/part-{tasks[0].key}.parquet"]

    rerun = run_sweep(spec, jobs=1, progress=False)
    assert sorted(rerun.outcomes) == sorted(t.key for t in tasks[1:])


@pytest.mark.parametrize(("signum", "why"), [(2, "interrupted"), (15, "terminated")])
def test_a_stop_swallowed_by_a_destructor_stops_the_sweep_at_the_next_task(sweep_file, signum, why):
    """A Ctrl-C whose KeyboardInterrupt lands in a destructor is swallowed by Python; the sweep's own process runs
    no engine slice that would raise it again, so it ran every task and exited 0 (a Dask sweep in the suite,
    2026-11-27): the runner raises the remembered stop after the task that took it in."""
    import gc
    import signal

    class SignalledWhileCollected:
        def __del__(self):
            signal.getsignal(signum)(signum, None)  # the handler, as the interpreter calls it: raises, swallowed

    def signal_in_a_destructor(task, outcome):
        SignalledWhileCollected()
        gc.collect()

    spec = load_sweep(sweep_file('workload = "swiglu"\nout = "r"\n[axes]\ntile_n = [16, 32, 64, 128]\n'))
    tasks = expand(spec)
    with pytest.raises(SweepStopped) as info:
        run_sweep(spec, jobs=1, progress=False, on_outcome=signal_in_a_destructor)
    assert info.value.reason == why
    assert str(info.value) == f"{why}; 1 of 4 task(s) finished and saved; run the same sweep again to resume"
    assert files_under(spec.out, "**/part-*.parquet") == [f"workload=swiglu/part-{tasks[0].key}.parquet"]


def test_a_folder_written_with_another_partition_by_is_refused(sweep_file):
    path = sweep_file('workload = "swiglu"\nout = "r"\n[axes]\ntile_n = [16]\n')
    spec = load_sweep(path)
    (task,) = expand(spec)
    run_sweep(spec, jobs=1, progress=False)
    moved = load_sweep(sweep_file('workload = "swiglu"\nout = "r"\npartition_by = ["tile_n"]\n[axes]\ntile_n = [16]\n'))
    with pytest.raises(ConfigError) as info:
        run_sweep(moved, jobs=1, progress=False)
    assert str(info.value) == (
        f"{spec.out}: task 0 has its result at workload=swiglu/part-{task.key}.parquet, not "
        f"tile_n=16/part-{task.key}.parquet: the folder was written with another partition_by; keep the same "
        f"partition_by for a folder, or write to another one")


def test_two_sweeps_cannot_write_into_one_folder_at_once(sweep_file):
    fcntl = pytest.importorskip("fcntl")
    spec = load_sweep(sweep_file('workload = "swiglu"\nout = "r"\n'))
    spec.out.mkdir()
    with open(spec.out / ".stepsim-sweep.lock", "a+") as lock:  # what a running sweep holds
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        with pytest.raises(ConfigError) as info:
            run_sweep(spec, jobs=1, progress=False)
    assert str(info.value) == (f"another stepsim sweep is writing into {spec.out} (lock "
                               f"{spec.out / '.stepsim-sweep.lock'} is held); wait for it to finish or choose "
                               f"another output folder")
    assert files_under(spec.out, "**/*.parquet") == []
