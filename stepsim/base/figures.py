"""PNG figures: matplotlib (the ``plot`` extra) on its non-interactive backend, saved atomically and reproducibly.

Every figure stepsim draws (reproduce, size-fifos, report, optimize, demo) goes through :func:`require_matplotlib`
(a clear one-line error when matplotlib is missing) and :func:`save_figure` (same figure, same bytes).
"""

from __future__ import annotations

from pathlib import Path

from stepsim.base.errors import ConfigError
from stepsim.base.files import atomic_output

MISSING_MATPLOTLIB = "matplotlib is missing; install it with: pip install 'stepsim[plot]'"


def require_matplotlib():
    """``matplotlib.pyplot`` with the non-interactive Agg backend.

    Raises
    ------
    ConfigError
        matplotlib is not installed (the message says how to install it).
    """
    try:
        import matplotlib
    except ImportError as exc:
        raise ConfigError(MISSING_MATPLOTLIB) from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: Path) -> Path:
    """Lay out ``fig``, write it to ``path`` as PNG atomically, close it; returns ``path``."""
    plt = require_matplotlib()
    fig.tight_layout()
    with atomic_output(path) as tmp:
        # no timestamp metadata, so the same table gives the same bytes
        fig.savefig(tmp, format="png", metadata={"Software": None})
    plt.close(fig)
    return Path(path)
