"""The two statistics the headline numbers need: geometric mean and Pearson correlation."""

from __future__ import annotations

import math
from collections.abc import Sequence

from stepsim.base.errors import MetricError


def geomean(values: Sequence[float]) -> float:
    """Geometric mean ``exp(mean(log v))`` of positive ratios (a single value is returned as is).

    Raises
    ------
    MetricError
        ``values`` is empty or holds a value <= 0.
    """
    values = [float(v) for v in values]
    if not values:
        raise MetricError("geometric mean of no values")
    if min(values) <= 0:
        raise MetricError(f"geometric mean needs positive values, got {min(values)}")
    if len(values) == 1:  # exp(log(v)) can be 1 ulp off; one window's ratio should read back exactly
        return values[0]
    return math.exp(math.fsum(math.log(v) for v in values) / len(values))


def pearson(x: Sequence[float], y: Sequence[float]) -> float:
    """Pearson correlation coefficient of two equally long samples.

    ``sum((x - mean x)(y - mean y)) / sqrt(sum((x - mean x)^2) * sum((y - mean y)^2))``, with ``math.fsum``
    so the result does not depend on summation order.

    Raises
    ------
    MetricError
        Fewer than 2 points, different lengths, or a constant sample (the coefficient is undefined).
    """
    x = [float(v) for v in x]
    y = [float(v) for v in y]
    if len(x) != len(y) or len(x) < 2:
        raise MetricError(f"Pearson correlation needs two samples of equal length >= 2, got {len(x)} and {len(y)}")
    mx, my = math.fsum(x) / len(x), math.fsum(y) / len(y)
    sxy = math.fsum((a - mx) * (b - my) for a, b in zip(x, y))
    sxx = math.fsum((a - mx) ** 2 for a in x)
    syy = math.fsum((b - my) ** 2 for b in y)
    if sxx == 0 or syy == 0:
        raise MetricError("Pearson correlation of a constant sample is undefined")
    return sxy / math.sqrt(sxx * syy)
