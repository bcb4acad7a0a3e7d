"""The HBM model of step-perf (STEP_TIMING §4), batched: one engine event per tile, not per request.

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

State: ``hfree[c]`` = channel c's next free cycle; ``hact[0:n]`` = active memory units sorted by priority;
``eng[E_HBM_*]`` scalars (next tick, offset, active count).
"""

from __future__ import annotations

from stepsim.kernels import abi as A
from stepsim.kernels.jit import kernel

# engine scalar slots owned by the HBM (indices into eng; see engine.py for the rest)
E_HBM_NEXT = 0  # first tick not yet served
E_HBM_OFF = 1  # channel offset (persistent across ticks)
E_HBM_NACT = 2  # number of active memory units
E_HBM_REQS = 3  # requests served (for statistics)
# the engine's other scalars (kept here so every kernel module shares one layout)
E_BYTES_READ = 4  # off-chip bytes read (sum of loaded tile bytes)
E_BYTES_WRITTEN = 5  # off-chip bytes written
E_STATUS = 6  # abi.ST_* raised by a unit
E_STATUS_ARG = 7  # the unit that raised it
E_WL_N = 8  # worklist length
N_ENG = 16

# registers of a memory unit while its tile is in flight (us columns)
R_T0 = A.US_R0 + 12
R_NREQ = A.US_R0 + 13
R_PAR = A.US_R0 + 14
R_CHUNK = A.US_R0 + 15  # chunks served so far; the completion time accumulates in US_TOK_B


@kernel
def n_requests(rows, cols, elem_bytes, addr_offset):
    """reads/writes: nothing / returns: rows * ceil(cols * elem_bytes / addr_offset) (HBM requests)."""
    return rows * ((cols * elem_bytes + addr_offset - 1) // addr_offset)


@kernel
def hbm_register(u, up, us, eng, hact, t0, nreq, par):
    """Start a tile of memory unit u at clock t0 with nreq requests, par per chunk.

    reads: up[u] priority, eng / writes: us[u] tile registers, hact, eng / returns: False if the first chunk
    would fall before the HBM's served horizon (a causality bug), else True.
    """
    us[u, R_T0] = t0
    us[u, R_NREQ] = nreq
    us[u, R_PAR] = par
    us[u, R_CHUNK] = 0
    us[u, A.US_TOK_B] = t0  # completion time (max over responses)
    us[u, A.US_WAIT_KIND] = A.WAIT_HBM
    us[u, A.US_WAIT_CH] = -1
    n = eng[E_HBM_NACT]
    prio = up[u, A.UP_MEM_PRIORITY]
    k = n
    while k > 0 and up[hact[k - 1], A.UP_MEM_PRIORITY] > prio:
        hact[k] = hact[k - 1]
        k -= 1
    hact[k] = u
    eng[E_HBM_NACT] = n + 1
    return t0 + 1 >= eng[E_HBM_NEXT]


@kernel
def hbm_next_tick(us, eng, hact):
    """reads: active units' registers / writes: nothing / returns: the next tick with a chunk, or NEVER."""
    best = A.NEVER
    for k in range(eng[E_HBM_NACT]):
        u = hact[k]
        t = us[u, R_T0] + 1 + us[u, R_CHUNK]
        best = min(best, t)
    return best


@kernel
def _serve_chunk(u, us, T, bi, off, hw, hfree):
    """Serve chunk us[u, R_CHUNK] of unit u at tick T; bi is the tick's batch index so far.

    reads: hw, hfree / writes: hfree, us[u] completion + chunk count / returns: (bi, off) after the chunk.
    """
    C = hw[A.HW_HBM_CHANNELS]
    ii = hw[A.HW_HBM_INIT_INTERVAL]
    lat = hw[A.HW_HBM_START_UP] + hw[A.HW_HBM_LATENCY] + 1
    par = us[u, R_PAR]
    k = us[u, R_CHUNK]
    n = us[u, R_NREQ] - k * par
    n = min(n, par)
    comp = us[u, A.US_TOK_B]
    for _ in range(n):
        off = (off + bi) % C
        bi += 1
        s = hfree[off]
        s = max(s, T + 1)
        hfree[off] = s + ii
        r = s + lat
        comp = max(comp, r)
    us[u, A.US_TOK_B] = comp
    us[u, R_CHUNK] = k + 1
    return bi, off


@kernel
def n_chunks(us, u):
    """reads: us[u] tile registers / writes: nothing / returns: ceil(n_req / par) (at least 1)."""
    par = us[u, R_PAR]
    m = (us[u, R_NREQ] + par - 1) // par
    return m if m > 0 else 1


@kernel
def hbm_process(bound, us, eng, hact, hw, hfree, done_list):
    """Serve HBM ticks in order while the next tick is <= bound; stop after a tick that completes a tile.

    reads: active units, hw / writes: hfree, eng HBM scalars, us of served units; completed units are
    removed from hact and written to done_list / returns: the number of completed units.
    """
    C = hw[A.HW_HBM_CHANNELS]
    ndone = 0
    while eng[E_HBM_NACT] > 0:
        n_act = eng[E_HBM_NACT]
        if n_act == 1:
            # fast path: one active unit, its chunks fall on consecutive ticks
            u = hact[0]
            m = n_chunks(us, u)
            off = eng[E_HBM_OFF]
            T = us[u, R_T0] + 1 + us[u, R_CHUNK]
            if T > bound:
                return ndone
            while us[u, R_CHUNK] < m and T <= bound:
                bi, off = _serve_chunk(u, us, T, 0, off, hw, hfree)
                off = (off + bi) % C
                eng[E_HBM_REQS] += bi
                T += 1
            eng[E_HBM_OFF] = off
            eng[E_HBM_NEXT] = T
            if us[u, R_CHUNK] == m:
                eng[E_HBM_NACT] = 0
                done_list[ndone] = u
                ndone += 1
            return ndone
        T = hbm_next_tick(us, eng, hact)
        if T > bound:
            return ndone
        bi = 0
        off = eng[E_HBM_OFF]
        for k in range(n_act):
            u = hact[k]
            if us[u, R_T0] + 1 + us[u, R_CHUNK] == T:
                bi, off = _serve_chunk(u, us, T, bi, off, hw, hfree)
        eng[E_HBM_OFF] = (off + bi) % C
        eng[E_HBM_REQS] += bi
        eng[E_HBM_NEXT] = T + 1
        # remove completed units (keeps priority order)
        w = 0
        for k in range(n_act):
            u = hact[k]
            if us[u, R_CHUNK] >= n_chunks(us, u):
                done_list[ndone] = u
                ndone += 1
            else:
                hact[w] = u
                w += 1
        eng[E_HBM_NACT] = w
        if ndone > 0:
            return ndone
    return ndone
