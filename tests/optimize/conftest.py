"""Fixtures of the optimize tests: an in-process executor (no worker start-up) and the exhaustive front."""

from __future__ import annotations

import pytest
from serial_executor import SerialExecutor  # one CLI test starts worker processes; the rest run in process


@pytest.fixture
def serial():
    return SerialExecutor()


def exhaustive(result) -> tuple[list, dict]:
    """Simulate every buildable candidate of ``result`` (run_config, no pruning): the exhaustive front as
    ``[(run_id, cycles, on_chip_bytes, allocated, chips)]`` sorted, and ``{run_id: cycles or None}`` (None: failed)."""
    from stepsim.base.errors import StepsimError
    from stepsim.optimize.pareto import pareto_front
    from stepsim.results.records import run_config

    cycles = {}
    for c in result.candidate_list:
        if c.status == "invalid":
            continue
        try:
            cycles[c.run_id] = run_config({**c.config, "mode": "simulate"}).row["cycles"]
        except StepsimError:
            cycles[c.run_id] = None
    ok = [c for c in result.candidate_list if cycles.get(c.run_id) is not None]
    points = [(cycles[c.run_id], c.on_chip_bytes, c.allocated_flops_per_cycle, c.chips) for c in ok]
    front = sorted((ok[i].run_id, *points[i]) for i in pareto_front(points))
    return front, cycles


@pytest.fixture
def exhaustive_front():
    return exhaustive
