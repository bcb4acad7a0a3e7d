"""The graph container, operator base class, placeholders (for cycles) and automatic Broadcast insertion.

Operators register themselves with a :class:`Graph` when constructed (``Flatten(g, x, 0, 1)``) and are named
``<Kind>_<index>`` by their position in the graph, so names (and the symbols derived from them) are identical
for every build of the same graph. Inputs are given as an operator with a single output, an
:class:`OutputRef` (``op.out(i)`` / ``op[i]``), or an ``(op, index)`` pair.

Cycles (the dynamic-parallelization dispatcher feeds back) are built with an explicit placeholder: create
``g.placeholder(stream)``, use it as an input, then ``g.connect(placeholder, real_output)`` once the producer
exists. A graph with an unconnected placeholder cannot be measured or lowered.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import ClassVar, NamedTuple

from stepsim.base.errors import ArgumentError, GraphError
from stepsim.graph.dims import normalize, sp, sum_of_products
from stepsim.graph.stream import Stream


class OnChipConvention(NamedTuple):
    """How on-chip bytes are counted (docs/semantics.md §2.0, §9).

    ``mode=1, count_fifos=False`` (``PUBLISHED``, the default) produced every published number: off-chip ops
    count one tile, maps count nothing. ``mode=2, count_fifos=True`` (``PAPER``) is the paper §4.1 model:
    double-buffered loads, matmul ``16*in_cols + |weight| + |out|``, FIFOs counted.
    """

    mode: int
    count_fifos: bool


PUBLISHED = OnChipConvention(1, False)
PAPER = OnChipConvention(2, True)
CONVENTIONS = {"published": PUBLISHED, "paper": PAPER, "fifos": OnChipConvention(1, True)}


def convention(value) -> OnChipConvention:
    """Accept an :class:`OnChipConvention`, a ``(mode, count_fifos)`` pair or a name (published/paper/fifos)."""
    if isinstance(value, OnChipConvention):
        return value
    if isinstance(value, str):
        try:
            return CONVENTIONS[value]
        except KeyError:
            raise ArgumentError(
                f"unknown on-chip convention {value!r}; expected one of {sorted(CONVENTIONS)}"
            ) from None
    mode, fifos = value
    if mode not in (1, 2):
        raise ArgumentError(f"on-chip mode must be 1 or 2, got {mode!r}")
    return OnChipConvention(int(mode), bool(fifos))


_as_convention = convention  # for methods whose ``convention`` parameter shadows the function


@dataclass(frozen=True)
class OutputRef:
    """Output ``index`` of operator ``op``."""

    op: "Op"
    index: int

    @property
    def stream(self) -> Stream:
        return self.op.outputs[self.index]

    def __str__(self) -> str:
        return self.op.name if self.op.num_outputs == 1 else f"{self.op.name}[{self.index}]"


class Op:
    """Base class of every STeP operator.

    Subclasses call ``self._begin(graph, inputs, name)`` first (which names the op and resolves inputs),
    validate and compute their output streams, then ``self._finish(outputs)`` (which adds the op to the
    graph). Metric methods return ints or sympy expressions in bytes / FLOPs.

    Attributes
    ----------
    channel_depth : int or None
        FIFO depth override (elements) for this operator's output channels; None uses the simulation default.
    fanout_depth : int or None
        FIFO depth of the outputs of an automatically inserted Broadcast that fans this op's output out.
    group : tuple or None
        A label (e.g. ``("expert", 3)``) used to attribute metrics to a part of a workload.
    """

    kind: ClassVar[str] = "Op"
    is_memory: ClassVar[bool] = False
    #: output used when the op itself is passed as an input (None: the op must have exactly one output)
    primary_output: ClassVar[int | None] = None

    def _begin(self, graph: "Graph", inputs, name: str | None = None) -> list[Stream]:
        if not isinstance(graph, Graph):
            raise GraphError(f"{self.kind}: the first argument must be a stepsim Graph, got {type(graph).__name__}")
        self.graph = graph
        self.id = graph._reserve_id()
        self.name = name or f"{self.kind}_{self.id}"
        self.inputs = [graph._resolve(x, self) for x in inputs]
        self.outputs: list[Stream] = []
        self.channel_depth: int | None = None
        self.fanout_depth: int | None = None
        self.group = None
        return [ref.stream for ref in self.inputs]

    def _finish(self, outputs: list[Stream]) -> None:
        self.outputs = list(outputs)
        self.graph._add(self)

    # --- outputs ---------------------------------------------------------------------------------------
    @property
    def num_outputs(self) -> int:
        return len(self.outputs)

    def out(self, index: int = 0) -> OutputRef:
        if not 0 <= index < len(self.outputs):
            raise ArgumentError(f"{self.name} has {len(self.outputs)} output(s); output {index} does not exist")
        return OutputRef(self, index)

    def __getitem__(self, index: int) -> OutputRef:
        return self.out(index)

    def assume_shape(self, index: int, shape) -> None:
        """Replace output ``index``'s shape by an equivalent one the caller knows (e.g. a known symbol).

        The artifact's scripts do this to name a ragged dimension by the quantity it equals (the tokens of an
        expert after padding removal). The rank must stay the same; use it before building consumers.
        """
        old = self.outputs[index]
        new = Stream(old.dtype, tuple(shape), old.layout)
        if new.rank != old.rank:
            raise self._error(ArgumentError, f"assume_shape cannot change rank: {old} -> {new}")
        self.outputs[index] = new

    def assume_dtype(self, index: int, dtype) -> None:
        """Replace output ``index``'s element type by an equivalent, more precise one (see assume_shape)."""
        old = self.outputs[index]
        self.outputs[index] = Stream(dtype, old.shape, old.layout)

    def assume_layout(self, index: int, layout) -> None:
        """Annotate output ``index`` with the :class:`~stepsim.graph.layout.Layout` of the tiles it carries (what
        a builder knows beyond the shape rules, e.g. an ONNX activation's). The layout must carry as many tiles
        as the stream has elements, when that count is a number."""
        old = self.outputs[index]
        total = old.total_elements()
        if layout is not None and isinstance(total, int) and total != layout.num_tiles:
            raise self._error(ArgumentError, f"output {index} {old} has {total} elements; layout {layout} carries "
                                             f"{layout.num_tiles} tiles")
        self.outputs[index] = Stream(old.dtype, old.shape, layout)

    @property
    def stream(self) -> Stream:
        """The single (or primary) output stream."""
        if self.primary_output is not None:
            return self.outputs[self.primary_output]
        if len(self.outputs) != 1:
            raise ArgumentError(f"{self.name} has {len(self.outputs)} outputs; use {self.name}[i]")
        return self.outputs[0]

    # --- errors ----------------------------------------------------------------------------------------
    def _error(self, cls, message: str):
        """Build a typed error naming this op and its input streams."""
        ins = ", ".join(f"{ref} -> {ref.stream}" for ref in getattr(self, "inputs", []))
        return cls(f"{self.name}: {message}" + (f" (inputs: {ins})" if ins else ""))

    # --- symbolic metrics --------------------------------------------------------------------------------
    def off_chip_bytes(self):
        """Off-chip traffic in bytes (int or sympy expression)."""
        return 0

    def on_chip_bytes(self, convention: OnChipConvention = PUBLISHED):
        """On-chip memory requirement in bytes under ``convention``."""
        return 0

    def flops(self):
        """Floating-point operations over the whole stream (see :mod:`stepsim.graph.functions`)."""
        return 0

    def off_chip_bytes_factors(self) -> tuple:
        """Factors whose product is :meth:`off_chip_bytes`: a memory operator's stream dims and its bytes per
        element. Evaluating them one by one gives the exact value without building the sympy product
        (:meth:`stepsim.workloads.base.Workload.op_values`)."""
        return (self.off_chip_bytes(),)

    def flops_factors(self) -> tuple:
        """Factors whose product is :meth:`flops`: a compute operator's firing count dims and the factors of one
        firing's FLOPs (see :meth:`off_chip_bytes_factors`)."""
        return (self.flops(),)

    def on_chip_bytes_terms(self, convention: OnChipConvention = PUBLISHED) -> tuple[tuple, ...]:
        """Terms whose sum is :meth:`on_chip_bytes` under ``convention``, each a tuple of factors whose product
        is the term: an operator whose footprint counts dynamic tiles gives their size factors
        (:func:`stepsim.graph.dtypes.size_factors`), so that it is evaluated without building a sympy sum or
        product (see :meth:`off_chip_bytes_factors`); here the one term :meth:`on_chip_bytes`."""
        return ((self.on_chip_bytes(convention),),)

    def __repr__(self) -> str:
        return f"<{self.name}: " + ", ".join(str(s) for s in self.outputs) + ">"


class OnChipFromTerms:
    """Mixin (before :class:`Op` in the bases) for operators that define :meth:`Op.on_chip_bytes_terms`: their
    :meth:`Op.on_chip_bytes` is the sum of the terms' products, so the two can never disagree."""

    def on_chip_bytes(self, convention: OnChipConvention = PUBLISHED):
        return sum_of_products(self.on_chip_bytes_terms(convention))


class Placeholder(Op):
    """A stand-in output used to close cycles; replaced by :meth:`Graph.connect`."""

    kind = "Placeholder"

    def __init__(self, graph: "Graph", stream: Stream, name: str | None = None):
        self._begin(graph, [], name)
        self.connected_to: OutputRef | None = None
        self._finish([stream])


class Broadcast(Op):
    """``num_consumers`` identical copies of the input stream (inserted automatically for fan-out).

    Defined beside :class:`Graph` because the graph inserts it itself (:meth:`Graph.insert_broadcasts`); the
    other routing operators are in :mod:`stepsim.graph.ops_routing`."""

    kind = "Broadcast"

    def __init__(self, graph, inp, num_consumers: int, *, channel_depth: int | None = None, name: str | None = None):
        (s,) = self._begin(graph, [inp], name)
        if not isinstance(num_consumers, int) or num_consumers < 1:
            raise self._error(ArgumentError, f"num_consumers must be a positive int, got {num_consumers!r}")
        self._finish([s] * num_consumers)
        self.channel_depth = channel_depth


class Graph:
    """A STeP dataflow graph: operators in insertion order, edges implied by their inputs."""

    def __init__(self, name: str = "graph"):
        self.name = name
        self.ops: list[Op] = []
        self._next_id = 0
        self._broadcasts_inserted = False
        self._consumers = None  # cache of consumers(); every change of ops or of their inputs drops it

    # --- construction -----------------------------------------------------------------------------------
    def _reserve_id(self) -> int:
        i = self._next_id
        self._next_id += 1
        return i

    def _add(self, op: Op) -> None:
        self.ops.append(op)
        self._broadcasts_inserted = False
        self._consumers = None

    def _resolve(self, x, consumer: Op) -> OutputRef:
        if isinstance(x, OutputRef):
            ref = x
        elif isinstance(x, Op):
            if x.primary_output is not None:
                ref = OutputRef(x, x.primary_output)
            elif len(x.outputs) != 1:
                raise ArgumentError(
                    f"{consumer.name if hasattr(consumer, 'name') else consumer.kind}: input {x.name} has "
                    f"{len(x.outputs)} outputs; pass {x.name}[i] to choose one"
                )
            else:
                ref = OutputRef(x, 0)
        elif isinstance(x, tuple) and len(x) == 2 and isinstance(x[0], Op):
            ref = x[0].out(x[1])
        else:
            raise ArgumentError(
                f"{consumer.name}: an input must be an operator or an operator output, got {type(x).__name__}"
            )
        if ref.op.graph is not self:
            raise GraphError(f"{consumer.name}: input {ref} belongs to graph {ref.op.graph.name!r}, not {self.name!r}")
        if isinstance(ref.op, Placeholder) and ref.op.connected_to is not None:
            ref = ref.op.connected_to
        return ref

    def placeholder(self, stream: Stream, name: str | None = None) -> Placeholder:
        """A placeholder output of type ``stream`` for building cycles; close it with :meth:`connect`."""
        return Placeholder(self, stream, name)

    def connect(self, placeholder: Placeholder, source) -> None:
        """Replace every use of ``placeholder`` by ``source`` (which must have the same stream type)."""
        self.connect_all([(placeholder, source)])

    def connect_all(self, pairs) -> None:
        """:meth:`connect` for many ``(placeholder, source)`` pairs in one pass over the operators (one pass
        each made a network of many transfers quadratic to build)."""
        refs = {}
        for placeholder, source in pairs:
            refs[id(placeholder)] = self._checked_connection(placeholder, source)
        for op in self.ops:
            if any(id(r.op) in refs for r in op.inputs):
                op.inputs = [refs.get(id(r.op), r) for r in op.inputs]
        self.ops[:] = [op for op in self.ops if id(op) not in refs]
        self._broadcasts_inserted = False
        self._consumers = None

    def _checked_connection(self, placeholder: Placeholder, source):
        """The output ``source`` resolves to, after checking it may close ``placeholder`` (marked connected)."""
        if not isinstance(placeholder, Placeholder) or placeholder.graph is not self:
            raise GraphError(f"connect: {placeholder!r} is not a placeholder of graph {self.name!r}")
        if placeholder.connected_to is not None:
            raise GraphError(f"connect: {placeholder.name} is already connected to {placeholder.connected_to}")
        ref = self._resolve(source, placeholder)
        if isinstance(ref.op, Placeholder):
            raise GraphError(f"connect: cannot connect {placeholder.name} to another placeholder {ref.op.name}")
        want, got = placeholder.stream, ref.stream
        if not want.same_type(got):
            raise placeholder._error(
                GraphError, f"placeholder expects {want} but {ref} produces {got}; a cycle must close on the same type"
            )
        placeholder.connected_to = ref
        return ref

    # --- queries ----------------------------------------------------------------------------------------
    def __iter__(self):
        return iter(self.ops)

    def __len__(self) -> int:
        return len(self.ops)

    def op(self, name: str) -> Op:
        for op in self.ops:
            if op.name == name:
                return op
        raise GraphError(f"graph {self.name!r} has no operator named {name!r}")

    def consumers(self) -> dict[tuple[int, int], list[tuple[Op, int]]]:
        """Map ``(producer id, output index)`` to the list of ``(consumer, input position)`` in op order.

        Cached until the graph changes (an operator added, a placeholder connected, broadcasts inserted):
        validation, broadcast insertion, metrics and lowering each ask for it. Read-only for callers."""
        if self._consumers is None:
            out: dict[tuple[int, int], list[tuple[Op, int]]] = {}
            for op in self.ops:
                for pos, ref in enumerate(op.inputs):
                    out.setdefault((ref.op.id, ref.index), []).append((op, pos))
            self._consumers = out
        return self._consumers

    def num_edges(self) -> int:
        return sum(len(op.inputs) for op in self.ops)

    def count_by_kind(self) -> dict[str, int]:
        counts: dict[str, int] = defaultdict(int)
        for op in self.ops:
            counts[op.kind] += 1
        return dict(counts)

    def validate(self) -> None:
        """Raise :class:`GraphError` for unconnected placeholders, inputs from foreign operators, or a Zip that
        is not read by exactly one Map.

        Why the Zip rule: a tuple stream exists only to give a Map a two-operand function (the paper's only
        use). The engine executes a Zip by fusing it into its Map, so other readers of tuples would build
        graphs that can be measured but never run; they are rejected here, where the graph is built.
        """
        members = {id(op) for op in self.ops}
        uses = self.consumers()
        for op in self.ops:
            if isinstance(op, Placeholder):
                raise GraphError(
                    f"graph {self.name!r}: placeholder {op.name} ({op.stream}) was never connected; "
                    f"call graph.connect({op.name}, producer)"
                )
            for ref in op.inputs:
                if id(ref.op) not in members:
                    raise GraphError(f"{op.name}: input {ref} is not part of graph {self.name!r}")
            if op.kind == "Zip":
                readers = [reader for reader, _ in uses.get((op.id, 0), [])]
                if len(readers) != 1 or readers[0].kind != "Map":
                    raise GraphError(f"{op.name}: a Zip must be read by exactly one Map, which applies a two-operand "
                                     f"function to its pairs; it is read by {[r.name for r in readers]} "
                                     "(zip the streams once per Map)")

    def insert_broadcasts(self) -> None:
        """Insert a Broadcast wherever one output feeds several inputs (idempotent; docs/semantics.md §2.7).

        Multi-edges count (an op reading the same stream twice gets two broadcast outputs). Broadcasts are
        appended after all existing operators, as the artifact's rewrite does.
        """
        if self._broadcasts_inserted:
            return
        by_id = {op.id: op for op in self.ops}
        for (pid, idx), uses in list(self.consumers().items()):
            if len(uses) < 2:
                continue
            producer = by_id[pid]
            if isinstance(producer, Broadcast):
                continue
            bc = Broadcast(self, producer.out(idx), len(uses))
            bc.channel_depth = producer.fanout_depth
            bc.group = producer.group
            for k, (consumer, pos) in enumerate(uses):
                consumer.inputs[pos] = bc.out(k)
        self._consumers = None
        self._broadcasts_inserted = True

    def finalize(self) -> "Graph":
        """Validate and insert broadcasts; metrics and lowering call this. Returns ``self``."""
        self.validate()
        self.insert_broadcasts()
        return self

    # --- metrics ----------------------------------------------------------------------------------------
    def off_chip_bytes(self) -> sp.Expr:
        """Total off-chip traffic in bytes (sympy expression over the graph's dimension symbols)."""
        self.finalize()
        return sp.Add(*[sp.sympify(op.off_chip_bytes()) for op in self.ops])

    def on_chip_bytes(self, convention: OnChipConvention | str = PUBLISHED) -> sp.Expr:
        """Total on-chip memory in bytes under ``convention`` (default: the published accounting)."""
        c = _as_convention(convention)
        self.finalize()
        return sp.Add(*[sp.sympify(op.on_chip_bytes(c)) for op in self.ops])

    def flops(self) -> sp.Expr:
        """Total FLOPs of all compute operators (the engine's FLOP convention)."""
        self.finalize()
        return sp.Add(*[sp.sympify(op.flops()) for op in self.ops])


def as_int(value, what: str = "value") -> int:
    """Turn a fully substituted metric into an int.

    Integral sympy Floats (from substituting float trace statistics) are accepted. Raises a MetricError naming
    the leftover symbols when some are unbound, or saying the value is not an integer (e.g. ``5/2``) when none
    are left.
    """
    from stepsim.base.errors import MetricError

    v = normalize(sp.sympify(value)) if not isinstance(value, int) else value
    if isinstance(v, int):
        return v
    v = sp.simplify(v)
    if v.is_Integer:
        return int(v)
    names = sorted(str(s) for s in v.free_symbols)
    if names:
        raise MetricError(f"{what} still depends on {names}; bind these symbols (e.g. from a trace) first")
    if v.is_number and v.is_real and (v - int(v)).is_zero:  # an integral Float from float trace statistics
        return int(v)
    raise MetricError(f"{what} = {v} is not an integer (check the bound values)")
