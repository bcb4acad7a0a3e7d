"""An in-process executor for tests: run_sweep's executor interface (imap_unordered, describe) without starting
worker processes, so search and index logic is tested alone (the optimize and sweep tests)."""

from __future__ import annotations


class SerialExecutor:
    """Runs each task in this process, in order."""

    def imap_unordered(self, tasks):
        from stepsim.batch.tasks import run_task

        for task in tasks:
            yield task, run_task(task.config, task.force)

    def describe(self) -> str:
        return "serial (tests)"
