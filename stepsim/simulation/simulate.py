"""``stepsim.simulation.simulate``: lower a graph (or workload) and run it on the compiled engine.

Compilation happens on the first call in a process (numba's on-disk cache makes later processes fast);
``compile_s`` reports it separately from ``sim_wall_s`` (engine time only).

``functional=True`` runs the same engine with real tile values (:mod:`stepsim.kernels.values`): loads read
the given (or seeded random) tensors, stores write ``SimResult.outputs``; every timing result is unchanged.
"""

from __future__ import annotations

import time
import weakref
import zlib
from dataclasses import dataclass, field

import numpy as np

from stepsim.base.defaults import UNSET, resolve_channel_depth
from stepsim.base.hardware import Hardware
from stepsim.graph.graph import Graph
from stepsim.graph.lower import lower
from stepsim.kernels.arena import FunctionalStats
from stepsim.workloads.base import Workload

_UNSET = UNSET  # the name this module first used


@dataclass
class SimResult:
    """Result of one timing simulation.

    Attributes
    ----------
    cycles : int
        Simulated cycles.
    off_chip_bytes_read, off_chip_bytes_written : int
        Off-chip traffic measured by the engine (bytes).
    events : int
        Engine events processed.
    fires : int
        Unit firings.
    sim_wall_s, compile_s, lower_s : float
        Engine wall time, first-call compilation time, lowering time (seconds).
    unit_names, channel_names : list of str
        Names matching the rows of the counter arrays.
    unit_counters : int64 array (n_units, 5)
        fires, busy cycles, cycles blocked on input, cycles blocked on output, final clock.
    channel_counters : int64 array (n_channels, 2)
        pushes, peak occupancy.
    inputs, outputs : dict of str to float32 array, or None
        Functional mode: the tensors the run loaded and the tensors it stored, by name.
    functional : FunctionalStats or None
        Functional mode: value-arena usage.
    link_bytes : int64 array or None
        Bytes each unit carried over a link (Link units; 0 for the others).
    unit_opcodes : list of str or None
        Each unit's operator kind (``"Link"``, ``"Map"``, ...), matching ``unit_names``.
    """

    cycles: int
    off_chip_bytes_read: int
    off_chip_bytes_written: int
    events: int
    fires: int
    sim_wall_s: float
    compile_s: float
    lower_s: float
    unit_names: list = field(repr=False)
    channel_names: list = field(repr=False)
    unit_counters: np.ndarray = field(repr=False)
    channel_counters: np.ndarray = field(repr=False)
    inputs: dict | None = field(default=None, repr=False)
    outputs: dict | None = field(default=None, repr=False)
    functional: FunctionalStats | None = None
    #: default FIFO depth (elements) the run used, after the precedence of stepsim.base.defaults
    channel_depth: int | None = None
    #: ``simulate(..., timeline=...)``: the run's :class:`stepsim.simulation.timeline.Timeline` (Arrow tables)
    timeline: object | None = field(default=None, repr=False)
    link_bytes: np.ndarray | None = field(default=None, repr=False)
    unit_opcodes: list | None = field(default=None, repr=False)

    @property
    def off_chip_bytes(self) -> int:
        return self.off_chip_bytes_read + self.off_chip_bytes_written


_compiled = False


#: graph -> (bindings, channel_elements result): FIFO sizing simulates one graph dozens of times, other depths only
_ELEMENTS_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _channel_elements(target, graph, program) -> list[int] | None:
    """The elements each of ``program``'s channels carries (the run-size estimate's input), from the graph's
    stream shapes with a Workload's trace bindings; None when a shape is unbound or the names do not match."""
    from stepsim.graph.channels import channel_elements

    bindings = target.bindings if isinstance(target, Workload) else None
    cached = _ELEMENTS_CACHE.get(graph)
    if cached is not None and cached[0] is bindings and cached[1] == len(graph.ops):  # same graph, same values
        counts = cached[2]
    else:
        counts = channel_elements(graph, bindings)
        _ELEMENTS_CACHE[graph] = (bindings, len(graph.ops), counts)
    if counts is None or any(name not in counts for name in program.channel_names):
        return None
    return [counts[name] for name in program.channel_names]


def simulate(target: Graph | Workload, hardware: Hardware | str | None = None, *, channel_depth=_UNSET,
             max_events: int | None = None, functional: bool = False, inputs: dict | None = None, seed: int = 0,
             arena_tiles: int | None = None, progress=None, channel_depths=_UNSET, timeline: bool | int = False,
             force: bool = False) -> SimResult:
    """Simulate ``target`` (a Graph or a Workload).

    Parameters
    ----------
    target : Graph or Workload
        What to run. A Workload supplies its experiment's hardware preset and FIFO depth as defaults.
    hardware : Hardware or str, optional
        A :class:`Hardware` or a preset name.
    channel_depth : int or None, optional
        Default FIFO depth (elements); None means 1024. Default: the hardware's when it sets one explicitly
        (a hardware file's ``channel_depth``), else the workload's, else (a bare graph) the hardware's; see
        :mod:`stepsim.base.defaults`.
    max_events : int, optional
        Safety bound on engine events.
    functional : bool
        Carry real values (functional mode); the result then has ``inputs``, ``outputs`` and ``functional``.
    inputs : dict of str to array, optional
        Functional mode: tensor values by name. Default: a Workload's seeded inputs
        (:func:`stepsim.workloads.reference.make_inputs`); for a Graph, each tensor's ``data`` or seeded
        normal values (bf16-rounded for bf16 tensors).
    seed : int
        Seed of the default inputs.
    arena_tiles : int, optional
        Functional mode: value-arena capacity in tiles (default: a bound that cannot run out).
    progress : callable, optional
        ``progress(events, cycle)``, called between slices of a long engine run (see
        :func:`stepsim.base.progress.engine_progress`).
    channel_depths : mapping of channel name to int, optional
        Per-channel FIFO depths overriding ``channel_depth`` (see :func:`stepsim.graph.lower.lower`). Default:
        a Workload's ``channel_depths`` (set from a ``--fifo-depths`` file), else none.
    timeline : bool or int
        Record the run's timeline into ``SimResult.timeline`` (:class:`stepsim.simulation.timeline.Timeline`: unit
        intervals, FIFO occupancy, on-chip FIFO bytes and HBM requests as Arrow tables). True records at most
        :data:`stepsim.simulation.timeline.DEFAULT_RECORDS` records, an int at most that many (past the limit the trace is
        cut, never the run). Off by default; timing results are identical either way.
    force : bool
        Run even when the estimated engine events exceed :data:`stepsim.kernels.run_size.MAX_EVENTS` (a run
        needing more memory than is available is refused anyway; :mod:`stepsim.kernels.run_size`).
    """
    global _compiled
    from stepsim.analysis.deadlock import run_diagnosed as run  # the numba engine; a deadlock comes explained

    _check_arguments(target, channel_depth, max_events)
    records = _timeline_records(timeline)
    graph = target.graph if isinstance(target, Workload) else target
    if hardware is None:
        hardware = target.hardware if isinstance(target, Workload) else "step-eval"
    if isinstance(hardware, str):
        hardware = Hardware.preset(hardware)
    channel_depth = resolve_channel_depth(channel_depth, hardware,
                                          target.channel_depth if isinstance(target, Workload) else UNSET)
    if channel_depths is _UNSET:
        channel_depths = target.channel_depths if isinstance(target, Workload) else None
    start = time.perf_counter()
    program = lower(graph, hardware, channel_depth=channel_depth, channel_depths=channel_depths)
    lower_s = time.perf_counter() - start
    from stepsim.kernels import run_size

    run_size.check(run_size.estimate(program, records, _channel_elements(target, graph, program)),
                   force=force)  # before any allocation or engine time
    compile_s = 0.0
    if not _compiled:
        from stepsim.kernels.api import _engine, _ensure_compiled

        start = time.perf_counter()
        _ensure_compiled(_engine())  # compile or load from numba's disk cache, outside the timed run
        compile_s = time.perf_counter() - start
        _compiled = True
    if functional:
        from stepsim.base.errors import ArenaError
        from stepsim.kernels.arena import check_tensors_fit

        check_tensors_fit(program)
        try:
            if inputs is None:
                inputs = default_inputs(target, seed)
            else:  # tensors that carry their values (an ONNX model's initializers) need not be given
                inputs = {**tensor_data(graph), **inputs}
            res = run(program, max_events=max_events, inputs=inputs, arena_tiles=arena_tiles, progress=progress,
                      timeline=records)
        except MemoryError as exc:  # the estimates above leave out NumPy's temporaries
            raise ArenaError(f"functional mode ran out of memory ({exc}); use smaller model dimensions "
                             "(e.g. stepsim.workloads.reference.small_moe_model)") from None
    else:
        from stepsim.base.errors import DeadlockError

        try:
            res = run(program, max_events=max_events, progress=progress, timeline=records)
        except DeadlockError as exc:  # the timeline up to the deadlock shows how the run got stuck
            if exc.timeline is not None:
                from stepsim.simulation.timeline import decode, graph_labels

                exc.timeline = decode(exc.timeline, program, *graph_labels(graph))
            raise
    recorded = None
    if res.timeline is not None:
        from stepsim.simulation.timeline import decode, graph_labels

        recorded = decode(res.timeline, program, *graph_labels(graph))
    return SimResult(cycles=int(res.cycles), off_chip_bytes_read=int(res.bytes_read),
                     off_chip_bytes_written=int(res.bytes_written), events=int(res.events), fires=int(res.fires),
                     sim_wall_s=float(res.wall_seconds), compile_s=compile_s, lower_s=lower_s,
                     unit_names=list(program.unit_names), channel_names=list(program.channel_names),
                     unit_counters=res.unit_counters, channel_counters=res.channel_counters,
                     inputs=inputs if functional else None, outputs=res.outputs, functional=res.functional,
                     channel_depth=channel_depth, timeline=recorded, link_bytes=res.link_bytes,
                     unit_opcodes=[program.opcode_name(u) for u in range(program.n_units)])


def _is_int(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _check_arguments(target, channel_depth, max_events) -> None:
    """ArgumentError for a target that is no Graph or Workload and for a depth or event limit that is not a
    positive int: a float depth was truncated, a bool taken as 1, None failed deep in the lowering, and
    ``max_events=0`` reported a limit of 1 that was never given."""
    from stepsim.base.errors import ArgumentError

    if not isinstance(target, (Graph, Workload)):
        raise ArgumentError(f"simulate: target must be a stepsim Graph or Workload, got {type(target).__name__} "
                            f"{target!r:.60}")
    if channel_depth is not _UNSET and channel_depth is not None and (not _is_int(channel_depth)
                                                                     or channel_depth < 1):
        raise ArgumentError(f"simulate: channel_depth must be an int >= 1 (elements) or None (1024), got "
                            f"{channel_depth!r} ({type(channel_depth).__name__})")
    if max_events is not None and (not _is_int(max_events) or max_events < 1):
        raise ArgumentError(f"simulate: max_events must be an int >= 1 or None (no limit), got {max_events!r}")


def _timeline_records(timeline) -> int:
    """The record limit of ``simulate(..., timeline=...)`` (0: off); ArgumentError for anything else."""
    from stepsim.base.errors import ArgumentError

    if timeline is False or timeline is None:
        return 0
    if timeline is True:
        from stepsim.simulation.timeline import DEFAULT_RECORDS

        return DEFAULT_RECORDS
    if isinstance(timeline, (int, np.integer)) and timeline > 0:
        return int(timeline)
    raise ArgumentError(f"timeline must be True, False or a positive record limit, got {timeline!r}")


def tensor_data(graph: Graph) -> dict[str, np.ndarray]:
    """The values of every loaded tensor that carries them (``Tensor.data``), by name."""
    return {op.tensor.name: np.asarray(op.tensor.data, dtype=np.float32) for op in graph.ops
            if getattr(op, "tensor", None) is not None and op.tensor.data is not None}


def default_inputs(target: Graph | Workload, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded functional-mode inputs: a Workload's :func:`~stepsim.workloads.reference.make_inputs` (for a
    workload kind without one, e.g. an ONNX model's ``onnx``, its graph's); for a Graph, every loaded tensor's
    ``data`` when set, else standard normal values (bf16-rounded when the tensor is bf16) drawn from ``seed``
    and the tensor's name."""
    if isinstance(target, Workload):
        from stepsim.workloads.kinds import KINDS

        kind = KINDS.get(target.name)
        if kind is not None and kind.inputs is not None:
            from stepsim.workloads.reference import make_inputs

            return make_inputs(target, seed)
        target = target.graph
    from stepsim.workloads.reference import round_to_bf16

    arrays = {}
    for op in target.ops:
        tensor = getattr(op, "tensor", None)
        if tensor is None or op.kind == "RandomOffChipStore" or tensor.name in arrays:
            continue
        if tensor.data is not None:
            arrays[tensor.name] = np.asarray(tensor.data, dtype=np.float32)
            continue
        rng = np.random.default_rng(np.random.SeedSequence([seed, zlib.crc32(tensor.name.encode())]))
        a = rng.standard_normal(tensor.shape).astype(np.float32)
        arrays[tensor.name] = round_to_bf16(a) if tensor.dtype.name == "bf16" else a
    return arrays
