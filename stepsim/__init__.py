"""stepsim: fast simulation of Streaming Tensor Programs (STeP) on spatial dataflow accelerators.

Importing stepsim never compiles kernels; compilation happens on first simulation (cached on disk) or with
``stepsim cache warm``.
"""

from stepsim._version import __version__
from stepsim.base.errors import StepsimError

__all__ = ["__version__", "StepsimError", "optimize", "serve"]


def __getattr__(name: str):
    """``stepsim.optimize(...)`` / ``stepsim.serve(...)``: the :mod:`stepsim.optimize` / :mod:`stepsim.serve`
    package, imported on first use (so ``import stepsim`` stays light); each package is callable as its
    function (:func:`stepsim.optimize.optimize`, :func:`stepsim.serve.serve`)."""
    if name in ("optimize", "serve"):
        import importlib

        return importlib.import_module(f"stepsim.{name}")
    raise AttributeError(f"module 'stepsim' has no attribute {name!r}")
