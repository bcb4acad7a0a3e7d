"""numba's CPU target set-up, without its BLAS probe, in processes that stepsim owns.

The first kernel a process loads makes numba import its CPU target's registries. One of them,
``numba.np.arraymath``, probes for BLAS by importing ``scipy.linalg`` (0.15-0.4 s, 40 % of loading the cached
kernels; SciPy is installed for the FIFO-sizing LP). The engine's kernels call no BLAS routine (no ``np.dot``,
``np.linalg``, ``np.correlate`` or ``np.convolve``), so a stepsim command and the worker pool's fork server set
the target up with ``scipy.linalg`` hidden. numba then records that BLAS is missing, which changes only
``np.correlate`` and ``np.convolve`` in jitted code (a plain inner product instead of BLAS's): code those
processes never run. A program that merely imports stepsim keeps numba's own behaviour, since its own jitted
code may use them.
"""

from __future__ import annotations

import sys

_skip_blas_probe = False


def skip_blas_probe() -> None:
    """Declare this process stepsim's own (a command, a pool worker): its kernel set-up skips the BLAS probe."""
    global _skip_blas_probe
    _skip_blas_probe = True


def prepare() -> None:
    """Set numba's CPU target up before the first kernel loads; with :func:`skip_blas_probe` declared and
    ``scipy.linalg`` not yet imported, without importing it. Idempotent (numba refreshes once)."""
    from numba.core.registry import cpu_target

    hide = _skip_blas_probe and "scipy.linalg" not in sys.modules
    if hide:
        sys.modules["scipy.linalg"] = None  # importing it, or any of its modules, raises ImportError
    try:
        cpu_target.target_context.refresh()
    except ImportError:
        if not hide:
            raise
        del sys.modules["scipy.linalg"]  # a numba that needs scipy.linalg beyond the probe: set up as usual
        hide = False
        cpu_target.target_context.refresh()
    finally:
        if hide and sys.modules.get("scipy.linalg", False) is None:
            del sys.modules["scipy.linalg"]
