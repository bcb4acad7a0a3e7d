"""Deadlock diagnosis: which units wait on which, the wait cycle(s), and the FIFO that breaks them.

Both engines describe a deadlock with the same record, :class:`stepsim.base.errors.BlockedUnit` (one per unit and channel it
waits on; an EagerMerge choosing between inputs waits on each of them). From the records and the program's
channel endpoints, :func:`diagnose` builds the *wait-for graph*:

* a unit blocked on a **full** channel waits for that channel's consumer (it must pop before we can push);
* a unit blocked on an **empty** channel waits for that channel's producer.

Every blocked unit waits for another unfinished unit, so the graph has at least one cycle. The strongly
connected components with a cycle (scipy's ``connected_components(connection="strong")``) are the deadlock's
causes; every other blocked unit only waits, transitively, on one of them. Within a component the report
shows one shortest cycle through a full channel, hop by hop, with each channel's occupancy and depth.

Only a *full* channel on a cycle can be fixed by a deeper FIFO: deepening it lets its producer move on. A
cycle made only of empty channels is a loop without initial tokens, which no FIFO depth fixes.
:func:`suggest_fix` checks a depth by rerunning the program with the cycles' full channels deepened (doubling,
then bisecting, within a time budget); a rerun that deadlocks on other channels adds them to the fix.

The message of :class:`~stepsim.base.errors.DeadlockError` (:func:`format_message`) has at most
:data:`MAX_LINES` lines; the full list stays in ``DeadlockError.blocked``.
"""

from __future__ import annotations

import dataclasses
import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from stepsim.base.errors import BlockedUnit  # the record both engines give (re-exported here)

#: the deadlock message never has more lines than this
MAX_LINES = 40
#: at most this many cycles are drawn hop by hop (the others are counted)
MAX_CYCLES_SHOWN = 2
#: a drawn cycle longer than this shows its first hops and the number left out
MAX_HOPS_SHOWN = 12
#: the deepest FIFO :func:`suggest_fix` tries (the artifact's "unbounded" FIFOs are 1024 deep)
MAX_FIX_DEPTH = 1024


@dataclass(frozen=True)
class Hop:
    """One edge of a wait cycle: ``unit`` waits (``waiting_for``) on ``channel`` for ``next_unit``."""

    unit: str
    opcode: str
    channel: str
    waiting_for: str
    occupancy: int
    capacity: int
    next_unit: str
    next_opcode: str


@dataclass(frozen=True)
class Diagnosis:
    """What :func:`diagnose` found.

    Attributes
    ----------
    n_blocked : int
        Blocked units (distinct names).
    n_full : int
        Blocked units waiting on a full channel.
    cycles : list of list of Hop
        One shortest cycle per cyclic strongly connected component, largest component first.
    component_sizes : list of int
        Units in each of those components (same order).
    fix_channels : list of str
        Full channels on the cycles (both endpoints in one cyclic component): a deeper FIFO on these is what
        can break the deadlock. Empty when every cycle is a loop of empty channels.
    fix_capacities : dict of str to int
        Their depth (elements) in the deadlocked run.
    """

    n_blocked: int
    n_full: int
    cycles: list
    component_sizes: list
    fix_channels: list
    fix_capacities: dict
    #: the engine's one-line description of each blocked record (for re-rendering the message with a fix)
    unit_lines: list = field(default_factory=list, repr=False, compare=False)

    def as_dict(self) -> dict:
        return {"n_blocked": self.n_blocked, "n_full": self.n_full,
                "cycles": [[dataclasses.asdict(h) for h in c] for c in self.cycles],
                "component_sizes": list(self.component_sizes), "fix_channels": list(self.fix_channels),
                "fix_capacities": dict(self.fix_capacities)}


@dataclass
class Fix:
    """A FIFO fix found by :func:`suggest_fix`.

    Attributes
    ----------
    channels : dict of str to int
        Channel name -> depth (elements) to use.
    depth : int or None
        The depth given to each of them (None: none found).
    verified : bool
        True when a rerun with exactly these depths finished.
    cycles : int or None
        Cycles of that rerun.
    probes : int
        Reruns made.
    seconds : float
        Wall time spent (s).
    note : str
        Why it is not verified, when it is not.
    """

    channels: dict
    depth: int | None
    verified: bool
    cycles: int | None = None
    probes: int = 0
    seconds: float = 0.0
    note: str = ""

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


# --- the wait-for graph ---------------------------------------------------------------------------------------
def _edges(program, blocked):
    """Wait-for edges ``(waiter unit id, waited-for unit id, channel id, record)`` in record order."""
    unit_id = {name: i for i, name in enumerate(program.unit_names)}
    ch_id = {}
    for i, name in enumerate(program.channel_names):
        ch_id.setdefault(name, i)
    blocked_names = {b.unit for b in blocked}
    edges = []
    for b in blocked:
        if b.channel is None or b.channel not in ch_id or b.waiting_for not in ("full", "empty"):
            continue
        c = ch_id[b.channel]
        other = int(program.ch_consumer[c] if b.waiting_for == "full" else program.ch_producer[c])
        if program.unit_names[other] in blocked_names:
            edges.append((unit_id[b.unit], other, c, b))
    return edges


def _shortest_cycle(start, succ, members):
    """A shortest cycle through ``start`` inside ``members`` (BFS; successors in record order): list of edges."""
    prev = {}
    queue = deque()
    for e in succ.get(start, ()):
        if e[1] in members and e[1] not in prev:
            prev[e[1]] = e
            queue.append(e[1])
    while queue:
        u = queue.popleft()
        if u == start:
            break
        for e in succ.get(u, ()):
            if e[1] in members and e[1] not in prev:
                prev[e[1]] = e
                queue.append(e[1])
    if start not in prev:
        return []
    path = [prev[start]]
    while path[-1][0] != start:
        path.append(prev[path[-1][0]])
    return path[::-1]


def diagnose(program, blocked: list[BlockedUnit]) -> Diagnosis:
    """Build the wait-for graph of a deadlock and find its cycles (see the module docstring)."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    edges = _edges(program, blocked)
    n = program.n_units
    succ: dict[int, list] = {}
    for e in edges:
        succ.setdefault(e[0], []).append(e)
    rows = np.array([e[0] for e in edges], dtype=np.int64)
    cols = np.array([e[1] for e in edges], dtype=np.int64)
    matrix = coo_matrix((np.ones(len(edges)), (rows, cols)), shape=(n, n)).tocsr()
    _, labels = connected_components(matrix, directed=True, connection="strong")
    members: dict[int, set] = {}
    for u in {e[0] for e in edges} | {e[1] for e in edges}:
        members.setdefault(int(labels[u]), set()).add(u)
    cyclic = [lab for lab, m in members.items()
              if len(m) > 1 or any(e[1] == e[0] for e in succ.get(next(iter(m)), ()))]
    # largest component first; ties by the first unit id (deterministic)
    cyclic.sort(key=lambda lab: (-len(members[lab]), min(members[lab])))
    cycles, sizes, fix, caps = [], [], [], {}
    for lab in cyclic:
        m = members[lab]
        inside = [e for e in edges if e[0] in m and e[1] in m]
        full = [e for e in inside if e[3].waiting_for == "full"]
        start = (full or inside)[0][0]
        path = _shortest_cycle(start, succ, m)
        cycles.append([Hop(unit=e[3].unit, opcode=e[3].opcode, channel=e[3].channel, waiting_for=e[3].waiting_for,
                           occupancy=int(e[3].occupancy), capacity=int(e[3].capacity),
                           next_unit=program.unit_names[e[1]], next_opcode=program.opcode_name(e[1]))
                       for e in path])
        sizes.append(len(m))
        for e in full:
            if e[3].channel not in caps:
                fix.append(e[3].channel)
                caps[e[3].channel] = int(e[3].capacity)
    return Diagnosis(n_blocked=len({b.unit for b in blocked}),
                     n_full=len({b.unit for b in blocked if b.waiting_for == "full"}),
                     cycles=cycles, component_sizes=sizes, fix_channels=fix, fix_capacities=caps)


# --- the message ----------------------------------------------------------------------------------------------
def _hop_line(h: Hop) -> str:
    what = "a free slot in" if h.waiting_for == "full" else "data on"
    by = "read by" if h.waiting_for == "full" else "written by"
    return (f"  {h.unit} ({h.opcode}) waits for {what} {h.channel!r} ({h.waiting_for}, "
            f"{h.occupancy}/{h.capacity}), {by} {h.next_unit} ({h.next_opcode})")


def _names(names, limit=4) -> str:
    shown = ", ".join(repr(n) for n in names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def fix_lines(diag: Diagnosis, fix: Fix | None = None) -> list[str]:
    """The fix part of the message (2-3 lines)."""
    if not diag.cycles:
        return ["fix: no wait cycle was found among the blocked units (see the list below)"]
    if not diag.fix_channels:
        return ["fix: no FIFO on the cycle is full, so no FIFO depth breaks it: the loop needs an initial token "
                "(a feedback channel without one never starts)"]
    chans = diag.fix_channels
    depths = sorted(set(diag.fix_capacities.values()))
    now = "/".join(str(d) for d in depths)
    lines = [f"fix: a deeper FIFO on {len(chans)} full channel(s) of the cycle(s) breaks them: {_names(chans)} "
             f"(depth now {now})"]
    if fix is not None and fix.verified:
        extra = [n for n in fix.channels if n not in diag.fix_channels]
        also = f" (with {len(extra)} more full channel(s) the reruns found: {_names(extra, 2)})" if extra else ""
        lines.append(f"  verified: depth {fix.depth} on those {len(fix.channels)} channel(s){also} finishes in "
                     f"{fix.cycles:,} cycles ({fix.probes} rerun(s), {fix.seconds:.1f} s)")
        lines.append(f"  {SIZE_FIFOS_ADVICE}, or --channel-depth {fix.depth} for every FIFO (more on-chip "
                     f"memory)")
    else:
        depth = fix.depth if fix is not None and fix.depth else 2 * max(depths)
        why = f" ({fix.note})" if fix is not None and fix.note else " (not verified by a rerun)"
        lines.append(f"  try depth {depth} there{why}: {SIZE_FIFOS_ADVICE}, or --channel-depth {depth} for every "
                     f"FIFO")
    return lines


#: the fix a user should apply: a depths file stepsim writes and checks (a hand-written one names channels by
#: their generated names and is easy to get wrong), sized with the run's own flags
SIZE_FIFOS_ADVICE = ("run `stepsim size-fifos` with this run's flags and --out depths.toml, then rerun with "
                     "--fifo-depths depths.toml")


def format_message(diag: Diagnosis, unit_lines: list[str], fix: Fix | None = None) -> str:
    """The deadlock message: summary, cycles hop by hop, fix, then as many blocked units as fit in
    :data:`MAX_LINES` lines (``unit_lines``: one engine-formatted line per blocked record)."""
    n_cycles = len(diag.cycles)
    lines = [f"deadlock: no unit can make progress; {diag.n_blocked:,} unit(s) blocked ({diag.n_full:,} on a full "
             f"FIFO), {n_cycles} wait cycle(s)"]
    for i, (cycle, size) in enumerate(zip(diag.cycles[:MAX_CYCLES_SHOWN], diag.component_sizes, strict=False)):
        lines.append(f"cycle {i + 1}: {len(cycle)} hop(s), in a group of {size} unit(s) waiting on each other:")
        lines += [_hop_line(h) for h in cycle[:MAX_HOPS_SHOWN]]
        if len(cycle) > MAX_HOPS_SHOWN:
            lines.append(f"  ... {len(cycle) - MAX_HOPS_SHOWN} more hop(s) back to {cycle[0].unit}")
    if n_cycles > MAX_CYCLES_SHOWN:
        lines.append(f"... and {n_cycles - MAX_CYCLES_SHOWN} more cycle(s) (DeadlockError.diagnosis has them)")
    lines += fix_lines(diag, fix)
    room = MAX_LINES - len(lines) - 1
    if len(unit_lines) <= room:
        lines.append("blocked units:")
        lines += unit_lines
    else:
        lines.append(f"blocked units (first {max(room, 0)} of {len(unit_lines):,}; DeadlockError.blocked has all, "
                     f"`stepsim run --deadlock-report FILE` writes them):")
        lines += unit_lines[:max(room, 0)]
    return "\n".join(lines)


def deadlock_error(program, blocked: list[BlockedUnit], unit_lines: list[str]):
    """The :class:`~stepsim.base.errors.DeadlockError` of a deadlocked ``program`` (diagnosis included)."""
    from stepsim.base.errors import DeadlockError

    diag = dataclasses.replace(diagnose(program, blocked), unit_lines=list(unit_lines))
    return DeadlockError(format_message(diag, unit_lines), blocked, diagnosis=diag, program=program,
                         unit_lines=list(unit_lines))


def diagnosed(error):
    """``error`` (an engine's raw :class:`~stepsim.base.errors.DeadlockError`) with its diagnosis attached: the
    wait cycles, the fix channels and the full message. An error already diagnosed, or one without its program
    (sent back by a worker process), is returned as it is."""
    if error.diagnosis is not None or error.program is None:
        return error
    explained = deadlock_error(error.program, error.blocked, error.unit_lines)
    explained.timeline = error.timeline
    return explained


def run_diagnosed(program, runner=None, **kwargs):
    """``runner(program, **kwargs)`` (default :func:`stepsim.kernels.run`, the numba engine; the reference twin's
    ``stepsim.kernels.reference.run`` runs the same), with a deadlock raised diagnosed."""
    from stepsim.base.errors import DeadlockError

    if runner is None:
        from stepsim.kernels import run as runner
    try:
        return runner(program, **kwargs)
    except DeadlockError as exc:
        raise diagnosed(exc) from None


# --- checking a fix by rerunning ------------------------------------------------------------------------------
def _with_depths(program, depths: dict[int, int]):
    cap = np.array(program.ch_capacity, dtype=np.int64, copy=True)
    for c, d in depths.items():
        cap[c] = max(int(cap[c]), int(d))
    cap.setflags(write=False)
    return dataclasses.replace(program, ch_capacity=cap)


def suggest_fix(program, diag: Diagnosis, *, budget_s: float = 30.0, runner=None,
                max_depth: int = MAX_FIX_DEPTH) -> Fix:
    """Find a depth for the cycles' full channels that lets ``program`` finish, by rerunning it.

    Depths double from twice the channels' current depth until a rerun finishes (a rerun that deadlocks on
    other full channels adds them to the set, at the same depth); then the depth is bisected down to the
    smallest that finishes. Every channel of the set gets the same depth. Stops when ``budget_s`` seconds
    are spent (checked between reruns), returning the best verified answer so far, or an unverified one.

    Parameters
    ----------
    program : stepsim.kernels.program.Program
        The deadlocked program.
    diag : Diagnosis
        Its diagnosis.
    budget_s : float
        Wall-time budget (s) for the reruns.
    runner : callable, optional
        ``runner(program) -> result with .cycles``; default :func:`stepsim.kernels.run`.
    max_depth : int
        Deepest FIFO tried (elements).
    """
    from stepsim.base.errors import DeadlockError

    if not diag.fix_channels:
        return Fix(channels={}, depth=None, verified=False, note="no full channel on the cycle")
    ch_id = {}
    for i, name in enumerate(program.channel_names):
        ch_id.setdefault(name, i)
    chans = [ch_id[n] for n in diag.fix_channels]
    start = time.perf_counter()
    probes = 0
    depth = 2 * max(int(program.ch_capacity[c]) for c in chans)
    low = depth // 2  # deepest known failing depth for the current set
    good: tuple | None = None

    def out_of_time():
        return time.perf_counter() - start >= budget_s

    def attempt(d):
        nonlocal probes, chans
        probes += 1
        try:
            # diagnosed, so a rerun that deadlocks on other full channels names them (None: the numba engine)
            return run_diagnosed(_with_depths(program, {c: d for c in chans}), runner).cycles, None
        except DeadlockError as exc:
            new = [ch_id[n] for n in (exc.diagnosis.fix_channels if exc.diagnosis else []) if ch_id[n] not in chans]
            return None, new

    while good is None and depth <= max_depth:
        if out_of_time():
            break
        cycles, new = attempt(depth)
        if cycles is not None:
            good = (depth, cycles)
        elif new:
            chans = chans + new  # same depth, more channels
        else:
            low = depth
            depth *= 2
    if good is None:
        why = (f"time budget of {budget_s:g} s spent after {probes} rerun(s)" if out_of_time()
               else f"still deadlocks with depth {max_depth}")
        return Fix(channels={program.channel_names[c]: min(depth, max_depth) for c in chans},
                   depth=min(depth, max_depth), verified=False, probes=probes,
                   seconds=time.perf_counter() - start, note=f"not verified: {why}")
    high = good[0]
    while high - low > 1 and not out_of_time():
        mid = (low + high) // 2
        cycles, new = attempt(mid)
        if cycles is not None and not new:
            high, good = mid, (mid, cycles)
        else:
            low = mid
    return Fix(channels={program.channel_names[c]: good[0] for c in chans}, depth=good[0], verified=True,
               cycles=int(good[1]), probes=probes, seconds=time.perf_counter() - start)


def full_list(error) -> list[dict]:
    """Every blocked record of a DeadlockError as plain dicts (the ``--deadlock-report`` file's ``blocked``)."""
    return [dataclasses.asdict(b) for b in error.blocked]
