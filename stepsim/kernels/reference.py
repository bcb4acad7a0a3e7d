"""Pure-Python reference engine: the slow, obviously-correct twin of :mod:`stepsim.kernels`.

It executes a :class:`stepsim.kernels.program.Program` with exactly the semantics of the numba engine
(docs/timing_model.md, canonical rules of the project lead) and is used by the tests and the benchmarks to
cross-check the fast engine. It is written DAM-style and favours clarity over speed:

* every unit (operator) is a Python generator with its own local clock; it ``yield``\\ s only when it must
  block: on an empty input channel, on a full output channel, on the HBM (a memory op waiting for its
  responses) or, for the time-sensitive EagerMerge and Link, to wait for the global time;
* a small scheduler resumes units whose request can be satisfied; when none can run, it lets the
  time-sensitive unit with the earliest action time act (EagerMerge and Link choices and HBM ticks);
* channels are deques of ``(stamp, token)`` with a capacity, a send latency, a credit latency and
  per-slot credit-free times;
* the HBM (one per chip, serving the memory ops on that chip) is modelled per request, tick by tick (docs/timing_model.md §4.2-§4.3): per tick, at most one response per
  HBM channel is forwarded (arriving at the memory op one cycle later), then at most one ``ParAddrs`` chunk
  per reader and then per writer (registration order = ``program.mem_order``) is taken, request i of the
  tick's batch goes to channel ``off = (off + i) mod C`` and afterwards ``off = (off + len(batch)) mod C``;
  a request taken at tick T on channel c starts at ``s = max(free[c], T + 1)``, sets ``free[c] = s + II``
  and is ready at ``s + start_up + latency``.

Canonical rules (docs/timing_model.md §1.2-§1.3, lead's decisions)
--------------------------------------------------------
1. Enqueue: send number ``i >= capacity`` first waits for the credit of slot ``i mod capacity``
   (``clock = max(clock, free)``); the element is stamped ``max(requested, clock + latency)``. A dequeue at
   receiver time ``d = max(clock, stamp)`` frees its slot at ``d + credit_latency``. Blocking receives
   (dequeue, peek) set ``clock = max(clock, stamp)``; a receive that finds the channel closed sets
   ``clock = max(clock, producer's final clock)`` (a closure is observed at T iff that clock ``<= T``, §1.3;
   without this, a unit could act on a closure "before" it happened and, e.g., issue HBM requests in the past).
2. Blocking units are timestamp-deterministic and run in any order.
3. Time-sensitive units (EagerMerge's choice, the HBM) act at a time T only when every other unit is finished,
   blocked, or cannot produce anything stamped ``<= T``: they act only when no blocking unit can run, the one
   with the smallest action time first. A head element is visible at T iff its stamp ``<= T``; a closed channel
   is observed at T iff its producer's final clock ``<= T``. EagerMerge decides at the first ``T >= clock``
   where some input head is visible, picking the smallest stamp (ties: lowest input index), or where all
   inputs are observed closed (it then finishes with clock T). A Link chooses by the same rule, then serializes
   the element (``ceil(bytes / bandwidth)`` busy cycles) and sends it at ``clock + latency``.
4. FlatReassemble: blocking peeks of every selected input, then drains them ordered by head stamp (ties in
   selector order) with ``now = max(now, a_i + switch_i + L(x))``, DEQ, ``now += W(x)``, ENQ.
5. Reported cycles = max over every unit's final clock and the HBM's end, which is (the max final clock over
   the memory ops) + 1 when the program has memory ops.

Counters
--------
``unit_counters`` is an int64 array ``[n_units, abi.N_CNT]`` with columns (``abi.CNT_*``):

* ``fires`` -- completed firings; per opcode: one per element emitted by SelectGen, MetadataGen, Flatten,
  Promote, Reshape (input elements), Broadcast, Parallelize (input elements), ExpandRef (outputs), Map, Scan;
  one per element consumed by Sink, Bufferize, Accum, MapAccum, Partition (data elements),
  Reassemble (data elements); one per tile by the off-chip loads and stores (after its HBM round trip); one per
  buffer by Streamify; one per reference element by DynStreamify; one per group by EagerMerge; one per input
  element of RepeatStatic and RowStreamify; one per selector / request / seq_len by ExpertAddrGen,
  CacheReadAddrGen, FilterLastTile.
* ``busy`` -- cycles the unit added to its own clock: compute/PMU rooflines, the +1 steps (sinks, SelectGen,
  Bufferize, Streamify, EagerMerge between elements, RepeatStatic's +r), FlatReassemble's
  ``max(now, a + switch + L)`` advance, and the HBM round trips of memory ops (the jumps to response stamps).
* ``blocked_in`` -- cycles the clock jumped forward to input stamps on blocking receives, plus EagerMerge's
  wait for its decision time.
* ``blocked_out`` -- cycles the clock jumped forward waiting for output credits.
* ``clock`` -- the final clock.

For every unit ``clock == busy + blocked_in + blocked_out`` (clocks start at 0 and only move through these).

``channel_counters`` is ``[n_channels, 2]``: ``pushes`` (elements enqueued) and ``peak`` occupancy. Occupancy is
defined on timestamps, so it does not depend on the scheduler's order: an element occupies its slot from the
sender's clock at the enqueue (after any credit wait) until its credit is back (dequeue time + credit latency);
``peak`` is the largest number of elements occupying slots at any send time (always ``<= capacity``).

``off_chip_bytes_read`` / ``off_chip_bytes_written`` sum ``rows * cols * bytes_per_element`` of every tile a
memory op loads / stores.

Example
-------
>>> from stepsim.kernels.program import ProgramBuilder
>>> b = ProgramBuilder()
>>> x = b.add_channel(name="x")
>>> _ = b.offchip_load(out=x, tile_rows=64, tile_cols=64, elem_bytes=2, view_shape=(4,), name="load")
>>> _ = b.sink(inp=x, name="sink")
>>> run(b.build()).cycles
586
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

from stepsim.base.errors import SimulationError
from stepsim.kernels import abi as A

__all__ = ["ReferenceResult", "Token", "run"]

# ------------------------------------------------------------------------------------------- tokens
KIND_TILE, KIND_SCALAR, KIND_SELECTOR, KIND_BUFFER = "tile", "scalar", "selector", "buffer"


@dataclass(frozen=True)
class Token:
    """One stream element.

    ``stop`` is the stop level (0 = Val). Tiles: ``rows x cols`` at ``nbytes`` bytes/element, ``mu`` =
    read_from_mu, ``pad`` = Reshape padding, ``valid`` = valid rows (RowStreamify filtering, SetOffset).
    Scalars: ``value``. Selectors: ``targets`` (ascending tuple) and ``cols`` = number of targets.
    Buffers: ``items`` (the buffered tokens) and ``rank`` b.

    ``ident`` says which values a tile holds (the reference engine computes no values; the functional-mode tests
    derive them from it): ``(load unit, tile index read)`` for a loaded tile, ``(parent ident, "row" | "col", i)``
    for row / column i that RowStreamify split off a tile, None for a Reshape pad tile (zeros) and for a tile
    computed by Map / Accum / Scan (no identity). Shape and routing operators forward it unchanged.
    """

    kind: str
    stop: int = 0
    rows: int = 1
    cols: int = 1
    nbytes: int = 1
    mu: bool = False
    pad: bool = False
    valid: int = 0
    value: int = 0
    targets: tuple = ()
    items: tuple = ()
    rank: int = 0
    ident: object = None

    @property
    def size(self) -> int:
        """Bytes of the element (``rows * cols * nbytes``)."""
        return self.rows * self.cols * self.nbytes


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


# ------------------------------------------------------------------------------------------- result
@dataclass
class ReferenceResult:
    """What :func:`run` returns.

    Attributes
    ----------
    cycles : int
        Canonical elapsed cycles (rule 5).
    unit_counters : int64 array (n_units, abi.N_CNT)
        fires, busy, blocked_in, blocked_out, final clock (see the module docstring).
    channel_counters : int64 array (n_channels, 2)
        pushes, peak occupancy.
    off_chip_bytes_read, off_chip_bytes_written : int
        Bytes moved by the memory ops.
    hbm_end : int
        The HBM's final clock (0 without memory ops).
    arrivals : list of list of int
        Per channel, the arrival stamp of every element in send order.
    dequeues : list of list of int
        Per channel, the receiver time ``d`` of every dequeue.
    tokens : list of list of Token or None
        Per channel, every element sent (only with ``record_tokens=True``).
    hbm_responses : dict
        Per memory unit, the arrival stamp of every HBM response (read data or write ack) in arrival order.
    steps : int
        Scheduler resumptions (a cost measure).
    stored : dict
        Per OffChipStore unit, every token it stored, in store order (tile i of its tensor is ``stored[u][i]``).
    link_bytes : int64 array (n_units,)
        Bytes each Link unit carried (0 for every other unit).
    """

    cycles: int
    unit_counters: np.ndarray
    channel_counters: np.ndarray
    off_chip_bytes_read: int
    off_chip_bytes_written: int
    hbm_end: int = 0
    arrivals: list = field(default_factory=list)
    dequeues: list = field(default_factory=list)
    hbm_responses: dict = field(default_factory=dict)
    tokens: list | None = None
    steps: int = 0
    stored: dict = field(default_factory=dict)
    link_bytes: np.ndarray | None = None

    def unit_clock(self, unit: int) -> int:
        """Final clock of a unit."""
        return int(self.unit_counters[unit, A.CNT_CLOCK])


# ------------------------------------------------------------------------------------------- state
W_EMPTY, W_FULL, W_HBM, W_TIME = "empty", "full", "hbm", "time"


class _Chan:
    __slots__ = (
        "cap",
        "cid",
        "clat",
        "close_time",
        "consumer",
        "credits",
        "done",
        "free",
        "lat",
        "name",
        "pops",
        "producer",
        "pushes",
        "q",
        "sends",
        "stamps",
        "tokens",
    )

    def __init__(self, cid, name, cap, lat, clat, producer, consumer):
        self.cid, self.name, self.cap, self.lat, self.clat = cid, name, cap, lat, clat
        self.q: deque = deque()  # (stamp, token)
        self.free = [0] * cap  # credit-free time per slot
        self.pushes = 0
        self.pops = 0
        self.done = False  # producer finished
        self.close_time = 0  # producer's final clock
        self.producer, self.consumer = producer, consumer
        self.stamps: list[int] = []
        self.sends: list[int] = []
        self.credits: list[int] = []
        self.tokens: list | None = None


class _Unit:
    __slots__ = ("bin", "bout", "busy", "clock", "done", "fires", "gen", "name", "op", "send", "uid", "wait")

    def __init__(self, uid, name, op):
        self.uid, self.name, self.op = uid, name, op
        self.clock = 0
        self.fires = self.busy = self.bin = self.bout = 0
        self.done = False
        self.wait = None  # (kind, arg) while blocked
        self.gen = None
        self.send = None  # value sent on the next resume


class _HBM:
    """The HBM controller and its channels, ticked per request (docs/timing_model.md §4.2-§4.4)."""

    def __init__(self, hw, mem_units):
        self.C = int(hw[A.HW_HBM_CHANNELS])
        self.ii = int(hw[A.HW_HBM_INIT_INTERVAL])
        self.lat = int(hw[A.HW_HBM_START_UP]) + int(hw[A.HW_HBM_LATENCY])
        self.addr_offset = int(hw[A.HW_ADDR_OFFSET])
        self.order = list(mem_units)  # arbitration order (readers, then writers)
        self.addr = {u: deque() for u in self.order}  # (stamp, n_requests) chunks
        self.resp = {u: deque() for u in self.order}  # response arrival stamps
        self.log = {u: [] for u in self.order}  # every response arrival stamp, per memory unit
        self.free = [0] * self.C
        self.chq = [deque() for _ in range(self.C)]  # (ready, unit)
        self.off = 0
        self.next_tick = 0
        self.requests = 0

    def candidate(self):
        best = None
        for q in self.chq:
            if q and (best is None or q[0][0] < best):
                best = q[0][0]
        for u in self.order:
            q = self.addr[u]
            if q and (best is None or q[0][0] < best):
                best = q[0][0]
        if best is None:
            return None
        return max(best, self.next_tick)

    def tick(self, T, wake):
        # 1. forward at most one response per channel (stamp T, arrives T + 1)
        for q in self.chq:
            if q and q[0][0] <= T:
                _, u = q.popleft()
                self.resp[u].append(T + 1)
                self.log[u].append(T + 1)
                wake(u)
        # 2. at most one chunk per reader, then per writer
        batch = []
        for u in self.order:
            q = self.addr[u]
            if q and q[0][0] <= T:
                _, n = q.popleft()
                batch.extend([u] * n)
        # 3. triangular channel assignment
        off = self.off
        for i, u in enumerate(batch):
            off = (off + i) % self.C
            s = max(self.free[off], T + 1)
            self.free[off] = s + self.ii
            self.chq[off].append((s + self.lat, u))
        self.off = (off + len(batch)) % self.C
        self.requests += len(batch)
        self.next_tick = T + 1


# ------------------------------------------------------------------------------------------- engine
class _Engine:
    def __init__(self, program, max_steps, record_tokens=False):
        self.p = program
        self.max_steps = max_steps
        P = program
        self.hw = P.hw
        self.pmu_bw = int(P.hw[A.HW_PMU_BW])
        self.units = [_Unit(u, P.unit_names[u], P.opcode(u)) for u in range(P.n_units)]
        self.ch = [_Chan(c, P.channel_names[c], int(P.ch_capacity[c]), int(P.ch_latency[c]),
                         int(P.ch_credit_latency[c]), int(P.ch_producer[c]), int(P.ch_consumer[c]))
                   for c in range(P.n_channels)]
        if record_tokens:
            for ch in self.ch:
                ch.tokens = []
        self.mem_units = [int(u) for u in P.mem_order]
        # one HBM per chip, serving that chip's memory units in mem_order
        chips = sorted({int(P.unit_params[u, A.UP_CHIP]) for u in self.mem_units})
        self.hbms = {c: _HBM(P.hw, [u for u in self.mem_units if int(P.unit_params[u, A.UP_CHIP]) == c])
                     for c in chips}
        self.bytes_read = 0
        self.bytes_written = 0
        self.stored: dict[int, list] = {}
        self.link_bytes = np.zeros(P.n_units, dtype=np.int64)
        self.ready: deque = deque()
        self.steps = 0

    # ----------------------------------------------------------------- parameters
    def par(self, u, slot):
        return int(self.p.unit_params[u, A.UP_A0 + slot])

    def payload(self, off, n):
        return [int(v) for v in self.p.payload[off:off + n]]

    # ----------------------------------------------------------------- wakeups
    def _wake(self, u, kind, arg=None):
        U = self.units[u]
        if U.wait is not None and U.wait[0] == kind and (arg is None or U.wait[1] == arg):
            U.wait = None
            self.ready.append(u)

    def wake_hbm(self, u):
        self._wake(u, W_HBM)

    # ----------------------------------------------------------------- clock helpers
    def in_wait(self, U, t):
        if t > U.clock:
            U.bin += t - U.clock
            U.clock = t

    def spend(self, U, n):
        U.clock += n
        U.busy += n

    def advance_busy(self, U, t):
        if t > U.clock:
            U.busy += t - U.clock
            U.clock = t

    def L(self, x: Token) -> int:
        return _ceil_div(x.size, self.pmu_bw) if x.mu else 0

    def W(self, x: Token, wb) -> int:
        return _ceil_div(x.size, self.pmu_bw) if wb else 0

    # ----------------------------------------------------------------- channel operations (generators)
    def avail(self, U, c):
        """Block until channel c holds an element (True) or is closed and empty (False)."""
        ch = self.ch[c]
        while not ch.q:
            if ch.done:
                self.in_wait(U, ch.close_time)  # a closure is observed at T iff the producer's final clock <= T
                return False
            U.wait = (W_EMPTY, c)
            yield
        return True

    def peek(self, U, c):
        """Blocking peek: the head token (clock = max(clock, stamp)) or None when closed."""
        if not (yield from self.avail(U, c)):
            return None
        stamp, tok = self.ch[c].q[0]
        self.in_wait(U, stamp)
        return tok

    def pop(self, U, c):
        """Remove c's head at the unit's clock (it must be present and the clock >= its stamp)."""
        ch = self.ch[c]
        stamp, tok = ch.q.popleft()
        d = max(U.clock, stamp)
        slot = ch.pops % ch.cap
        ch.free[slot] = d + ch.clat
        ch.credits.append(d + ch.clat)
        ch.pops += 1
        self._wake(ch.producer, W_FULL, c)
        return tok

    def deq(self, U, c):
        """Blocking dequeue: the token, or None when the channel is closed."""
        tok = yield from self.peek(U, c)
        if tok is None:
            return None
        self.pop(U, c)
        return tok

    def room(self, U, c):
        """Block until channel c has a physically free slot."""
        ch = self.ch[c]
        while len(ch.q) >= ch.cap:
            U.wait = (W_FULL, c)
            yield

    def credit(self, U, c):
        """Credit wait for the next send on c (a slot must be physically free)."""
        ch = self.ch[c]
        free = ch.free[ch.pushes % ch.cap]
        if free > U.clock:
            U.bout += free - U.clock
            U.clock = free

    def put(self, U, c, tok, requested):
        """Send on c after its credit wait (a slot must be physically free)."""
        self.credit(U, c)
        ch = self.ch[c]
        stamp = max(requested, U.clock + ch.lat)
        ch.q.append((stamp, tok))
        ch.stamps.append(stamp)
        ch.sends.append(U.clock)
        if ch.tokens is not None:
            ch.tokens.append(tok)
        ch.pushes += 1
        self._wake(ch.consumer, W_EMPTY, c)

    def enq_together(self, U, sends):
        """Blocking enqueue of one element on several channels at one time: ``sends`` is ``[(channel, token)]``;
        wait until every channel has a free slot, then for every credit, then send all (Broadcast, and Reshape
        with its padding flags)."""
        for c, _ in sends:
            yield from self.room(U, c)
        for c, _ in sends:
            self.credit(U, c)
        t = U.clock
        for c, tok in sends:
            self.put(U, c, tok, t)

    def enq(self, U, c, tok, requested=None):
        """Blocking enqueue at ``requested`` (default: the clock before any wait)."""
        if requested is None:
            requested = U.clock
        yield from self.room(U, c)
        self.put(U, c, tok, requested)

    def time_wait(self, U, candidate: Callable):
        U.wait = (W_TIME, candidate)
        T = yield
        return T

    # ----------------------------------------------------------------- HBM use by memory ops
    def hbm_tile(self, U, rows, cols, nbytes, par, write, traffic_bytes=None):
        """Issue one tile's requests at the unit's clock and wait for all responses.

        ``nbytes`` per element set the request count; ``traffic_bytes`` (default ``nbytes``) are counted.
        """
        hbm = self.hbms[int(self.p.unit_params[U.uid, A.UP_CHIP])]
        nreq = rows * _ceil_div(cols * nbytes, hbm.addr_offset)
        counted = rows * cols * (nbytes if traffic_bytes is None else traffic_bytes)
        if write:
            self.bytes_written += counted
        else:
            self.bytes_read += counted
        t0 = U.clock
        q = hbm.addr[U.uid]
        k = 0
        left = nreq
        while left > 0:
            n = min(par, left)
            q.append((max(t0 + k, t0 + 1), n))  # unbounded channel, latency 1
            k += 1
            left -= n
        resp = hbm.resp[U.uid]
        for _ in range(nreq):
            while not resp:
                U.wait = (W_HBM, None)
                yield
            self.advance_busy(U, resp.popleft())

    # ----------------------------------------------------------------- selectors
    def targets(self, U, tok: Token, n_ports: int):
        if tok.kind != KIND_SELECTOR:
            raise SimulationError(f"{U.name}: expected a selector element, got a {tok.kind}")
        for t in tok.targets:
            if not 0 <= t < n_ports:
                raise SimulationError(f"{U.name}: selector target {t} out of range for {n_ports} ports")
        return tok.targets

    # ----------------------------------------------------------------- scheduler
    def run(self):
        for U in self.units:
            U.gen = self._make(U)
            self.ready.append(U.uid)
        while True:
            while self.ready:
                u = self.ready.popleft()
                U = self.units[u]
                self._resume(U)
            # time-sensitive step: the earliest action among EagerMerges and the HBM
            best = None
            best_u = None
            for U in self.units:
                if not U.done and U.wait is not None and U.wait[0] == W_TIME:
                    t = U.wait[1]()
                    if t is not None and (best is None or t < best):
                        best, best_u = t, U
            best_hbm = None
            for hbm in self.hbms.values():  # the chips' HBMs in chip order: ties go to the lowest chip
                t = hbm.candidate()
                if t is not None and (best is None or t < best):
                    best, best_u, best_hbm = t, None, hbm
            if best is None:
                break
            self.steps += 1
            if best_u is None:
                best_hbm.tick(best, self.wake_hbm)
            else:
                best_u.wait = None
                best_u.send = best
                self._resume(best_u)
        pending = [U for U in self.units if not U.done]
        if pending:
            raise self._deadlock(pending)
        return self._result()

    def _resume(self, U):
        self.steps += 1
        if self.steps > self.max_steps:
            raise SimulationError(f"reference engine: more than max_steps={self.max_steps} scheduler steps")
        value, U.send = U.send, None
        try:
            U.gen.send(value)
        except StopIteration:
            self._finish(U)

    def _finish(self, U):
        U.done = True
        U.wait = None
        for c in self.p.outputs(U.uid):
            ch = self.ch[c]
            if ch.done:  # a Link closed this transfer's output when the transfer ended
                continue
            ch.done = True
            ch.close_time = U.clock
            self._wake(ch.consumer, W_EMPTY, c)

    def _deadlock(self, pending):
        """The raw DeadlockError, with the records the numba engine gives (an EagerMerge choosing waits on each
        of its inputs: one record per input); diagnosed above the engine (:mod:`stepsim.analysis.deadlock`)."""
        from stepsim.base.errors import BlockedUnit, raw_deadlock

        blocked = []
        lines = []
        for U in pending:
            kind, arg = U.wait if U.wait is not None else ("none", None)
            op = A.OPCODE_NAMES[U.op]
            if kind in (W_EMPTY, W_FULL):
                ch = self.ch[arg]
                blocked.append(BlockedUnit(U.name, op, U.clock, ch.name, kind, len(ch.q), ch.cap))
                lines.append(f"  {U.name} ({op}) waits on {kind} channel {ch.name!r} "
                             f"(occupancy {len(ch.q)}/{ch.cap})")
            elif kind == W_TIME:
                chans = [self.ch[c] for c in self.p.inputs(U.uid)]
                blocked += [BlockedUnit(U.name, op, U.clock, ch.name, "empty", len(ch.q), ch.cap) for ch in chans]
                lines.append(f"  {U.name} ({op}) waits on empty channels "
                             + ", ".join(f"{ch.name!r} (occupancy {len(ch.q)}/{ch.cap})" for ch in chans))
            else:
                blocked.append(BlockedUnit(U.name, op, U.clock, None, str(kind)))
                lines.append(f"  {U.name} ({op}) waits on {kind}")
        return raw_deadlock(self.p, blocked, lines)

    def _result(self):
        P = self.p
        uc = np.zeros((P.n_units, A.N_CNT), dtype=np.int64)
        for U in self.units:
            uc[U.uid] = (U.fires, U.busy, U.bin, U.bout, U.clock)
        cc = np.zeros((P.n_channels, 2), dtype=np.int64)
        for ch in self.ch:
            cc[ch.cid, A.CCNT_PUSHES] = ch.pushes
            cc[ch.cid, A.CCNT_PEAK] = _peak(ch.sends, ch.credits)
        cycles = max((U.clock for U in self.units), default=0)
        hbm_end = 0
        if self.mem_units:
            hbm_end = max(self.units[u].clock for u in self.mem_units) + 1
            cycles = max(cycles, hbm_end)
        return ReferenceResult(cycles=int(cycles), unit_counters=uc, channel_counters=cc,
                               off_chip_bytes_read=self.bytes_read, off_chip_bytes_written=self.bytes_written,
                               hbm_end=hbm_end, arrivals=[list(ch.stamps) for ch in self.ch],
                               dequeues=[[t - ch.clat for t in ch.credits] for ch in self.ch],
                               hbm_responses={u: log for hbm in self.hbms.values() for u, log in hbm.log.items()},
                               tokens=[ch.tokens for ch in self.ch] if self.ch and self.ch[0].tokens is not None
                               else None, steps=self.steps, stored=self.stored, link_bytes=self.link_bytes)

    # ----------------------------------------------------------------- unit generators
    def _make(self, U):
        fn = _BEHAVIOURS.get(U.op)
        if fn is None:
            raise SimulationError(f"{U.name}: opcode {U.op} is not supported by the reference engine")
        return fn(self, U, self.p.inputs(U.uid), self.p.outputs(U.uid))


def _peak(sends, credits):
    """Max number of elements holding a slot at a send time (intervals [send, credit))."""
    peak = 0
    j = 0
    for i, s in enumerate(sends):
        while j < len(credits) and j < i and credits[j] <= s:
            j += 1
        peak = max(peak, i - j + 1)
    return peak


def _stop_from_shape(dims, i):
    """Number of innermost dims of ``dims`` (outermost first) that element i closes."""
    level = 0
    for d in reversed(dims):
        if i % d == d - 1:
            level += 1
            i //= d
        else:
            break
    return level


# ================================================================================== behaviours
_BEHAVIOURS: dict[int, Callable] = {}


def _op(code):
    def deco(fn):
        _BEHAVIOURS[code] = fn
        return fn
    return deco


# ---------------------------------------------------------------------------------- sources / sinks
@_op(A.OP_SELECT_GEN)
def _select_gen(E, U, ins, outs):
    u = U.uid
    n = E.par(u, A.PA_N_ELEMS)
    e0 = E.par(u, A.PA_VALUES_OFF)
    dims = E.payload(E.par(u, A.PA_SHAPE_OFF), E.par(u, A.PA_SHAPE_LEN))
    width = E.par(u, A.PA_N_TARGETS)
    sp, si = E.p.sel_ptr, E.p.sel_idx
    for i in range(n):
        e = e0 + i
        tg = tuple(sorted(int(t) for t in si[sp[e]:sp[e + 1]]))
        tok = Token(KIND_SELECTOR, stop=_stop_from_shape(dims, i), rows=1, cols=width, nbytes=1, targets=tg)
        yield from E.enq(U, outs[0], tok, U.clock + 1)
        E.spend(U, 1)
        U.fires += 1


@_op(A.OP_METADATA_GEN)
def _metadata_gen(E, U, ins, outs):
    u = U.uid
    n = E.par(u, A.PA_N_ELEMS)
    dims = E.payload(E.par(u, A.PA_SHAPE_OFF), E.par(u, A.PA_SHAPE_LEN))
    vals = E.payload(E.par(u, A.PA_VALUES_OFF), n)
    for i in range(n):
        tok = Token(KIND_SCALAR, stop=_stop_from_shape(dims, i), nbytes=8, valid=1, value=vals[i])
        yield from E.enq(U, outs[0], tok, i)
        U.fires += 1


@_op(A.OP_SINK)
def _sink(E, U, ins, outs):
    while (yield from E.deq(U, ins[0])) is not None:
        E.spend(U, 1)
        U.fires += 1


@_op(A.OP_EXPERT_ADDR_GEN)
def _expert_addr_gen(E, U, ins, outs):
    T = E.par(U.uid, A.PA_TILES_PER_TARGET)
    base = E.par(U.uid, A.PA_BASE)
    while True:
        sel = yield from E.deq(U, ins[0])
        if sel is None:
            return
        U.fires += 1
        tg = sel.targets if sel.kind == KIND_SELECTOR else ()
        n = len(tg) * T
        for i in range(n):
            e, j = tg[i // T], i % T
            stop = 1
            if j == T - 1:
                stop = 2 + sel.stop if i == n - 1 else 2
            yield from E.enq(U, outs[0], Token(KIND_SCALAR, stop=stop, nbytes=8, valid=1, value=base + e * T + j))


@_op(A.OP_CACHE_READ_ADDR_GEN)
def _cache_read_addr_gen(E, U, ins, outs):
    row_offset = E.par(U.uid, A.PA_ROW_OFFSET)
    while True:
        idx = yield from E.deq(U, ins[0])
        if idx is None:
            return
        ln = yield from E.deq(U, ins[1])
        if ln is None:
            return
        U.fires += 1
        start = U.clock
        n = ln.value
        for j in range(n):
            stop = 1 + idx.stop if j == n - 1 else 0
            tok = Token(KIND_SCALAR, stop=stop, nbytes=8, valid=1, value=idx.value * row_offset + j)
            yield from E.enq(U, outs[0], tok, start + j)


@_op(A.OP_FILTER_LAST_TILE)
def _filter_last_tile(E, U, ins, outs):
    while True:
        ln = yield from E.deq(U, ins[0])
        if ln is None:
            return
        U.fires += 1
        n = ln.value
        for j in range(n):
            last = j == n - 1
            tok = Token(KIND_SELECTOR, stop=1 + ln.stop if last else 0, rows=1, cols=2, nbytes=1,
                        targets=(0,) if last else (1,))
            yield from E.enq(U, outs[0], tok)


# ---------------------------------------------------------------------------------- off-chip memory
def _mem_tile_params(E, u):
    return (E.par(u, A.PA_TILE_ROWS), E.par(u, A.PA_TILE_COLS), E.par(u, A.PA_ELEM_BYTES),
            E.par(u, A.PA_PAR_DISPATCH))


@_op(A.OP_OFFCHIP_LOAD)
def _offchip_load(E, U, ins, outs):
    rows, cols, nb, par = _mem_tile_params(E, U.uid)
    dims = E.payload(E.par(U.uid, A.PA_VIEW_OFF), E.par(U.uid, A.PA_VIEW_LEN))
    yield from _load_view(E, U, outs[0], rows, cols, nb, par, dims, 0, bool(E.par(U.uid, A.PA_RESIDENT)))


def _view_strides(E, u, dims):
    """Tile stride per view dim of a load: its tensor's strides, else row-major over the view."""
    t = E.p.unit_tensors[u] if E.p.unit_tensors else None
    if t is not None and t.strides:
        return [int(s) for s in t.strides]
    return [int(np.prod(dims[k + 1:])) for k in range(len(dims))]


def _view_tile(dims, strides, i):
    """Tile index read by view element i: ``sum_k idx_k * stride_k`` (idx: i unravelled over dims)."""
    t = 0
    for d, s in zip(reversed(dims), reversed(strides)):
        t += (i % d) * s
        i //= d
    return t


def _load_view(E, U, out, rows, cols, nb, par, dims, ref_stop, resident=False):
    """The tiles of a load's view; a resident tensor (on-chip memory) skips the HBM round trip."""
    n = int(np.prod(dims))
    strides = _view_strides(E, U.uid, dims)
    for i in range(n):
        if not resident:
            yield from E.hbm_tile(U, rows, cols, nb, par, False)
        stop = _stop_from_shape(dims, i) + (ref_stop if i == n - 1 else 0)
        tok = Token(KIND_TILE, stop=stop, rows=rows, cols=cols, nbytes=nb, mu=True, valid=rows,
                    ident=(U.uid, _view_tile(dims, strides, i)))
        yield from E.enq(U, out, tok)
        U.fires += 1


@_op(A.OP_DYN_OFFCHIP_LOAD)
def _dyn_offchip_load(E, U, ins, outs):
    rows, cols, nb, par = _mem_tile_params(E, U.uid)
    dims = E.payload(E.par(U.uid, A.PA_VIEW_OFF), E.par(U.uid, A.PA_VIEW_LEN))
    while True:
        ref = yield from E.deq(U, ins[0])
        if ref is None:
            return
        yield from _load_view(E, U, outs[0], rows, cols, nb, par, dims, ref.stop)


@_op(A.OP_RANDOM_OFFCHIP_LOAD)
def _random_offchip_load(E, U, ins, outs):
    rows, cols, nb, par = _mem_tile_params(E, U.uid)
    while True:
        addr = yield from E.deq(U, ins[0])
        if addr is None:
            return
        yield from E.hbm_tile(U, rows, cols, nb, par, False)
        yield from E.enq(U, outs[0], Token(KIND_TILE, stop=addr.stop, rows=rows, cols=cols, nbytes=nb, mu=True,
                                           valid=rows, ident=(U.uid, addr.value)))
        U.fires += 1


@_op(A.OP_OFFCHIP_STORE)
def _offchip_store(E, U, ins, outs):
    par = E.par(U.uid, A.PA_PAR_DISPATCH)
    traffic = E.par(U.uid, A.PA_ELEM_BYTES)  # 0: count at the tile's own width
    stored = E.stored.setdefault(U.uid, [])
    while True:
        x = yield from E.peek(U, ins[0])
        if x is None:
            return
        if not E.par(U.uid, A.PA_RESIDENT):  # a resident tensor (on-chip memory) needs no HBM round trip
            yield from E.hbm_tile(U, x.rows, x.cols, x.nbytes, par, True, traffic or x.nbytes)
        E.pop(U, ins[0])
        stored.append(x)
        U.fires += 1


@_op(A.OP_RANDOM_OFFCHIP_STORE)
def _random_offchip_store(E, U, ins, outs):
    rows, cols, nb, par = _mem_tile_params(E, U.uid)
    on_waddr = E.par(U.uid, A.PA_ACK_ON_WADDR)
    while True:
        a = yield from E.peek(U, ins[0])
        if a is None:
            return
        d = yield from E.peek(U, ins[1])
        if d is None:
            return
        yield from E.hbm_tile(U, rows, cols, nb, par, True)
        stop = a.stop if on_waddr else d.stop
        yield from E.enq(U, outs[0], Token(KIND_SCALAR, stop=stop, nbytes=1, valid=1, value=1))
        E.pop(U, ins[0])
        E.pop(U, ins[1])
        U.fires += 1


# ---------------------------------------------------------------------------------- on-chip buffers
@_op(A.OP_BUFFERIZE)
def _bufferize(E, U, ins, outs):
    b = E.par(U.uid, A.PA_RANK)
    items = []
    while True:
        x = yield from E.deq(U, ins[0])
        if x is None:
            return
        U.fires += 1
        if x.stop < b:
            items.append(x)
            E.spend(U, 1)
            continue
        items.append(replace(x, stop=b))
        ref = Token(KIND_BUFFER, stop=x.stop - b, rows=len(items), cols=b, nbytes=0, items=tuple(items), rank=b)
        items = []
        yield from E.enq(U, outs[0], ref)


def _buffer_stop(x: Token, b: int, extra: int) -> int:
    return b + extra if x.stop >= b else x.stop


@_op(A.OP_STREAMIFY)
def _streamify(E, U, ins, outs):
    reps = E.payload(E.par(U.uid, A.PA_REPEAT_OFF), E.par(U.uid, A.PA_REPEAT_LEN))
    nrep = int(np.prod(reps)) if reps else 1
    while True:
        buf = yield from E.peek(U, ins[0])
        if buf is None:
            return
        count = len(buf.items)
        for j in range(count * nrep):
            rep = j // count
            extra = _stop_from_shape(reps, rep) if reps else 0
            if extra == len(reps):
                extra += buf.stop
            x = buf.items[j % count]
            yield from E.enq(U, outs[0], replace(x, stop=_buffer_stop(x, buf.rank, extra)))
            E.spend(U, 1)
        E.pop(U, ins[0])
        U.fires += 1


@_op(A.OP_DYN_STREAMIFY)
def _dyn_streamify(E, U, ins, outs):
    repeat_rank = E.par(U.uid, A.PA_REPEAT_RANK)
    while True:
        buf = yield from E.peek(U, ins[0])
        if buf is None:
            return
        ref = yield from E.deq(U, ins[1])
        if ref is None:
            return
        for x in buf.items:
            yield from E.enq(U, outs[0], replace(x, stop=_buffer_stop(x, buf.rank, ref.stop)))
            E.spend(U, 1)
        U.fires += 1
        if ref.stop >= repeat_rank + 1:
            E.pop(U, ins[0])


# ---------------------------------------------------------------------------------- compute
def _bcast(r1, c1, r2, c2):
    return max(r1, r2), max(c1, c2)


def _stops_conflict(s1, s2):
    """Both operands carry a stop and the levels differ (a plain value may pair with a stop; see
    :func:`stepsim.kernels.units_compute.stops_conflict`)."""
    return s1 != s2 and s1 > 0 and s2 > 0


def _map_result(E, U, fn, fn_param, x: Token, y: Token | None):
    """(output rows, cols, cycles of the function, kind, value, valid) for Map."""
    bw = E.par(U.uid, A.PA_COMPUTE_BW)
    if fn == A.FN_MATMUL:
        M, K = x.rows, x.cols
        N = y.rows if fn_param == 1 else y.cols
        return M, N, _ceil_div(2 * M * K * N, bw), KIND_TILE, 0, x.valid
    if fn in (A.FN_ADD, A.FN_SUB, A.FN_MUL, A.FN_DIV, A.FN_MAX):
        R, C = _bcast(x.rows, x.cols, y.rows, y.cols)
        return R, C, _ceil_div(R * C, bw), KIND_TILE, 0, x.valid if x.rows == R else y.valid
    if fn == A.FN_SILU:
        return x.rows, x.cols, _ceil_div(8 * x.rows * x.cols, bw), KIND_TILE, 0, x.valid
    if fn == A.FN_EXP:
        return x.rows, x.cols, _ceil_div(4 * x.rows * x.cols, bw), KIND_TILE, 0, x.valid
    if fn == A.FN_POINTWISE:
        flops = A.POINTWISE_FLOPS[fn_param & 255]
        return x.rows, x.cols, _ceil_div(flops * x.rows * x.cols, bw), KIND_TILE, 0, x.valid
    if fn in (A.FN_ROWSUM, A.FN_ROWMAX):
        return x.rows, 1, _ceil_div(x.rows * x.cols, bw), KIND_TILE, 0, x.valid
    if fn == A.FN_ONLINE_SOFTMAX:  # x: scores [q, n], y: values [n, d]
        q, n, d = x.rows, x.cols, y.cols
        return q, d + 2, _ceil_div(2 * q * n * d + 8 * q * n + 2 * q * d + 6 * q, bw), KIND_TILE, 0, x.valid
    if fn == A.FN_SOFTMAX_NORMALIZE:
        return x.rows, x.cols - 2, _ceil_div(x.rows * (x.cols - 2), bw), KIND_TILE, 0, x.valid
    if fn == A.FN_SET_OFFSET:
        return x.rows, x.cols, 1, KIND_TILE, 0, y.value
    if fn == A.FN_ROW_APPEND:
        return x.rows, x.cols, 1, KIND_TILE, 0, x.valid
    if fn == A.FN_CACHE_WRITE_ADDR:
        return 1, 1, 1, KIND_SCALAR, x.value * fn_param + y.value - 1, 1
    raise SimulationError(f"{U.name}: function {A.FUNCTION_NAMES.get(fn, fn)!r} cannot be used in a Map")


@_op(A.OP_MAP)
def _map(E, U, ins, outs):
    u = U.uid
    fn, fp, wb = E.par(u, A.PA_FN), E.par(u, A.PA_FN_PARAM), E.par(u, A.PA_WRITE_BACK)
    while True:
        x = yield from E.peek(U, ins[0])
        y = None
        if len(ins) == 2:
            y = yield from E.peek(U, ins[1])
            if (x is None) != (y is None):
                raise SimulationError(f"{U.name}: one input of a BinaryMap closed before the other")
            if x is not None and _stops_conflict(x.stop, y.stop):
                raise SimulationError(f"{U.name}: BinaryMap inputs disagree on the stop level "
                                      f"({x.stop} vs {y.stop})")
        if x is None:
            return
        rows, cols, comp, kind, value, valid = _map_result(E, U, fn, fp, x, y)
        out = Token(kind, stop=x.stop, rows=rows, cols=cols, nbytes=x.nbytes, mu=bool(wb), valid=valid, value=value)
        load = E.L(x) + (E.L(y) if y is not None else 0)
        E.spend(U, max(load, comp, E.W(out, wb)))
        yield from E.enq(U, outs[0], out)
        E.pop(U, ins[0])
        if y is not None:
            E.pop(U, ins[1])
        U.fires += 1


def _init_tile(E, u, wb):
    kind = KIND_SCALAR if E.par(u, A.PA_FN) == A.FN_SIGNAL_REQ_ALL_READ else KIND_TILE
    return Token(kind, rows=E.par(u, A.PA_INIT_ROWS), cols=E.par(u, A.PA_INIT_COLS), nbytes=E.par(u, A.PA_INIT_BYTES),
                 mu=bool(wb), valid=0)


def _fold(E, U, fn, acc: Token, x: Token, wb):
    """Accumulate x into acc: (new acc, cycles). An empty accumulator adopts the input's shape.

    RetileRow / RetileCol concatenate (0 cycles) and inherit x's read_from_mu and bytes; every other
    function (including matmul used as a fold) is element-wise with broadcasting, ``rows * cols`` FLOPs.
    """
    if fn == A.FN_RETILE_ROW:
        valid = 0 if x.pad else x.valid
        return Token(KIND_TILE, rows=acc.rows + x.rows, cols=x.cols, nbytes=x.nbytes, mu=x.mu,
                     valid=acc.valid + valid), 0
    if fn == A.FN_RETILE_COL:
        return Token(KIND_TILE, rows=x.rows, cols=acc.cols + x.cols, nbytes=x.nbytes, mu=x.mu, valid=x.rows), 0
    if fn == A.FN_SIGNAL_REQ_ALL_READ:
        return Token(KIND_SCALAR, rows=1, cols=1, nbytes=8, mu=bool(wb), valid=1, value=1), 1
    if fn in (A.FN_ADD, A.FN_SUB, A.FN_MUL, A.FN_MAX, A.FN_DIV, A.FN_MATMUL):
        empty = acc.rows * acc.cols == 0
        R, C = (x.rows, x.cols) if empty else _bcast(acc.rows, acc.cols, x.rows, x.cols)
        nb = acc.nbytes if acc.nbytes > 0 else x.nbytes
        bw = E.par(U.uid, A.PA_COMPUTE_BW)
        valid = x.valid if empty else max(acc.valid, x.valid)
        return Token(KIND_TILE, rows=R, cols=C, nbytes=nb, mu=bool(wb), valid=valid), _ceil_div(R * C, bw)
    raise SimulationError(f"{U.name}: function {A.FUNCTION_NAMES.get(fn, fn)!r} cannot accumulate")


@_op(A.OP_ACCUM)
def _accum(E, U, ins, outs):
    u = U.uid
    fn, wb, r = E.par(u, A.PA_FN), E.par(u, A.PA_WRITE_BACK), E.par(u, A.PA_RANK)
    init = _init_tile(E, u, wb)
    acc = init
    while True:
        x = yield from E.peek(U, ins[0])
        if x is None:
            return
        acc, comp = _fold(E, U, fn, acc, x, wb)
        U.fires += 1
        if x.stop < r:
            E.spend(U, max(E.L(x), comp))
            E.pop(U, ins[0])
            continue
        E.spend(U, max(E.L(x), comp, E.W(init, wb)))
        E.pop(U, ins[0])
        out = replace(acc, stop=x.stop - r)
        acc = init
        yield from E.enq(U, outs[0], out)


@_op(A.OP_MAP_ACCUM)
def _map_accum(E, U, ins, outs):
    u = U.uid
    fn, fp, wb, r = E.par(u, A.PA_FN), E.par(u, A.PA_FN_PARAM), E.par(u, A.PA_WRITE_BACK), E.par(u, A.PA_RANK)
    init = _init_tile(E, u, wb)
    acc = init
    while True:
        x = yield from E.peek(U, ins[0])
        y = yield from E.peek(U, ins[1])
        if (x is None) != (y is None):
            raise SimulationError(f"{U.name}: one input of a MapAccum closed before the other")
        if x is None:
            return
        if _stops_conflict(x.stop, y.stop):
            raise SimulationError(f"{U.name}: MapAccum inputs disagree on the stop level ({x.stop} vs {y.stop})")
        rows, cols, comp, _, _, valid = _map_result(E, U, fn, fp, x, y)
        empty = acc.rows == 0 or acc.cols == 0
        R, C = (rows, cols) if empty else _bcast(acc.rows, acc.cols, rows, cols)
        acc = Token(KIND_TILE, rows=R, cols=C, nbytes=acc.nbytes if acc.nbytes > 0 else x.nbytes, mu=bool(wb),
                    valid=valid if empty else max(acc.valid, valid))
        load = E.L(x) + E.L(y)
        U.fires += 1
        if x.stop < r:
            E.spend(U, max(load, comp))
            E.pop(U, ins[0])
            E.pop(U, ins[1])
            continue
        E.spend(U, max(load, comp, E.W(init, wb)))
        E.pop(U, ins[0])
        E.pop(U, ins[1])
        out = replace(acc, stop=x.stop - r)
        acc = init
        yield from E.enq(U, outs[0], out)


@_op(A.OP_SCAN)
def _scan(E, U, ins, outs):
    u = U.uid
    fn, wb, r = E.par(u, A.PA_FN), E.par(u, A.PA_WRITE_BACK), E.par(u, A.PA_RANK)
    init = _init_tile(E, u, wb)
    acc = init
    while True:
        x = yield from E.peek(U, ins[0])
        if x is None:
            return
        acc, comp = _fold(E, U, fn, acc, x, wb)
        out = replace(acc, stop=x.stop)
        E.spend(U, max(E.L(x), comp, E.W(out, wb)))
        E.pop(U, ins[0])
        if x.stop >= r:
            acc = init
        yield from E.enq(U, outs[0], out)
        U.fires += 1


# ---------------------------------------------------------------------------------- routing
def _switch(E, u, n):
    return E.payload(E.par(u, A.PA_SWITCH_OFF), n)


def _group_end(stop, rank):
    return rank == 0 or stop >= rank


@_op(A.OP_PARTITION)
def _partition(E, U, ins, outs):
    u = U.uid
    r, wb = E.par(u, A.PA_RANK), E.par(u, A.PA_WRITE_BACK)
    sw = _switch(E, u, len(outs))
    data, selc = ins
    while True:
        sel = yield from E.peek(U, selc)
        if sel is None:
            return
        E.spend(U, E.L(sel))
        E.pop(U, selc)
        tg = E.targets(U, sel, len(outs))
        swc = max((sw[e] for e in tg), default=0)
        while True:
            x = yield from E.peek(U, data)
            if x is None:  # data closed: the unit ends (like step-perf's loop on the data stream)
                return
            E.spend(U, E.L(x))
            E.pop(U, data)
            E.spend(U, swc + E.W(x, wb))
            out = replace(x, stop=min(x.stop, r), mu=bool(wb))
            for e in tg:
                yield from E.enq(U, outs[e], out)
            U.fires += 1
            if _group_end(x.stop, r):
                break


@_op(A.OP_REASSEMBLE)
def _reassemble(E, U, ins, outs):
    u = U.uid
    r, wb = E.par(u, A.PA_RANK), E.par(u, A.PA_WRITE_BACK)
    data, selc = ins[:-1], ins[-1]
    sw = _switch(E, u, len(data))
    while True:
        sel = yield from E.peek(U, selc)
        if sel is None:
            return
        E.spend(U, E.L(sel))
        E.pop(U, selc)
        tg = E.targets(U, sel, len(data))
        heads = []
        for k, i in enumerate(tg):
            x = yield from E.peek(U, data[i])
            if x is None:
                raise SimulationError(f"{U.name}: selected input {E.ch[data[i]].name!r} is closed")
            heads.append((E.ch[data[i]].q[0][0], k, i))
        heads.sort()
        for n_done, (a, _, i) in enumerate(heads):
            last_input = n_done == len(heads) - 1
            while True:
                x = yield from E.peek(U, data[i])
                if x is None:
                    raise SimulationError(f"{U.name}: input {E.ch[data[i]].name!r} closed inside a group")
                E.advance_busy(U, a + sw[i] + E.L(x))
                E.pop(U, data[i])
                E.spend(U, E.W(x, wb))
                end = _group_end(x.stop, r)
                stop = x.stop
                if end and last_input:
                    stop = x.stop + sel.stop + 1
                elif end and r == 0:
                    stop = 0
                yield from E.enq(U, outs[0], replace(x, stop=stop, mu=bool(wb)))
                U.fires += 1
                if end:
                    break


@_op(A.OP_EAGER_MERGE)
def _eager_merge(E, U, ins, outs):
    r = E.par(U.uid, A.PA_RANK)
    chans = [E.ch[c] for c in ins]
    data_out, sel_out = outs
    while True:
        T = yield from E.time_wait(U, lambda: _earliest_head(U, chans))
        E.in_wait(U, T)
        pick = None
        for k, ch in enumerate(chans):
            if ch.q and ch.q[0][0] <= T and (pick is None or ch.q[0][0] < chans[pick].q[0][0]):
                pick = k
        if pick is None:
            if all(ch.done and not ch.q and ch.close_time <= T for ch in chans):
                return
            continue
        yield from E.enq(U, sel_out, Token(KIND_SELECTOR, rows=1, cols=len(ins), nbytes=1, targets=(pick,)))
        while True:
            x = yield from E.deq(U, ins[pick])
            if x is None:  # the chosen input closed inside a group: choose again
                break
            if x.stop > r:
                raise SimulationError(f"{U.name}: stop level {x.stop} above the merge rank {r} "
                                      "(step-perf panics)")
            U.fires += 1
            yield from E.enq(U, data_out, x)
            if r == 0 or x.stop == r:
                break
            E.spend(U, 1)


def _earliest_head(U, chans):
    """The decision time of a unit that takes its inputs' heads in arrival order (EagerMerge, Link): the first
    time >= its clock at which a head is visible, or at which every input is observed closed; None: wait."""
    best = None
    for ch in chans:
        if ch.q:
            t = max(U.clock, ch.q[0][0])
            if best is None or t < best:
                best = t
    if best is None and all(ch.done for ch in chans):
        best = max([U.clock] + [ch.close_time for ch in chans])
    return best


@_op(A.OP_LINK)
def _link(E, U, ins, outs):
    """First come, first served among the transfers whose receiver has a free slot; each element occupies the link
    ceil(bytes / bandwidth) cycles and arrives ``latency`` cycles after its last byte left; transfer k's output
    closes when its input is observed closed (kernels.units_link)."""
    bandwidth = E.par(U.uid, A.PA_LINK_BW)
    latency = E.par(U.uid, A.PA_LINK_LAT)
    chans = [E.ch[c] for c in ins]
    out_chans = [E.ch[c] for c in outs]

    def ready(ch, out):
        """When transfer (ch -> out) may send its head: arrived and the receiver's next slot free (None: full)."""
        if len(out.q) >= out.cap:
            return None
        return max(ch.q[0][0], out.free[out.pushes % out.cap])

    def candidate():
        best = None
        for ch, out in zip(chans, out_chans):
            if ch.q:
                t = ready(ch, out)
                if t is None:
                    continue
                t = max(U.clock, t)
            elif ch.done and not out.done:
                t = max(U.clock, ch.close_time)
            else:
                continue
            if best is None or t < best:
                best = t
        if best is None and all(ch.done and not ch.q for ch in chans):  # a queued head waits for its credit
            best = max([U.clock] + [ch.close_time for ch in chans])
        return best

    while True:
        T = yield from E.time_wait(U, candidate)
        E.in_wait(U, T)
        for ch, out in zip(chans, out_chans):
            if ch.done and not ch.q and ch.close_time <= T and not out.done:
                out.done = True
                out.close_time = U.clock
                E._wake(out.consumer, W_EMPTY, out.cid)
        pick = None
        for k, (ch, out) in enumerate(zip(chans, out_chans)):
            if ch.q and (pick is None or ch.q[0][0] < chans[pick].q[0][0]):
                t = ready(ch, out)
                if t is not None and t <= T:
                    pick = k
        if pick is None:
            if all(ch.done and not ch.q and ch.close_time <= T for ch in chans):
                return
            continue
        x = yield from E.deq(U, ins[pick])
        U.fires += 1
        E.link_bytes[U.uid] += x.size
        E.spend(U, _ceil_div(x.size, bandwidth))
        yield from E.enq(U, outs[pick], x, U.clock + latency)


@_op(A.OP_PARALLELIZE)
def _parallelize(E, U, ins, outs):
    r = E.par(U.uid, A.PA_RANK)
    sw = _switch(E, U.uid, len(outs))
    lane = 0
    while True:
        x = yield from E.deq(U, ins[0])
        if x is None:
            return
        if x.stop > r:
            raise SimulationError(f"{U.name}: stop level {x.stop} above the parallelize rank {r} (step-perf panics)")
        U.fires += 1
        yield from E.enq(U, outs[lane], x, U.clock + sw[lane])
        if _group_end(x.stop, r):
            lane = (lane + 1) % len(outs)


@_op(A.OP_BROADCAST)
def _broadcast(E, U, ins, outs):
    while True:
        x = yield from E.deq(U, ins[0])
        if x is None:
            return
        yield from E.enq_together(U, [(c, x) for c in outs])
        U.fires += 1


# ---------------------------------------------------------------------------------- shape
@_op(A.OP_FLATTEN)
def _flatten(E, U, ins, outs):
    lo, hi = E.par(U.uid, A.PA_MIN_RANK), E.par(U.uid, A.PA_MAX_RANK)
    while True:
        x = yield from E.deq(U, ins[0])
        if x is None:
            return
        s = x.stop
        if s > hi:
            s -= hi - lo
        elif s > lo:
            s = lo
        yield from E.enq(U, outs[0], replace(x, stop=s))
        U.fires += 1


@_op(A.OP_PROMOTE)
def _promote(E, U, ins, outs):
    p, outer = E.par(U.uid, A.PA_RANK), E.par(U.uid, A.PA_PROMOTE_OUTER)
    while True:
        x = yield from E.deq(U, ins[0])
        if x is None:
            return
        s = x.stop + 1 if x.stop >= p else x.stop
        if outer:
            nxt = yield from E.peek(U, ins[0])
            if nxt is None:
                s = max(s, p)
        yield from E.enq(U, outs[0], replace(x, stop=s))
        U.fires += 1


@_op(A.OP_RESHAPE)
def _reshape(E, U, ins, outs):
    u = U.uid
    S, r = E.par(u, A.PA_CHUNK), E.par(u, A.PA_RANK)
    pad_bytes = E.par(u, A.PA_PAD_BYTES)
    add_outer, wb = E.par(u, A.PA_ADD_OUTER), E.par(u, A.PA_RESHAPE_WB)
    pad = Token(KIND_TILE, rows=E.par(u, A.PA_PAD_ROWS), cols=E.par(u, A.PA_PAD_COLS), nbytes=pad_bytes,
                mu=bool(wb), pad=True, valid=0)
    out = outs[0]
    flags = outs[1] if len(outs) == 2 else None

    def send(tok, padded=False):
        """The element, and its padding flag (when read: 1 if this Reshape padded it) at one time."""
        if flags is None:
            yield from E.enq(U, out, tok)
            return
        flag = Token(KIND_SCALAR, stop=tok.stop, nbytes=1, valid=1, value=int(padded))
        yield from E.enq_together(U, [(out, tok), (flags, flag)])

    def pads(final_stop):
        n = S - j % S
        for k in range(n):
            yield from send(replace(pad, stop=final_stop if k == n - 1 else 0), padded=True)

    j = 0  # rank-r units seen in the current dim
    while True:
        x = yield from E.deq(U, ins[0])
        if x is None:
            if r == 0 and j % S != 0 and pad_bytes > 0:  # rank-0 input: the close ends the dim
                yield from pads(2 if add_outer else 1)
            return
        U.fires += 1
        L = x.stop
        if L < r:
            yield from send(x)
            continue
        j += 1
        if L == r:
            if j % S == 0:
                s = r + 1
                if add_outer:
                    nxt = yield from E.peek(U, ins[0])
                    if nxt is None:
                        s = r + 2
                        j = 0
            else:
                s = r
            yield from send(replace(x, stop=s))
            continue
        # L > r: the element closes the whole dim
        if j % S != 0 and r == 0 and pad_bytes > 0:
            yield from send(replace(x, stop=0))
            yield from pads(L + 1)
        else:
            yield from send(replace(x, stop=L + 1))
        j = 0


@_op(A.OP_EXPAND_REF)
def _expand_ref(E, U, ins, outs):
    k = E.par(U.uid, A.PA_RANK)
    while True:
        x = yield from E.peek(U, ins[0])
        if x is None:
            return
        while True:
            ref = yield from E.deq(U, ins[1])
            if ref is None:
                return
            yield from E.enq(U, outs[0], replace(x, stop=ref.stop))
            U.fires += 1
            if ref.stop >= k:
                E.pop(U, ins[0])
                break


@_op(A.OP_REPEAT_STATIC)
def _repeat_static(E, U, ins, outs):
    n = E.par(U.uid, A.PA_COUNT)
    while True:
        x = yield from E.peek(U, ins[0])
        if x is None:
            return
        for i in range(n):
            # requested stamp = current clock (after earlier credit waits) + i  (docs/timing_model.md §9 S10)
            yield from E.room(U, outs[0])
            requested = U.clock + i
            E.put(U, outs[0], replace(x, stop=x.stop + 1 if i == n - 1 else 0), requested)
        E.spend(U, n)
        E.pop(U, ins[0])
        U.fires += 1


@_op(A.OP_ROW_STREAMIFY)
def _row_streamify(E, U, ins, outs):
    split, filt, new_dim = E.par(U.uid, A.PA_SPLIT_ROWS), E.par(U.uid, A.PA_FILTER), E.par(U.uid, A.PA_NEW_DIM)
    while True:
        x = yield from E.deq(U, ins[0])
        if x is None:
            return
        U.fires += 1
        n = x.rows if split else x.cols
        if filt:
            if x.pad:
                n = 0
            elif split:
                n = min(n, x.valid)
        piece = replace(x, rows=1, valid=1, pad=False) if split else replace(x, cols=1, valid=x.rows, pad=False)
        axis = "row" if split else "col"
        for i in range(n):
            ident = None if x.ident is None else (x.ident, axis, i)
            yield from E.enq(U, outs[0], replace(piece, stop=x.stop + new_dim if i == n - 1 else 0, ident=ident))


# ---------------------------------------------------------------------------------- public API
def run(program, *, max_steps: int = 50_000_000, record_tokens: bool = False) -> ReferenceResult:
    """Execute ``program`` on the pure-Python reference engine.

    Parameters
    ----------
    program : stepsim.kernels.program.Program
        A built program.
    max_steps : int
        Upper bound on scheduler resumptions (guards against runaway programs).
    record_tokens : bool
        Keep every element sent on every channel in ``ReferenceResult.tokens`` (for tests).

    Returns
    -------
    ReferenceResult
        Cycles and counters (see the module docstring).

    Raises
    ------
    DeadlockError
        No unit can make progress while some are unfinished; the message names each blocked unit, the channel
        it waits on, whether it is full or empty, and its occupancy / capacity.
    SimulationError
        A malformed stream (mismatched stop levels, a selector target out of range, ...) or ``max_steps``.
    """
    return _Engine(program, max_steps, record_tokens).run()
