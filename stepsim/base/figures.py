"""PNG figures: matplotlib (the ``plot`` extra) on its non-interactive backend, saved atomically and reproducibly.

Every figure stepsim draws (reproduce, size-fifos, report, optimize, demo) goes through :func:`require_matplotlib`
(a clear one-line error when matplotlib is missing) and :func:`save_figure` (same figure, same bytes).
:func:`si_axis` writes an axis' ticks with the decimal prefixes of the text views (:mod:`stepsim.base.display`:
``2 MB``, ``200k`` cycles), on linear and log axes alike, so a figure and the CLI read the same.
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


def si_axis(axis, unit: str = "", *, max_labels: int | None = None, min_gap: float | None = None) -> None:
    """Ticks of ``axis`` (``ax.xaxis`` / ``ax.yaxis``) with decimal prefixes and ``unit``: ``500 kB``, ``2 MB``;
    without a unit ``20k``, ``1.5M``. On a log axis the labelled ticks are the densest of 1-9x / 1,2,3,5x /
    1,2,5x / 1,3x / 1x each decade that keeps at most 6 labels on an x axis (8 on a y axis): no overlapping ``3x10^4``
    minor labels, and a narrow axis still gets several. ``max_labels`` sets another limit and ``min_gap`` the
    least distance between two labels as a fraction of the axis (default ``1 / (2 max_labels)``): a narrow
    panel needs a wider share per label."""
    require_matplotlib()
    from matplotlib.ticker import EngFormatter, NullFormatter

    formatter = EngFormatter(unit=unit, sep=" " if unit else "")
    axis.set_major_formatter(formatter)
    if axis.get_scale() == "log":
        axis.set_major_locator(_DecadeLocator(max_labels or (6 if axis.axis_name == "x" else 8), min_gap))
        axis.set_minor_formatter(NullFormatter())


#: log-axis tick multiples tried, densest first: the densest that puts at most the axis' limit in view wins
_SUBS = (tuple(float(k) for k in range(1, 10)), (1.0, 2.0, 3.0, 5.0), (1.0, 2.0, 5.0), (1.0, 3.0), (1.0,))


def _decade_locator_class():
    from matplotlib.ticker import LogLocator

    class DecadeLocator(LogLocator):
        """Log ticks at the densest of :data:`_SUBS` that keeps at most ``max_ticks`` in view, none of them
        closer than ``min_gap`` of the axis (default ``1 / (2 max_ticks)``: labels need room), else at every
        decade (every few decades on a very wide axis)."""

        def __init__(self, max_ticks: int, min_gap: float | None = None):
            super().__init__(base=10, subs=(1.0,))
            self.max_ticks = max_ticks
            self.min_gap = min_gap or 1 / (2 * max_ticks)

        def tick_values(self, vmin, vmax):
            import math

            import numpy as np

            lo, hi = sorted((vmin, vmax))
            if lo > 0:
                decades = range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1)
                span = math.log10(hi / lo)
                for subs in _SUBS:
                    ticks = np.array([k * 10.0 ** d for d in decades for k in subs])
                    shown = np.log10(ticks[(ticks >= lo * 0.9999) & (ticks <= hi * 1.0001)])
                    # few enough, and no two closer than the axis' share of one label (70 MB / 80 MB crowd)
                    if len(shown) < 2:  # a narrow axis: at most one multiple of this density in view
                        break
                    if len(shown) <= self.max_ticks and np.diff(shown).min() >= span * self.min_gap:
                        self.set_params(subs=subs)
                        return super().tick_values(vmin, vmax)
                else:
                    self.set_params(subs=(1.0,))
                    return super().tick_values(vmin, vmax)
                # within one step of the densest multiples (201.34-201.50 MB): matplotlib's own fallback (the
                # linear AutoLocator) labels every 0.02 MB and the labels overlap; a few round values instead
                from matplotlib.ticker import MaxNLocator

                return MaxNLocator(nbins=max(2, self.max_ticks // 2)).tick_values(lo, hi)
            self.set_params(subs=(1.0,))
            return super().tick_values(vmin, vmax)

    return DecadeLocator


def _DecadeLocator(max_ticks: int, min_gap: float | None = None):  # noqa: N802 - builds the matplotlib subclass on
    return _decade_locator_class()(max_ticks, min_gap)  # first use (matplotlib is optional)


def save_figure(fig, path: Path, *, rect: tuple[float, float, float, float] | None = None) -> Path:
    """Lay out ``fig`` (``tight_layout`` inside ``rect``, the figure fraction left for the axes: room for a
    caption), write it to ``path`` as PNG atomically, close it; returns ``path``."""
    plt = require_matplotlib()
    fig.tight_layout(rect=rect)
    with atomic_output(path) as tmp:
        # no timestamp metadata, so the same table gives the same bytes
        fig.savefig(tmp, format="png", metadata={"Software": None})
    plt.close(fig)
    return Path(path)
