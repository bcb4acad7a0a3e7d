"""The :class:`Workload` bundle every builder returns: a graph plus the trace values of its symbols.

Symbols are bound *by meaning*: a builder knows that ``Partition_4``'s count symbol ``i`` is the number of
tokens routed to expert ``i`` and records ``{symbol: count}`` from the trace, instead of sorting symbol names
and hoping the order lines up (the artifact's scripts do that; docs/semantics.md §9 item 6).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from functools import partial
from typing import Any, NamedTuple

from stepsim.graph.dims import sp
from stepsim.graph.gcpause import gc_paused
from stepsim.graph.graph import PUBLISHED, Graph, as_int, convention
from stepsim.graph.numeric import Unbound, Unsupported, exact_value, python_bindings
from stepsim.workloads.kinds import DEFAULT_WORKLOAD_CHANNEL_DEPTH, WORKLOAD_HARDWARE


def substitute(expr, bindings: dict) -> Any:
    """Substitute ``bindings`` into a metric expression (ints pass through)."""
    if isinstance(expr, int):
        return expr
    expr = sp.sympify(expr)
    return expr.xreplace({s: sp.sympify(bindings[s]) for s in expr.free_symbols if s in bindings})


def evaluate(expr, bindings: dict, what: str = "value") -> int:
    """Substitute ``bindings`` and return an int, or raise a MetricError naming the unbound symbols.

    Evaluated numerically and exactly (:func:`stepsim.graph.numeric.exact_value`); expressions it does not
    handle, unbound symbols and non-integer results go through sympy, which gives the same value or the error.
    """
    try:
        value = exact_value(expr, bindings)
    except (Unsupported, Unbound):
        return as_int(substitute(expr, bindings), what)
    if isinstance(value, int):
        return value
    if value.denominator == 1:
        return int(value)
    return as_int(substitute(expr, bindings), what)


def factors_value(factors: tuple, metric, bindings: dict, what: str) -> int | Fraction:
    """The value of an operator's ``metric()`` with ``bindings`` (which may hold exact Fractions), from its
    ``factors`` (whose product ``metric()`` is), an int or a Fraction.

    Each factor is evaluated on its own: building the sympy product of a symbolic stream shape and a per-element
    term (a firing's FLOPs, a tile's bytes) cost about a tenth of a ``stepsim reproduce`` run, and the product
    of the exact values is the exact value of the product. A factor the numeric evaluator cannot handle sends
    the whole metric through :func:`evaluate_exact`."""
    try:
        return _whole(_exact_product(factors, bindings))
    except (Unsupported, Unbound):
        return evaluate_exact(metric(), bindings, what)


def _exact_product(factors: tuple, bindings: dict) -> int | Fraction:
    """The product of the exact values of ``factors`` (raises Unsupported or Unbound as :func:`exact_value`)."""
    value = 1
    for factor in factors:
        value = value * exact_value(factor, bindings)
    return value


def _whole(value: int | Fraction) -> int | Fraction:
    """``value`` as an int when it is a whole Fraction."""
    # exact_value gives ints and Fractions only; a type test avoids isinstance's ABC machinery, once per metric
    return int(value) if type(value) is Fraction and value.denominator == 1 else value


def factors_int(factors: tuple, metric, bindings: dict, what: str) -> int:
    """The int value of an operator's ``metric()`` with ``bindings`` of ints, from its ``factors`` (whose product
    ``metric()`` is): :func:`terms_int` of the one term."""
    return terms_int((factors,), metric, bindings, what)


def terms_int(terms: tuple, metric, bindings: dict, what: str) -> int:
    """The int value of an operator's ``metric()`` with ``bindings`` of ints, from its ``terms`` (tuples of
    factors; ``metric()`` is the sum of their products): no sympy sum or product is built. A term the numeric
    evaluator cannot handle, or a non-integer total, goes through :func:`evaluate` of ``metric()`` (which gives
    the same value or raises the MetricError naming ``what``)."""
    try:
        if len(terms) == 1:  # most metrics are one product: no generator
            value = _whole(_exact_product(terms[0], bindings))
        else:
            value = _whole(sum((_exact_product(term, bindings) for term in terms), 0))
    except (Unsupported, Unbound):
        return evaluate(metric(), bindings, what)
    return value if isinstance(value, int) else evaluate(metric(), bindings, what)


class OpValues(NamedTuple):
    """One operator's concrete metrics (:meth:`Workload.op_values`): bytes, bytes, FLOPs, FLOPs or None."""

    off_chip_bytes: int
    on_chip_bytes: int
    flops: int
    exact_flops: int | Fraction | None


def flop_based(op) -> bool:
    """Whether ``op`` is a compute operator whose cycles follow its FLOPs (``ceil(FLOPs / compute_bw)``), not a
    fixed-cost function such as the token-packing ``Accum(RetileRow)``."""
    fn = getattr(op, "fn", None)
    return bool(getattr(op, "compute_bw", None)) and fn is not None and fn.fixed_cycles is None


def evaluate_exact(expr, bindings: dict, what: str) -> int | Fraction:
    """``expr``'s exact value with ``bindings`` that may hold Fractions (an int or a Fraction)."""
    try:
        return exact_value(expr, bindings)
    except (Unsupported, Unbound):
        return evaluate(expr, bindings, what)


def _op_values(op, c, bindings: dict, exact_bindings: dict | None) -> OpValues:
    """``op``'s :class:`OpValues` under on-chip convention ``c``; ``exact_bindings`` (the tile-rows means, or
    None when no dimension has them) give ``exact_flops``."""
    name = op.name
    off_chip = factors_int(op.off_chip_bytes_factors(), op.off_chip_bytes, bindings, f"off-chip bytes of {name}")
    on_chip = terms_int(op.on_chip_bytes_terms(c), partial(op.on_chip_bytes, c), bindings, f"on-chip bytes of {name}")
    flops = factors_int(op.flops_factors(), op.flops, bindings, f"FLOPs of {name}")
    exact = _exact_flops(op, bindings, exact_bindings, flops) if flop_based(op) else None
    return OpValues(off_chip, on_chip, flops, exact)


def _exact_flops(op, bindings: dict, exact_bindings: dict | None, flops: int | None = None) -> int | Fraction:
    """A FLOP-based ``op``'s ``exact_flops`` (:meth:`Workload.op_values`): its FLOPs with ``bindings`` (``flops``
    when the caller has them) or, where a dimension has ragged tiles, with ``exact_bindings``."""
    what = f"FLOPs of {op.name}"
    if exact_bindings is not None:
        return factors_value(op.flops_factors(), op.flops, exact_bindings, what)
    return flops if flops is not None else factors_int(op.flops_factors(), op.flops, bindings, what)


@dataclass
class Workload:
    """A ready-to-measure (and, with the engine, ready-to-simulate) STeP program.

    Attributes
    ----------
    name : str
        Workload kind (``moe``, ``swiglu``, ``attention``).
    graph : Graph
        The operator graph (broadcasts are inserted on first measurement).
    params : dict
        Every knob the builder used (model dims, tiling, tile sizes, regions, bandwidths, FIFO depths).
    bindings : dict
        ``{sympy symbol: value}`` from the trace (per-expert token counts, per-region tile counts, ...).
    algorithmic_flops : int or None
        The paper's algorithmic FLOP count for the layer (including padding), as its scripts compute it.
    idle_groups : set
        Operator groups (``op.group`` labels) that received no work in the trace; their on-chip footprint
        is what ``on_chip_bytes_active`` leaves out (the spec's unselected-expert correction).
    channel_depth : int or None
        Default FIFO depth the paper's experiment uses for this workload (None = 1024 in step-perf); a hardware
        that sets ``channel_depth`` explicitly, or a per-run depth, overrides it (:mod:`stepsim.base.defaults`).
    hardware : str
        Hardware preset the paper's experiment uses.
    trace : dict
        The trace values the graph was built from, as read-only int64 arrays: ``routing`` ([B, top_k] expert
        ids) for ``moe``, ``kv_lengths`` ([B] tokens) for ``attention``; empty for ``swiglu``. Kept apart from
        ``params`` (which go into every result row as JSON) because they grow with the batch.
    tile_rows : dict
        ``{symbol: tuple of ints}``: the rows of every tile of a ragged tile dimension that ``bindings`` binds,
        for sizing, to the largest of several tiles (a time-multiplexed region's merged dynamic tiles, one per
        member expert with tokens). Every tile fires the operators that see it equally often, so the mean
        (:meth:`flop_bindings`) makes tiles x rows the exact sum of FLOPs (:meth:`op_flops`), and
        :mod:`stepsim.analysis.bounds` charges each tile its own firing costs.
    balanced_units : list
        Regions among which a dispatcher assigns the work during the run (dynamic parallelization), one entry
        per dispatcher: a tuple of one operator-name tuple per region, the regions built alike. Their
        per-region metrics use a nominal assignment; only sums over the regions are exact (:mod:`stepsim.analysis.bounds`).
    channel_depths : dict or None
        Per-channel FIFO depths (channel name -> elements) that override ``channel_depth`` in simulation, e.g.
        from a ``stepsim size-fifos`` file (:func:`stepsim.graph.depths_file.apply_depths_file`); None: none.
    """

    name: str
    graph: Graph
    params: dict = field(default_factory=dict)
    bindings: dict = field(default_factory=dict)
    algorithmic_flops: int | None = None
    idle_groups: set = field(default_factory=set)
    channel_depth: int | None = DEFAULT_WORKLOAD_CHANNEL_DEPTH
    hardware: str = WORKLOAD_HARDWARE["moe"]
    trace: dict = field(default_factory=dict)
    channel_depths: dict | None = None
    tile_rows: dict = field(default_factory=dict)
    balanced_units: list = field(default_factory=list)

    def symbolic(self, on_chip_convention=PUBLISHED) -> dict:
        """Symbolic totals (sympy): ``off_chip_bytes``, ``on_chip_bytes``, ``flops``."""
        g = self.graph
        return {
            "off_chip_bytes": g.off_chip_bytes(),
            "on_chip_bytes": g.on_chip_bytes(on_chip_convention),
            "flops": g.flops(),
        }

    @gc_paused  # see stepsim.graph.gcpause: collections made large builds superlinear
    def op_values(self, on_chip_convention=PUBLISHED) -> dict[str, OpValues]:
        """Per-operator concrete metrics ``{op name: OpValues(off_chip_bytes, on_chip_bytes, flops,
        exact_flops)}``.

        Each metric is evaluated on its own, factor by factor (:func:`factors_value`, :func:`terms_int`: stream
        dims, a dynamic tile's rows, cols and bytes, a function's FLOP factors), with the bindings as Python ints
        and Fractions (:func:`~stepsim.graph.numeric.python_bindings`): the paper's workloads build no sympy
        expression here (the sympy products of dynamic tiles, about 30 per expert, were two thirds to three
        quarters of a dynamic-tiling MoE layer's metrics time; bench/README.md). ``exact_flops`` (FLOP-based compute
        operators only, else None) is what the engine's cost model charges the operator over the run, the sum
        over its firings of the function's FLOPs (docs/timing_model.md §3.3): ``flops`` evaluated with the mean
        of ``tile_rows`` over ``bindings``, an int or, where a mean is bound, an exact Fraction.
        """
        c = convention(on_chip_convention)
        bindings, exact_bindings = self._evaluation_bindings()
        return {op.name: _op_values(op, c, bindings, exact_bindings) for op in self.graph.ops}

    def _evaluation_bindings(self) -> tuple:
        """The graph finalized (its broadcasts inserted); ``(bindings, exact_bindings)`` of :func:`_op_values` as
        :func:`~stepsim.graph.numeric.python_bindings` (each evaluation's memo), the second None without ragged
        tiles."""
        self.graph.finalize()
        exact_bindings = python_bindings(self.flop_bindings()) if self.tile_rows else None
        return python_bindings(self.bindings), exact_bindings

    def flop_bindings(self) -> dict:
        """``bindings`` with each :attr:`tile_rows` dimension bound to its mean rows (an exact Fraction; 0 for a
        dimension without tiles): the values under which an operator's FLOPs are its exact total."""
        means = {s: Fraction(sum(rows), len(rows)) if rows else Fraction(0) for s, rows in self.tile_rows.items()}
        return {**self.bindings, **means}

    @gc_paused
    def op_flops(self, values: dict | None = None) -> dict:
        """``{op name: exact FLOPs}`` of every FLOP-based compute operator (``OpValues.exact_flops``), from
        ``values`` (an :meth:`op_values` result) or evaluated now for those operators alone (the mapper's unit plan
        asks for them on every candidate it builds, and needs no operator's bytes)."""
        if values is not None:
            return {name: v.exact_flops for name, v in values.items() if v.exact_flops is not None}
        bindings, exact_bindings = self._evaluation_bindings()
        return {op.name: _exact_flops(op, bindings, exact_bindings) for op in self.graph.ops if flop_based(op)}

    def group_on_chip_bytes(self, group, on_chip_convention=PUBLISHED) -> int:
        """On-chip bytes of the operators labelled ``group`` with the trace's values substituted."""
        values = self.op_values(on_chip_convention)
        return sum(values[op.name][1] for op in self.graph.ops if op.group == group)

    def metrics(self, on_chip_convention=PUBLISHED, values: dict | None = None) -> dict:
        """Concrete totals for the bound trace (from ``values``, an :meth:`op_values` result of the same
        convention, when given).

        Returns
        -------
        dict
            ``off_chip_bytes``, ``on_chip_bytes`` (raw, published accounting unless another convention is
            given), ``on_chip_bytes_active`` (minus idle groups' footprint), ``flops`` (algorithmic, the
            paper's formula; falls back to ``graph_flops``), ``graph_flops`` (sum over compute operators with
            the engine's FLOP convention), all ints in bytes / FLOPs.
        """
        values = values if values is not None else self.op_values(on_chip_convention)
        off = sum(v[0] for v in values.values())
        on = sum(v[1] for v in values.values())
        graph_flops = sum(v[2] for v in values.values())
        idle = sum(values[op.name][1] for op in self.graph.ops if op.group in self.idle_groups)
        return {
            "off_chip_bytes": off,
            "on_chip_bytes": on,
            "on_chip_bytes_active": on - idle,
            "flops": self.algorithmic_flops if self.algorithmic_flops is not None else graph_flops,
            "graph_flops": graph_flops,
        }
