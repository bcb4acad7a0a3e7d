"""Shared helpers for the engine tests (imported as a plain module: tests/ is not a package)."""

from __future__ import annotations

from stepsim.hardware import Hardware
from stepsim.kernels import abi
from stepsim.program import ProgramBuilder


def builder(preset: str = "step-eval", **overrides) -> ProgramBuilder:
    """A ProgramBuilder on a preset (STEP_TIMING §9 common setup: step-eval, depth 2, PMU 64 B/cycle)."""
    return ProgramBuilder(Hardware.preset(preset, **overrides))


def final_clock(result, unit: int) -> int:
    """A unit's final clock (cycles) from an EngineResult."""
    return int(result.unit_counters[unit, abi.CNT_CLOCK])

