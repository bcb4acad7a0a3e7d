"""Analytical FIFO depths: StreamTensor's linear program over start-time offsets on reconvergent paths.

Why: when a stream forks and the branches meet again (a fork/join, a Partition/Reassemble pair), the join can
only start once its slowest input delivers; meanwhile the fast branch keeps producing, and its tokens must wait
in FIFOs. If those FIFOs are too shallow, the fast branch stalls (back-pressure) and, through the fork, so does
the slow one: the run slows down or deadlocks. StreamTensor (a PyTorch-to-FPGA stream compiler) sizes these
FIFOs with a linear program; this module applies that formulation to a STeP graph.

Model (the assumptions, all first-order; :func:`stepsim.passes.size_fifos` checks the answer by simulation):

* **Units and edges.** One node per operator (Zips are fused into their Map, as in the lowering), one edge
  per channel with a consumer. Feedback edges (cycles closed with ``graph.connect``) are left out of the LP
  and keep the base depth.
* **Token counts** ``n_e``: each stream's element count from its symbolic shape with the trace's bindings
  (:mod:`stepsim.graph.channels`), so data-dependent streams (a Partition's output e) carry the number of
  tokens the trace routes there.
* **Per-firing cost** ``c_u`` (cycles), from the timing model (``docs``: docs/timing_model.md §3, §4, §8): FLOP-based
  compute operators ``ceil(FLOPs / compute_bw)`` per firing (total FLOPs over firings); fixed-cost functions
  their fixed cycles; off-chip loads and stores the tile's bytes at the HBM peak
  (``Hardware.hbm_peak_bytes_per_cycle``); selector/metadata sources, buffers, repeats and sinks 1 cycle per
  element; routing and shape operators 0. A unit fires once per element of its largest input stream (its
  output stream for sources).
* **Latency** ``L_u``: cycles from a unit's first firing to its first output: ``c_u`` times the firings per
  output element (an Accum emits once per reduced group), plus the 1-cycle hop every channel adds
  (docs/timing_model.md §1.4); off-chip loads add the HBM start-up and latency.
* **Rates.** A static dataflow graph runs at the pace of its bottleneck: ``T = max_u c_u * firings_u``
  cycles, and every stream spreads its ``n_e`` tokens evenly over ``T``: the period of edge e is
  ``p_e = T / n_e`` cycles per token.

Linear program (variables: the start time ``s_u >= 0`` of every unit)::

    minimize    sum_e  w_e / p_e * (s_v - s_u - L_u)        e = (u -> v), w_e = element bytes
    subject to  s_v - s_u >= L_u                            for every edge e = (u -> v) of the DAG

``sigma_e = s_v - s_u - L_u`` is how long the first token of e waits for its consumer to start; in steady
state ``sigma_e / p_e`` tokens are in flight, so the depth that avoids back-pressure is

    depth_e = max(base, ceil(sigma_e / p_e))

with ``base = 2`` (the smallest depth at which two back-to-back units are not slowed by the credit round
trip, docs/timing_model.md §1.4). On a reconvergent path the constraints force the slacks of the fast branch to add
up to the latency difference; the objective puts them on the edges where they cost the fewest bytes. (The
constraint matrix is a network matrix, so HiGHS returns an integral vertex for integral latencies.) The LP is
solved with ``scipy.optimize.linprog(method="highs")``.

What it does not capture: data-dependent timing (which expert a token goes to decides when it arrives), the
HBM's arbitration, bursts (operators that emit many elements at once), and rates that change during the run.
Those are what the simulation refinement of :func:`stepsim.passes.size_fifos` handles; the LP gives it a
starting point and ``lp_fifo_bytes`` in the report.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from stepsim.base.errors import ConfigError, SimulationError
from stepsim.base.hardware import Hardware
from stepsim.graph import ops_memory as M
from stepsim.graph.channels import ChannelInfo, _value, channel_infos
from stepsim.graph.graph import Graph

#: smallest depth without the credit round-trip bubble (docs/timing_model.md §1.4)
BASE_DEPTH = 2
#: operators that spend one cycle per element
_ONE_CYCLE = {"SelectorSource", "MetadataSource", "Bufferize", "Streamify", "DynStreamify", "RepeatStatic",
              "Sink", "ExpertAddrGen", "CacheReadAddrGen"}
_MEMORY = (M.LinearOffChipLoad, M.RandomOffChipLoad, M.LinearOffChipStore, M.RandomOffChipStore)


@dataclass(frozen=True)
class UnitTiming:
    """Timing-model parameters of one unit (cycles)."""

    firings: int
    cost: int
    latency: int

    @property
    def busy(self) -> int:
        return self.firings * self.cost


@dataclass(frozen=True)
class LPResult:
    """Result of :func:`lp_depths`.

    Attributes
    ----------
    depths : dict of str to int
        Channel name -> depth (elements), every channel of the graph.
    slack : dict of str to float
        Channel name -> ``sigma_e`` (cycles) for the edges in the LP.
    period : dict of str to float
        Channel name -> ``p_e`` (cycles per token).
    timing : dict of str to UnitTiming
        Operator name -> its timing-model parameters.
    bottleneck_cycles : int
        ``T``.
    channels : list of ChannelInfo
    """

    depths: dict
    slack: dict
    period: dict
    timing: dict
    bottleneck_cycles: int
    channels: list

    def fifo_bytes(self) -> int:
        """Total FIFO bytes at the LP's depths."""
        return sum(self.depths[c.name] * c.elem_bytes for c in self.channels)


def unit_timing(graph: Graph, channels: list[ChannelInfo], bindings: dict, hardware: Hardware) -> dict:
    """Operator name -> :class:`UnitTiming` (see the module docstring for the cost model)."""
    tokens_in: dict[str, int] = {}
    tokens_out: dict[str, int] = {}
    for ch in channels:
        tokens_out[ch.producer.name] = max(tokens_out.get(ch.producer.name, 0), ch.tokens)
        if ch.consumer is not None:
            tokens_in[ch.consumer.name] = max(tokens_in.get(ch.consumer.name, 0), ch.tokens)
    peak = hardware.hbm_peak_bytes_per_cycle
    out = {}
    for op in graph.ops:
        if op.kind == "Zip":
            continue
        n_out = tokens_out.get(op.name, 0)
        firings = tokens_in.get(op.name, n_out)
        fn = getattr(op, "fn", None)
        extra = 0
        if isinstance(op, _MEMORY):
            tile = op.tile_rows * op.tile_cols * _memory_elem_bytes(op)
            cost = max(1, math.ceil(tile / peak))
            extra = hardware.hbm_start_up + hardware.hbm_latency
            if isinstance(op, M.LinearOffChipLoad) and not op.has_ref:
                firings = n_out
        elif fn is not None and getattr(op, "compute_bw", None) is not None:
            if fn.fixed_cycles is not None:
                cost = int(fn.fixed_cycles)
            else:
                flops = _value(op.flops(), bindings)
                cost = math.ceil(flops / op.compute_bw / firings) if firings and op.compute_bw else 0
        elif op.kind in _ONE_CYCLE:
            cost = 1
        else:
            cost = 0
        per_output = math.ceil(firings / n_out) if n_out else 1
        out[op.name] = UnitTiming(firings=firings, cost=cost, latency=cost * max(per_output, 1) + 1 + extra)
    return out


def _memory_elem_bytes(op) -> int:
    tensor = getattr(op, "tensor", None)
    if tensor is not None:
        return tensor.dtype.bytes
    return op.inputs[0].stream.dtype.dtype.bytes


def _back_edges(channels: list[ChannelInfo]) -> set[str]:
    """Channels closing a cycle (found by depth-first search from the operators in graph order)."""
    succ: dict[str, list[tuple[str, str]]] = {}
    order: list[str] = []
    for ch in channels:
        for name in (ch.producer.name, *((ch.consumer.name,) if ch.consumer else ())):
            if name not in succ:
                succ[name] = []
                order.append(name)
        if ch.consumer is not None:
            succ[ch.producer.name].append((ch.consumer.name, ch.name))
    state: dict[str, int] = {}  # 1 on the stack, 2 done
    back: set[str] = set()
    for root in order:
        if root in state:
            continue
        stack = [(root, iter(succ[root]))]
        state[root] = 1
        while stack:
            node, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                state[node] = 2
                stack.pop()
                continue
            child, chan = nxt
            if state.get(child) == 1:
                back.add(chan)
            elif child not in state:
                state[child] = 1
                stack.append((child, iter(succ[child])))
    return back


def lp_depths(graph: Graph, bindings: dict | None = None, hardware: Hardware | None = None, *,
              base_depth: int = BASE_DEPTH, channels: list[ChannelInfo] | None = None) -> LPResult:
    """Solve the module's LP for ``graph`` with the trace values ``bindings``.

    Parameters
    ----------
    graph : Graph
    bindings : dict, optional
        Symbol values (a Workload's ``bindings``).
    hardware : Hardware, optional
        Default the ``step-eval`` preset.
    base_depth : int
        Smallest depth given to any channel.
    channels : list of ChannelInfo, optional
        Precomputed :func:`~stepsim.graph.channels.channel_infos` of ``graph``.

    Raises
    ------
    SimulationError
        HiGHS did not find an optimum (it always should: the LP is feasible and bounded below by 0).
    """
    try:
        from scipy.optimize import linprog
        from scipy.sparse import coo_matrix
    except ImportError as exc:
        raise ConfigError(f"FIFO sizing needs SciPy's HiGHS solver ({exc}); install it with "
                          "pip install 'stepsim[passes]' (or 'scipy')") from None

    bindings = bindings or {}
    hardware = hardware or Hardware.preset("step-eval")
    channels = channels if channels is not None else channel_infos(graph, bindings)
    timing = unit_timing(graph, channels, bindings, hardware)
    bottleneck = max([t.busy for t in timing.values()] + [1])
    back = _back_edges(channels)
    edges = [ch for ch in channels if ch.consumer is not None and ch.name not in back and ch.tokens > 0]
    nodes = sorted({n for ch in edges for n in (ch.producer.name, ch.consumer.name)},
                   key=lambda n: graph.op(n).id)
    index = {n: i for i, n in enumerate(nodes)}
    period = {ch.name: bottleneck / ch.tokens for ch in edges}
    cost = np.zeros(len(nodes))
    rows, cols, vals, rhs = [], [], [], []
    for k, ch in enumerate(edges):
        u, v = index[ch.producer.name], index[ch.consumer.name]
        weight = ch.elem_bytes / period[ch.name]
        cost[v] += weight
        cost[u] -= weight
        rows += [k, k]
        cols += [u, v]
        vals += [1.0, -1.0]
        rhs.append(-float(timing[ch.producer.name].latency))  # s_u - s_v <= -L_u
    slack: dict[str, float] = {}
    if edges:
        a_ub = coo_matrix((vals, (rows, cols)), shape=(len(edges), len(nodes))).tocsr()
        res = linprog(cost, A_ub=a_ub, b_ub=np.array(rhs), bounds=(0, None), method="highs")
        if res.status != 0:
            raise SimulationError(f"FIFO sizing LP for graph {graph.name!r} failed: {res.message}")
        s = np.round(res.x, 6)
        for ch in edges:
            slack[ch.name] = max(0.0, float(s[index[ch.consumer.name]] - s[index[ch.producer.name]]
                                            - timing[ch.producer.name].latency))
    depths = {}
    for ch in channels:
        need = math.ceil(slack[ch.name] / period[ch.name] - 1e-9) if ch.name in slack else 0
        depths[ch.name] = max(base_depth, need)
    return LPResult(depths=depths, slack=slack, period=period, timing=timing, bottleneck_cycles=bottleneck,
                    channels=channels)
