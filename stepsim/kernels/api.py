"""Python entry point of the engine: :func:`run` and :class:`EngineResult`.

Example
-------
>>> from stepsim.kernels.program import ProgramBuilder
>>> from stepsim.kernels import run
>>> b = ProgramBuilder()
>>> x = b.add_channel()
>>> _ = b.offchip_load(out=x, tile_rows=64, tile_cols=4096, elem_bytes=2, view_shape=(1,))
>>> _ = b.sink(inp=x)
>>> run(b.build()).cycles    # docs/timing_model.md §9 S1
8212
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from stepsim.base.errors import ArenaError, ArgumentError, BlockedUnit, DeadlockError, SimulationError, raw_deadlock
from stepsim.base.signals import raise_if_stopped
from stepsim.kernels import abi as A
from stepsim.kernels import arena
from stepsim.kernels import timeline as TL
from stepsim.kernels import values as V
from stepsim.kernels.arena import FunctionalStats
from stepsim.kernels.hbm import E_EVENTS, E_HBM_PER_TICK, E_TS_RESCAN, E_WORK_LEFT, N_ENG

#: the engine doubles Bufferize arena regions at most this many times before giving up
MAX_ARENA_DOUBLINGS = 12


@dataclass(frozen=True)
class EngineResult:
    """Outcome of one engine run.

    Attributes
    ----------
    cycles : int
        Simulated cycles (max final clock over units; memory units count +1 for the HBM's end).
    unit_counters : int64 array (n_units, 5)
        Per unit ``[fires, busy cycles, cycles blocked on input, cycles blocked on output, final clock]``
        (columns ``abi.CNT_*``).
    channel_counters : int64 array (n_channels, 2)
        Per channel ``[pushes, peak occupancy]`` (columns ``abi.CCNT_*``).
    bytes_read, bytes_written : int
        Off-chip bytes moved (sum of the loaded / stored tile sizes).
    events : int
        Engine events (unit steps plus HBM batches).
    fires : int
        Total unit firings (elements consumed; emitted for sources).
    wall_seconds : float
        Wall time of the engine call, excluding numba compilation.
    events_recorded : int64 array (n, 4)
        Recorded steps ``[unit, clock after the step, fires so far, step code]`` (empty unless requested).
    outputs : dict of str to float32 array, or None
        Functional mode: every stored tensor after the run, in its own shape.
    functional : FunctionalStats or None
        Functional mode: value-arena usage (:class:`stepsim.kernels.arena.FunctionalStats`).
    hbm_requests : int
        HBM requests served (``addr_offset``-byte requests, reads and writes).
    hbm_closed_form_ticks : int
        HBM ticks served in closed form as whole periods of a steady state (:mod:`stepsim.kernels.hbm`);
        0 with ``run(..., hbm_closed_form=False)``.
    hbm_uneven_closed_form_ticks : int
        Of those, the ticks of periods whose channels moved by different amounts (served with the K-th period
        tick by tick, see ``kernels.hbm._try_skip``).
    time_sensitive_scans : int
        Scans of the time-sensitive units' (EagerMerge, Link) decision times; the event loop reuses the last
        scan while no unit has stepped since (every decision scans with ``run(..., reuse_scans=False)``).
    time_sensitive_evaluations : int
        Decision times those scans computed: a unit's is kept while neither it nor a unit across one of its
        channels has stepped (``reuse_scans=False`` computes every waiting unit's at every scan).
    timeline : int64 array or None
        ``run(..., timeline=N)``: the engine's raw recording buffer (layout in :mod:`stepsim.kernels.timeline`;
        decoded by :func:`stepsim.simulation.timeline.decode`).
    link_bytes : int64 array (n_units,) or None
        Bytes each Link unit carried (0 for every other unit; :mod:`stepsim.kernels.units_link`).
    """

    cycles: int
    unit_counters: np.ndarray
    channel_counters: np.ndarray
    bytes_read: int
    bytes_written: int
    events: int
    fires: int
    wall_seconds: float
    events_recorded: np.ndarray
    outputs: dict | None = None
    functional: FunctionalStats | None = None
    hbm_requests: int = 0
    hbm_closed_form_ticks: int = 0
    hbm_uneven_closed_form_ticks: int = 0
    time_sensitive_scans: int = 0
    time_sensitive_evaluations: int = 0
    timeline: np.ndarray | None = None
    link_bytes: np.ndarray | None = None

    @property
    def firings_per_second(self) -> float:
        """Unit firings per wall-clock second of the engine call."""
        return self.fires / self.wall_seconds if self.wall_seconds > 0 else float("inf")


#: events in the engine's first slice; later slices grow until one takes about SLICE_SECONDS. Small, because an
#: event's cost grows with the program (a 128-chip ring all-reduce of 50,000 units runs about 1,000 events/s: a
#: first slice of 65,536 events kept Ctrl-C waiting a minute); doubling from here costs a few 20 us calls
FIRST_SLICE_EVENTS = 1 << 10
#: the most events in one slice: an event's cost can jump within a run (a 128-chip ring all-reduce runs its
#: first 64,000 events at 1e6/s and its next ones at 6,000/s, so a slice doubled on the cheap ones took 10 s);
#: 4,096 events are 4 ms at 1e6 events/s (the 20 us call costs 0.5 %) and 0.7 s at that slowest rate measured
MAX_SLICE_EVENTS = 1 << 12
#: the most HBM work in one slice (it doubles with fast slices; bounded so it stays an int64 however many)
MAX_SLICE_WORK = 1 << 40
#: HBM work in the engine's first slice (kernels.hbm: a tick costs one plus its due units). One event can hold
#: unbounded work (a tile of 2**30 columns is billions of requests), so a slice is bounded by work as well as by
#: events; both grow while a slice takes under SLICE_SECONDS / 2
FIRST_SLICE_WORK = 1 << 20
#: target wall time of one engine slice (s): Python handles signals (Ctrl-C) and progress between slices
SLICE_SECONDS = 0.1
#: a callback ``progress(events, cycle)`` after each slice: engine events so far and the latest unit clock
Progress = Callable[[int, int], None]


def _engine(functional: bool = False, timeline: bool = False):
    """The engine's kernels module (imported on first use: importing it loads numba's cached code), after the
    command line's "compiling once" notice when this kind of run is due to compile
    (:mod:`stepsim.base.compile_notice`)."""
    from stepsim.base.compile_notice import say_once

    say_once(functional, timeline)
    from stepsim.kernels import engine

    return engine


def _call(engine, program, max_events, rec, fv=None, fi=None, progress: Progress | None = None,
          hbm_closed_form: bool = True, tl=None, reuse_scans: bool = True):
    """Run a program to completion, deadlock or ``max_events``, in slices of the event loop.

    The engine's state lives in arrays, so stopping the event loop after any event and calling it again
    continues exactly where it stopped: slicing changes no cycle, count or event (the tests compare sliced
    and unsliced runs). Between slices Python can react to signals (Ctrl-C raises KeyboardInterrupt here,
    not after a minutes-long engine call) and report progress. Slices start small, so short runs pay almost
    nothing, and double while a slice takes less than half of SLICE_SECONDS, so long runs make a few calls
    per second (the per-call cost is about 20 µs).

    ``tl``: the timeline recording buffer (:mod:`stepsim.kernels.timeline`), or None to record nothing.

    A slice also ends when its HBM work (ticks, weighted by their due units; from FIRST_SLICE_WORK, grown with
    the event count and halved after a slow slice that ended on it) is spent, in the middle of an HBM event (:func:`stepsim.kernels.hbm.hbm_process`), so that a Ctrl-C acts
    within a fraction of a second whatever the tile sizes; this too changes no cycle, count or event.

    Returns (out scalars abi.OUT_*, unit state us, channel state chs).
    """
    us, chs, slots, arena_rows, eng, hfree, hq, done_list, wl, ts_units, n_ts = engine.new_state(
        program.unit_params, program.ch_capacity, program.ch_latency, program.ch_credit_latency, program.ch_producer,
        program.ch_consumer, program.hw, len(program.mem_order), program.arena_rows)
    from stepsim.kernels.units_link import link_cache_init

    link_cache_init(program.unit_params, program.in_ch, program.out_ch, chs, us)  # the Links' cached views
    eng[E_HBM_PER_TICK::N_ENG] = 0 if hbm_closed_form else 1  # in every chip's HBM segment
    eng[E_TS_RESCAN] = 0 if reuse_scans else 1  # an engine-wide scalar: segment 0
    n_slice, work = FIRST_SLICE_EVENTS, FIRST_SLICE_WORK
    while True:
        raise_if_stopped()  # a Ctrl-C whose KeyboardInterrupt a destructor swallowed (stepsim.base.signals)
        stop = min(max_events, int(eng[E_EVENTS]) + n_slice)
        eng[E_WORK_LEFT] = work
        t0 = time.perf_counter()
        status = engine.event_loop(program.unit_params, us, program.in_ptr, program.in_ch, program.out_ptr,
                                   program.out_ch, program.ch_producer, program.ch_consumer, chs, slots,
                                   program.payload, program.sel_ptr, program.sel_idx, program.hw, arena_rows, eng,
                                   hfree, hq, done_list, wl, ts_units, n_ts, stop, rec, fv, fi, tl)
        if status != A.ST_MAX_EVENTS or eng[E_EVENTS] >= max_events:
            break
        elapsed = time.perf_counter() - t0
        if elapsed < SLICE_SECONDS / 2:
            n_slice, work = min(2 * n_slice, MAX_SLICE_EVENTS), min(2 * work, MAX_SLICE_WORK)
        elif elapsed > 2 * SLICE_SECONDS:
            if eng[E_WORK_LEFT] <= 0:  # a slow slice that ended on its HBM work: the ticks got dearer (more due
                work = max(work // 2, 1)  # units), so fewer of them per slice
            elif SLICE_SECONDS > 0:  # ended on its events, which got dearer: as many as fit in SLICE_SECONDS at
                n_slice = max(int(n_slice * SLICE_SECONDS / elapsed), 1)  # this slice's rate (0: fixed slices)
        if progress is not None:
            progress(int(eng[E_EVENTS]), int(us[:, A.US_CLOCK].max()))
    out = np.zeros(A.N_OUT, dtype=np.int64)
    engine.engine_finish(program.unit_params, us, chs, slots, eng, status, out)
    if tl is not None:
        from stepsim.kernels.channels import record_queued

        record_queued(chs, slots, tl)
    return out, us, chs


def _ensure_compiled(engine, functional: bool = False) -> None:
    """Compile (or load from the disk cache) the timing or functional specialization outside the timed call."""
    sigs = getattr(engine.event_loop, "signatures", None)
    if sigs is None:  # NUMBA_DISABLE_JIT: plain Python
        return
    from numba import types

    want_none = not functional
    if any((isinstance(sig[-2], types.NoneType)) == want_none for sig in sigs):  # sig[-2]: fi; sig[-1]: tl
        return
    from stepsim.kernels.warm import warm_program

    program = warm_program(functional)
    rec = np.zeros((0, 4), dtype=np.int64)
    state = None
    if functional:
        refs = arena.tensor_refs(program)
        arrays = {name: np.zeros((refs[name].rows, refs[name].cols), np.float32) for name in refs}
        state = arena.build_state(program, arrays, 256, arena.static_block_hint(program) * 4)
    _call(engine, program, 1 << 40, rec, *(state[:2] if state else ()))


def run(program, *, max_events: int | None = None, record_events: int = 0, inputs: dict | None = None,
        arena_tiles: int | None = None, progress: Progress | None = None, hbm_closed_form: bool = True,
        timeline: int = 0, reuse_scans: bool = True) -> EngineResult:
    """Simulate a :class:`stepsim.kernels.program.Program`.

    Parameters
    ----------
    program : Program
        Built by :class:`stepsim.kernels.program.ProgramBuilder` (or the lowering).
    max_events : int, optional
        Stop with :class:`SimulationError` after this many engine events (default: unlimited).
    record_events : int
        Record the first ``record_events`` unit steps into ``EngineResult.events_recorded``.
    inputs : dict of str to array, optional
        Functional mode: the values of every tensor the program loads, by tensor name (any shape with the
        tensor's element count). Tiles then carry real values and ``EngineResult.outputs`` holds the stored
        tensors; every timing result is identical to timing mode.
    arena_tiles : int, optional
        Functional mode: value-arena capacity in tiles. Default: a bound that cannot run out (module
        :mod:`stepsim.kernels.arena`), found with one extra timing run.
    progress : callable, optional
        Called as ``progress(events, cycle)`` between slices of a long run (engine events so far, latest
        unit clock); see :func:`_call`.
    hbm_closed_form : bool
        Serve steady HBM periods in closed form (default). False serves every tick one by one: the same
        results, slower; the equivalence tests compare the two.
    timeline : int
        Record a timeline of at most this many records (unit intervals and FIFO occupancy changes) into
        ``EngineResult.timeline``; 0 (default) records nothing and runs the engine without any recording code.
    reuse_scans : bool
        Reuse the last scan of the time-sensitive units' decision times while no unit has stepped (default).
        False scans them at every decision: the same results, slower; the equivalence tests compare the two.

    Returns
    -------
    EngineResult

    Raises
    ------
    DeadlockError
        No unit can progress and some are unfinished; lists every blocked unit, its channel and occupancy.
    ArenaError
        A Bufferize buffer kept outgrowing its arena region, or (functional) ``arena_tiles`` is too small;
        the message says how many tiles the run needs.
    SimulationError
        Event limit reached, an operator met input step-perf would panic on (stop level, selector, ...), or
        (functional) a random address outside its tensor.
    """
    engine = _engine(functional=inputs is not None, timeline=bool(timeline))
    _ensure_compiled(engine, functional=inputs is not None)
    limit = (1 << 62) if max_events is None else int(max_events)
    rec = np.zeros((max(int(record_events), 0), 4), dtype=np.int64)
    if isinstance(timeline, bool) or not isinstance(timeline, (int, np.integer)) or timeline < 0:
        raise ArgumentError(f"timeline must be a record count >= 0, got {timeline!r}")

    def attempt(cutoff: int) -> EngineResult:
        recording = (int(timeline), cutoff)
        if inputs is None:
            out, us, chs, wall, _, _, tl = _run_growing(engine, program, limit, rec, None, progress,
                                                        hbm_closed_form, recording, reuse_scans)
            return _result(program, out, us, chs, wall, rec, tl)
        return _run_functional(engine, program, limit, rec, inputs, arena_tiles, progress, hbm_closed_form,
                               recording, reuse_scans)

    result = attempt(A.NEVER)
    if result.timeline is not None and result.timeline[TL.TLH_DROPPED]:
        # the records did not fit: run again keeping only those before the latest time at which they all fit
        # (kernels/timeline.py), so the partial timeline is complete up to as late a cycle as the limit allows
        result = attempt(TL.cutoff_that_fits(result.timeline))
    return result


def _new_timeline(program, recording):
    """A zeroed recording buffer for ``recording = (capacity, cutoff)`` (None when capacity is 0: the engine
    then records nothing)."""
    capacity, cutoff = recording
    if capacity <= 0:
        return None
    tl = np.zeros(TL.layout_size(program.n_units, capacity), dtype=np.int64)
    TL.init(tl, program.n_units, capacity, cutoff)
    return tl


def _run_growing(engine, program, limit, rec, make_state, progress=None, hbm_closed_form=True,
                 recording=(0, A.NEVER), reuse_scans=True):
    """One engine run, rerun with larger Bufferize regions while a buffer overflows its region.

    ``make_state(program)`` returns the functional ``(fv, fi)`` for a run (None: timing mode).
    ``recording``: (record capacity, cutoff cycle) of a fresh timeline buffer per attempt (capacity 0: none).
    Returns (out, us, chs, wall seconds, the program that ran, (fv, fi, offsets) or None, timeline or None).
    """
    scale = 1
    current = program
    while True:
        state = make_state(current) if make_state else None
        fv, fi = (state[0], state[1]) if state else (None, None)
        tl = _new_timeline(current, recording)
        t0 = time.perf_counter()
        out, us, chs = _call(engine, current, limit, rec, fv, fi, progress, hbm_closed_form, tl, reuse_scans)
        wall = time.perf_counter() - t0
        if int(out[A.OUT_STATUS]) != A.ST_ARENA_FULL:
            return out, us, chs, wall, current, state, tl
        if scale >= 1 << MAX_ARENA_DOUBLINGS:
            unit = int(out[A.OUT_STATUS_ARG])
            raise ArenaError(f"{program.unit_names[unit]} (Bufferize): a buffer needs more than "
                             f"{int(current.unit_params[unit, A.UP_A0 + A.PA_ARENA_SIZE])} arena elements")
        scale *= 2
        current = program.with_arena_scale(scale)


def _run_functional(engine, program, limit, rec, inputs, arena_tiles, progress=None, hbm_closed_form=True,
                    recording=(0, A.NEVER), reuse_scans=True):
    """Functional mode: size the value arena, run, rerun once with larger blocks if a tile outgrew them."""
    arrays = arena.check_inputs(program, inputs)
    if arena_tiles is not None and (isinstance(arena_tiles, bool) or not isinstance(arena_tiles, (int, np.integer))
                                    or arena_tiles < 1):
        raise ArgumentError(f"arena_tiles must be a positive int, got {arena_tiles!r}")
    pushes = None

    def capacity(current):
        nonlocal pushes
        if arena_tiles is not None:
            return int(arena_tiles)
        if pushes is None:  # element count per channel; a timing run gives them exactly
            pushes = run(program, max_events=limit).channel_counters[:, A.CCNT_PUSHES]
        return arena.safe_capacity(current, pushes)

    block = arena.static_block_hint(program)
    while True:
        out, us, chs, wall, current, state, tl = _run_growing(
            engine, program, limit, rec,
            lambda cur: arena.build_state(cur, arrays, capacity(cur), block), progress, hbm_closed_form, recording,
            reuse_scans)
        fv, fi, offsets = state
        vstatus = int(fi[V.FI_STATUS])
        if vstatus == V.VS_TOO_BIG and int(out[A.OUT_STATUS]) == A.ST_OK:
            block = int(fi[V.FI_ARG2])  # the largest tile of the run: one more run fits every tile
            continue
        break
    if vstatus == V.VS_FULL:
        raise _arena_full_error(program, fi, arena_tiles, lambda: _run_functional(engine, program, limit, rec,
                                                                                  inputs, None))
    if vstatus == V.VS_BAD_ADDRESS:
        unit = int(fi[V.FI_ARG])
        t = program.unit_tensors[unit]
        raise SimulationError(f"{program.unit_names[unit]} ({program.opcode_name(unit)}): tile address "
                              f"{int(fi[V.FI_ARG2])} is outside tensor {t.name!r} ({t.n_tiles} tiles of "
                              f"{t.tile_rows}x{t.tile_cols})")
    result = _result(current, out, us, chs, wall, rec, tl)
    return dataclasses.replace(result, outputs=arena.read_outputs(program, fv, offsets), functional=arena.stats(fi))


def _arena_full_error(program, fi, arena_tiles, rerun) -> ArenaError:
    """The user's arena was too small: rerun with a safe capacity to say how many tiles the run needs."""
    unit = int(fi[V.FI_ARG])
    block = int(fi[V.FI_BLOCK])
    need = rerun().functional.peak_tiles
    return ArenaError(f"functional value arena full: {program.unit_names[unit]} ({program.opcode_name(unit)}) "
                      f"needed a tile beyond arena_tiles={arena_tiles} ({(arena_tiles + 1) * block * 4} bytes of "
                      f"{block}-float blocks); this run needs {need} tiles ({(need + 1) * block * 4} bytes)")


def _result(program, out, us, chs, wall, rec, tl=None) -> EngineResult:
    """Check the engine status and package the counters."""
    status = int(out[A.OUT_STATUS])
    if status == A.ST_DEADLOCK:
        err = _deadlock_error(program, us, chs)
        err.timeline = tl  # the raw buffer up to the deadlock; simulate() decodes it
        raise err
    if status == A.ST_MAX_EVENTS:
        raise SimulationError(f"engine stopped after max_events={int(out[A.OUT_EVENTS])} events at cycle "
                              f"{int(us[:, A.US_CLOCK].max()) if len(us) else 0} (raise max_events?)")
    if status not in (A.ST_OK, A.ST_VALUES):
        unit = int(out[A.OUT_STATUS_ARG])
        raise SimulationError(f"{program.unit_names[unit]} ({program.opcode_name(unit)}): "
                              f"{_STATUS_MESSAGES.get(status, A.STATUS_NAMES.get(status, str(status)))} "
                              f"at cycle {int(us[unit, A.US_CLOCK])}")
    counters = np.stack([us[:, A.US_FIRES], us[:, A.US_BUSY], us[:, A.US_BLOCKED_IN], us[:, A.US_BLOCKED_OUT],
                         us[:, A.US_CLOCK]], axis=1)
    ch_counters = np.stack([chs[:, A.CH_TAIL], chs[:, A.CH_PEAK]], axis=1)
    return EngineResult(cycles=int(out[A.OUT_CYCLES]), unit_counters=counters, channel_counters=ch_counters,
                        bytes_read=int(out[A.OUT_BYTES_READ]), bytes_written=int(out[A.OUT_BYTES_WRITTEN]),
                        events=int(out[A.OUT_EVENTS]), fires=int(out[A.OUT_FIRES]), wall_seconds=wall,
                        events_recorded=rec[:int(out[A.OUT_N_RECORDED])].copy(),
                        hbm_requests=int(out[A.OUT_HBM_REQUESTS]),
                        hbm_closed_form_ticks=int(out[A.OUT_HBM_CLOSED_FORM_TICKS]),
                        hbm_uneven_closed_form_ticks=int(out[A.OUT_HBM_UNEVEN_TICKS]),
                        time_sensitive_scans=int(out[A.OUT_TS_SCANS]),
                        time_sensitive_evaluations=int(out[A.OUT_TS_EVALS]), timeline=tl,
                        link_bytes=_link_bytes(program, us))


def _link_bytes(program, us) -> np.ndarray:
    """Bytes carried per unit: the Link units' byte register, 0 elsewhere (the register is scratch there)."""
    from stepsim.kernels.units_link import R_LINK_BYTES  # a plain constant; the kernels it sits beside load lazily

    links = program.unit_params[:, A.UP_OPCODE] == A.OP_LINK
    return np.where(links, us[:, R_LINK_BYTES], 0).astype(np.int64)


_STATUS_MESSAGES = {
    A.ST_BAD_STOP: "an input element carries a stop level above the operator's rank (step-perf panics here)",
    A.ST_MISMATCH: "lock-stepped inputs disagree (different stop levels, or one input closed before the other)",
    A.ST_BAD_SELECTOR: "a selector names a target outside the operator's ports",
    A.ST_CAUSALITY: "internal error: an HBM request was scheduled before the HBM's served horizon",
}


def blocked_units(program, us, chs) -> list[BlockedUnit]:
    """Every unfinished unit of a stopped run: what it waits on, and that channel's occupancy."""
    blocked = []
    for u in range(program.n_units):
        if us[u, A.US_DONE]:
            continue
        kind = int(us[u, A.US_WAIT_KIND])
        c = int(us[u, A.US_WAIT_CH])
        waits = []
        if kind == A.WAIT_TIME:  # EagerMerge choosing: waits on every input
            waits = [(ch, "empty") for ch in program.inputs(u)]
        elif c >= 0:
            waits = [(c, A.WAIT_NAMES[kind])]
        for ch, state in waits or [(-1, A.WAIT_NAMES[kind])]:
            blocked.append(BlockedUnit(
                unit=program.unit_names[u], opcode=program.opcode_name(u), clock=int(us[u, A.US_CLOCK]),
                channel=program.channel_names[ch] if ch >= 0 else None, waiting_for=state,
                occupancy=int(chs[ch, A.CH_TAIL] - chs[ch, A.CH_HEAD]) if ch >= 0 else None,
                capacity=int(chs[ch, A.CH_CAP]) if ch >= 0 else None))
    return blocked


def _deadlock_error(program, us, chs) -> DeadlockError:
    """The engine's raw DeadlockError: one record and one listing line per blocked unit and channel (the
    diagnosis is attached above the engine, :func:`stepsim.analysis.deadlock.diagnosed`)."""
    blocked = blocked_units(program, us, chs)
    lines = []
    for b in blocked:
        if b.channel is None:
            lines.append(f"  {b.unit} ({b.opcode}) at cycle {b.clock}: waiting ({b.waiting_for})")
        else:
            what = "a free slot on" if b.waiting_for == "full" else "data on"
            lines.append(f"  {b.unit} ({b.opcode}) at cycle {b.clock}: waits for {what} channel "
                         f"{b.channel!r} ({b.waiting_for}, {b.occupancy}/{b.capacity})")
    return raw_deadlock(program, blocked, lines)
