"""``size_fifos``: per-channel FIFO depths that finish, stay within ``slack`` of unbounded FIFOs, and use few bytes.

Two layers (both always run):

1. **Analytical start** (:mod:`stepsim.passes.fifo_lp`): token counts from the symbolic shapes and the trace,
   unit costs and latencies from the timing model, StreamTensor's LP over start-time offsets. It gives depths
   that avoid back-pressure on the static parts of the graph (``lp_fifo_bytes``).
2. **Simulation refinement** for the data-dependent parts (routing, merging, dynamic tiles):

   a. run with every FIFO 1024 deep (the artifact's "unbounded" ``None``): ``unbounded_cycles`` and each
      channel's peak occupancy, an upper bound ``ub`` on what it needs (never below ``min_depth``);
   b. check ``ub`` (every channel at its peak) by simulation, then the LP's depths clipped to
      ``[min_depth, ub]``; the cheaper one that passes is the starting state;
   c. shrink groups of equivalent channels (one role in every expert or region,
      :mod:`stepsim.graph.channels`), largest bytes first: a search over a cap ``k`` (each channel of the
      group gets ``min(its depth, k)``) between ``min_depth`` and the group's largest depth, keeping the
      smallest cap that passes. The first probe of a group is ``min_depth`` itself (most groups get there
      in one run), then bisection. With ``jobs > 1`` each round probes ``jobs`` caps at once on the sweep's
      local executor (:class:`stepsim.batch.executors.LocalExecutor`), so the search takes
      ``log_(jobs+1)`` rounds instead of ``log_2``.

   d. **Agreement with the deadlock diagnosis.** Before 2a the graph runs once at its default FIFO depth; if
      it deadlocks, the channels the diagnosis names (:mod:`stepsim.analysis.deadlock`: the full channels of
      the wait cycles, the ones its message tells the user to deepen) get a floor of their default depth + 1
      through the whole refinement, so the sized file deepens every channel the diagnosis named
      (``deadlock_fix_channels``). Without the floor the search often breaks the same cycle by deepening
      another channel of it (a cheaper one of equal effect), which would leave the two pieces of advice
      disagreeing; the floor costs a few elements (``deadlock_fix_bytes``, counted in the total).

   A candidate *passes* when every trace's run finishes and takes at most ``floor(U * (1 + slack))`` cycles,
   ``U`` being that trace's cycles with unbounded FIFOs. Every accepted state was simulated, so the result is verified as returned. The
   search assumes that a deeper cap never fails where a shallower one passes (true in practice; the answer
   is verified either way).

The result is deterministic: every decision depends only on simulated cycle counts and on names sorted in a
fixed order; the same inputs give the same depths and the same file. The sizing ignores depths a workload
already carries (``Workload.channel_depths``), so re-running it on a workload loaded with its own output
gives the same depths again.

``uniform_fifo_bytes`` is the FIFO memory of the same graph with every channel at the smallest uniform depth
that finishes (``uniform_depth``; found by doubling from 1 and bisection, counted in ``uniform_simulations``,
not in ``simulations``).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from stepsim.base.errors import ArgumentError, SimulationError
from stepsim.base.files import arrays_sha256
from stepsim.base.hardware import Hardware
from stepsim.graph.channels import ChannelInfo, channel_infos, graph_fingerprint
from stepsim.graph.graph import Graph
from stepsim.passes.fifo_lp import BASE_DEPTH, lp_depths
from stepsim.workloads.base import Workload

#: the artifact's "unbounded" FIFO (step-perf's DEFAULT_CHAN_SIZE for ``None``)
UNBOUNDED_DEPTH = 1024
#: keys of :meth:`SizingResult.report` (``--json``)
REPORT_KEYS = ("cycles", "unbounded_cycles", "total_fifo_bytes", "uniform_fifo_bytes", "uniform_depth",
               "lp_fifo_bytes", "unbounded_fifo_bytes", "simulations", "uniform_simulations", "channels_changed",
               "deadlock_fix_channels", "deadlock_fix_bytes")


@dataclass
class SizingResult:
    """What :func:`size_fifos` found.

    Attributes
    ----------
    depths : dict of str to int
        Channel name -> depth (elements), every channel of the graph, in lowering order.
    cycles : int
        Cycles with ``depths`` (the largest over the traces).
    unbounded_cycles : int
        Cycles with every FIFO 1024 deep (the largest over the traces).
    total_fifo_bytes, lp_fifo_bytes, unbounded_fifo_bytes, uniform_fifo_bytes : int
        Sum over channels of depth x element bytes for the sized, LP, 1024-deep and uniform depths.
    uniform_depth : int
        The smallest uniform depth with which every trace's run finishes.
    simulations : int
        Engine runs the sizing took (unbounded run and refinement, every trace counted).
    uniform_simulations : int
        Engine runs of the uniform-depth search.
    channels_changed : int
        Channels whose depth differs from the workload's default FIFO depth.
    default_depth : int
        That default.
    lp_depths : dict of str to int
        The LP's depths.
    groups : list of (str, int, int)
        Per group of equivalent channels (sorted by role): label (first channel, count, per expert/region),
        bytes at 1024 deep, bytes sized.
    fingerprint : str
        :func:`~stepsim.graph.channels.graph_fingerprint` of the graph.
    graph_name : str
    identity : dict
        The workload's identity (``workload``, ``params``; ``config`` when sized from a config).
    trace_hashes : list of str
        SHA-256 of each trace sized on.
    slack : float
    deadlock_fix_channels : dict of str to int
        The channels the deadlock diagnosis named at the default depth, with the floor the sizing kept them at
        (default depth + 1); empty when the default depth finishes.
    deadlock_fix_bytes : int
        Bytes of those channels at their floors (floor x element bytes, summed).
    """

    depths: dict
    cycles: int
    unbounded_cycles: int
    total_fifo_bytes: int
    lp_fifo_bytes: int
    unbounded_fifo_bytes: int
    uniform_fifo_bytes: int
    uniform_depth: int
    simulations: int
    uniform_simulations: int
    channels_changed: int
    default_depth: int
    lp_depths: dict
    groups: list
    fingerprint: str
    graph_name: str
    identity: dict = field(default_factory=dict)
    trace_hashes: list = field(default_factory=list)
    slack: float = 0.01
    deadlock_fix_channels: dict = field(default_factory=dict)
    deadlock_fix_bytes: int = 0

    def report(self) -> dict:
        """The report as plain data (the ``--json`` object, keys :data:`REPORT_KEYS`)."""
        return {key: getattr(self, key) for key in REPORT_KEYS}

    def text(self) -> list[str]:
        """Human-readable report lines (bytes as every view writes them: ``format_bytes``, then the exact count)."""
        from stepsim.base.display import format_bytes as fb

        over = 100.0 * (self.cycles / self.unbounded_cycles - 1.0) if self.unbounded_cycles else 0.0
        return [
            f"graph {self.graph_name}: {len(self.depths):,} channels, sized on {len(self.trace_hashes)} trace(s)",
            f"cycles              {self.cycles:,} ({over:+.3f} % vs unbounded; slack {100 * self.slack:g} %)",
            f"unbounded cycles    {self.unbounded_cycles:,} (every FIFO {UNBOUNDED_DEPTH} deep)",
            f"FIFO bytes sized    {fb(self.total_fifo_bytes)} ({self.total_fifo_bytes:,} B)",
            f"FIFO bytes LP       {fb(self.lp_fifo_bytes)} ({self.lp_fifo_bytes:,} B)",
            f"FIFO bytes uniform  {fb(self.uniform_fifo_bytes)} ({self.uniform_fifo_bytes:,} B; every FIFO "
            f"{self.uniform_depth} deep, the smallest uniform depth that finishes)",
            f"FIFO bytes 1024     {fb(self.unbounded_fifo_bytes)} ({self.unbounded_fifo_bytes:,} B; "
            f"{self.unbounded_fifo_bytes / max(self.total_fifo_bytes, 1):,.0f}x the sized total)",
            f"simulations         {self.simulations} (+{self.uniform_simulations} for the uniform depth)",
            f"channels changed    {self.channels_changed:,} (depth other than the default {self.default_depth})",
        ] + ([f"deadlock fix        {len(self.deadlock_fix_channels):,} channel(s) the diagnosis named at depth "
              f"{self.default_depth} kept deeper ({self.deadlock_fix_bytes:,} B)"] if self.deadlock_fix_channels
             else [])


@dataclass
class _Case:
    """One trace's workload (or a bare graph) to simulate, and its program lowered once."""

    target: Workload | Graph
    hardware: Hardware
    trace_hash: str
    config: dict | None = None
    program: object = None
    names: list | None = None

    def lowered(self):
        """The program with every FIFO 1024 deep (lowered on first use)."""
        if self.program is None:
            from stepsim.graph.lower import lower
            from stepsim.kernels import abi

            graph = self.target.graph if isinstance(self.target, Workload) else self.target
            program = lower(graph, self.hardware, channel_depth=UNBOUNDED_DEPTH)
            # Bufferize arena regions are sized from their output FIFO's depth in the builder: re-lower those
            reuse = not (program.unit_params[:, abi.UP_OPCODE] == abi.OP_BUFFERIZE).any()
            self.program, self.names = (program if reuse else False), list(program.channel_names)
        return self.program


def _array_hash(trace: Mapping) -> str:
    return arrays_sha256(trace)  # in base.files: applying a depths file compares it too


def _cases(target, traces, hardware) -> list[_Case]:
    from stepsim.base.files import trace_sha256
    from stepsim.results.records import build_workload  # an ONNX model through the front end, as `run` builds it
    from stepsim.workloads.config import normalize_config, resolve_hardware, resolved_trace

    if isinstance(target, Mapping):
        cfg = normalize_config({**target, "mode": "simulate"})
        paths = list(traces) if traces else [resolved_trace(cfg)]
        cases = []
        for path in paths:
            one = {**cfg, "trace": str(path) if path is not None else None, "fifo_depths": None}
            workload = build_workload(one)
            hw = _hardware(hardware) or resolve_hardware(one, workload)
            cases.append(_Case(workload, hw, trace_sha256(path) if path is not None else "", config=one))
        return cases
    if traces:
        raise ArgumentError("size_fifos: traces= applies to a config mapping (one workload is built per trace); "
                            "a Workload or Graph already carries its trace")
    if isinstance(target, Workload):
        hw = _hardware(hardware) or Hardware.preset(target.hardware)
        return [_Case(target, hw, _array_hash(target.trace) if target.trace else "")]
    if isinstance(target, Graph):
        return [_Case(target, _hardware(hardware) or Hardware.preset("step-eval"), "")]
    raise ArgumentError(f"size_fifos: expected a Workload, a Graph or a config mapping, got {type(target).__name__}")


def _hardware(hardware) -> Hardware | None:
    if hardware is None or isinstance(hardware, Hardware):
        return hardware
    if isinstance(hardware, str):
        return Hardware.from_toml(hardware) if hardware.endswith(".toml") else Hardware.preset(hardware)
    raise ArgumentError(f"size_fifos: hardware must be a Hardware, a preset name or a .toml path, got {hardware!r}")


def _simulate(case: _Case, depths: dict) -> tuple[int | None, np.ndarray | None]:
    """(cycles, peak occupancy per channel), or (None, None) when the run does not finish.

    The graph is lowered once per case; a candidate only replaces the program's channel capacities (what
    lowering with ``channel_depths`` would give, without re-walking thousands of operators per candidate).
    """
    import dataclasses

    from stepsim.kernels import run
    from stepsim.simulation.simulate import simulate

    program = case.lowered()
    try:
        if program is False:
            res = simulate(case.target, case.hardware, channel_depth=UNBOUNDED_DEPTH, channel_depths=depths)
        else:
            capacity = np.array([depths[n] for n in case.names], dtype=np.int64)
            capacity.setflags(write=False)
            res = run(dataclasses.replace(program, ch_capacity=capacity))
    except SimulationError:
        return None, None
    return int(res.cycles), res.channel_counters[:, 1]


# --- parallel candidate runs on the sweep executor -----------------------------------------------------
_WORKER_CACHE: dict[str, _Case] = {}


def _worker_cycles(config: dict, depths: dict) -> int | None:
    """Worker side: build and lower (once per process) the workload of ``config``; simulate it with ``depths``."""
    import json

    from stepsim.results.records import build_workload
    from stepsim.workloads.config import resolve_hardware

    key = json.dumps(config, sort_keys=True)
    if key not in _WORKER_CACHE:
        _WORKER_CACHE.clear()
        workload = build_workload(config)
        _WORKER_CACHE[key] = _Case(workload, resolve_hardware(config, workload), "")
    return _simulate(_WORKER_CACHE[key], depths)[0]


class _Runner:
    """Evaluates candidate depth maps: in this process, or ``jobs`` at a time on a local worker pool."""

    def __init__(self, cases: list[_Case], limits: list[int], jobs: int):
        self.cases, self.limits, self.simulations = cases, limits, 0
        self.pool = None
        if jobs > 1 and all(c.config is not None for c in cases):
            from stepsim.batch.executors import LocalExecutor

            self.pool = LocalExecutor(jobs, warm_kernels=True)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()

    def passes(self, candidates: list[dict]) -> list[tuple[bool, int | None]]:
        """For each candidate: (passes, largest cycles over the traces or None when a run did not finish); it
        passes when every trace's run finishes within that trace's limit."""
        self.simulations += len(candidates) * len(self.cases)
        if self.pool is None:
            results = [[_simulate(c, d)[0] for c in self.cases] for d in candidates]
        else:
            futures = [[self.pool._pool.submit(_worker_cycles, c.config, d) for c in self.cases] for d in candidates]
            results = [[f.result() for f in row] for row in futures]
        out = []
        for cycles in results:
            if any(c is None for c in cycles):
                out.append((False, None))
            else:
                out.append((all(c <= lim for c, lim in zip(cycles, self.limits)), max(cycles)))
        return out


def _fifo_bytes(channels: list[ChannelInfo], depths: Mapping[str, int]) -> int:
    return sum(depths[c.name] * c.elem_bytes for c in channels)


def _role_label(role: tuple) -> str:
    return "/".join(str(x) for x in role)


def _group_label(role: tuple, group: list) -> str:
    """A readable name for a group of equivalent channels: its first channel, how many, and per what."""
    if role[0] == "channel":
        return group[0].name
    per = role[1] if role[0] == "into" else role[0]
    more = f" + {len(group) - 1} more" if len(group) > 1 else ""
    return f"{group[0].name}{more} ({'into ' if role[0] == 'into' else ''}each {per})"


def _uniform_search(cases: list[_Case], start: int) -> tuple[int, int]:
    """(smallest uniform depth with which every case finishes, simulations used)."""
    sims = 0

    def finishes(depth: int) -> bool:
        nonlocal sims
        for case in cases:
            sims += 1
            case.lowered()
            if _simulate(case, dict.fromkeys(case.names, depth))[0] is None:
                return False
        return True

    lo, hi = start - 1, start  # lo: known to fail (or below the range), hi: candidate
    while not finishes(hi):
        lo, hi = hi, min(2 * hi, UNBOUNDED_DEPTH)
        if lo == UNBOUNDED_DEPTH:
            raise SimulationError("size_fifos: the run does not finish even with every FIFO 1024 deep")
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if finishes(mid):
            hi = mid
        else:
            lo = mid
    return hi, sims


def size_fifos(target, traces: Sequence | None = None, *, slack: float = 0.01, hardware=None, jobs: int = 1,
               min_depth: int = 1, uniform: bool = True, progress=None) -> SizingResult:
    """Size every FIFO of a workload (see the module docstring for the method).

    Parameters
    ----------
    target : Workload, Graph or mapping
        What to size. A mapping is a run config (the knobs of :mod:`stepsim.workloads.config`); it is built
        once per trace of ``traces``.
    traces : sequence of paths, optional
        With a config mapping: the traces to size on (the depths must work on all of them); default the
        config's own trace. Must be None for a Workload or Graph (they carry their trace).
    slack : float
        Allowed cycle overhead over unbounded FIFOs (0.01 = 1 %).
    hardware : Hardware or str, optional
        Default: the workload's (a config's ``hardware`` knob, else its experiment's preset).
    jobs : int
        Candidate simulations run at once (config mappings only; a Workload or Graph runs in this process).
    min_depth : int
        Smallest depth the refinement gives a channel (default 1: a depth-1 FIFO costs a bubble per element,
        docs/timing_model.md §1.4, which the slack check accepts or refuses; the LP itself never goes below
        :data:`stepsim.passes.fifo_lp.BASE_DEPTH`).
    uniform : bool
        Also search the smallest uniform depth that finishes (``uniform_fifo_bytes``).
    progress : callable, optional
        Called with one line of text per step (the CLI prints them on stderr).

    Returns
    -------
    SizingResult

    Raises
    ------
    ArgumentError
        Bad ``slack``, ``jobs`` or ``min_depth``, or ``traces`` with a Workload/Graph.
    SimulationError
        The run does not finish even with 1024-deep FIFOs.
    """
    if isinstance(slack, bool) or not isinstance(slack, (int, float)) or not 0 <= slack < 1 or math.isnan(slack):
        raise ArgumentError(f"size_fifos: slack must be a number in [0, 1) (0.01 = 1 %), got {slack!r}")
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ArgumentError(f"size_fifos: jobs must be an int >= 1, got {jobs!r}")
    if isinstance(min_depth, bool) or not isinstance(min_depth, int) or not 1 <= min_depth <= UNBOUNDED_DEPTH:
        raise ArgumentError(f"size_fifos: min_depth must be an int in 1..{UNBOUNDED_DEPTH}, got {min_depth!r}")
    say = progress or (lambda line: None)
    cases = _cases(target, traces, hardware)
    first = cases[0].target
    graph = first.graph if isinstance(first, Workload) else first
    fingerprint = graph_fingerprint(graph)
    for case in cases[1:]:
        if graph_fingerprint(case.target.graph) != fingerprint:
            raise ArgumentError("size_fifos: the traces build different graphs (another batch size?); "
                                "size each graph on its own")
    per_case = [channel_infos(c.target.graph if isinstance(c.target, Workload) else c.target,
                              c.target.bindings if isinstance(c.target, Workload) else {}) for c in cases]
    # element bytes and token counts can differ per trace (dynamic tiles): size for the largest
    channels = [max(group, key=lambda c: (c.elem_bytes, c.tokens)) for group in zip(*per_case)]
    names = [c.name for c in channels]

    # 1. analytical start
    lp = [lp_depths(graph if i == 0 else (c.target.graph if isinstance(c.target, Workload) else c.target),
                    c.target.bindings if isinstance(c.target, Workload) else {}, c.hardware,
                    base_depth=max(BASE_DEPTH, min_depth), channels=per_case[i]) for i, c in enumerate(cases)]
    lp_map = {n: max(r.depths[n] for r in lp) for n in names}
    say(f"LP: {_fifo_bytes(channels, lp_map):,} FIFO bytes (bottleneck {lp[0].bottleneck_cycles:,} cycles)")

    # 2d first: the channels the deadlock diagnosis names at the default depth keep a floor above it
    floors, sims = _diagnosis_floors(cases)
    if floors:
        say(f"default depth deadlocks: {len(floors)} channel(s) the diagnosis names kept deeper")

    # 2a. unbounded run
    unbounded = {n: UNBOUNDED_DEPTH for n in names}
    cycles_u, peaks = [], []
    for case in cases:
        cycles, peak = _simulate(case, unbounded)
        sims += 1
        if cycles is None:
            raise SimulationError(f"size_fifos: graph {graph.name!r} does not finish even with every FIFO "
                                  f"{UNBOUNDED_DEPTH} deep")
        cycles_u.append(cycles)
        peaks.append(peak)
    u_cycles = max(cycles_u)
    limits = [math.floor(c * (1.0 + slack)) for c in cycles_u]
    peak = np.max(np.stack(peaks), axis=0)
    ub = {n: int(min(UNBOUNDED_DEPTH, max(min_depth, floors.get(n, 0), p))) for n, p in zip(names, peak)}
    say(f"unbounded: {u_cycles:,} cycles; limit {max(limits):,}; peak occupancy total {_fifo_bytes(channels, ub):,} B")

    runner = _Runner(cases, limits, jobs)
    runner.simulations = sims
    try:
        # 2b. starting state: peaks, then the LP inside them
        state, cycles = dict(unbounded), u_cycles
        (ok, c), = runner.passes([ub])
        if ok:
            state, cycles = ub, c
        lp_start = {n: min(state[n], max(min_depth, floors.get(n, 0), lp_map[n])) for n in names}
        if lp_start != state:
            (ok, c), = runner.passes([lp_start])
            if ok:
                state, cycles = lp_start, c
        say(f"start: {_fifo_bytes(channels, state):,} B at {cycles:,} cycles")

        # 2c. shrink groups of equivalent channels, largest bytes first
        members: dict[tuple, list[ChannelInfo]] = defaultdict(list)
        for ch in channels:
            members[ch.role].append(ch)
        order = sorted(members, key=lambda r: (-sum(state[c.name] * c.elem_bytes for c in members[r]),
                                               _role_label(r)))
        for role in order:
            group = members[role]
            hi = max(state[c.name] for c in group)
            lo = min_depth - 1
            first_round, searched = True, hi - lo > 1
            while hi - lo > 1:
                probes = _probes(lo, hi, jobs, first_round)
                first_round = False
                candidates = [{**state, **{c.name: max(floors.get(c.name, 0), min(state[c.name], k)) for c in group}}
                              for k in probes]
                results = runner.passes(candidates)
                passing = [(k, cand, c) for k, cand, (ok, c) in zip(probes, candidates, results) if ok]
                if passing:
                    k, cand, c = passing[0]
                    state, cycles, hi = cand, c, k
                failing = [k for k, (ok, _) in zip(probes, results) if not ok and k < hi]
                lo = max(failing) if failing else lo
            if searched:
                say(f"{_group_label(role, group)}: cap {hi} -> {_fifo_bytes(channels, state):,} B "
                    f"after {runner.simulations} simulations")
    finally:
        runner.close()

    uniform_depth, uniform_sims = 0, 0
    if uniform:
        uniform_depth, uniform_sims = _uniform_search(cases, 1)
    default_depth = (first.channel_depth if isinstance(first, Workload) else 2) or UNBOUNDED_DEPTH
    groups = []
    for role, group in sorted(members.items(), key=lambda kv: _role_label(kv[0])):
        groups.append((_group_label(role, group), sum(UNBOUNDED_DEPTH * c.elem_bytes for c in group),
                       sum(state[c.name] * c.elem_bytes for c in group)))
    identity = {"workload": first.name if isinstance(first, Workload) else "graph",
                "params": dict(first.params) if isinstance(first, Workload) else {}}
    if cases[0].config is not None:
        identity["config"] = {k: v for k, v in cases[0].config.items()
                              if v is not None and k not in ("trace", "mode", "fifo_depths")}
    return SizingResult(
        depths={n: int(state[n]) for n in names}, cycles=int(cycles), unbounded_cycles=int(u_cycles),
        total_fifo_bytes=_fifo_bytes(channels, state), lp_fifo_bytes=_fifo_bytes(channels, lp_map),
        unbounded_fifo_bytes=_fifo_bytes(channels, unbounded),
        uniform_fifo_bytes=uniform_depth * sum(c.elem_bytes for c in channels), uniform_depth=uniform_depth,
        simulations=runner.simulations, uniform_simulations=uniform_sims,
        channels_changed=sum(1 for n in names if state[n] != default_depth), default_depth=default_depth,
        lp_depths=lp_map, groups=groups, fingerprint=fingerprint, graph_name=graph.name, identity=identity,
        trace_hashes=[c.trace_hash for c in cases if c.trace_hash], slack=float(slack),
        deadlock_fix_channels=dict(floors),
        deadlock_fix_bytes=sum(floors[c.name] * c.elem_bytes for c in channels if c.name in floors))


def _diagnosis_floors(cases: list[_Case]) -> tuple[dict[str, int], int]:
    """``({channel: floor}, simulations)``: run every case at its default FIFO depths (ignoring depths it
    carries); for each that deadlocks, every channel the diagnosis names (``fix_channels``) gets a floor of
    its depth + 1."""
    from stepsim.base.errors import DeadlockError
    from stepsim.simulation.simulate import simulate

    floors: dict[str, int] = {}
    for case in cases:
        try:
            simulate(case.target, case.hardware, channel_depths=None)
        except DeadlockError as exc:
            if exc.diagnosis is not None:
                for name in exc.diagnosis.fix_channels:
                    floors[name] = max(floors.get(name, 0), exc.diagnosis.fix_capacities[name] + 1)
    return floors, len(cases)


def _probes(lo: int, hi: int, jobs: int, first: bool) -> list[int]:
    """Up to ``jobs`` caps strictly between ``lo`` (fails) and ``hi`` (passes), ascending. The first round of a
    group starts with ``lo + 1`` (the floor), which most groups reach, then spaces the others evenly."""
    if first:
        return [lo + 1] + (_probes(lo + 1, hi, jobs - 1, False) if jobs > 1 else [])
    n = min(jobs, hi - lo - 1)
    return sorted({lo + (i * (hi - lo)) // (n + 1) for i in range(1, n + 1)})


__all__ = ["REPORT_KEYS", "SizingResult", "UNBOUNDED_DEPTH", "size_fifos"]
