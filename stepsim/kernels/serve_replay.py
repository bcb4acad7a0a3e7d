"""Machine code for a serving replay (docs/serving.md §5, item 6): the scheduler loop of
:mod:`stepsim.serve.replay` and :mod:`stepsim.serve.scheduler` (vLLM V1, Sarathi-Serve, Orca) and the fast model's
per-step pricing (:class:`stepsim.serve.fast.FastLatency`) in one compiled loop over flat arrays.

**Same numbers, bit for bit.** Every rule is the Python reference's, statement for statement, on arrays instead of
objects (``running`` a list of request indices in admission order, ``waiting`` a ring buffer); every float is made
by the same operations in the same order: the regressors' dot products are NumPy's pairwise sums
(:func:`_row_sum`, numpy/_core/src/umath/loops_utils.h.src ``pairwise_sum`` after a reduction's initial 0.0, for at
most 128 terms), ``np.rint``, ``ceil``, one division each. Integers that Python would let grow past 2^53 (where a
float no longer holds them, so a quotient could round differently) stop the loop with :data:`UNSUPPORTED`: the
caller then replays with the reference instead. ``tests/serve/test_replay_compiled.py`` runs both on random traces.

**Decode pools.** With ``cfg[C_DECODE_POOL]`` the loop is a disaggregated deployment's decode pool
(:func:`stepsim.serve.disaggregated._decode_pool`): requests arrive with their KV cache (the caller sets their
computed tokens and outputs), wait in an incoming queue and are admitted by :func:`_admit_incoming`; the scheduler's
``waiting`` holds only the requests it preempted.

**Resumable.** Every piece of state is in the arrays the caller passes (``st``, the request table, the queues),
so the loop returns whenever it must: the step columns are full (:data:`FULL`), the routing's window starts are
used up (:data:`STARTS`: the caller draws the next batch exactly as the Python path would), ``pause_steps`` steps
were made or a calibration's ``record`` of the steps' batches may not hold the next (:data:`PAUSE`), the next step
would start at the horizon (:data:`HORIZON`: a replica replayed alongside others, which may be sent a request
arriving then), or the run is done (:data:`DONE`); called again it goes on. A step
the reference would refuse (a cost it rejects, a request that cannot be scheduled) returns :data:`REFUSED`: the
caller replays with the reference, which raises its own error.

No allocation: the caller passes every scratch array (compiled without numba's runtime, like the engine).
"""

from __future__ import annotations

import math

import numpy as np

from stepsim.kernels import serve_fast as sf
from stepsim.kernels import serve_mapped as sm
from stepsim.kernels.jit import kernel
from stepsim.kernels.row_sum import EXACT, ROW_SUM_LIMIT, _dot, _row_sum  # noqa: F401 - the loop's and tests'

# ------------------------------------------------------------------------------------------ layouts
#: rows of the request table ``req`` (int64 ``[R_ROWS, requests]``)
R_PROMPT, R_OUTPUT, R_NUM_TOKENS, R_COMPUTED, R_OUTPUTS, R_BLOCKS, R_PREFILLING, R_PREEMPTIONS, R_ROWS = range(9)
#: rows of the request times ``times`` (float64 ``[T_ROWS, requests]``, seconds; -1.0 until set); ``T_SINCE``: what
#: the stop rule measures a request's TTFT, TPOT and E2E from (its arrival; a decode pool's request its arrival in
#: the trace, not in the pool: :mod:`stepsim.serve.disaggregated`, "Early stop")
T_ARRIVAL, T_FIRST_SCHEDULED, T_FIRST_TOKEN, T_LAST_TOKEN, T_FINISH, T_SINCE, T_ROWS = range(7)
#: entries of the loop state ``st`` (int64)
(S_NEXT, S_DONE, S_FREE, S_RUNNING, S_WAIT_HEAD, S_WAIT_LEN, S_STEPS, S_GAPS, S_PREEMPTED, S_STARTS_USED,
 S_BATCH, S_IN_HEAD, S_PENDING, S_KNOWN, S_RECORDED, S_ROWS) = range(16)
#: ``st[S_RECORDED]``: with ``cfg[C_RECORD]``, the sequences written into ``record`` since the caller last emptied it
#: ``st[S_KNOWN]``: the requests the loop serves, the table's first ``S_KNOWN`` columns (all of them for a replay;
#: a replica replayed alongside others gets each request when a router sends it, :mod:`stepsim.plan.joint`)
#: entries of the clock ``clock`` (float64, s): the time now, and the horizon: the loop returns :data:`HORIZON`
#: rather than start a step at or after it (inf for a replay; a joint replay's next request to route arrives then)
CLOCK_NOW, CLOCK_HORIZON = range(2)
#: ``st[S_PENDING]``: 1 when the loop returned :data:`NEED` after scheduling a step (its batch in ``batch_r`` /
#: ``batch_n``, ``st[S_BATCH]`` long): called again, it prices that step instead of scheduling one
#: ``st[S_IN_HEAD]``: in a decode pool (``cfg[C_DECODE_POOL]``), the first arrived request not yet admitted; the
#: incoming queue is the requests ``S_IN_HEAD .. S_NEXT - 1`` (arrivals join in order and leave from the head)
#: entries of the configuration ``cfg`` (int64)
(C_POLICY, C_MAX_SEQS, C_BUDGET, C_CHUNK, C_BLOCK_SIZE, C_MAX_MODEL_LEN, C_USABLE, C_WATERMARK, C_PAUSE,
 C_DECODE_POOL, C_RECORD, C_ROWS) = range(12)
#: ``cfg[C_RECORD]``: 1 when every step's batch is kept for a calibration's reservoir: each step's sequences' cached
#: tokens and new tokens appended to ``record`` (int64 ``[2, capacity]``, rows :data:`RC_CONTEXT` / :data:`RC_NEW`,
#: ``st[S_RECORDED]`` columns so far); the loop returns :data:`PAUSE` before a step that might not fit, and the
#: caller offers the steps and empties it (:meth:`stepsim.serve.replay_compiled.CompiledLoop._record`)
#: ``cfg[C_DECODE_POOL]``: 1 for a disaggregated deployment's decode pool (:func:`_admit_incoming`), 0 for a
#: colocated replay
#: policies (``cfg[C_POLICY]``)
VLLM, SARATHI, ORCA = 0, 1, 2
#: rows of the per-step integer columns ``steps_i`` (int64 ``[I_ROWS, capacity]``)
(I_TOKENS, I_SEQUENCES, I_PREFILL, I_DECODE, I_BLOCKS, I_PREEMPTIONS, I_WAITING, I_CYCLES_ATTENTION, I_CYCLES_FFN,
 I_CYCLES_WEIGHTS, I_HBM, I_FLOPS, I_CYCLES, I_CYCLES_HIDDEN, I_DECODE_REQUESTS, I_QUERY_TILES, I_CYCLES_FLOOR,
 I_ROWS) = range(18)
#: ``I_CYCLES_HIDDEN``: mapped pricing's cycles streaming hid; ``I_DECODE_REQUESTS`` / ``I_QUERY_TILES``: its
#: decode attention's requests (every KV head's) and prefill query tiles (one head's), the buckets a run notes;
#: ``I_CYCLES_FLOOR``: the cycles its roofline floor added (:func:`_floor`)
#: rows of the per-step float columns ``steps_f`` (float64 ``[F_ROWS, capacity]``, seconds)
F_START, F_DURATION, F_ROWS = range(3)
#: entries of the pricing parameters ``pi`` (int64)
(P_MODE, P_LAYERS, P_HEADS, P_MOE, P_COUNT, P_LAYER_WEIGHTS, P_HEAD_CYCLES, P_EMBEDDING_BYTES, P_HBM_PEAK,
 P_CLOCK, P_SHARED, P_ROUNDS, P_EXPERTS, P_TILE_SHIFT, P_FEW_TOKENS, P_FIXED_BYTES, P_EXPERT_BYTES, P_KV_BYTES,
 P_FLOPS_PER_TOKEN, P_ATTENTION_FLOPS, P_PEAK_BYTES, P_PEAK_FLOPS, P_COMPUTE_BW, P_HEAD_FLOPS, P_CHIPS,
 P_SHARED_CHIPS, P_CHIP_COLUMNS, P_THETA_LENGTH) = range(28)
#: ``P_CHIPS``: the system's chips (1 on one chip; more: :class:`stepsim.serve.system_fast.SystemFastLatency`, the
#: embedding rows read ``1 / n`` a chip and the collectives' cycles at the step's tokens from ``proj[0, 0]``, which
#: the caller fills when the loop returns :data:`NEED`); ``P_SHARED_CHIPS``: the chips the shared experts' tiles are
#: counted over; ``P_CHIP_COLUMNS``: 1 when the FFN's regressors end with the per-chip columns
#: (:func:`stepsim.serve.fast.chip_features`, experts on ``chip_of``'s chips, tokens in ``shard_bounds``)
#: entries of ``pi``: the scalars, then the four coefficient rows' lengths
P_ROWS = P_THETA_LENGTH + 4
#: pricing modes (``pi[P_MODE]``): every step ``constant`` seconds, the fast model, or the fast model on mapped
#: layers (:mod:`stepsim.kernels.serve_mapped`)
CONSTANT, FAST, MAPPED = 0, 1, 2
#: rows of ``theta`` (float64 ``[4, columns]``: decode, prefill, ffn, ffn_prefill); ``pi[P_THETA_LENGTH + k]`` is
#: the length of row ``k``, -1 for a kind without coefficients (priced by its bound)
TH_DECODE, TH_PREFILL, TH_FFN, TH_FFN_PREFILL = range(4)
#: rows of ``forms`` (float64 ``[6, 6]``): off-chip bytes and FLOPs coefficients of decode, prefill, ffn
FM_DECODE_BYTES, FM_DECODE_FLOPS, FM_PREFILL_BYTES, FM_PREFILL_FLOPS, FM_FFN_BYTES, FM_FFN_FLOPS = range(6)
#: rows of ``record``
RC_CONTEXT, RC_NEW = range(2)
#: return values
DONE, FULL, STARTS, PAUSE, REFUSED, UNSUPPORTED, STOPPED, NEED, HORIZON = range(9)
#: ``NEED``: mapped pricing's tables lack a bucket's schedule or a token count's projections (``need`` says which;
#: the caller fills them and calls again); ``HORIZON``: the next step would start at or after
#: ``clock[CLOCK_HORIZON]`` (``DONE``: every known request is done, whatever the horizon)
#: entries of the stop rule's integers ``stop_i`` (int64; :meth:`stepsim.serve.replay_stop.StopRule.as_arrays`):
#: active (0: no rule), the misses each metric may have, the misses counted, the TTFT and E2E arrival pointers
(SP_ACTIVE, SP_ALLOW_TTFT, SP_ALLOW_TPOT, SP_ALLOW_E2E, SP_MISS_TTFT, SP_MISS_TPOT, SP_MISS_E2E, SP_PTR_TTFT,
 SP_PTR_E2E, SP_ROWS) = range(10)
#: each metric as the reference names it, with its entries of ``stop_i``: (name, misses counted, misses allowed)
SP_METRICS = (("ttft", SP_MISS_TTFT, SP_ALLOW_TTFT), ("tpot", SP_MISS_TPOT, SP_ALLOW_TPOT),
              ("e2e", SP_MISS_E2E, SP_ALLOW_E2E))
#: the stop rule's limits ``stop_f`` (float64, s; inf: not held)
SF_TTFT, SF_TPOT, SF_E2E = range(3)
#: bits of the per-request ``seen`` flags: TTFT counted, finish counted, E2E counted
SEEN_TTFT, SEEN_END, SEEN_E2E = 1, 2, 4
#: a step may end at most this late (s): stepsim.base.ranges.MAX_TIME_S, whose check the reference makes
MAX_TIME_S = float(2**32)


@kernel
def _fits(a, b):
    """Whether ``a * b`` (both >= 0) stays below :data:`EXACT`."""
    return a < EXACT // max(b, 1)


@kernel
def _blocks_for(tokens, block_size):
    return -(-tokens // block_size)


# ------------------------------------------------------------------------------------------ scheduler
@kernel
def _preempt(victim, req, st, waiting, n_req):
    """Recompute preemption: the victim's blocks freed, its KV forgotten, to the head of waiting."""
    st[S_FREE] += req[R_BLOCKS, victim]
    req[R_BLOCKS, victim] = 0
    req[R_COMPUTED, victim] = 0
    req[R_PREFILLING, victim] = 1
    req[R_PREEMPTIONS, victim] += 1
    head = st[S_WAIT_HEAD] - 1
    if head < 0:
        head += n_req
    waiting[head] = victim
    st[S_WAIT_HEAD] = head
    st[S_WAIT_LEN] += 1
    st[S_PREEMPTED] += 1


@kernel
def _pop_waiting(st, waiting, n_req):
    r = waiting[st[S_WAIT_HEAD]]
    st[S_WAIT_HEAD] = (st[S_WAIT_HEAD] + 1) % n_req
    st[S_WAIT_LEN] -= 1
    return r


@kernel
def _vllm(cfg, req, st, running, waiting, n_req, batch_r, batch_n):
    """``Scheduler._vllm``: the step's batch into ``batch_r``/``batch_n``; returns its length."""
    budget = cfg[C_BUDGET]
    threshold = cfg[C_CHUNK]
    bs = cfg[C_BLOCK_SIZE]
    max_len = cfg[C_MAX_MODEL_LEN]
    limit = max_len - 1
    m = 0
    st[S_PREEMPTED] = 0
    i = 0
    while i < st[S_RUNNING] and budget > 0:
        r = running[i]
        computed = req[R_COMPUTED, r]
        n = req[R_NUM_TOKENS, r] - computed
        if 0 < threshold < n:
            n = threshold
        if n > budget:
            n = budget
        if n > limit - computed:
            n = limit - computed
        if n <= 0:
            i += 1
            continue
        need = _blocks_for(min(computed + n, max_len), bs) - req[R_BLOCKS, r]
        stopped = False
        while need > st[S_FREE]:
            st[S_RUNNING] -= 1
            victim = running[st[S_RUNNING]]
            _preempt(victim, req, st, waiting, n_req)
            if victim == r:
                stopped = True
                break
        if stopped:
            break
        st[S_FREE] -= need
        req[R_BLOCKS, r] += need
        batch_r[m] = r
        batch_n[m] = n
        m += 1
        budget -= n
        i += 1
    if st[S_PREEMPTED]:  # a step that preempts admits nobody
        return m
    while st[S_WAIT_LEN] > 0 and budget > 0 and st[S_RUNNING] < cfg[C_MAX_SEQS]:
        r = waiting[st[S_WAIT_HEAD]]
        n = req[R_NUM_TOKENS, r]
        if 0 < threshold < n:
            n = threshold
        if n > budget:
            n = budget
        if n > limit:
            n = limit
        need = _blocks_for(min(n, max_len), bs)
        if need > st[S_FREE]:
            break  # a waiting request never preempts
        _pop_waiting(st, waiting, n_req)
        running[st[S_RUNNING]] = r
        st[S_RUNNING] += 1
        st[S_FREE] -= need
        req[R_BLOCKS, r] = need
        batch_r[m] = r
        batch_n[m] = n
        m += 1
        budget -= n
    return m


@kernel
def _orca(cfg, req, st, running, waiting, n_req, batch_r, batch_n):
    """``Scheduler._orca``."""
    st[S_PREEMPTED] = 0
    m = 0
    for i in range(st[S_RUNNING]):
        batch_r[m] = running[i]
        batch_n[m] = 1
        m += 1
    reserve = _blocks_for(cfg[C_MAX_MODEL_LEN], cfg[C_BLOCK_SIZE])
    while (st[S_WAIT_LEN] > 0 and st[S_RUNNING] < cfg[C_MAX_SEQS]
           and st[S_FREE] - reserve >= cfg[C_WATERMARK]):
        r = _pop_waiting(st, waiting, n_req)
        running[st[S_RUNNING]] = r
        st[S_RUNNING] += 1
        st[S_FREE] -= reserve
        req[R_BLOCKS, r] = reserve
        batch_r[m] = r
        batch_n[m] = req[R_NUM_TOKENS, r]
        m += 1
    return m


@kernel
def _sarathi(cfg, req, st, running, waiting, n_req, batch_r, batch_n, rest, prefills):
    """``Scheduler._sarathi``: ``rest`` (a copy of running, consumed from both ends) and ``prefills`` are scratch;
    running is rebuilt in place (decodes, then unfinished prefills, then new requests)."""
    chunk = cfg[C_CHUNK]
    bs = cfg[C_BLOCK_SIZE]
    lo = 0
    hi = st[S_RUNNING]
    for i in range(hi):
        rest[i] = running[i]
    n_running = 0
    n_prefills = 0
    m = 0
    st[S_PREEMPTED] = 0
    tokens = 0
    while lo < hi:
        r = rest[lo]
        lo += 1
        if req[R_PREFILLING, r]:
            prefills[n_prefills] = r
            n_prefills += 1
            continue
        # can_append_slot: one free block, whether or not this decode needs a new one
        while st[S_FREE] == 0 and lo < hi:
            hi -= 1
            _preempt(rest[hi], req, st, waiting, n_req)
        if st[S_FREE] == 0:
            _preempt(r, req, st, waiting, n_req)
            continue
        need = _blocks_for(req[R_COMPUTED, r] + 1, bs) - req[R_BLOCKS, r]
        st[S_FREE] -= need
        req[R_BLOCKS, r] += need
        running[n_running] = r
        n_running += 1
        batch_r[m] = r
        batch_n[m] = 1
        m += 1
        tokens += 1
    for j in range(n_prefills):  # their whole prompt was allocated at admission
        r = prefills[j]
        running[n_running] = r
        n_running += 1
        n = min(req[R_NUM_TOKENS, r] - req[R_COMPUTED, r], chunk - tokens)
        if n > 0:
            batch_r[m] = r
            batch_n[m] = n
            m += 1
            tokens += n
    while st[S_WAIT_LEN] > 0:
        r = waiting[st[S_WAIT_HEAD]]
        need = _blocks_for(req[R_NUM_TOKENS, r], bs)
        if st[S_FREE] - need < cfg[C_WATERMARK] or n_running >= cfg[C_MAX_SEQS]:
            break
        n = min(req[R_NUM_TOKENS, r], chunk - tokens)
        if n <= 0:
            break
        _pop_waiting(st, waiting, n_req)
        running[n_running] = r
        n_running += 1
        st[S_FREE] -= need
        req[R_BLOCKS, r] = need
        batch_r[m] = r
        batch_n[m] = n
        m += 1
        tokens += n
    st[S_RUNNING] = n_running
    return m


@kernel
def _finish_step(req, times, st, running, batch_r, batch_n, m, end, gaps):
    """``Scheduler.finish_step``: advance the batch, emit tokens at ``end``, drop finished requests."""
    finished = 0
    for j in range(m):
        r = batch_r[j]
        req[R_COMPUTED, r] += batch_n[j]
        if req[R_COMPUTED, r] != req[R_NUM_TOKENS, r]:
            continue  # a partial prefill chunk produces nothing
        req[R_PREFILLING, r] = 0
        req[R_OUTPUTS, r] += 1
        req[R_NUM_TOKENS, r] += 1
        if req[R_OUTPUTS, r] == 1:
            times[T_FIRST_TOKEN, r] = end
        else:
            gaps[st[S_GAPS]] = end - times[T_LAST_TOKEN, r]
            st[S_GAPS] += 1
        times[T_LAST_TOKEN, r] = end
        if req[R_OUTPUTS, r] == req[R_OUTPUT, r]:
            times[T_FINISH, r] = end
            finished += 1
    if finished:
        keep = 0
        for i in range(st[S_RUNNING]):
            r = running[i]
            if times[T_FINISH, r] >= 0.0:
                st[S_FREE] += req[R_BLOCKS, r]
                req[R_BLOCKS, r] = 0
            else:
                running[keep] = r
                keep += 1
        st[S_RUNNING] = keep
    return finished


@kernel
def _admit_incoming(cfg, req, times, st, running, now):
    """A decode pool's admission (:func:`stepsim.serve.disaggregated._decode_pool`): when no preempted request
    waits, the incoming requests join ``running`` from the head, each with the blocks of the KV it brought (Orca:
    its reservation), while they fit above the spare blocks (the watermark, none for vLLM) and fewer than
    ``max_num_seqs`` run; the first that does not fit stops admission."""
    if st[S_WAIT_LEN] > 0:
        return
    policy = cfg[C_POLICY]
    bs = cfg[C_BLOCK_SIZE]
    spare = 0 if policy == VLLM else cfg[C_WATERMARK]
    while st[S_IN_HEAD] < st[S_NEXT] and st[S_RUNNING] < cfg[C_MAX_SEQS]:
        r = st[S_IN_HEAD]
        need = _blocks_for(cfg[C_MAX_MODEL_LEN], bs) if policy == ORCA else _blocks_for(req[R_PROMPT, r], bs)
        if need > st[S_FREE] - spare:
            break
        st[S_IN_HEAD] += 1
        st[S_FREE] -= need
        req[R_BLOCKS, r] = need
        times[T_FIRST_SCHEDULED, r] = now
        running[st[S_RUNNING]] = r
        st[S_RUNNING] += 1


@kernel
def _stop_check(req, times, batch_r, m, now, stop_f, stop_i, seen):
    """:meth:`stepsim.serve.replay_stop.StopTracker.after_step`, statement for statement: count the step's first
    tokens and finishes and the requests now late; whether a metric has more misses than it may."""
    arrival, since = times[T_ARRIVAL], times[T_SINCE]
    n = arrival.shape[0]
    ttft, tpot, e2e_limit = stop_f[SF_TTFT], stop_f[SF_TPOT], stop_f[SF_E2E]
    for j in range(m):
        i = batch_r[j]
        first = times[T_FIRST_TOKEN, i]
        if first >= 0.0 and not seen[i] & SEEN_TTFT:
            seen[i] |= SEEN_TTFT
            if first - since[i] > ttft:
                stop_i[SP_MISS_TTFT] += 1
        finish = times[T_FINISH, i]
        if finish >= 0.0 and not seen[i] & SEEN_END:
            seen[i] |= SEEN_END
            e2e = finish - since[i]
            if not seen[i] & SEEN_E2E:
                seen[i] |= SEEN_E2E
                if e2e > e2e_limit:
                    stop_i[SP_MISS_E2E] += 1
            out = req[R_OUTPUT, i]
            if out > 1 and (e2e - (first - since[i])) / np.float64(out - 1) > tpot:
                stop_i[SP_MISS_TPOT] += 1
    while stop_i[SP_PTR_TTFT] < n and now - arrival[stop_i[SP_PTR_TTFT]] > ttft:
        i = stop_i[SP_PTR_TTFT]
        if not seen[i] & SEEN_TTFT:  # no first token yet: it comes at a later step's end
            seen[i] |= SEEN_TTFT
            stop_i[SP_MISS_TTFT] += 1
        stop_i[SP_PTR_TTFT] += 1
    while stop_i[SP_PTR_E2E] < n and now - arrival[stop_i[SP_PTR_E2E]] > e2e_limit:
        i = stop_i[SP_PTR_E2E]
        if not seen[i] & SEEN_E2E:
            seen[i] |= SEEN_E2E
            stop_i[SP_MISS_E2E] += 1
        stop_i[SP_PTR_E2E] += 1
    return (stop_i[SP_MISS_TTFT] > stop_i[SP_ALLOW_TTFT] or stop_i[SP_MISS_TPOT] > stop_i[SP_ALLOW_TPOT]
            or stop_i[SP_MISS_E2E] > stop_i[SP_ALLOW_E2E])


# ------------------------------------------------------------------------------------------ fast pricing
@kernel
def _window(prefix, start, tokens, tile_shift, experts, tiles, keep):
    """One layer's window of ``tokens`` pool tokens from ``start`` (:func:`stepsim.kernels.serve_fast.
    window_features`, pool 0): ``(expert tiles, active experts, busiest tiles)``; each expert's tiles in
    ``tiles`` when ``keep``."""
    stop, turns = sf.window_rows(prefix.shape[1] - 1, start, tokens)
    round_up = (1 << tile_shift) - 1
    total = 0
    active = 0
    busiest = 0
    for e in range(experts):
        c = sf.window_count(prefix, 0, start, stop, turns, e)
        t = (c + round_up) >> tile_shift
        if keep:  # the same for every expert: moved out of the loop by the compiler
            tiles[e] = t
        total += t
        active += 1 if c > 0 else 0
        busiest = max(busiest, t)
    return total, active, busiest


@kernel
def _price_fast(pi, forms, theta, ctx, new, m, tokens, prefix, pool_rows, starts, row_of_starts, out_i, k,
                loads, dec, pre, x, basis, scratch, tiles, collective, chip_of, expert_of_rank, chip_rows):
    """The fast model's cycles of one step (:meth:`stepsim.serve.fast.FastLatency.__call__`) into ``out_i[.., k]``
    (the three cycle columns, HBM bytes, FLOPs, total cycles). Returns False when a number would not be exact."""
    layers = pi[P_LAYERS]
    hbm_peak = np.float64(pi[P_HBM_PEAK])
    compute_bw = np.float64(pi[P_COMPUTE_BW])
    # attention (FastLatency.attention_regressors): features in one pass, as stepsim.kernels.serve_fast does
    round_up = (1 << pi[P_TILE_SHIFT]) - 1
    regions = len(loads)
    for j in range(regions):
        loads[j] = 0
    for j in range(5):
        dec[j] = 0
    for j in range(3):
        pre[j] = 0
    context_sum = 0
    seen = 0
    for i in range(m):
        c = ctx[i]
        nn = new[i]
        context_sum += c
        seen += nn * c + nn * (nn + 1) // 2
        if seen >= EXACT or context_sum >= EXACT:
            return False
        if nn == 1:
            t = (c + 1 + round_up) >> pi[P_TILE_SHIFT]
            dec[0] += 1
            dec[1] += t
            dec[2] = max(dec[2], t)
            best = 0
            for j in range(1, regions):
                if loads[j] < loads[best]:
                    best = j
            loads[best] += t
        else:
            first = c >> pi[P_TILE_SHIFT]
            last = (c + nn - 1) >> pi[P_TILE_SHIFT]
            pre[0] += 1
            pre[1] += last - first + 1
            pre[2] += ((last + 1) * (last + 2) - first * (first + 1)) // 2
    most = 0
    for j in range(regions):
        most = max(most, loads[j])
    dec[3] = most
    dec[4] = (dec[0] + regions - 1) // regions
    attention = 0
    for piece in range(2):
        f = dec if piece == 0 else pre
        if f[0] == 0:
            continue
        row = FM_DECODE_BYTES if piece == 0 else FM_PREFILL_BYTES
        x[0, 0] = 1.0
        x[0, 1] = np.float64(f[0])
        x[0, 2] = np.float64(f[1])
        x[0, 3] = np.float64(f[2])
        hbm = _dot(x[0], forms[row], 4, scratch) / hbm_peak
        compute = _dot(x[0], forms[row + 1], 4, scratch) / compute_bw
        n = 4
        if piece == 0:
            x[0, 4] = np.float64(dec[3])
            x[0, 5] = np.float64(dec[4])
            n = 6
        x[0, n] = hbm
        x[0, n + 1] = compute
        x[0, n + 2] = compute if compute > hbm else hbm  # Python's max(hbm, compute)
        n += 3
        length = pi[P_THETA_LENGTH + piece]
        if length < 0:
            v = np.ceil(x[0, n - 1])
        else:
            if length != n:
                return False
            v = np.rint(_dot(x[0], theta[piece], n, scratch))
            if v < 1.0:
                v = 1.0
        if not -EXACT < v < EXACT:
            return False
        attention += np.int64(v)
    # FFN (FastLatency.ffn_rows, predict_rows)
    prefill_step = pre[0] > 0
    ffn_row = TH_FFN_PREFILL if prefill_step else TH_FFN
    length = pi[P_THETA_LENGTH + ffn_row]
    few = pi[P_FEW_TOKENS]
    shared = pi[P_SHARED]
    rounds = pi[P_ROUNDS]
    experts = pi[P_EXPERTS]
    rows = layers if pi[P_MOE] else 1
    own = 8 + few + 1 + shared + (experts if rounds else 0)
    columns = own + (3 if pi[P_CHIP_COLUMNS] else 0)
    if length >= 0 and length != columns:
        return False
    shared_tiles = -(-tokens // (1 << pi[P_TILE_SHIFT]))
    chips = pi[P_SHARED_CHIPS]
    shared_basis = shared_tiles  # fast.shared_tiles over the chips' shards
    if chips > 1:
        base, extra = tokens // chips, tokens % chips
        tile = 1 << pi[P_TILE_SHIFT]
        shared_basis = extra * -(-(base + 1) // tile) + (chips - extra) * -(-base // tile)
    ffn = 0
    touched = 0
    for layer in range(rows):
        xl = x[layer]
        for j in range(columns):
            xl[j] = 0.0
        start = starts[row_of_starts, layer] if pi[P_MOE] else 0
        if pi[P_MOE]:
            total, active, busiest = _window(prefix, start, tokens, pi[P_TILE_SHIFT], experts, tiles, rounds)
        else:
            total, active, busiest = shared_tiles, 1, shared_tiles
        xl[0] = 1.0
        xl[1] = np.float64(tokens)
        xl[2] = np.float64(total)
        xl[3] = np.float64(active)
        xl[4] = np.float64(busiest)
        basis[0] = 1.0
        basis[1] = xl[1]
        basis[2] = xl[2]
        basis[3] = xl[3]
        basis[4] = xl[4]
        width = 5
        if shared:  # the shared experts' tiles: a basis column of the bounds, and a regressor after the pair column
            basis[5] = np.float64(shared_basis)
            xl[8 + few + 1] = basis[5]
            width = 6
        hbm = _dot(basis, forms[FM_FFN_BYTES], width, scratch) / hbm_peak
        compute = _dot(basis, forms[FM_FFN_FLOPS], width, scratch) / compute_bw
        xl[5] = hbm
        xl[6] = compute
        xl[7] = hbm if hbm >= compute else compute  # np.maximum
        if hbm != hbm or compute != compute:
            return False
        if tokens <= few:
            xl[7 + tokens] = 1.0
        if tokens == 2 and pi[P_MOE]:  # pair_parity: experts the two tokens share (a bijection keeps them)
            pool = pool_rows.shape[0]
            a = (start) % pool
            b = (start + 1) % pool
            same = 0
            for u in range(pool_rows.shape[1]):
                for w in range(pool_rows.shape[1]):
                    if pool_rows[a, u] == pool_rows[b, w]:
                        same += 1
            xl[8 + few] = np.float64(same % 2)
        if rounds:  # expert_rounds: the tiles sorted, largest first; column a - 1 = t_a - t_(a+1)
            for e in range(1, experts):
                t = tiles[e]
                j = e - 1
                while j >= 0 and tiles[j] < t:
                    tiles[j + 1] = tiles[j]
                    j -= 1
                tiles[j + 1] = t
            base = 8 + few + 1 + shared
            for e in range(experts):
                nxt = tiles[e + 1] if e + 1 < experts else 0
                xl[base + e] = np.float64(tiles[e] - nxt)
        if pi[P_CHIP_COLUMNS]:  # fast.chip_features: rows crossing a link, and the busiest chip's rows
            sm.chip_columns(prefix, pool_rows, chip_rows, False, expert_of_rank[layer], chip_of, 0, start, tokens,
                            pi[P_CHIPS], chip_rows, xl, own)  # chip_rows twice: no window counts here (counted False)
        if length < 0:
            v = np.ceil(xl[7])
        else:
            v = np.rint(_dot(xl, theta[ffn_row], columns, scratch))
            if v < 1.0:
                v = 1.0
        if not -EXACT < v < EXACT:
            return False
        ffn += np.int64(v)
        touched += active
    ffn *= pi[P_COUNT]
    if pi[P_MOE] == 0:
        touched = 0
    heads_layers = pi[P_HEADS] * layers
    if attention >= EXACT // max(heads_layers, 1) or ffn >= EXACT:
        return False
    attention *= heads_layers
    attention += collective  # a system's all-reduces (0 on one chip)
    embedding = tokens * pi[P_EMBEDDING_BYTES]
    if embedding >= EXACT or attention >= EXACT:
        return False
    embedding = -(-embedding // pi[P_CHIPS])  # a system's chips each read their share (tp_weight_cycles)
    weights = layers * pi[P_LAYER_WEIGHTS] + pi[P_HEAD_CYCLES] + math.ceil(embedding / hbm_peak)
    cycles = attention + ffn + weights
    if not _write_work(pi, context_sum, seen, m, tokens, touched, cycles, out_i, k):
        return False
    out_i[I_CYCLES_ATTENTION, k] = attention
    out_i[I_CYCLES_FFN, k] = ffn
    out_i[I_CYCLES_WEIGHTS, k] = weights
    return True


@kernel
def _write_work(pi, context_sum, seen, m, tokens, touched, cycles, out_i, k):
    """The roofline (:meth:`stepsim.mapping.roofline.StepWork.work`) of a step of ``m`` sequences, ``tokens`` new
    tokens over ``context_sum`` cached ones (``seen``: context tokens attended to), ``touched`` experts, priced at
    ``cycles``: its HBM bytes, FLOPs and cycles into ``out_i[.., k]``; False (nothing written) when a number would
    not be exact."""
    if seen >= EXACT // max(pi[P_ATTENTION_FLOPS], 1) or tokens >= EXACT // max(pi[P_FLOPS_PER_TOKEN], 1):
        return False
    if not (_fits(touched, pi[P_EXPERT_BYTES]) and _fits(context_sum + tokens, pi[P_KV_BYTES])
            and _fits(tokens, pi[P_EMBEDDING_BYTES])):
        return False
    hbm_bytes = (pi[P_FIXED_BYTES] + touched * pi[P_EXPERT_BYTES] + (context_sum + tokens) * pi[P_KV_BYTES]
                 + tokens * pi[P_EMBEDDING_BYTES])
    if m >= EXACT // max(pi[P_HEAD_FLOPS], 1):
        return False
    flops = tokens * pi[P_FLOPS_PER_TOKEN] + m * pi[P_HEAD_FLOPS] + pi[P_ATTENTION_FLOPS] * seen
    if (cycles >= EXACT // max(pi[P_PEAK_BYTES], 1) or cycles >= EXACT // max(pi[P_PEAK_FLOPS], 1)
            or hbm_bytes >= EXACT or flops >= EXACT):
        return False
    out_i[I_HBM, k] = hbm_bytes
    out_i[I_FLOPS, k] = flops
    out_i[I_CYCLES, k] = cycles
    return True


@kernel
def _roofline(pi, ctx, new, m, tokens, touched, cycles, out_i, k):
    """:meth:`stepsim.mapping.roofline.StepWork.work` of a step priced elsewhere (``cycles`` in all) into
    ``out_i[.., k]``; False when a number would not be exact."""
    context_sum = 0
    seen = 0
    for i in range(m):
        c = ctx[i]
        nn = new[i]
        context_sum += c
        seen += nn * c + nn * (nn + 1) // 2
        if seen >= EXACT or context_sum >= EXACT:
            return False
    if cycles <= 0:
        return False
    return _write_work(pi, context_sum, seen, m, tokens, touched, cycles, out_i, k)


@kernel
def _floor(pi, out_i, k):
    """:meth:`stepsim.serve.fast.FastLatency._floored` (every fast provider's) on a step whose roofline :func:`_write_work`
    wrote: its cycles raised to ``StepWork.bound_cycles`` (``math.ceil`` of int / int, as Python divides: both
    below 2^53, so one correctly rounded float each) when below it, the cycles added into ``I_CYCLES_FLOOR``."""
    bound = max(math.ceil(out_i[I_HBM, k] / pi[P_PEAK_BYTES]), math.ceil(out_i[I_FLOPS, k] / pi[P_PEAK_FLOPS]))
    added = max(0, bound - out_i[I_CYCLES, k])
    out_i[I_CYCLES_FLOOR, k] = added
    out_i[I_CYCLES, k] += added


# ------------------------------------------------------------------------------------------ the loop
@kernel
def replay_loop(cfg, st, clock, req, times, running, waiting, rest, prefills, batch_r, batch_n, ctx, gaps,
                steps_i, steps_f, pi, constant_s, forms, theta, prefix, pool_rows, starts, loads, dec, pre, x,
                basis, scratch, tiles, stop_f, stop_i, seen, pm, buckets_i, buckets_f, proj, expert_of_rank,
                rank_of_expert, need, res, mloads, counts, regions, pc, record):
    """Replay until done or a reason to return (module docstring); returns that reason.

    ``clock`` (float64 ``[2]``) holds the time now and the horizon (s, :data:`CLOCK_NOW`, :data:`CLOCK_HORIZON`);
    ``st`` the loop's counters (it serves the first ``st[S_KNOWN]`` requests of the table); ``steps_i`` /
    ``steps_f`` get a column per step (``st[S_STEPS]`` of them so far, at most their width); ``pi`` the pricing's
    integers (mode :data:`CONSTANT`: every step ``constant_s`` seconds; :data:`FAST`: the fast model over ``forms``,
    ``theta``, the routing pool's prefix counts ``prefix`` and rows ``pool_rows``, window starts ``starts`` per
    step);
    ``stop_i[SP_ACTIVE]``: after every step, :func:`_stop_check` over the rule ``stop_f`` / ``stop_i`` and the
    per-request flags ``seen`` (returns :data:`STOPPED` once the SLO is provably missed). Mode :data:`MAPPED`:
    :func:`stepsim.kernels.serve_mapped.price_mapped` over ``pm`` and its tables (returns :data:`NEED` with the
    step pending when they lack something). With ``cfg[C_RECORD]`` each step's batch is appended to ``record``
    (:data:`C_RECORD`)."""
    n_req = req.shape[1]
    arrival = times[T_ARRIVAL]
    capacity = steps_i.shape[1]
    made = 0
    policy = cfg[C_POLICY]
    fast = pi[P_MODE] == FAST
    mapped = pi[P_MODE] == MAPPED
    decode_pool = cfg[C_DECODE_POOL] != 0
    while st[S_DONE] < st[S_KNOWN]:
        now = clock[CLOCK_NOW]
        known = st[S_KNOWN]
        if st[S_PENDING]:  # the step scheduled before the last NEED: price it now
            m = st[S_BATCH]
        else:
            if now >= clock[CLOCK_HORIZON]:  # a request not yet known may join this step: the caller routes it
                return HORIZON
            if decode_pool:  # arrivals join the incoming queue (S_IN_HEAD .. S_NEXT - 1), admitted from its head
                while st[S_NEXT] < known and arrival[st[S_NEXT]] <= now:
                    st[S_NEXT] += 1
                _admit_incoming(cfg, req, times, st, running, now)
                if st[S_RUNNING] == 0 and st[S_WAIT_LEN] == 0 and st[S_IN_HEAD] < st[S_NEXT]:
                    return REFUSED  # the reference names the request that cannot join the idle pool
            while st[S_NEXT] < known and arrival[st[S_NEXT]] <= now:
                tail = (st[S_WAIT_HEAD] + st[S_WAIT_LEN]) % n_req
                waiting[tail] = st[S_NEXT]
                st[S_WAIT_LEN] += 1
                st[S_NEXT] += 1
            if st[S_RUNNING] == 0 and st[S_WAIT_LEN] == 0:
                clock[CLOCK_NOW] = arrival[st[S_NEXT]]  # idle: the next step starts the moment a request arrives
                continue
            if st[S_STEPS] == capacity:
                return FULL
            if (fast or mapped) and pi[P_MOE] and st[S_STARTS_USED] == starts.shape[0]:
                return STARTS
            if made == cfg[C_PAUSE] or (cfg[C_RECORD]
                                         and st[S_RECORDED] + min(cfg[C_MAX_SEQS], known) > record.shape[1]):
                return PAUSE
            if policy == VLLM:
                m = _vllm(cfg, req, st, running, waiting, n_req, batch_r, batch_n)
            elif policy == SARATHI:
                m = _sarathi(cfg, req, st, running, waiting, n_req, batch_r, batch_n, rest, prefills)
            else:
                m = _orca(cfg, req, st, running, waiting, n_req, batch_r, batch_n)
            st[S_BATCH] = m
            if m == 0:
                if st[S_PREEMPTED]:
                    continue  # only preempted: schedule again at this instant
                return REFUSED  # the reference names the request that cannot be scheduled
        prefill = 0
        tokens = 0
        for j in range(m):
            r = batch_r[j]
            if times[T_FIRST_SCHEDULED, r] < 0.0:
                times[T_FIRST_SCHEDULED, r] = now
            ctx[j] = req[R_COMPUTED, r]
            tokens += batch_n[j]
            if req[R_PREFILLING, r]:
                prefill += batch_n[j]
        k = st[S_STEPS]
        if fast:
            collective = 0
            if pi[P_CHIPS] > 1:  # the all-reduces' cycles at this token count: the caller's closed form
                if tokens >= proj.shape[2] or proj[0, 0, tokens] < 0:
                    need[0] = tokens
                    need[1] = m
                    need[2] = 0
                    st[S_PENDING] = 1
                    return NEED
                collective = proj[0, 0, tokens]
            st[S_PENDING] = 0
            if not _price_fast(pi, forms, theta, ctx, batch_n, m, tokens, prefix, pool_rows, starts,
                               st[S_STARTS_USED], steps_i, k, loads, dec, pre, x, basis, scratch, tiles, collective,
                               counts, expert_of_rank, regions):
                return UNSUPPORTED
            _floor(pi, steps_i, k)
            if pi[P_MOE]:
                st[S_STARTS_USED] += 1
            seconds = np.float64(steps_i[I_CYCLES, k]) / np.float64(pi[P_CLOCK])
        elif mapped:
            status = sm.price_mapped(pm, forms, theta, buckets_i, buckets_f, proj, ctx, batch_n, m, tokens, prefix,
                                     pool_rows, expert_of_rank, rank_of_expert, starts, st[S_STARTS_USED], need,
                                     res, mloads, x, scratch, counts, regions, pc)
            if status == sm.NEED:
                st[S_PENDING] = 1
                return NEED
            st[S_PENDING] = 0
            if status != sm.PRICED or not _roofline(pi, ctx, batch_n, m, tokens, res[sm.R_TOUCHED],
                                                    res[sm.R_TOTAL], steps_i, k):
                return UNSUPPORTED
            _floor(pi, steps_i, k)
            steps_i[I_CYCLES_ATTENTION, k] = res[sm.R_ATTENTION]
            steps_i[I_CYCLES_FFN, k] = res[sm.R_FFN]
            steps_i[I_CYCLES_WEIGHTS, k] = res[sm.R_WEIGHTS]
            steps_i[I_CYCLES_HIDDEN, k] = res[sm.R_HIDDEN]
            steps_i[I_DECODE_REQUESTS, k] = res[sm.R_DECODE_REQUESTS]
            steps_i[I_QUERY_TILES, k] = res[sm.R_QUERY_TILES]
            if pi[P_MOE]:
                st[S_STARTS_USED] += 1
            seconds = np.float64(steps_i[I_CYCLES, k]) / np.float64(pi[P_CLOCK])
        else:
            seconds = constant_s
        end = now + seconds
        if not (seconds > 0.0 and now < end <= MAX_TIME_S):
            return REFUSED  # the reference's checked_cost says why
        steps_f[F_START, k] = now
        steps_f[F_DURATION, k] = seconds
        steps_i[I_TOKENS, k] = tokens
        steps_i[I_SEQUENCES, k] = m
        steps_i[I_PREFILL, k] = prefill
        steps_i[I_DECODE, k] = tokens - prefill
        steps_i[I_BLOCKS, k] = cfg[C_USABLE] - st[S_FREE]
        steps_i[I_PREEMPTIONS, k] = st[S_PREEMPTED]
        steps_i[I_WAITING, k] = st[S_WAIT_LEN] + (st[S_NEXT] - st[S_IN_HEAD] if decode_pool else 0)
        st[S_STEPS] = k + 1
        made += 1
        if cfg[C_RECORD]:
            at = st[S_RECORDED]
            if at + m > record.shape[1]:  # more sequences than C_MAX_SEQS (no policy makes such a step)
                return UNSUPPORTED
            for j in range(m):
                record[RC_CONTEXT, at + j] = ctx[j]
                record[RC_NEW, at + j] = batch_n[j]
            st[S_RECORDED] = at + m
        clock[CLOCK_NOW] = end
        st[S_DONE] += _finish_step(req, times, st, running, batch_r, batch_n, m, end, gaps)
        if stop_i[SP_ACTIVE] and _stop_check(req, times, batch_r, m, end, stop_f, stop_i, seen):
            return STOPPED
    return DONE
