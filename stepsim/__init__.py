"""stepsim: fast simulation of Streaming Tensor Programs (STeP) on spatial dataflow accelerators.

Importing stepsim never compiles kernels; compilation happens on first simulation (cached on disk) or with
``stepsim cache warm``.
"""

from stepsim._version import __version__
from stepsim.base.errors import StepsimError

__all__ = ["__version__", "StepsimError", "optimize"]


def __getattr__(name: str):
    """``stepsim.optimize(...)``: the :mod:`stepsim.optimize` package, imported on first use (so ``import
    stepsim`` stays light); the package is callable as :func:`stepsim.optimize.optimize`."""
    if name == "optimize":
        import importlib

        return importlib.import_module("stepsim.optimize")
    raise AttributeError(f"module 'stepsim' has no attribute {name!r}")
