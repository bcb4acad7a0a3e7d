"""A local pool's workers take the ``STEPSIM_*`` settings and the working folder of the process that makes the
pool, not those of the fork server they are forked from (started once per process, with the environment and
folder of that moment): a test that had changed ``$STEPSIM_MAPPING_CACHE`` before another's plan made that plan's
workers search schedules in the old folder (stepsim/batch/tasks.py ``caller_context``)."""

from __future__ import annotations

import os

from stepsim.batch.executors import LocalExecutor
from stepsim.batch.grid import Task

SETTING, ONLY_FIRST = "STEPSIM_TEST_POOL_SETTING", "STEPSIM_TEST_POOL_ONLY_FIRST"


def _in_a_worker(function, *calls) -> list:
    """``function(config, force)`` for each ``(config, force)`` of ``calls``, run by a new one-worker pool."""
    with LocalExecutor(1, warm_kernels=False) as pool:
        pool.task_function = function
        tasks = [Task(i, config, f"t{i}", force=force) for i, (config, force) in enumerate(calls)]
        done = dict((task.index, outcome) for task, outcome in pool.imap_unordered(tasks))
    return [done[i] for i in range(len(calls))]


def test_each_pool_takes_its_callers_settings_and_folder(tmp_path, monkeypatch):
    for value in ("first", "second"):  # the first pool may start the fork server: the second cannot
        folder = tmp_path / value
        folder.mkdir()
        monkeypatch.chdir(folder)
        monkeypatch.setenv(SETTING, value)
        if value == "first":
            monkeypatch.setenv(ONLY_FIRST, "1")
        else:
            monkeypatch.delenv(ONLY_FIRST)
        assert _in_a_worker(os.getenv, (SETTING, None), (ONLY_FIRST, None)) == [value, "1" if value == "first"
                                                                                else None]
        assert _in_a_worker(os.path.samefile, (".", str(folder))) == [True]


def test_background_tasks_run_on_workers_of_the_lowest_cpu_priority():
    """``LocalExecutor.background`` (a plan's offered runs between its waves' parts) runs a task on workers of its
    own at nice 19, so it takes only the CPU the pool's tasks leave idle; the pool's own workers keep the caller's
    priority."""
    here = os.getpriority(os.PRIO_PROCESS, 0)
    with LocalExecutor(1, warm_kernels=False) as pool:
        pool.task_function = os.getpriority  # (config, force) = (which, who): this worker's niceness
        task = Task(0, os.PRIO_PROCESS, "t0", force=0)
        assert pool.outcome(pool.background(task), task, 1) == 19
        assert [outcome for _, outcome in pool.imap_unordered([task])] == [here]
