"""Graph passes. :func:`size_fifos`: per-channel FIFO depths that finish, stay within a slack of unbounded
FIFOs and use few bytes (an LP over start-time offsets, refined by simulation; :mod:`stepsim.passes.sizing`,
:mod:`stepsim.passes.fifo_lp`). SciPy and the engine are imported only when a pass runs.
"""

from stepsim.passes.fifo_lp import LPResult, lp_depths
from stepsim.passes.sizing import SizingResult, size_fifos

__all__ = ["LPResult", "SizingResult", "lp_depths", "size_fifos"]
