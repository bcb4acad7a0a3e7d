"""Each chip has its own HBM: memory operators on different chips do not contend, on one chip they do
(ProgramBuilder.chip, abi.UP_CHIP); both engines agree, and one chip's programs are unchanged."""

from __future__ import annotations

import numpy as np
import pytest
from kernel_helpers import builder

from stepsim.kernels import abi
from stepsim.kernels.api import run as fast_run
from stepsim.kernels.reference import run as ref_run


def _loads(chips):
    """One 8-tile load and its sink per entry, on the chip the entry names; a 1-channel HBM (2 cycles per request)."""
    b = builder(hbm_channels=1)
    for i, chip in enumerate(chips):
        b.chip = chip
        x = b.add_channel(name=f"x{i}")
        b.offchip_load(out=x, tile_rows=16, tile_cols=64, elem_bytes=2, view_shape=(8,), name=f"load{i}")
        b.sink(inp=x, name=f"sink{i}")
    return b.build()


@pytest.mark.parametrize("chips, cycles", [((0,), 650), ((0, 0), 1072), ((0, 1), 650), ((1, 0, 1), 1072),
                                           ((2, 0, 1), 650)])
def test_loads_on_different_chips_do_not_share_an_hbm(chips, cycles):
    program = _loads(chips)
    fast, ref = fast_run(program), ref_run(program)
    assert fast.cycles == ref.cycles == cycles
    np.testing.assert_array_equal(fast.unit_counters, ref.unit_counters)
    assert fast.hbm_requests == 256 * len(chips)  # 8 tiles x 16 rows x 2 requests of 64 B, per load


def test_each_chip_ranks_its_own_memory_operators():
    program = _loads((1, 0, 1))
    memory = program.unit_params[:, abi.UP_MEM_PRIORITY] >= 0
    assert program.unit_params[memory, abi.UP_CHIP].tolist() == [1, 0, 1]
    assert program.unit_params[memory, abi.UP_MEM_PRIORITY].tolist() == [0, 0, 1]
