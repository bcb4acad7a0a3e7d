"""The FIFO channels of a graph as the engine will see them: stable names, endpoints, element bytes, tokens.

One :class:`ChannelInfo` per channel that :func:`stepsim.graph.lower.lower` creates, in the same order and
with the same name (``<producer op name>[<output index>]``; operator names are ``<Kind>_<index>`` by graph
position, so every build of the same workload gives the same names). A Zip has no channel of its own (its Map
reads the Zip's two inputs), so a channel into a Zip is attributed to the Map that reads the Zip.

Quantities (all ints, with the workload's trace bindings substituted):

* ``elem_bytes``: bytes of one element (the stream dtype's size: fp32 tiles count 4 B per value, dynamic
  tiles the bound row count, a multi-hot selector one byte per target);
* ``tokens``: elements the stream carries over the whole run (product of its shape).

A value that still depends on an unbound symbol (a ragged dimension no builder binds) is taken as the largest
value the bound symbols give, or 1 when nothing is bound (documented, so FIFO bytes stay defined).

``group``/``role``: channels of operators labelled ``("expert", e)`` or ``("region", r)`` (``op.group``) get
``role = (label kind, position of the producer among its label's operators, output index, producer kind)``;
an unlabelled producer writing into a labelled consumer (a Partition's output e into expert e) takes the
consumer's role (``"into"``). Channels with the same role in different experts are *equivalent* (the same
place in each expert's sub-graph) and are shrunk together by :func:`stepsim.passes.size_fifos`. Other
channels are their own role.
"""

from __future__ import annotations

import hashlib
import math
from collections import defaultdict
from dataclasses import dataclass

from stepsim.graph import ops_shape as S
from stepsim.graph.dims import sp
from stepsim.graph.dtypes import size_in_bytes
from stepsim.graph.graph import Graph, Op
from stepsim.graph.numeric import Unbound, Unsupported, exact_value, python_bindings


@dataclass(frozen=True)
class ChannelInfo:
    """One FIFO channel (see the module docstring).

    Attributes
    ----------
    name : str
        Stable channel name, as in ``SimResult.channel_names``.
    producer : Op
        The operator writing the channel.
    index : int
        Producer output index.
    consumer : Op or None
        The operator reading it (None: the implicit sink of an unconsumed output).
    elem_bytes : int
        Bytes per element.
    tokens : int
        Elements over the whole run.
    role : tuple
        Equivalence key (channels sharing it are sized together).
    """

    name: str
    producer: Op
    index: int
    consumer: Op | None
    elem_bytes: int
    tokens: int
    role: tuple

    @property
    def stream(self) -> str:
        """The stream type (for messages)."""
        return str(self.producer.outputs[self.index])


def _value(expr, bindings: dict) -> int:
    """``expr`` with ``bindings`` substituted, as an int (unbound symbols: see the module docstring)."""
    if isinstance(expr, int):
        return expr
    expr = sp.sympify(expr).xreplace({s: sp.Integer(int(bindings[s])) for s in sp.sympify(expr).free_symbols
                                      if s in bindings})
    if expr.free_symbols:
        fill = max((int(v) for v in bindings.values()), default=1)
        expr = expr.xreplace({s: sp.Integer(fill) for s in expr.free_symbols})
    return max(int(sp.ceiling(expr)), 0)


def _roles(graph: Graph) -> dict[int, tuple]:
    """Op id -> (label kind, position among the ops of its label) for labelled ops."""
    seen: dict[tuple, int] = defaultdict(int)
    roles = {}
    for op in graph.ops:
        if isinstance(op.group, tuple) and len(op.group) == 2:
            roles[op.id] = (op.group[0], seen[op.group])
            seen[op.group] += 1
    return roles


def _endpoints(graph: Graph):
    """``(producer, output index, consumer or None)`` per channel, in lowering order (graph finalized)."""
    uses = graph.consumers()
    zip_reader = {}
    for op in graph.ops:
        if isinstance(op, S.Zip):
            (reader, _), = uses[(op.id, 0)]
            zip_reader[op.id] = reader
    for op in graph.ops:
        if isinstance(op, S.Zip):
            continue
        for idx in range(op.num_outputs):
            users = uses.get((op.id, idx), [])
            if isinstance(op, S.Reshape) and idx == 1 and not users:
                continue  # lower.py: Reshape's padding flags get a channel only when read
            consumer = users[0][0] if users else None
            if consumer is not None and consumer.id in zip_reader:
                consumer = zip_reader[consumer.id]
            yield op, idx, consumer


def channel_names(graph: Graph) -> list[str]:
    """The names of every channel the lowering of ``graph`` creates, in lowering order (cheap: no quantities)."""
    return [f"{op.name}[{idx}]" for op, idx, _ in _endpoints(graph.finalize())]


def channel_elements(graph: Graph, bindings: dict | None = None) -> dict[str, int] | None:
    """``{channel name: elements it carries over the run}`` for every channel the lowering of ``graph`` creates
    (the product of its stream's shape with ``bindings``, exact), or None when some shape depends on a symbol
    ``bindings`` leave unbound (unlike :func:`channel_infos`, no guess: the run-size estimate that reads this
    must not be a guess). Evaluated numerically (:func:`stepsim.graph.numeric.exact_value`), not with sympy, so
    it costs little beside the lowering even on thousands of channels."""
    values = python_bindings(bindings or {})
    known: dict = {}  # dim -> value: streams share their dims (a layer's thousands of channels, a few dozen dims)
    out = {}
    for op, idx, _ in _endpoints(graph.finalize()):
        n = 1
        for d in op.outputs[idx].shape:  # the product of the values, not the value of a sympy product (slow)
            if isinstance(d, int):
                n *= d
                continue
            if d not in known:
                try:
                    known[d] = exact_value(d, values)
                except (Unbound, Unsupported):
                    v = sp.sympify(d).xreplace({s: sp.sympify(x) for s, x in values.items()})
                    if v.free_symbols:
                        return None
                    known[d] = python_bindings({0: v})[0]
            n *= known[d]
        out[f"{op.name}[{idx}]"] = max(math.ceil(n), 0)
    return out


def channel_infos(graph: Graph, bindings: dict | None = None) -> list[ChannelInfo]:
    """Every channel the lowering of ``graph`` creates, in lowering order (the graph is finalized)."""
    graph = graph.finalize()
    bindings = bindings or {}
    roles = _roles(graph)
    out = []
    for op, idx, consumer in _endpoints(graph):
        stream = op.outputs[idx]
        if op.id in roles:
            role = (*roles[op.id], idx, op.kind)
        elif consumer is not None and consumer.id in roles:  # e.g. a Partition's output into expert e
            pos = next(i for i, ref in enumerate(consumer.inputs) if ref.op is op and ref.index == idx) \
                if any(ref.op is op for ref in consumer.inputs) else -1
            role = ("into", *roles[consumer.id], pos, consumer.kind)
        else:
            role = ("channel", op.name, idx)
        out.append(ChannelInfo(name=f"{op.name}[{idx}]", producer=op, index=idx, consumer=consumer,
                               elem_bytes=max(_value(size_in_bytes(stream.dtype), bindings), 1),
                               tokens=_value(stream.total_elements(), bindings), role=role))
    return out


def _dim_key(d) -> str:
    """A stable, cheap text for a dimension: the int, or the sorted names of its symbols (printing a sympy
    expression costs ~1 ms, too much for thousands of channels; the symbols are named after their operators)."""
    if isinstance(d, int):
        return str(d)
    return "(" + ",".join(sorted(s.name for s in d.free_symbols)) + ")"


def _stream_key(stream) -> str:
    dtype = stream.dtype
    inner = ",".join(_dim_key(d) for d in getattr(dtype, "shape", ()) if d is not None)
    return f"{type(dtype).__name__}[{inner}]{getattr(getattr(dtype, 'dtype', None), 'name', '')}" \
           f"<{','.join(_dim_key(d) for d in stream.shape)}>"


def graph_fingerprint(graph: Graph) -> str:
    """SHA-256 (hex) of the graph's channel structure: every channel's name, consumer name and stream type
    (element type, tile dims and stream dims; symbolic dims by their symbols' names), in lowering order. Two
    builds of the same workload (same model, tiling, batch) agree; a depths file whose fingerprint differs was
    made for another graph."""
    graph = graph.finalize()
    lines = [f"{op.name}[{idx}]\t{consumer.name if consumer else '-'}\t{_stream_key(op.outputs[idx])}\n"
             for op, idx, consumer in _endpoints(graph)]
    return hashlib.sha256("".join(lines).encode()).hexdigest()
