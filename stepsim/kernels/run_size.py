"""The size of a run, estimated from its Program before the engine starts: memory and engine events.

Model dimensions have no upper limit (a hidden size of 2**30 or 10**15 is a valid int), and the engine's cost
grows with them: its state holds one slot per FIFO element of capacity (a depth of 10**12 asks for terabytes),
and its time follows its events. Finding out by running means a MemoryError traceback after the allocation, or
minutes of a run nobody meant to start.

* Memory: the engine's arrays (FIFO slots, value arena, timeline buffer) are counted exactly; more than the
  machine has available is refused, always (the allocation would fail).
* Events: :func:`event_bound`, an upper bound on the engine's events (unit steps plus HBM events) from the
  elements each channel carries (the graph knows them before the run: ``stepsim.graph.channels.
  channel_elements``); more than :data:`MAX_EVENTS` is refused unless the caller forces it (``--force``), with
  the estimate and its time at :data:`EVENTS_PER_SECOND`. HBM requests are not counted: an HBM serves its ticks
  in bulk (closed form over steady periods), so a 5e10-request layer of 2,400 events runs in about a second.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from stepsim.base.errors import ConfigError
from stepsim.kernels import abi as A

#: estimated engine events a run may have without --force: about 17 minutes at EVENTS_PER_SECOND, and more than
#: a thousand times the paper's largest layers (under 10**6 events each), so such a run almost certainly has a
#: dimension wrong. The environment variable STEPSIM_MAX_EVENTS sets another limit (:func:`max_events`)
MAX_EVENTS = 10**9
MAX_EVENTS_VARIABLE = "STEPSIM_MAX_EVENTS"
#: engine events per second the refusal converts its estimate at: the order of what the numba engine runs on one
#: core of an AMD EPYC (1.4e5 to 7e6 measured on the paper's workloads, most near 1e6; bench/README.md)
EVENTS_PER_SECOND = 10**6


@dataclass(frozen=True)
class RunSize:
    """What a run of a Program will take (see the module docstring)."""

    memory_bytes: int
    fifo_slots: int
    events: int | None  # the upper bound of :func:`event_bound`; None: the channels' element counts are unknown


def estimate(program, timeline_records: int = 0, channel_elements=None) -> RunSize:
    """The memory and engine events of running ``program`` (no allocation, no engine call).

    ``channel_elements``: the elements each channel carries over the run (one int per channel, in the Program's
    order), or None when unknown (then no event estimate)."""
    up = program.unit_params
    opcodes = up[:, A.UP_OPCODE]
    slots = max(int(np.asarray(program.ch_capacity, dtype=object).sum()), 1)  # object: no int64 overflow
    scratch = int(up[opcodes == A.OP_REASSEMBLE, A.UP_N_IN].sum())
    memory = 8 * (slots * A.N_SLOT + (int(program.arena_rows) + scratch) * A.N_TOKEN
                  + up.shape[0] * A.N_US + len(program.ch_capacity) * A.N_CH) + 32 * int(timeline_records)
    events = None if channel_elements is None else event_bound(program, channel_elements)
    return RunSize(memory_bytes=memory, fifo_slots=slots, events=events)


def event_bound(program, channel_elements) -> int:
    """An upper bound on the engine events of a run of ``program`` in which channel c carries
    ``channel_elements[c]`` elements: ``U + C + 2 P + 2 M + 2 D`` (+ ``S / L + M + H`` with several HBMs).

    Why (engine.py: an event is one unit step or one HBM event): every unit is stepped once at the start (U);
    later steps follow a wake, and a unit is woken on a channel it waits for only after a push into it (P pushes,
    plus one close per channel: C), or after a pop from a full one (P pops); a memory op is woken once per tile
    its HBM completes (M: the largest element count on the op's channels, summed over memory ops); an EagerMerge
    or Link once per decision, each of which takes an element or closes an input (D: the input elements plus
    inputs plus one, summed over them). An HBM event completes a tile (M) or stops at a bound: another unit's
    decision (D) or, with H > 1 HBMs (chips), another HBM's next tick plus L = start_up + latency + 1 cycles.
    Such an event starts at the earliest tick of every HBM and ends L past another's, so one HBM's own such
    events start more than L cycles apart: at most one per L ticks of a run of consecutive ticks, and a tick
    serves at least one chunk (S: the chunks, ``ceil(requests / par_dispatch)`` per tile, summed over tiles).

    Measured (tests/kernels/test_event_estimate.py, bench/README.md): 1.35 to 3.2 times the events on one HBM
    (random programs and every workload kind); with several HBMs and large tiles the S / L term dominates: 20
    times on Mixtral B=64 over 2 chips (the tests allow 40).
    """
    elems = [int(x) for x in channel_elements]  # Python ints: no int64 overflow on huge dimensions
    up = program.unit_params
    opcodes = up[:, A.UP_OPCODE]
    hw = program.hw
    addr = int(hw[A.HW_ADDR_OFFSET])
    tiles = decisions = chunks = 0
    chips = set()
    for u in np.flatnonzero(np.isin(opcodes, A.TIME_SENSITIVE_OPS + A.MEMORY_READ_OPS + A.MEMORY_WRITE_OPS)):
        ins = [elems[c] for c in program.in_ch[program.in_ptr[u]:program.in_ptr[u + 1]]]
        outs = [elems[c] for c in program.out_ch[program.out_ptr[u]:program.out_ptr[u + 1]]]
        if opcodes[u] in A.TIME_SENSITIVE_OPS:
            decisions += sum(ins) + len(ins) + 1
        if opcodes[u] in A.MEMORY_READ_OPS + A.MEMORY_WRITE_OPS:
            n = max([0, *ins, *outs])
            tiles += n
            if not up[u, A.UP_A0 + A.PA_RESIDENT]:  # an on-chip tensor (a collective's) makes no HBM requests
                chips.add(int(up[u, A.UP_CHIP]))
                rows, cols, elem = (int(up[u, A.UP_A0 + k]) for k in (A.PA_TILE_ROWS, A.PA_TILE_COLS,
                                                                          A.PA_ELEM_BYTES))
                requests = rows * -(-cols * elem // addr)
                chunks += n * -(-requests // max(int(up[u, A.UP_A0 + A.PA_PAR_DISPATCH]), 1))
    bound = up.shape[0] + len(elems) + 2 * sum(elems) + 2 * tiles + 2 * decisions
    if len(chips) > 1:
        lat = int(hw[A.HW_HBM_START_UP] + hw[A.HW_HBM_LATENCY]) + 1
        bound += chunks // lat + 1 + tiles + len(chips)
    return bound


def available_memory() -> int | None:
    """Bytes of memory available to a new allocation (Linux ``MemAvailable``), None where unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _gb(n: int) -> str:
    return f"{n / 1e9:,.1f} GB" if n >= 1e8 else f"{n / 1e6:,.1f} MB"


def _duration(seconds: float) -> str:
    """``seconds`` in words, rounded ("about 72 minutes")."""
    if seconds < 1:
        return "under a second"
    if seconds < 120:
        return f"about {seconds:,.0f} s"
    if seconds < 2 * 3600:
        return f"about {seconds / 60:,.0f} minutes"
    if seconds < 2 * 86400:
        return f"about {seconds / 3600:,.0f} hours"
    return f"about {seconds / 86400:,.0f} days"


def _count(n: int) -> str:
    """A limit as written: ``1e+09`` for a power of ten, else with thousands separators."""
    return f"{n:.0e}" if n >= 10**6 and str(n).rstrip("0") == "1" else f"{n:,}"


def max_events() -> int:
    """The event limit: ``STEPSIM_MAX_EVENTS`` when set (a positive integer, read at every check so worker
    processes and the command server see the caller's), else :data:`MAX_EVENTS`."""
    text = os.environ.get(MAX_EVENTS_VARIABLE, "").strip()
    if not text:
        return MAX_EVENTS
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ConfigError(f"the environment variable {MAX_EVENTS_VARIABLE} must be a positive integer (engine "
                          f"events), got {text!r}")
    return value


def check(size: RunSize, force: bool = False, available: int | None = None) -> None:
    """Refuse a run whose memory exceeds what is available (always) or whose estimated engine events exceed
    :func:`max_events` (unless ``force``), with the estimate; ConfigError, otherwise nothing."""
    available = available_memory() if available is None else available
    if available is not None and size.memory_bytes > available:
        raise ConfigError(f"this run needs about {_gb(size.memory_bytes)} of engine memory ({size.fifo_slots:,} FIFO "
                          f"slots: the sum of the FIFO depths), more than the {_gb(available)} available; use "
                          f"smaller FIFO depths (--channel-depth, the depths file) or model dimensions")
    limit = max_events()
    if size.events is not None and size.events > limit and not force:
        raise ConfigError(f"this run needs up to {size.events:.2e} engine events, "
                          f"{_duration(size.events / EVENTS_PER_SECOND)} at {EVENTS_PER_SECOND:.0e} events/s; the "
                          f"limit is {_count(limit)} (check the model dimensions), --force runs it anyway")
