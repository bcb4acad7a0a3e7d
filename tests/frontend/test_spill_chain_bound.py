"""stepsim.analysis.spill_bounds.spill_chain_cycles: the cycle bound that follows a spill's whole-tensor wait. On
the Llama block the first-output bounds restart behind a spill (spilling ``z`` lowers the pipeline bound from
2,082 to 1,555 cycles while the run gets slower, 2,188 -> 2,996); the spill-chain bound rises with every spill
and stays at or below the engine's cycles. (Whole spaces are checked in test_hierarchy.py.)"""

import sys
from pathlib import Path

from stepsim.analysis.bounds import cycle_bounds
from stepsim.analysis.spill_bounds import spill_chain_cycles
from stepsim.base.hardware import Hardware
from stepsim.frontend import from_onnx
from stepsim.simulation.simulate import simulate

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from onnx_blocks import BLOCKS  # noqa: E402


def test_the_bound_follows_the_spills_and_never_exceeds_the_engine():
    m = BLOCKS["llama"](2, 8, 64, 128)
    rows = []
    for spill in [(), ("z",), ("gate",), ("h", "z", "down")]:
        w = from_onnx(m, spill=spill)
        hw = Hardware.preset(w.hardware)
        rows.append((spill, cycle_bounds(w, hw)["pipeline_cycles"], spill_chain_cycles(w, hw), simulate(w).cycles))
    assert rows == [((), 2082, 2125, 2188), (("z",), 1555, 2724, 2996), (("gate",), 1555, 2845, 2987),
                    (("h", "z", "down"), 1555, 2873, 3242)]
