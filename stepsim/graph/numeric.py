"""Exact numeric evaluation of metric expressions, without building new sympy objects.

A workload's metrics are thousands of small sympy expressions (one per operator and metric) in the trace's
symbols. Substituting with ``xreplace`` builds and re-canonicalizes a new expression tree for each, which cost
0.1-0.35 s per Qwen configuration and over a second at 512 experts. :func:`exact_value` walks the tree once with
Python ints and :class:`fractions.Fraction` instead, so the result is exact (no floating point anywhere) and the
same integer ``xreplace`` gives (the tests compare the two on every operator of every paper workload).

Supported: integers and rationals, symbols (looked up in the bindings), sums, products, integer powers, floor,
ceiling, Mod, Max, Min and Piecewise with relational / boolean conditions. Anything else raises
:class:`Unsupported`, and the caller falls back to sympy.
"""

from __future__ import annotations

import functools
import math
import numbers
from fractions import Fraction

from stepsim.graph.dims import sp


class Unsupported(Exception):
    """An expression node this evaluator does not know (the caller falls back to sympy)."""


class Unbound(Exception):
    """A symbol without a value in the bindings."""


def exact_value(expr, bindings: dict) -> int | Fraction:
    """The value of ``expr`` with ``bindings`` (``{symbol: int}``), as an int or an exact Fraction.

    Raises :class:`Unbound` for a symbol without a value, :class:`Unsupported` for an unknown node type.
    """
    if isinstance(expr, int):
        return expr
    return _value(expr, bindings)


class Bindings(dict):
    """:func:`python_bindings`' result: ``{symbol: value}`` and ``memo``, the value of every composite expression
    :func:`exact_value` has evaluated with them (so it must not change once made).

    Why: an operator's metrics repeat its layer's sub-expressions (an expert's tile count ``ceiling(n_e / tile_n)``
    is in the shape of every stream of its FFN, and each of a time-multiplexed region's sums of them in all of the
    region's), and sympy expressions are immutable and hash by structure, so each is walked once an evaluation. An
    expert-parallel schedule search of the mapper (Qwen3-30B-A3B, 8 tokens on ``ring-2``) took 0.68 of its CPU time
    with it (bench/README.md, session 50)."""

    __slots__ = ("memo",)

    def __init__(self, values=()):
        super().__init__(values)
        self.memo: dict = {}


def python_bindings(bindings: dict) -> Bindings:
    """``bindings`` with every number as a Python int or Fraction: sympy Integers and Rationals and numpy integers
    converted exactly, anything else (an int, a Fraction, an expression) as it is; a :class:`Bindings`, whose memo
    :func:`exact_value` fills.

    :func:`exact_value` returns a bound symbol's value unchanged, so a sympy number there makes the rest of the
    evaluation sympy arithmetic, whose result is no Python int: callers then fall back to sympy substitution
    (attention binds its per-region counts to sympy Integers and Rationals)."""
    return Bindings((symbol, _python_number(value)) for symbol, value in bindings.items())


def _python_number(value):
    if isinstance(value, (int, Fraction)):
        return value
    if isinstance(value, sp.Integer):
        return int(value)
    if isinstance(value, sp.Rational):
        return Fraction(int(value.p), int(value.q))
    if isinstance(value, numbers.Integral):  # numpy integers: a Python int cannot overflow
        return int(value)
    return value


def _value(e, b):
    if e.is_Integer:
        return int(e)
    if e.is_Rational:
        return Fraction(int(e.p), int(e.q))
    if e.is_Symbol:
        try:
            return b[e]
        except KeyError:
            raise Unbound(e) from None
    if type(b) is not Bindings:
        return _composite(e, b)
    value = b.memo.get(e, _UNSEEN)
    if value is _UNSEEN:  # an error (Unbound, Unsupported) is raised again on the next visit: not remembered
        value = b.memo[e] = _composite(e, b)
    return value


_UNSEEN = object()


def _composite(e, b):
    """:func:`_value` of a node that is no number or symbol."""
    if e.is_Add:
        return sum((_value(a, b) for a in e.args), 0)
    if e.is_Mul:
        out = 1
        for a in e.args:
            out = out * _value(a, b)
        return out
    if e.is_Pow:
        exponent = e.exp
        if not exponent.is_Integer:
            raise Unsupported(e)
        base = _value(e.base, b)
        n = int(exponent)
        return base ** n if n >= 0 else Fraction(1) / (Fraction(base) ** -n)
    if isinstance(e, sp.floor):
        return math.floor(_value(e.args[0], b))
    if isinstance(e, sp.ceiling):
        return math.ceil(_value(e.args[0], b))
    if isinstance(e, sp.Mod):
        return _value(e.args[0], b) % _value(e.args[1], b)
    if isinstance(e, sp.Max):
        return max(_value(a, b) for a in e.args)
    if isinstance(e, sp.Min):
        return min(_value(a, b) for a in e.args)
    if isinstance(e, sp.Piecewise):
        for value, condition in e.args:
            if _truth(condition, b):
                return _value(value, b)
        raise Unsupported(e)  # no branch holds: let sympy say what it makes of it
    raise Unsupported(e)


@functools.cache
def _relations() -> dict:
    """{sympy relational class: its test on numbers} (built on first use: sympy is imported lazily)."""
    return {sp.GreaterThan: lambda x, y: x >= y, sp.StrictGreaterThan: lambda x, y: x > y,
            sp.LessThan: lambda x, y: x <= y, sp.StrictLessThan: lambda x, y: x < y,
            sp.Equality: lambda x, y: x == y, sp.Unequality: lambda x, y: x != y}


def _truth(c, b) -> bool:
    if c is sp.true:
        return True
    if c is sp.false:
        return False
    relation = _relations().get(type(c))
    if relation is not None:
        return relation(_value(c.lhs, b), _value(c.rhs, b))
    if isinstance(c, sp.And):
        return all(_truth(a, b) for a in c.args)
    if isinstance(c, sp.Or):
        return any(_truth(a, b) for a in c.args)
    if isinstance(c, sp.Not):
        return not _truth(c.args[0], b)
    raise Unsupported(c)


def sympy_expressions_built(call) -> int:
    """How many sympy sums and products (``AssocOp`` instances: Add, Mul, ...) ``call()`` constructs: the check
    that a numeric path builds no expression per operator (tests, bench). Not thread-safe: it patches sympy's
    ``AssocOp.__new__`` while ``call`` runs."""
    count = 0
    real = sp.core.operations.AssocOp.__new__

    def counting(cls, *args, **kwargs):
        nonlocal count
        count += 1
        return real(cls, *args, **kwargs)

    sp.core.operations.AssocOp.__new__ = counting
    try:
        call()
    finally:
        sp.core.operations.AssocOp.__new__ = real
    return count
