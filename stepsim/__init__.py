"""stepsim: fast simulation of Streaming Tensor Programs (STeP) on spatial dataflow accelerators.

Importing stepsim never compiles kernels; compilation happens on first simulation (cached on disk) or with
``stepsim cache warm``.
"""

from stepsim._version import __version__
from stepsim.errors import StepsimError

__all__ = ["__version__", "StepsimError"]
