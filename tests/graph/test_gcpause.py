"""gc_paused: the collector is off inside the call and restored after it, also when the call raises."""

from __future__ import annotations

import gc

import pytest

from stepsim.graph.gcpause import gc_paused


@gc_paused
def _state(fail: bool = False):
    if fail:
        raise ValueError("boom")
    return gc.isenabled()


def test_paused_inside_and_restored_after():
    assert gc.isenabled()
    assert _state() is False
    assert gc.isenabled()
    with pytest.raises(ValueError, match="^boom$"):
        _state(fail=True)
    assert gc.isenabled()


def test_nested_and_already_disabled_calls_leave_the_outer_state():
    gc.disable()
    try:
        assert _state() is False
        assert not gc.isenabled()
    finally:
        gc.enable()
    assert gc_paused(lambda: gc_paused(gc.isenabled)() or gc.isenabled())() is False
    assert gc.isenabled()
