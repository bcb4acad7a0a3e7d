"""The HBM model of step-perf (docs: docs/timing_model.md §4), batched: one engine event per tile, not per request.

A memory unit that starts a tile at clock ``t0`` registers ``(t0, n_req, par_dispatch)`` with
:func:`hbm_register`; chunk k (``min(P, n_req - kP)`` requests) is taken by the HBM at tick ``t0 + 1 + k``
(the HBM takes at most one chunk per reader per tick, and chunk k is stamped ``max(t0 + k, t0 + 1)``).
Per tick the chunks are served readers first, then writers, each in builder order (``UP_MEM_PRIORITY``);
request i of the tick's batch goes to channel ``off = (off + i) mod C`` (triangular offsets), and after the
tick ``off = (off + batch_len) mod C``. Per request ``s = max(free[c], T + 1)``, ``free[c] = s + II``,
``ready = s + start_up + latency`` and the unit receives the response at ``ready + 1``; its tile completes at
the max over its requests (canonical rule 5).

:func:`hbm_process` serves ticks in tight loops up to a bound (the earliest other time-sensitive event) and
stops after a tick that completed some tile, so the Kahn units can react before later ticks are served:
a completion at ``ready + 1 >= T + 18`` can only cause requests at ticks after T, and a time-sensitive event
at E can only cause requests at ticks >= E + 2.

Cost: work per tick is proportional to the units that are due at that tick, not to all registered units.
A registered tile is either *pending* (its first chunk lies in the future) or *started*. Once started, a
unit is served at every tick until its last chunk (chunk k at ``t0 + 1 + k``, consecutive ticks), so at any
tick the due units are exactly: every started unit, plus the pending units whose first tick is now. Pending
units wait in a binary min-heap keyed by ``(first tick, priority)``; started units are kept sorted by
priority in one of two buffers, and a tick with newcomers merges the heap's due units into the other buffer
(an O(due) merge; no insertion shifts). Finding the next tick is O(1): the tick after the last served one
while any unit is started, else the heap's top. The per-request path has no division or modulo.
(An earlier version kept every registered unit in one sorted array and scanned it three times per tick;
512-expert MoE layers spent 99 % of their engine time there.)

State (all int64), one set per HBM (a chip's; the engine passes each HBM's views: ``hq[h]``, ``hfree[h]`` and the
segment ``eng[h * N_ENG:(h + 1) * N_ENG]``, whose engine-wide scalars are used in segment 0 only):

* ``hfree[0, c]``: channel c's next free cycle; ``hfree[1, c]``: its value at the start of the watched period;
  ``hfree[2, c]``: 1 if a request of the watched period found channel c idle (started at its tick + 1).
* ``hq[n_mem, N_HQ]``, one row per memory unit, indexed by its priority p (``UP_MEM_PRIORITY``; readers
  first, then writers, in builder order). Columns ``HQ_START_A`` / ``HQ_START_B`` (the two started-list
  buffers) and ``HQ_HEAP`` hold priorities, not rows of their own; ``HQ_T0`` .. ``HQ_PMAX`` are unit p's
  registers for the tile in flight (a 72-byte row per memory unit in all).
* ``eng[E_HBM_*]`` scalars: next tick, channel offset, started count, pending count, which started buffer is
  current, requests served.
"""

from __future__ import annotations

from stepsim.kernels import abi as A
from stepsim.kernels.jit import inline_kernel, kernel
from stepsim.kernels.timeline import tl_hbm

# engine scalar slots owned by the HBM (indices into eng; see engine.py for the rest)
E_HBM_NEXT = 0  # first tick not yet served (started units are due exactly then)
E_HBM_OFF = 1  # channel offset (persistent across ticks)
E_HBM_NACT = 2  # number of started units
E_HBM_REQS = 3  # requests served (for statistics)
# the engine's other scalars (kept here so every kernel module shares one layout)
E_BYTES_READ = 4  # off-chip bytes read (sum of loaded tile bytes)
E_BYTES_WRITTEN = 5  # off-chip bytes written
E_STATUS = 6  # abi.ST_* raised by a unit
E_STATUS_ARG = 7  # the unit that raised it
E_WL_N = 8  # worklist length
E_HBM_NPEND = 9  # number of pending units (in the heap)
E_HBM_CUR = 10  # which started buffer is current: 0 = HQ_START_A, 1 = HQ_START_B
E_EVENTS = 11  # engine events so far (kept across slices of the event loop)
E_N_REC = 12  # recorded steps so far
E_HBM_SNAP_T = 13  # tick of the period snapshot in hfree[1] (-1: none; see _start_period)
E_HBM_PERIOD = 14  # ticks per period of the channel pattern (L)
E_HBM_UNEVEN = 15  # ticks served in closed form with channels shifted by different amounts (see _try_skip)
E_HBM_TICK_REQS = 16  # requests per tick of the watched run
E_HBM_PER_TICK = 17  # 1: serve every tick one by one (no closed form; for equivalence tests)
E_HBM_SKIPPED = 18  # ticks served in closed form
E_WORK_LEFT = 19  # HBM work (ticks served, each weighted by its due units) left in this slice of the event loop
E_HBM_RESUME = 20  # 1 + the HBM (chip) whose batch a slice cut short when its work ran out; 0: none
E_HBM_RESUME_BOUND = 21  # that batch's bound: the next slice finishes it first, as it would have gone on
E_TS_SCANS = 22  # scans of the time-sensitive units' decision times (statistics; see engine.event_loop)
E_TS_RESCAN = 23  # 1: scan them at every decision, never reuse the last scan (for equivalence tests)
E_TS_FRESH = 24  # 1: no unit stepped since the last scan, whose result E_TS_T / E_TS_U still holds (kept across
E_TS_T = 25  # slices, so the scan count does not depend on where slices end); its earliest decision time
E_TS_U = 26  # and that time's unit (-1: none)
E_TS_EVALS = 27  # decision times computed in the scans (statistics; the rest were still fresh)
N_ENG = 28

#: hbm_process's return value when it stopped because the slice's work ran out (not a completion count)
HBM_OUT_OF_WORK = -1

# hq columns
HQ_START_A = 0  # started list (priorities, ascending), buffer A
HQ_START_B = 1  # buffer B
HQ_HEAP = 2  # pending heap (priorities), ordered by (HQ_T0, priority)
HQ_T0 = 3  # the tile's start clock t0 (first chunk at tick t0 + 1)
HQ_LEFT = 4  # requests not yet served
HQ_PAR = 5  # requests per chunk (par_dispatch)
HQ_COMP = 6  # completion so far: max over served requests of ready + 1 (t0 before the first)
HQ_UNIT = 7  # the unit with this priority
HQ_PMAX = 8  # the maximum of the completions in the watched period (see _try_skip)
N_HQ = 9


@kernel
def n_requests(rows, cols, elem_bytes, addr_offset):
    """reads/writes: nothing / returns: rows * ceil(cols * elem_bytes / addr_offset) (HBM requests)."""
    return rows * ((cols * elem_bytes + addr_offset - 1) // addr_offset)


@kernel
def _before(hq, p, q):
    """reads: hq / returns: True if pending unit p is due before q (first tick, then priority)."""
    tp = hq[p, HQ_T0]
    tq = hq[q, HQ_T0]
    return tp < tq or (tp == tq and p < q)


@kernel
def _heap_push(hq, n, p):
    """Insert priority p into the pending heap of size n. writes: hq[:, HQ_HEAP] / returns: nothing."""
    k = n
    while k > 0:
        parent = (k - 1) >> 1
        q = hq[parent, HQ_HEAP]
        if not _before(hq, p, q):
            break
        hq[k, HQ_HEAP] = q
        k = parent
    hq[k, HQ_HEAP] = p


@kernel
def _heap_pop(hq, n):
    """Remove and return the top of the pending heap of size n (n >= 1). writes: hq[:, HQ_HEAP]."""
    top = hq[0, HQ_HEAP]
    n -= 1
    last = hq[n, HQ_HEAP]
    k = 0
    while True:
        child = 2 * k + 1
        if child >= n:
            break
        c = hq[child, HQ_HEAP]
        if child + 1 < n:
            c2 = hq[child + 1, HQ_HEAP]
            if _before(hq, c2, c):
                child += 1
                c = c2
        if not _before(hq, c, last):
            break
        hq[k, HQ_HEAP] = c
        k = child
    if n > 0:
        hq[k, HQ_HEAP] = last
    return top


@kernel
def hbm_init(hq, up, h):
    """reads: up priorities and HBM ids / writes: hq[:, HQ_UNIT] (the unit of each priority) of HBM h / returns:
    nothing."""
    for u in range(up.shape[0]):
        p = up[u, A.UP_MEM_PRIORITY]
        if p >= 0 and up[u, A.UP_CHIP] == h:
            hq[p, HQ_UNIT] = u


@kernel
def hbm_register(u, up, us, eng, hq, t0, nreq, par):
    """Start a tile of memory unit u at clock t0 with nreq requests, par per chunk.

    reads: up[u] priority, eng / writes: us[u] wait state, hq, eng / returns: False if the first chunk
    would fall before the HBM's served horizon (a causality bug), else True.
    """
    p = up[u, A.UP_MEM_PRIORITY]
    hq[p, HQ_T0] = t0
    hq[p, HQ_LEFT] = nreq
    hq[p, HQ_PAR] = par
    hq[p, HQ_COMP] = t0
    us[u, A.US_WAIT_KIND] = A.WAIT_HBM
    us[u, A.US_WAIT_CH] = -1
    n = eng[E_HBM_NPEND]
    _heap_push(hq, n, p)
    eng[E_HBM_NPEND] = n + 1
    return t0 + 1 >= eng[E_HBM_NEXT]


@kernel
def hbm_next_tick(eng, hq):
    """reads: eng, the heap's top / writes: nothing / returns: the next tick with a chunk, or NEVER."""
    if eng[E_HBM_NACT] > 0:
        return eng[E_HBM_NEXT]
    if eng[E_HBM_NPEND] > 0:
        return hq[hq[0, HQ_HEAP], HQ_T0] + 1
    return A.NEVER


@inline_kernel  # one call site, once per chunk: a call passed ~25 words (two exploded arrays) per chunk
def _serve_chunk(hq, p, T1, off, bim, C, ii, lat, hfree):
    """Serve the next chunk of unit p (priority) at tick T1 - 1, from channel offset off and batch step bim.

    reads: hq[p], hw values / writes: hfree[0] and the idle flags hfree[2], hq[p] requests left, completion and
    period maximum / returns: (off, bim, requests served).
    """
    n = min(hq[p, HQ_PAR], hq[p, HQ_LEFT])
    smax = -1
    for _ in range(n):
        off += bim
        if off >= C:
            off -= C
        bim += 1
        if bim == C:
            bim = 0
        s = hfree[0, off]
        if s < T1:
            s = T1
            hfree[2, off] = 1
        hfree[0, off] = s + ii
        if s > smax:
            smax = s
    hq[p, HQ_LEFT] -= n
    if smax >= 0:
        r = smax + lat
        if r > hq[p, HQ_COMP]:
            hq[p, HQ_COMP] = r
        if r > hq[p, HQ_PMAX]:
            hq[p, HQ_PMAX] = r
    return off, bim, n


@kernel
def _gcd(a, b):
    """returns: gcd(a, b) for a, b >= 0."""
    while b:
        a, b = b, a % b
    return a


@kernel
def _start_period(hq, col, ns, eng, hfree, C, T, n_tick):
    """Begin watching for a periodic steady state at tick T: snapshot the channels, reset the period maxima.

    A tick of n requests moves the channel offset by n(n+1)/2 (mod C), so the channel pattern of the ticks
    repeats every L = C / gcd(n(n+1)/2 mod C, C) ticks. writes: hfree[1] and hfree[2], hq period maxima, eng
    period slots.
    """
    delta = (n_tick * (n_tick + 1) // 2) % C
    eng[E_HBM_PERIOD] = C // _gcd(delta, C)
    eng[E_HBM_SNAP_T] = T
    eng[E_HBM_TICK_REQS] = n_tick
    for c in range(C):
        hfree[1, c] = hfree[0, c]
        hfree[2, c] = 0
    for i in range(ns):
        hq[hq[i, col], HQ_PMAX] = -1


@kernel
def _try_skip(hq, col, ns, eng, hfree, C, bound, t_pend):
    """At the end of a watched period: if it repeats, serve as many whole periods as allowed in closed form.

    The channels are independent, and channel c's future depends only on its backlog r_c = free[c] - T at a
    period start. Over one period (L ticks, the same units each serving a full chunk per tick, so the same
    channel sequence) channel c moved by m_c. If m_c = L, its backlog repeats exactly, so every later period
    repeats this one on c shifted by L. If m_c > L and no request found c idle (max(free, T+1) = free throughout,
    a linear recurrence), its backlog only grows, so every later period is this one on c shifted by m_c. Any
    other visited channel (m_c < L, or idle with m_c > L) is not steady yet: no skip. K is the largest number of
    periods in which no unit finishes, no pending unit starts and no tick passes bound.

    * Every visited channel moved by the same D: K periods shift every response by K*D, so each unit's
      completion becomes max(completion, its maximum in this period + K*D).
    * Channels moved by different amounts: only K - 1 periods are skipped (channel c shifted by (K-1) m_c), with
      no completion update, and the K-th is served tick by tick: each request skipped on channel c has the
      request at the same place of the K-th period on the same channel, at least as late (m_c >= 0), so the
      K-th period's completions cover the skipped ones and each unit's maximum stays exact without a per-channel
      maximum in the per-request path.

    reads: hfree, hq, eng / writes: hfree[0], hq, eng next tick and request counts / returns: ticks skipped.
    """
    L = eng[E_HBM_PERIOD]
    T = eng[E_HBM_NEXT]  # the first tick of the next period
    D = -1
    even = True
    for c in range(C):
        moved = hfree[0, c] - hfree[1, c]
        if moved == 0:
            continue
        if moved < L or (moved > L and hfree[2, c] != 0):
            return 0
        if D < 0:
            D = moved
        elif moved != D:
            even = False
    K = (bound - T + 1) // L
    if t_pend != A.NEVER:
        K = min(K, (t_pend - T) // L)
    for i in range(ns):
        p = hq[i, col]
        K = min(K, (hq[p, HQ_LEFT] - 1) // (L * hq[p, HQ_PAR]))
    if not even:
        K -= 1  # the K-th period is served tick by tick (see above)
    if K <= 0:
        return 0
    for c in range(C):
        moved = hfree[0, c] - hfree[1, c]
        hfree[0, c] += K * moved
    for i in range(ns):
        p = hq[i, col]
        hq[p, HQ_LEFT] -= K * L * hq[p, HQ_PAR]
        if even:
            r = hq[p, HQ_PMAX] + K * D
            if r > hq[p, HQ_COMP]:
                hq[p, HQ_COMP] = r
    eng[E_HBM_REQS] += K * L * eng[E_HBM_TICK_REQS]
    eng[E_HBM_NEXT] = T + K * L
    eng[E_HBM_SKIPPED] += K * L
    if not even:
        eng[E_HBM_UNEVEN] += K * L
    return K * L


@kernel
def hbm_process(bound, us, eng, hq, hw, hfree, done_list, tl):
    """Serve HBM ticks in order while the next tick is <= bound; stop after a tick that completes a tile.

    Ticks are served one by one; while the set of due units stays the same, the HBM watches for a periodic
    steady state and serves whole periods of it in closed form (:func:`_try_skip`), so a long stream of
    tiles costs time in proportion to its changes, not its requests.

    It also stops, before a tick, when the slice's work budget ``eng[E_WORK_LEFT]`` is spent (each tick costs
    one plus its due units), returning :data:`HBM_OUT_OF_WORK`: one event can hold unbounded work (a tile of
    2**30 columns is billions of requests), and a slice bounded by events alone could then run for minutes
    without letting Python see a Ctrl-C. Stopping there is the same as stopping at ``bound``: every state is
    kept, and the next call, with the same bound, serves the same ticks the same way (the engine counts the
    event once, when the call that finishes it returns).

    reads: hq, hw / writes: hfree, eng HBM scalars, hq, eng[E_WORK_LEFT]; a completed unit u gets its
    completion time in us[u, US_TOK_B] and is written to done_list / returns: the number of completed units,
    or HBM_OUT_OF_WORK.
    """
    C = hw[A.HW_HBM_CHANNELS]
    ii = hw[A.HW_HBM_INIT_INTERVAL]
    lat = hw[A.HW_HBM_START_UP] + hw[A.HW_HBM_LATENCY] + 1
    ndone = 0
    ns = eng[E_HBM_NACT]
    npend = eng[E_HBM_NPEND]
    cur = eng[E_HBM_CUR]
    off = eng[E_HBM_OFF]
    while ns > 0 or npend > 0:
        t_pend = hq[hq[0, HQ_HEAP], HQ_T0] + 1 if npend > 0 else A.NEVER
        T = eng[E_HBM_NEXT] if ns > 0 else t_pend
        if T > bound:
            break
        if eng[E_WORK_LEFT] <= 0:
            ndone = HBM_OUT_OF_WORK
            break
        eng[E_WORK_LEFT] -= 1 + ns
        # Serve the due units in priority order: the started list merged with the newcomers popped from the
        # heap. Units that stay started are compacted into the other buffer when there are newcomers, else in
        # place (the write index never passes the read index).
        merging = t_pend == T
        src = HQ_START_A + cur
        dst = HQ_START_B - cur if merging else src
        bi = 0  # requests of this tick so far (for the statistics)
        bim = 0  # bi mod C: the triangular offset step, kept without a division
        i = 0
        w = 0
        while True:
            a = hq[i, src] if i < ns else A.NEVER
            b = A.NEVER
            if merging and npend > 0:
                top = hq[0, HQ_HEAP]
                if hq[top, HQ_T0] + 1 == T:
                    b = top
            if a < b:
                p = a
                i += 1
            elif b != A.NEVER:
                p = _heap_pop(hq, npend)
                npend -= 1
            else:
                break
            off, bim, n = _serve_chunk(hq, p, T + 1, off, bim, C, ii, lat, hfree)
            bi += n
            if hq[p, HQ_LEFT] == 0:
                u = hq[p, HQ_UNIT]
                us[u, A.US_TOK_B] = hq[p, HQ_COMP]
                done_list[ndone] = u
                ndone += 1
            else:
                hq[w, dst] = p
                w += 1
        if merging:
            cur = 1 - cur
        ns = w
        off += bim
        if off >= C:
            off -= C
        eng[E_HBM_REQS] += bi
        eng[E_HBM_NEXT] = T + 1
        if tl is not None:
            tl_hbm(tl, T, 1, bi)
        if ndone > 0:
            eng[E_HBM_SNAP_T] = -1
            break
        # the same units serve full chunks at the next tick unless a unit joins: watch for a steady state
        col = HQ_START_A + cur
        if merging or eng[E_HBM_SNAP_T] < 0 or eng[E_HBM_TICK_REQS] != bi:
            _start_period(hq, col, ns, eng, hfree, C, T + 1, bi)
        elif T + 1 - eng[E_HBM_SNAP_T] == eng[E_HBM_PERIOD] and eng[E_HBM_PER_TICK] == 0:
            t_next = hq[hq[0, HQ_HEAP], HQ_T0] + 1 if npend > 0 else A.NEVER
            t_from = eng[E_HBM_NEXT]
            skipped = _try_skip(hq, col, ns, eng, hfree, C, bound, t_next)
            if tl is not None:
                tl_hbm(tl, t_from, skipped, eng[E_HBM_TICK_REQS])
            _start_period(hq, col, ns, eng, hfree, C, eng[E_HBM_NEXT], bi)
    eng[E_HBM_NACT] = ns
    eng[E_HBM_NPEND] = npend
    eng[E_HBM_CUR] = cur
    eng[E_HBM_OFF] = off
    return ndone
