"""Multi-chip systems: chips, their hardware and the links between them (docs/system.md).

Plain data for the layers above; the engine sees links only as link units (:mod:`stepsim.kernels.abi`
``OP_LINK``) that the lowering creates.
"""

from stepsim.base.system.config import PRESETS, Dimension, System, from_dict, from_toml
from stepsim.base.system.topology import TOPOLOGIES, Link

__all__ = ["PRESETS", "TOPOLOGIES", "Dimension", "Link", "System", "from_dict", "from_toml"]
