"""NumPy's float sums in machine code, bit for bit: the dot products of the compiled replay's fast pricing
(:mod:`stepsim.kernels.serve_replay`, :mod:`stepsim.kernels.serve_mapped`)."""

from __future__ import annotations

from stepsim.kernels.jit import kernel

#: integers up to here are exact in a float64 (beyond it the compiled replay stops with UNSUPPORTED)
EXACT = 1 << 53
#: longest dot product :func:`_row_sum` sums as NumPy does in one block
ROW_SUM_LIMIT = 128


@kernel
def _row_sum(a, n):
    """``np.add.reduce`` of ``a[:n]`` (n <= 128, float64), bit for bit: 0.0 plus NumPy's pairwise sum (one block:
    eight accumulators, combined as ((0+1)+(2+3))+((4+5)+(6+7)), then the rest in order; under 8 terms, in
    order from -0.0)."""
    if n < 8:
        res = -0.0
        for i in range(n):
            res += a[i]
        return 0.0 + res
    r0, r1, r2, r3, r4, r5, r6, r7 = a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7]
    i = 8
    stop = n - n % 8
    while i < stop:
        r0 += a[i]
        r1 += a[i + 1]
        r2 += a[i + 2]
        r3 += a[i + 3]
        r4 += a[i + 4]
        r5 += a[i + 5]
        r6 += a[i + 6]
        r7 += a[i + 7]
        i += 8
    res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    while i < n:
        res += a[i]
        i += 1
    return 0.0 + res


@kernel
def _dot(x, coef, n, scratch):
    """``(x[:n] * coef[:n]).sum()`` as NumPy computes it (products first, then :func:`_row_sum`)."""
    for i in range(n):
        scratch[i] = x[i] * coef[i]
    return _row_sum(scratch, n)
