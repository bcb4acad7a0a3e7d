"""The numba engine gives the same results however it is cut into slices, and with or without the HBM's
closed form: cycles, every unit and channel counter, bytes, events, firings, recorded steps and the scans of the
time-sensitive units (the event loop keeps its last scan across slices).

Slicing (``kernels.api._call``) stops the event loop after a number of events and calls it again, so Python can
react to Ctrl-C and draw progress; the closed form (``kernels.hbm._try_skip``) serves whole periods of a steady
HBM state at once. Both must be invisible in every result.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ref_random_programs import random_program

from stepsim.base.errors import DeadlockError, SimulationError
from stepsim.base.hardware import Hardware
from stepsim.graph.lower import lower
from stepsim.kernels import api
from stepsim.models.presets import moe_model
from stepsim.workloads.attention.build import build_attention
from stepsim.workloads.moe.build import build_moe


def _outcome(program, **kw):
    try:
        r = api.run(program, record_events=64, **kw)
    except DeadlockError as exc:
        return ("deadlock", str(exc))
    except SimulationError as exc:
        return ("error", str(exc))
    return (r.cycles, r.events, r.fires, r.bytes_read, r.bytes_written, r.hbm_requests, r.time_sensitive_scans,
            r.unit_counters.tolist(), r.channel_counters.tolist(), r.events_recorded.tolist())


@pytest.fixture
def one_event_slices(monkeypatch):
    """Every engine call stops after one event (slices never grow)."""
    monkeypatch.setattr(api, "FIRST_SLICE_EVENTS", 1)
    monkeypatch.setattr(api, "SLICE_SECONDS", 0.0)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**31 - 1))
def test_random_programs_same_in_one_event_slices_and_per_tick_hbm(seed, one_event_slices):
    program = random_program(seed)
    sliced = _outcome(program)
    assert sliced == _outcome(program, hbm_closed_form=False)
    with pytest.MonkeyPatch.context() as m:  # one call for the whole run
        m.setattr(api, "FIRST_SLICE_EVENTS", 1 << 62)
        assert _outcome(program) == sliced


def _program(w):
    return lower(w.graph, Hardware.preset(w.hardware), channel_depth=w.channel_depth)


def _small_moe(tiling, **kw):
    routing = np.random.default_rng(3).integers(0, 8, size=(64, 2))
    routing[:, 1] = (routing[:, 0] + 1 + routing[:, 1] % 7) % 8  # two distinct experts per token
    return build_moe(moe_model("custom", hidden=256, intermediate=512, experts=8, top_k=2), routing, tiling=tiling,
                     **kw)


@pytest.mark.parametrize("make", [
    lambda: _small_moe("static", tile_n=16),
    lambda: _small_moe("dynamic"),
    lambda: _small_moe("static", tile_n=32, regions=2, tile_f=64),
    lambda: build_attention(np.array([100, 900, 3000, 40, 64, 1200, 7, 2500, 333, 4000, 50, 61, 800, 90, 1, 2048]),
                            "dynamic"),
], ids=["moe-static16", "moe-dynamic", "moe-timeshared", "attention-dynamic"])
def test_workloads_same_sliced_and_per_tick(make, one_event_slices):
    w = make()
    program = _program(w)
    sliced = _outcome(program)
    assert sliced == _outcome(program, hbm_closed_form=False)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(api, "FIRST_SLICE_EVENTS", 1 << 62)
        assert _outcome(program) == sliced


def test_progress_reports_between_slices(monkeypatch):
    monkeypatch.setattr(api, "FIRST_SLICE_EVENTS", 100)
    monkeypatch.setattr(api, "SLICE_SECONDS", 0.0)
    w = _small_moe("static", tile_n=16)
    reports = []
    result = api.run(_program(w),
                     progress=lambda events, cycle: reports.append((events, cycle)))
    # a slice ends at its first unit step at or after 100 more events (an HBM batch may overshoot by one)
    events = [0] + [e for e, _ in reports]
    assert all(100 <= b - a <= 101 for a, b in zip(events, events[1:]))
    assert len(reports) > 10 and 0 < result.events - events[-1] <= 101  # the last slice ends the run, unreported
    assert all(c1 <= c2 for (_, c1), (_, c2) in zip(reports, reports[1:]))
    assert reports[-1][1] <= result.cycles


def test_keyboard_interrupt_between_slices_stops_the_run(monkeypatch):
    """A signal handler's exception surfaces between two slices (here raised by the progress callback)."""
    monkeypatch.setattr(api, "FIRST_SLICE_EVENTS", 10)
    w = _small_moe("dynamic")

    def interrupt(events, cycle):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        api.run(_program(w), progress=interrupt)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**31 - 1))
def test_multichip_programs_same_in_one_event_slices_tiny_work_budgets_and_per_tick_hbm(seed, one_event_slices):
    """Links and one HBM per chip: the slice's HBM work budget is shared by the chips' HBMs."""
    program = random_program(seed, links=True)
    sliced = _outcome(program)
    assert sliced == _outcome(program, hbm_closed_form=False)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(api, "FIRST_SLICE_WORK", 1)
        assert _outcome(program) == sliced
        m.setattr(api, "FIRST_SLICE_EVENTS", 1 << 62)
        m.setattr(api, "FIRST_SLICE_WORK", 1 << 62)
        assert _outcome(program) == sliced


def test_expert_parallel_moe_same_sliced_and_per_tick(one_event_slices):
    w = _small_moe("static", tile_n=16, ep=4, placement="load-balanced")
    program = _program(w)
    assert len(set(program.unit_params[program.unit_params[:, 5] >= 0, -1].tolist())) == 4  # four chips' HBMs
    sliced = _outcome(program)
    assert sliced == _outcome(program, hbm_closed_form=False)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(api, "FIRST_SLICE_EVENTS", 1 << 62)
        assert _outcome(program) == sliced


def test_tensor_x_expert_parallel_moe_same_sliced_and_per_tick(one_event_slices):
    """--tp 2 --ep 2: four chips' HBMs, the all-to-alls and the groups' all-reduces on one set of links."""
    w = _small_moe("static", tile_n=16, tp=2, ep=2, placement="round-robin")
    program = _program(w)
    assert len(set(program.unit_params[program.unit_params[:, 5] >= 0, -1].tolist())) == 4  # four chips' HBMs
    sliced = _outcome(program)
    assert sliced == _outcome(program, hbm_closed_form=False)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(api, "FIRST_SLICE_EVENTS", 1 << 62)
        assert _outcome(program) == sliced


def test_slices_are_capped_and_shrink_when_events_get_dear(monkeypatch):
    """However cheap the first events, a slice holds at most MAX_SLICE_EVENTS events (an event's cost can jump
    within a run, and a slice doubled on cheap events kept Ctrl-C waiting 10 s); a slice slower than twice
    SLICE_SECONDS makes the next one as many events as fit in SLICE_SECONDS at its rate. Counts are unchanged."""
    w = _small_moe("static", tile_n=16)
    whole = _outcome(_program(w))
    monkeypatch.setattr(api, "FIRST_SLICE_EVENTS", 16)
    monkeypatch.setattr(api, "MAX_SLICE_EVENTS", 64)
    reports = []
    capped = api.run(_program(w), record_events=64, progress=lambda events, cycle: reports.append(events))
    sizes = np.diff([0] + reports)
    assert len(reports) > 10 and sizes.max() <= 64 + 1 and sizes[0] >= 16  # +1: an HBM batch may overshoot by one
    assert (capped.cycles, capped.events, capped.fires) == whole[:3]
    # every slice "takes" 0.5 s (the clock the slicer reads moves half a second per reading): the next one shrinks
    # to SLICE_SECONDS' worth at that rate, 64 * 0.1 / 0.5 = 12 events, then 2.4 -> 2, then 0.4 -> 1 (at least one)
    clock = iter(range(10**9))
    monkeypatch.setattr(api.time, "perf_counter", lambda: float(next(clock)) / 2)
    reports.clear()
    monkeypatch.setattr(api, "FIRST_SLICE_EVENTS", 64)
    slow = api.run(_program(w), record_events=64, progress=lambda events, cycle: reports.append(events))
    sizes = np.diff([0] + reports)
    assert list(sizes[:4]) in ([64, 12, 2, 1], [65, 12, 2, 1]) and sizes[3:].max() <= 2
    assert (slow.cycles, slow.events, slow.fires) == whole[:3]
