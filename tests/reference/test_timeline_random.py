"""Recording a timeline changes nothing on random programs, and the timeline matches every counter exactly."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from kernel_helpers import check_timeline_against_counters
from ref_random_programs import random_program

from stepsim.base.errors import DeadlockError, SimulationError
from stepsim.kernels import api
from stepsim.simulation.timeline import decode


def _outcome(program, **kw):
    try:
        r = api.run(program, record_events=64, **kw)
    except (DeadlockError, SimulationError) as exc:
        return (type(exc).__name__, str(exc)), None
    return (r.cycles, r.events, r.fires, r.bytes_read, r.bytes_written, r.hbm_requests, r.unit_counters.tolist(),
            r.channel_counters.tolist(), r.events_recorded.tolist()), r


class _Named:
    """The names and counters ``check_timeline_against_counters`` reads, from an EngineResult."""

    def __init__(self, program, result):
        self.unit_names, self.channel_names = program.unit_names, program.channel_names
        self.unit_counters, self.channel_counters = result.unit_counters, result.channel_counters


@settings(max_examples=120, deadline=None)
@given(seed=st.integers(0, 2**31 - 1))
def test_random_programs_same_with_a_timeline_and_it_matches_the_counters(seed):
    program = random_program(seed)
    off, _ = _outcome(program)
    on, result = _outcome(program, timeline=100_000)
    assert on == off
    if result is not None:
        timeline = decode(result.timeline, program)
        check_timeline_against_counters(timeline, _Named(program, result), program.ch_capacity.tolist())
        assert sum(timeline.hbm.column("requests").to_pylist()) == result.hbm_requests
