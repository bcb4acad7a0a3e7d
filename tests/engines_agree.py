"""Both engines on one program: the check every multi-chip test makes (identical cycles, unit and channel
counters and bytes per link), and the bytes each link unit carried, by name."""

from __future__ import annotations

import numpy as np

from stepsim.kernels.api import run as fast_run
from stepsim.kernels.reference import run as ref_run


def both_engines(program, max_steps: int = 5_000_000):
    """Run the reference engine and the numba engine on ``program`` and assert they agree on the cycles, every
    unit's and channel's counters and every link's bytes; return the numba engine's result."""
    ref, fast = ref_run(program, max_steps=max_steps), fast_run(program)
    assert ref.cycles == fast.cycles
    np.testing.assert_array_equal(ref.unit_counters, fast.unit_counters)
    np.testing.assert_array_equal(ref.channel_counters, fast.channel_counters)
    np.testing.assert_array_equal(ref.link_bytes, fast.link_bytes)
    return fast


def link_unit_bytes(program, result) -> dict[str, int]:
    """Bytes each Link unit of ``program`` carried in ``result``, by unit name (``chip0->chip1``)."""
    return {program.unit_names[u]: int(b) for u, b in enumerate(result.link_bytes)
            if program.opcode_name(u) == "Link"}
