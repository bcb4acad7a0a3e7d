"""Machine code for the least experts a routing window can touch (``stepsim plan``'s step floor,
:mod:`stepsim.plan.pricing`).

The fast path takes every step's tokens from windows of consecutive rows of a routing pool (a synthetic routing's
drawn pool, a dump's rows: :mod:`stepsim.serve.routing`), wrapping around its end. :func:`least_distinct` gives, for
every window length, the fewest distinct experts any such window holds: O(rows x longest x top_k), a count array
cleared after each start.
"""

from __future__ import annotations

from stepsim.kernels.jit import kernel


@kernel
def least_distinct(rows, longest, counts, out):
    """``out[t]`` (``t`` = 0 .. ``longest``, at most ``len(rows)``): the fewest distinct values among the ``t``
    consecutive rows of ``rows`` (int64 ``[n, k]``, values >= 0) from any start, wrapping around the end;
    ``counts``: int64 zeros, one per value (left zero)."""
    n, k = rows.shape
    out[0] = 0
    for t in range(1, longest + 1):
        out[t] = n * k + 1
    for start in range(n):
        distinct = 0
        for t in range(1, longest + 1):
            row = (start + t - 1) % n
            for j in range(k):
                e = rows[row, j]
                if counts[e] == 0:
                    distinct += 1
                counts[e] += 1
            if distinct < out[t]:
                out[t] = distinct
        for t in range(longest):
            row = (start + t) % n
            for j in range(k):
                counts[rows[row, j]] = 0
