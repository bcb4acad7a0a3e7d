"""Least squares whose every bit is the same on any machine: the fast serving model's fits (stepsim.serve.fast).

``np.linalg.lstsq`` (LAPACK ``gelsd`` over the BLAS NumPy was built with) gives results whose last bits depend on
the BLAS kernel the CPU selects (OpenBLAS's ``DYNAMIC_ARCH``: Haswell, SkylakeX, Zen, ... each its own ``dgemm``)
and on its thread count. The fast model's coefficients decide, after rounding to whole cycles, when each step of a
replay ends, so those bits moved whole steps between machines (issue 44: the README's serve figures differed).

Here every reduction is :func:`math.fsum` (the correctly rounded sum, independent of order) of element-wise
products (each correctly rounded, IEEE 754), and the rest is element-wise ``+ - * / sqrt``: the same bits on every
x86-64 machine, any BLAS, any thread count. The method is a Householder QR with column pivoting, the rank cut where a pivot falls below ``eps * max(rows, columns)`` of the first (as
``lstsq``'s default ``rcond``), and the minimum-norm solution of a rank-deficient system from a second QR of the
kept rows (a complete orthogonal decomposition): the solution ``lstsq`` returns, to rounding. Sizes are small
(hundreds of rows, tens of columns): pure Python is fast enough (milliseconds).
"""

from __future__ import annotations

import math

import numpy as np


def _dot(u: np.ndarray, v: np.ndarray) -> float:
    """``u . v`` correctly rounded (the same on every machine)."""
    return math.fsum((u * v).tolist())


def _householder(a: np.ndarray, pivot: bool) -> tuple[np.ndarray, list, list, list]:
    """QR of ``a`` (m x n, m >= 1) in place by Householder reflections, with column pivoting if ``pivot``:
    returns ``(R in a's upper triangle, reflectors (v, beta), column order, column norms at each pivot)``."""
    m, n = a.shape
    order = list(range(n))
    reflectors, pivots = [], []
    for k in range(min(m, n)):
        if pivot:
            norms = [_dot(a[k:, j], a[k:, j]) for j in range(k, n)]
            j = k + max(range(len(norms)), key=lambda i: (norms[i], -i))  # the largest; ties: the first
            if j != k:
                a[:, [k, j]] = a[:, [j, k]]
                order[k], order[j] = order[j], order[k]
        x = a[k:, k].copy()
        alpha = math.sqrt(_dot(x, x))
        pivots.append(alpha)
        if alpha == 0.0:
            reflectors.append(None)
            continue
        if x[0] > 0:
            alpha = -alpha
        v = x
        v[0] -= alpha
        beta = _dot(v, v)
        for j in range(k, n):
            a[k:, j] -= v * (2.0 * _dot(v, a[k:, j]) / beta)
        reflectors.append((v, beta))
    return a, reflectors, order, pivots


def _apply_reflectors(reflectors: list, y: np.ndarray) -> np.ndarray:
    """``Q^T y`` for the reflectors of :func:`_householder`."""
    y = y.copy()
    for k, reflector in enumerate(reflectors):
        if reflector is not None:
            v, beta = reflector
            y[k:] -= v * (2.0 * _dot(v, y[k:]) / beta)
    return y


def _back_substitute(r: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``x`` with ``r x = b``, ``r`` upper triangular (r x r) with a non-zero diagonal."""
    n = r.shape[0]
    x = np.zeros(n)
    for i in range(n - 1, -1, -1):
        x[i] = (b[i] - _dot(r[i, i + 1:], x[i + 1:])) / r[i, i]
    return x


def numeric_rank(a) -> int:
    """Rank of ``a`` (2-D) by :func:`solve`'s pivoted QR and cut (``np.linalg.matrix_rank``'s role, machine-
    independent)."""
    a = np.array(a, dtype=np.float64)
    if a.size == 0:
        return 0
    _, _, _, pivots = _householder(a, pivot=True)
    return _rank(pivots, a.shape)


def _rank(pivots: list, shape: tuple) -> int:
    if not pivots or pivots[0] == 0.0:
        return 0
    cut = pivots[0] * np.finfo(np.float64).eps * max(shape)
    return next((k for k, p in enumerate(pivots) if p <= cut), len(pivots))


def solve(a, y) -> np.ndarray:
    """The minimum-norm least-squares solution of ``a x = y`` (``a`` m x n, ``y`` of m), as
    ``np.linalg.lstsq(a, y, rcond=None)[0]`` to rounding, bit-identical on every machine."""
    a = np.array(a, dtype=np.float64)
    y = np.array(y, dtype=np.float64)
    m, n = a.shape
    if m == 0 or n == 0:
        return np.zeros(n)
    r, reflectors, order, pivots = _householder(a.copy(), pivot=True)
    rank = _rank(pivots, a.shape)
    z = np.zeros(n)
    if rank:
        qty = _apply_reflectors(reflectors, y)[:rank]
        top = np.triu(r[:rank, :])  # rank x n: [R11 R12]
        if rank == n:
            z = _back_substitute(top, qty)
        else:  # minimum norm: top^T = Q2 [L; 0], so top = [L^T 0] Q2^T and z = Q2 [L^-T qty; 0]
            lower_t, reflectors2, _, _ = _householder(top.T.copy(), pivot=False)
            w = _forward_substitute(np.triu(lower_t[:rank, :rank]).T, qty)
            z = np.concatenate([w, np.zeros(n - rank)])
            for k in range(len(reflectors2) - 1, -1, -1):
                if reflectors2[k] is not None:
                    v, beta = reflectors2[k]
                    z[k:] -= v * (2.0 * _dot(v, z[k:]) / beta)
    x = np.zeros(n)
    x[order] = z
    return x


def _forward_substitute(lower: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``x`` with ``lower x = b``, ``lower`` lower triangular with a non-zero diagonal."""
    n = lower.shape[0]
    x = np.zeros(n)
    for i in range(n):
        x[i] = (b[i] - _dot(lower[i, :i], x[:i])) / lower[i, i]
    return x
