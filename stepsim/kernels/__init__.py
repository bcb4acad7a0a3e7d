"""The compiled engine: plain int64 arrays in, cycle counts and counters out.

``run(program, ...)`` executes a :class:`stepsim.kernels.program.Program`. Importing this package never compiles
anything (the numba kernels are imported lazily on the first call to :func:`run`).
"""

from __future__ import annotations


def run(program, **kwargs):
    """Run a program on the numba engine; see :func:`stepsim.kernels.api.run`."""
    from stepsim.kernels.api import run as _run

    return _run(program, **kwargs)


__all__ = ["run"]
