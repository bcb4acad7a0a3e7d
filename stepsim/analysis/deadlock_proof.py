"""A proof, without simulating, that a MoE layer on time-multiplexed regions deadlocks at its FIFO depths.

Why: ``stepsim optimize`` cannot prune a schedule that deadlocks by its cycle bound (its on-chip bytes are
the lowest of the space, so no simulated point dominates it), and simulating it only shows the deadlock: on
Qwen3-30B-A3B B=64, 34 of the default space's simulations did. Here a counting argument over the graph's
buffers and the trace's routing shows some of them must deadlock, whatever the timing.

The pattern (``stepsim.workloads.moe.build``): a Partition sends each token, in token order, to its experts; each
expert packs its rows into tiles (Reshape into chunks of ``S`` rows, Flatten, Accum) on its own *pre* path;
an EagerMerge takes the tiles of a region's experts in whatever order they come, the region computes them in
that order, and a Partition sends each result back to its expert (the back-partition); each expert's *post*
path (RetileStreamify, Map) leads to a Reassemble that gathers every token's rows in token order.

The argument, for experts ``x != y`` of one region and a token ``t`` routed to ``y``:

1. The Reassemble takes token ``t`` only when every one of its experts' rows is there, so before ``y``'s row
   of ``t`` exists it has taken no row of a token after ``t``.
2. ``y``'s tile holding ``t`` exists only once the Partition has sent ``y`` the token ``t'`` after that tile
   (a Reshape that adds an outer dim looks at the next row before it closes a chunk,
   ``units_shape.step_reshape``; without one, the tile's last token), or has ended (a partial last tile is
   padded at the close). The Partition sends tokens in order, so by then it has sent ``x`` every one of its
   ``N`` tokens strictly between ``t`` and ``t'``.
3. When the EagerMerge takes ``y``'s tile, each of those ``N`` rows of ``x`` is on ``x``'s pre path, or was
   merged before ``y``'s tile. The region keeps the merge order up to the back-partition, so every row merged
   before ``y``'s tile must leave the back-partition into ``x``'s post path before ``y``'s tile can, and by
   (1) none of them leaves the post path before then.
4. So a run that finishes needs ``N <= pre + post``, the rows ``x``'s two private paths can hold: every
   channel's capacity (elements) times the rows of its element (a static tile's rows, padding included), and
   at most two elements in each operator (the Accum holds its accumulator and a finished tile, the others
   one element; two is an upper bound for all). ``N > pre + post`` proves the deadlock.

Dedicated regions (one per expert, no EagerMerge: the paper's baseline layout) deadlock the same way with
``x``'s whole private path in place of its pre and post paths: the Partition sends ``x`` its ``N`` tokens between
``t`` and ``t'`` before it sends ``y`` the token ``t'`` that closes ``y``'s tile, and none of them can leave
``x``'s path into the Reassemble before ``t`` (step 1). Every token inside the path (sent, not yet taken by the
Reassemble) sits on *every* chain of channels from the Partition's output ``x`` to the Reassemble's input ``x``:
past a Broadcast each branch carries it until they join, and an operator emits each element in order (or holds
it). So the rows one such chain can hold bound the tokens in the path, and ``N`` above the smallest chain's
rows proves the deadlock. A chain's rows: each channel's depth times its element's rows, :data:`HELD_ELEMENTS`
elements in each operator; between a RepeatStatic of ``R`` and the next Accum / MapAccum (the expert's FFN,
where each token tile meets every weight tile) the elements are ``R`` repeats of one tile after another, so the
``W`` element slots there hold at most ``ceil(W / R) + 1`` tiles. Weight loads that a token tile triggers (its
ref input) carry no token and are not on a chain; a path that reaches any operator outside
:data:`DEDICATED_KINDS` (another expert's, a store) is not proven.

Only orders are used, never times, so the proof holds for every timing, including the EagerMerge's choices.
It is sufficient, not necessary: a layer it does not prove may still deadlock (then the simulation says so).
The FIFO depths are the run's: a channel's override (``Workload.channel_depths``), else its producer's
``channel_depth``, else the run's default (:func:`stepsim.base.defaults.channel_capacity`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from stepsim.base.defaults import channel_capacity
from stepsim.base.errors import MetricError
from stepsim.workloads.base import Workload, evaluate

__all__ = ["DeadlockProof", "prove_deadlock"]

#: operators of an expert's pre path (token rows to tiles), walked back from an EagerMerge input
PRE_KINDS = ("Accum", "Flatten", "Reshape")
#: operators of an expert's post path (result tiles to rows), walked from a back-partition output
POST_KINDS = ("RetileStreamify", "Map", "Flatten")
#: operators that keep the order of the elements they pass on (one output element group per input element,
#: in input order), allowed between an EagerMerge and its back-partition
IN_ORDER_KINDS = ("RepeatStatic", "Map", "MapAccum", "Accum", "Broadcast", "Flatten")
#: most elements an operator on a private path holds at once (the Accum: its accumulator and a finished tile)
HELD_ELEMENTS = 2
#: operators allowed on a dedicated region's private path (module docstring)
DEDICATED_KINDS = ("Reshape", "Flatten", "Accum", "Broadcast", "RepeatStatic", "Map", "MapAccum",
                   "RetileStreamify")
#: operators that end a RepeatStatic's run of repeated elements (they reduce the repeats of one tile)
REDUCING_KINDS = ("Accum", "MapAccum")
#: most chains walked through one expert's private path (else it is not proven)
MAX_CHAINS = 64


@dataclass(frozen=True)
class DeadlockProof:
    """Why a layer must deadlock (module docstring): ``x``'s ``rows`` tokens strictly between ``token`` and
    ``until`` exceed the ``pre + post`` rows its private paths hold.

    Attributes
    ----------
    merge : str
        The region's EagerMerge; for dedicated regions the token Partition (then ``pre`` is the rows of the
        whole private path and ``post`` 0).
    x, y : int
        Expert ids (the Partition's outputs).
    token : int
        A token routed to ``y`` (its row in the batch).
    until : int
        The token whose arrival closes ``y``'s tile holding ``token``; the batch size when only the end of the
        token stream closes it.
    rows : int
        ``x``'s tokens strictly between ``token`` and ``until``.
    pre, post : int
        Rows ``x``'s path can hold before the region and after it.
    """

    merge: str
    x: int
    y: int
    token: int
    until: int
    rows: int
    pre: int
    post: int
    batch: int

    @property
    def message(self) -> str:
        """One line: the proof's numbers."""
        closes = ("once every token is routed" if self.until >= self.batch
                  else f"once token {self.until} is routed")
        if self.merge.startswith("Partition"):  # dedicated regions: one private path, no shared region
            return (f"deadlock at these FIFO depths, proven without simulating: expert {self.y}'s tile holding "
                    f"token {self.token} closes only {closes}, and the Reassemble needs token {self.token} first, "
                    f"so expert {self.x}'s {self.rows} tokens in between must wait in its path from "
                    f"{self.merge}, which holds {self.pre} rows")
        return (f"deadlock at these FIFO depths, proven without simulating: region {self.merge} can take expert "
                f"{self.y}'s tile holding token {self.token} only {closes}, and the Reassemble needs token "
                f"{self.token} first, so expert {self.x}'s {self.rows} tokens in between must wait in its path, "
                f"which holds {self.pre + self.post} rows ({self.pre} before the region, {self.post} after it)")


@dataclass
class _Path:
    """An expert's private paths: its Partition output, capacities (rows) and tile closing (chunk size,
    whether the Reshape adds an outer dim); ``chunk`` is None when its tiles do not follow that pattern."""

    expert: int
    pre: int
    post: int
    chunk: int | None
    lookahead: bool


def prove_deadlock(workload: Workload, default_depth: int) -> DeadlockProof | None:
    """The first proof (module docstring) that ``workload`` deadlocks with FIFOs of ``default_depth`` elements
    where nothing else sets a channel's depth, or None. Regions are tried in graph order, then expert ``y``,
    token ``t`` and expert ``x`` in ascending order, so the answer is deterministic."""
    graph = workload.graph.finalize()
    consumers = graph.consumers()
    overrides = dict(workload.channel_depths or {})

    def capacity_rows(ref) -> int | None:
        rows = _rows(ref.stream, workload)
        depth = channel_capacity(ref.op, ref.index, default_depth, overrides)
        return None if rows is None else depth * rows

    by_selector = {_origin(op.inputs[1]): op for op in graph.ops if op.kind == "Partition"}
    routings = {}  # every region of a layer shares its token Partition: its routing is read once
    for merge in graph.ops:
        if merge.kind != "EagerMerge":
            continue
        found = _region(merge, by_selector.get((merge.id, 1)), consumers, capacity_rows, workload)
        if found is None:
            continue
        partition, paths = found
        if partition.id not in routings:
            routings[partition.id] = _Routing.of(partition)
        proof = _count(merge.name, routings[partition.id], paths)
        if proof is not None:
            return proof
    for partition in graph.ops:  # dedicated regions: a token Partition whose outputs lead to one Reassemble
        if partition.kind != "Partition" or partition.rank != 0 or _selectors(partition.inputs[1].op) is None:
            continue
        paths = _dedicated(partition, consumers, capacity_rows, workload, default_depth, overrides)
        if paths is None:
            continue
        if partition.id not in routings:
            routings[partition.id] = _Routing.of(partition)
        proof = _count(partition.name, routings[partition.id], paths)
        if proof is not None:
            return proof
    return None


def _dedicated(partition, consumers, capacity_rows, workload, default_depth, overrides) -> list | None:
    """The private path (module docstring, dedicated regions) of every output of ``partition``: the rows its
    smallest chain holds and its tile closing; None when the graph does not follow the pattern."""
    paths, reassemble = [], None
    for expert in range(partition.num_outputs):
        found = _chains(partition, expert, consumers)
        if found is None:
            return None
        sink, chains = found
        if sink[1] != expert or reassemble not in (None, sink[0]):
            return None
        reassemble = sink[0]
        rows = [_chain_rows(chain, capacity_rows, workload, default_depth, overrides) for chain in chains]
        if not rows or None in rows:
            return None
        end = _tiling_end(partition, expert, consumers)
        pre = _pre_path(end, capacity_rows, workload) if end is not None else None
        chunk, lookahead = (pre[3], pre[4]) if pre is not None and pre[0] is partition else (None, False)
        paths.append(_Path(expert, min(rows), 0, chunk, lookahead))
    if (reassemble is None or reassemble.rank != 0
            or not _same_routing(_selectors(partition.inputs[1].op), _selectors(reassemble.inputs[-1].op))):
        return None
    return paths


def _chains(partition, expert, consumers):
    """``((Reassemble, position), chains)``: every chain of ``(op, output)`` steps from ``partition``'s output
    ``expert`` to a Reassemble input through :data:`DEDICATED_KINDS` operators (weight loads a token tile
    triggers are left out: no token goes on from them); None when it reaches anything else, two Reassemble
    inputs, or more than :data:`MAX_CHAINS` chains."""
    sink, chains = None, []
    pending = [[(partition, expert)]]
    while pending:
        chain = pending.pop()
        op, out = chain[-1]
        for reader, position in consumers.get((op.id, out), ()):  # an output nobody reads ends there
            if reader.kind == "Reassemble":
                if sink not in (None, (reader, position)):
                    return None
                sink = (reader, position)
                chains.append(chain)
            elif reader.kind == "LinearOffChipLoad":  # a weight load its token tile triggers (ref input)
                continue
            elif reader.kind not in DEDICATED_KINDS or any(reader is o for o, _ in chain):
                return None
            else:
                pending.extend(chain + [(reader, index)] for index in range(reader.num_outputs))
        if len(chains) + len(pending) > MAX_CHAINS:
            return None
    return (sink, chains) if sink is not None else None


def _chain_rows(chain, capacity_rows, workload, default_depth, overrides) -> int | None:
    """Rows one chain holds at most (module docstring): its channels and operators, the repeats of a
    RepeatStatic counted as the tiles they can hold."""
    rows = capacity_rows(chain[0][0][chain[0][1]])
    repeat = None  # (R, element slots, largest rows) inside a RepeatStatic's run
    for (before, index), (op, out) in zip(chain, chain[1:]):
        ref = op[out]
        # the tokens it holds come in on the chain (a weight tile beside them holds none) and leave on its outputs
        op_rows = [_rows(s, workload) for s in op.outputs] + [_rows(before.outputs[index], workload)]
        step, depth = capacity_rows(ref), channel_capacity(op, out, default_depth, overrides)
        if rows is None or step is None or None in op_rows:
            return None
        if repeat is not None and op.kind in REDUCING_KINDS:  # the run ends: its slots as whole tiles
            count, slots, tile = repeat
            rows += (-(-slots // count) + 1) * tile
            repeat = None
        if repeat is not None:
            count, slots, tile = repeat
            repeat = (count, slots + HELD_ELEMENTS + depth, max(tile, *op_rows))
            continue
        rows += HELD_ELEMENTS * max(op_rows)
        if op.kind == "RepeatStatic":
            repeat = (op.count, depth, max(op_rows))
        else:
            rows += step
    return None if repeat is not None else rows


def _tiling_end(partition, expert, consumers):
    """The last output of the expert's tiling chain (Reshape, Flatten, Accum, one reader each) right after
    ``partition``'s output ``expert``, or None."""
    op, out, end = partition, expert, None
    while True:
        readers = consumers.get((op.id, out), ())
        if len(readers) != 1 or readers[0][0].kind not in PRE_KINDS:
            return end
        op, out = readers[0][0], 0
        end = op[0]


def _region(merge, back, consumers, capacity_rows, workload):
    """``(the token Partition, the region's paths)`` when ``merge`` heads the pattern of the module docstring
    with ``back`` (the Partition whose selector is ``merge``'s) as its back-partition, else None."""
    if back is None or not _keeps_order(merge, back, consumers):
        return None
    partition, reassemble, paths = None, None, []
    for index, ref in enumerate(merge.inputs):
        pre = _pre_path(ref, capacity_rows, workload)
        post = _post_path(back, index, consumers, capacity_rows, workload)
        if pre is None or post is None:
            return None
        (source, expert, pre_rows, chunk, lookahead), (sink, position, post_rows) = pre, post
        if expert != position or partition not in (None, source) or reassemble not in (None, sink):
            return None
        partition, reassemble = source, sink
        paths.append(_Path(expert, pre_rows, post_rows, chunk, lookahead))
    routing = _selectors(partition.inputs[1].op)
    if (partition.rank != 0 or reassemble.rank != 0 or routing is None
            or not _same_routing(routing, _selectors(reassemble.inputs[-1].op))):
        return None
    return partition, paths


@dataclass
class _Routing:
    """The tokens of a Partition's selectors: ``tokens[e]`` the tokens routed to output ``e`` (ascending), and
    ``before[u, e]`` how many of them come before token ``u`` (``batch + 1`` rows)."""

    tokens: list
    before: np.ndarray
    batch: int

    @classmethod
    def of(cls, partition) -> _Routing:
        ptr, targets = _selectors(partition.inputs[1].op)
        batch, outputs = len(ptr) - 1, partition.num_outputs
        position = np.repeat(np.arange(batch), np.diff(ptr))
        routed = np.zeros((batch, outputs), dtype=np.int64)
        routed[position, targets] = 1
        before = np.vstack([np.zeros((1, outputs), dtype=np.int64), np.cumsum(routed, axis=0)])
        return cls([position[targets == e] for e in range(outputs)], before, batch)


def _count(merge: str, routing: _Routing, paths: list) -> DeadlockProof | None:
    """Step 4 of the module docstring over every ``y``, its tokens ``t`` (ascending) and every ``x`` of the
    region (in merge-input order), all ``(t, x)`` of one ``y`` at once."""
    experts = np.array([p.expert for p in paths])
    capacity = np.array([p.pre + p.post for p in paths])
    for column, y in enumerate(paths):
        if y.chunk is None:
            continue
        ys = routing.tokens[y.expert]
        end = (np.arange(len(ys)) // y.chunk + 1) * y.chunk  # y's tokens [.., end) fill each token's tile
        if y.lookahead:
            until = np.append(ys, routing.batch)[np.minimum(end, len(ys))]
        else:
            until = np.append(ys, routing.batch)[np.where(end <= len(ys), end - 1, len(ys))]
        # x's tokens strictly between t and until
        rows = routing.before[until][:, experts] - routing.before[ys + 1][:, experts]
        over = rows > capacity
        over[:, column] = False
        if over.any():
            j, i = np.argwhere(over)[0]
            x = paths[i]
            return DeadlockProof(merge, x.expert, y.expert, int(ys[j]), int(until[j]), int(rows[j, i]), x.pre,
                                 x.post, routing.batch)
    return None


def _keeps_order(merge, back, consumers) -> bool:
    """Whether ``back`` reads, as its data, what ``merge``'s data output becomes through order-keeping
    operators only (:data:`IN_ORDER_KINDS`; the region's weight loads may join them)."""
    pending, seen = [merge], set()
    while pending:
        op = pending.pop()
        for index in ([0] if op is merge else range(op.num_outputs)):
            for consumer, position in consumers.get((op.id, index), ()):
                if consumer is back:
                    if position != 0:
                        return False
                elif consumer.kind not in IN_ORDER_KINDS:
                    return False
                elif consumer.id not in seen:
                    seen.add(consumer.id)
                    pending.append(consumer)
    return True


def _pre_path(ref, capacity_rows, workload):
    """``(Partition, its output index, rows held, chunk, lookahead)`` of the pre path ending at the EagerMerge
    input ``ref``, or None when it is not Accum / Flatten / Reshape operators with one reader each, fed by a
    Partition output. ``chunk`` is the Reshape's chunk size when the Accum's groups are its chunks (else
    None: the tile closing is not known)."""
    rows = capacity_rows(ref)
    kinds, reshape, accum = [], None, None
    while ref.op.kind in PRE_KINDS:
        op = ref.op
        held = _held_rows(op, workload)
        if rows is None or held is None or len(op.inputs) != 1:
            return None
        kinds.append(op.kind)
        reshape = op if op.kind == "Reshape" else reshape
        accum = op if op.kind == "Accum" else accum
        ref = op.inputs[0]
        step = capacity_rows(ref)
        rows = None if step is None else rows + held + step
    if ref.op.kind != "Partition" or rows is None:
        return None
    chunk = None
    if (reshape is not None and accum is not None and reshape.rank == 0 and accum.rank == 1
            and kinds.index("Accum") < kinds.index("Reshape")
            and accum.inputs[0].stream.shape[-1] == reshape.outputs[0].shape[-1] == reshape.chunk_size):
        chunk = reshape.chunk_size
    return ref.op, ref.index, rows, chunk, bool(reshape is not None and reshape.add_outer_dim)


def _post_path(back, index, consumers, capacity_rows, workload):
    """``(Reassemble, its input position, rows held)`` of the post path from ``back``'s output ``index``, or
    None when it is not RetileStreamify / Map / Flatten operators leading to a Reassemble."""
    op, out, rows = back, index, 0
    while True:
        readers = consumers.get((op.id, out), ())
        if len(readers) != 1:
            return None
        step = capacity_rows(op[out])
        if step is None:
            return None
        rows += step
        reader, position = readers[0]
        if reader.kind == "Reassemble":
            return reader, position, rows
        held = _held_rows(reader, workload)
        if reader.kind not in POST_KINDS or reader.num_outputs != 1 or held is None:
            return None
        rows += held
        op, out = reader, 0


def _held_rows(op, workload) -> int | None:
    """Rows an operator of a private path holds at most: :data:`HELD_ELEMENTS` of its largest element."""
    sizes = [_rows(ref.stream, workload) for ref in op.inputs] + [_rows(s, workload) for s in op.outputs]
    return None if None in sizes else HELD_ELEMENTS * max(sizes)


def _rows(stream, workload) -> int | None:
    """Rows of one element of ``stream`` with the trace's bindings (1 for a non-tile element); None when
    symbolic."""
    rows = getattr(stream.dtype, "rows", 1)
    try:
        return evaluate(rows, workload.bindings)
    except MetricError:
        return None


def _origin(ref) -> tuple[int, int]:
    """``(producer id, output index)`` of ``ref``, looking through Broadcasts."""
    while ref.op.kind == "Broadcast":
        ref = ref.op.inputs[0]
    return ref.op.id, ref.index


def _selectors(op):
    """``(ptr, targets)`` of a SelectorSource (through Broadcasts), or None."""
    while op.kind == "Broadcast":
        op = op.inputs[0].op
    return (op.ptr, op.targets) if op.kind == "SelectorSource" else None


def _same_routing(a, b) -> bool:
    return b is not None and np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
