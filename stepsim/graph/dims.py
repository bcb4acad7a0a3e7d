"""Stream dimensions: static ints, dynamic-regular symbols and ragged symbols.

A dimension is either a Python ``int`` (static-regular) or a sympy expression over symbols created with
``integer=True, nonnegative=True``. The paper distinguishes dynamic-regular dimensions (the same value for
every sub-tensor, e.g. the number of tokens routed to one expert) from ragged ones (a different value per
sub-tensor, e.g. the number of KV tiles per request). Ragged symbols are instances of :class:`RaggedSymbol`,
a sympy ``Symbol`` subclass, so the paper's *absorbing rule* (an expression containing a ragged dimension is
ragged) falls out of ``free_symbols`` without any bookkeeping.

Symbol names are derived from the graph-local name of the operator that introduces them (``Partition_4_007``),
never from a process-global counter, so two builds of the same graph give identical expressions.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import TYPE_CHECKING, Union

from stepsim.base.errors import ArgumentError
from stepsim.base.lazy_import import LazyModule

if TYPE_CHECKING:
    import sympy

#: sympy, imported when a graph first has a symbolic dimension (all-static graphs never import it)
sp = LazyModule("sympy")

Dim = Union[int, "sympy.Expr"]
Shape = tuple  # tuple[Dim, ...], outermost first: (D_N, ..., D_0)


@functools.cache
def ragged_symbol_class() -> type:
    """The class :class:`RaggedSymbol`, a sympy ``Symbol`` subclass standing for a ragged dimension (its value
    differs between sub-tensors of one stream). Defined on first use because it subclasses a sympy class;
    ``stepsim.graph.dims.RaggedSymbol`` names it (and pickle finds it there)."""

    class RaggedSymbol(sp.Symbol):
        """A symbol standing for a ragged dimension (its value differs between sub-tensors of one stream)."""

    RaggedSymbol.__module__, RaggedSymbol.__qualname__ = __name__, "RaggedSymbol"
    return RaggedSymbol


def __getattr__(name: str):
    if name == "RaggedSymbol":
        return ragged_symbol_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def make_symbol(name: str, ragged: bool = False) -> sympy.Symbol:
    """Create the dimension symbol ``name`` (integer, nonnegative); ragged symbols absorb expressions."""
    cls = ragged_symbol_class() if ragged else sp.Symbol
    return cls(name, integer=True, nonnegative=True)


def normalize(d) -> Dim:
    """Return ``d`` as a Python int when it is a concrete integer, else as a sympy expression.

    Raises :class:`~stepsim.base.errors.ArgumentError` for anything else (a bool, a Python float, a string, ...).
    """
    if isinstance(d, bool):
        raise ArgumentError(f"a dimension cannot be a bool, got {d!r}")
    if isinstance(d, int):
        return d
    if isinstance(d, sp.Basic):
        if d.is_Integer:
            return int(d)
        return d
    if hasattr(d, "__index__"):  # numpy integers
        return int(d)
    raise ArgumentError(f"a dimension must be an int or a sympy expression, got {type(d).__name__}: {d!r}")


def is_static(d: Dim) -> bool:
    """True for a concrete integer dimension."""
    return isinstance(normalize(d), int)


def is_ragged(d: Dim) -> bool:
    """True when the expression contains a ragged symbol (the absorbing rule)."""
    d = normalize(d)
    return not isinstance(d, int) and any(isinstance(s, ragged_symbol_class()) for s in d.free_symbols)


def kind(d: Dim) -> str:
    """``"static"``, ``"dynamic"`` (dynamic-regular) or ``"ragged"``."""
    if is_static(d):
        return "static"
    return "ragged" if is_ragged(d) else "dynamic"


def as_expr(d: Dim) -> sympy.Expr:
    """The dimension as a sympy expression."""
    return sp.Integer(d) if isinstance(d, int) else d


def dims_equal(a: Dim, b: Dim) -> bool:
    """Structural/semantic equality of two dimensions (sympy ``equals`` for expressions)."""
    a, b = normalize(a), normalize(b)
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    if isinstance(a, int) != isinstance(b, int):
        return False
    if a == b:
        return True
    if a.is_Symbol and b.is_Symbol:  # two different symbols are independent dimensions: never equal
        return False
    return bool(sp.simplify(a - b) == 0)


def shapes_equal(a: Iterable[Dim], b: Iterable[Dim]) -> bool:
    a, b = tuple(a), tuple(b)
    return len(a) == len(b) and all(dims_equal(x, y) for x, y in zip(a, b))


def ceil_div(d: Dim, s: int) -> Dim:
    """``ceil(d / s)``, written ``(d + s - 1) // s`` (a sympy ``floor`` for symbolic ``d``, as the artifact)."""
    d = normalize(d)
    if isinstance(d, int):
        return -(-d // s)
    if _plain_count(d):
        # floor's evaluation asks sympy's assumption system about the sum (milliseconds per call); for a
        # non-negative integer symbol it leaves floor(d/s + (s-1)/s) as it is (or d for s = 1), so build that
        # tree directly, in sympy's canonical argument order (the number first), without the arithmetic that
        # would canonicalize it (tests/graph/test_shape_rules.py checks it is the same tree for s to 130,
        # the powers of two to 1,024 and every eighth prime to 1,100)
        if s == 1:
            return d
        inner = sp.Add(sp.Rational(s - 1, s), sp.Mul(sp.Rational(1, s), d, evaluate=False), evaluate=False)
        return sp.floor(inner, evaluate=False)
    return normalize(sp.floor((d + s - 1) / sp.Integer(s)))


def nonzero_indicator(d: Dim) -> Dim:
    """1 if ``d >= 1`` else 0: ``Piecewise((1, d >= 1), (0, True))`` for symbols (paper's Promote rule)."""
    d = normalize(d)
    if isinstance(d, int):
        return 1 if d >= 1 else 0
    if _plain_count(d):  # evaluating only asks the assumption system; for a plain count symbol it changes nothing
        return sp.Piecewise((1, sp.GreaterThan(d, 1, evaluate=False)), (0, True), evaluate=False)
    return sp.Piecewise((1, d >= 1), (0, True))


def _plain_count(d) -> bool:
    """True for a sympy symbol declared integer and non-negative (a token or tile count)."""
    return isinstance(d, sp.Symbol) and d.is_integer is True and d.is_nonnegative is True


def product(dims: Iterable[Dim]) -> Dim:
    """Product of dimensions, an int when all are static."""
    out: Dim = 1
    for d in dims:
        out = normalize(out * normalize(d))
    return out


def dim_sum(dims: Iterable[Dim]) -> Dim:
    """Sum of dimensions, an int when all are static. Symbolic terms go into one sympy ``Add``: adding them one
    at a time re-canonicalizes the growing sum each time (quadratic in the terms; the same tree either way)."""
    terms = [normalize(d) for d in dims]
    static = sum(t for t in terms if isinstance(t, int))
    symbolic = [t for t in terms if not isinstance(t, int)]
    return normalize(sp.Add(static, *symbolic)) if symbolic else static


def sum_of_products(terms: Iterable[tuple]) -> Dim:
    """The sum over ``terms`` (tuples of dims) of each term's :func:`product`: a metric given as terms of factors
    (``Op.on_chip_bytes_terms``), as one expression."""
    return dim_sum(product(term) for term in terms)


def fmt_dim(d: Dim) -> str:
    return str(normalize(d))


def fmt_shape(shape: Iterable[Dim]) -> str:
    """``[1, 4, S_0]``-style text for error messages."""
    return "[" + ", ".join(fmt_dim(d) for d in shape) + "]"
