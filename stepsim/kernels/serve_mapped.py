"""Machine code for a step priced by ``--fidelity fast`` on mapped layers
(:class:`stepsim.serve.fast_mapped.MappedFastLatency`, its one-chip ``_streamed`` path), for the compiled replay
(:mod:`stepsim.kernels.serve_replay`, mode ``MAPPED``).

Per step, as the provider computes it: the mapped decode attention's regressors over every KV head's requests (the
busiest of its bucket's regions when they are dealt greedily, the bucket's cycles scaled by that load), the
prefill attention's regressors of every KV head's chunks (their query tiles dealt to the bucket's regions as the
builder deals them, the busiest region's KV tiles, the bucket's estimate), each layer's FFN regressors from its
routing window (expert tiles at the bucket's ``tile_n``, the busiest region of contiguous experts, the tile estimate
and the two-point estimate of :func:`stepsim.serve.fast_mapped.bucket_estimate`), the
coefficients' prices, then the step's pieces in run order (per layer q/k/v, attention, o, router, FFN; the LM head)
with the weights streamed ahead (:func:`stepsim.serve.projections.stream_ahead`, integer for integer).

What depends on the mapper (each bucket's schedule) and on the engine (the projections' cycles at each token
count) is not computed here: the caller fills tables ``buckets_i`` / ``buckets_f`` (per bucket, by its log2) and
``proj`` (per token count) from the provider's own functions, when :func:`price_mapped` returns :data:`NEED` with
what it needs in ``need``. Floats are made by the same operations in the same order as the provider's NumPy
(:func:`stepsim.kernels.row_sum._dot`); integers are Python's wherever they stay below 2^53 (checked: else
:data:`UNSUPPORTED`, and the caller replays in Python). No allocation: the caller passes every scratch array.

On a system's chips the step is one chip's: a dense model's tensor-parallel shard
(:class:`~stepsim.serve.system_fast.MappedSystemFastLatency`: the shard's heads and FFN columns, an all-reduce after
the o projection and after the FFN) or an MoE model's expert-parallel chip
(:class:`~stepsim.serve.fast_mapped_ep.MappedEPFastLatency`: the head shard, one all-reduce after the o projection,
the router over the chip's shard of the tokens, the block's regressors with the busiest chip's tiles and the chips'
link columns, the block's traffic its busiest chip's, :func:`stepsim.serve.projections.ep_block_traffic`); the
all-reduces are pieces in which the HBM idles, and a chip reads its share of the embedding rows.
"""

from __future__ import annotations

import numpy as np

from stepsim.kernels.cpu import lowest_bit, prefetch
from stepsim.kernels.jit import kernel
from stepsim.kernels.row_sum import EXACT, _dot
from stepsim.kernels.serve_fast import window_count, window_rows, window_stop

#: the mapped prefill attention's regressors (:func:`stepsim.serve.fast_mapped.prefill_regressors`, the estimate last)
PREFILL_COLUMNS = 9
#: entries of the mapped pricing's integers ``pm`` (int64)
(M_LAYERS, M_KV_HEADS, M_HEADS, M_MOE, M_EXPERTS, M_TILE_SHIFT, M_FEW, M_HBM_PEAK, M_CAPACITY, M_PEAK_FLOPS,
 M_COMPUTE_BW, M_PER_EXPERT, M_SHARED_W, M_FFN_FLOPS, M_ROW_BYTES, M_EMBEDDING_BYTES, M_W_QKV, M_W_O, M_W_ROUTER,
 M_W_HEAD, M_KV_READ, M_DECODE_FLOPS, M_READ_TILE, M_CHIPS, M_ALLREDUCES, M_EP, M_EXPERT_ROW_FLOPS,
 M_SHARED_ROW_FLOPS, M_THETA_LENGTH) = range(29)
#: (``M_CHIPS``: the chips of a system, 1 on one chip; the attention's dimensions are then one chip's shard;
#: ``M_ALLREDUCES``: the all-reduces a layer, 2 on a dense model's tensor-parallel chips, 1 on an MoE model's
#: expert-parallel chips (after the o projection; the block combines its tokens by all-to-all), 0 on one chip;
#: ``M_EP``: 1 on the expert-parallel chips, :class:`stepsim.serve.fast_mapped_ep.MappedEPFastLatency`;
#: ``M_EXPERT_ROW_FLOPS`` / ``M_SHARED_ROW_FLOPS``: FLOPs of one token row through a routed / the shared experts)
#: entries of ``pm``: the scalars, then the four coefficient rows' lengths (decode, prefill, ffn, ffn_prefill)
M_ROWS = M_THETA_LENGTH + 4
#: rows of the per-bucket integers ``buckets_i`` (int64 ``[B_ROWS, 64]``, column log2 of the bucket): the FFN's
#: (filled, tile_n and regions of its loads, tile_n and on-chip bytes of its traffic), the decode attention's
#: (filled, regions knob, on-chip bytes, the representative requests' busiest region load)
(B_FFN, B_FFN_TILE_N, B_FFN_REGIONS, B_FFN_TRAFFIC_TILE_N, B_FFN_ON_CHIP, B_DECODE, B_DECODE_REGIONS,
 B_DECODE_ON_CHIP, B_DECODE_REP_LOAD, B_PREFILL, B_PREFILL_REGIONS, B_PREFILL_REP_LOAD, B_PREFILL_REP_KV,
 B_FFN_BOTTOM_TOKENS, B_FFN_TOP_TOKENS, B_ROWS) = range(16)
#: (``B_PREFILL``...: the prefill attention's filled, regions knob, the representative data's busiest region load and
#: KV tiles, :func:`stepsim.serve.fast_mapped.prefill_reference`)
#: (``B_FFN_BOTTOM_TOKENS``, ``B_FFN_TOP_TOKENS``: the FFN bucket's two simulated points' tokens,
#: :class:`stepsim.serve.fast_mapped.Reference`)
#: rows of the per-bucket floats ``buckets_f`` (float64 ``[BF_ROWS, 64]``): the FFN's cycles, representative tiles
#: and region tiles, the decode attention's cycles, the prefill attention's
#: (then the FFN's top point's load and its bottom point's cycles)
(BF_FFN_CYCLES, BF_FFN_TILES, BF_FFN_REGIONS, BF_DECODE_CYCLES, BF_PREFILL_CYCLES, BF_FFN_TOP_LOAD,
 BF_FFN_BOTTOM_CYCLES, BF_FFN_CHIPS, BF_ROWS) = range(9)
#: (``BF_FFN_CHIPS``: on expert-parallel chips the busiest chip's representative tiles,
#: :class:`stepsim.serve.fast_mapped_ep.Reference` ``chip_rep``; ``BF_FFN_REGIONS`` its ``region_rep``)
#: ``proj`` (int64 ``[5, 4, n]``): q/k/v, o, router at a step's tokens and the LM head at its sequences; fields
#: cycles (-1: not filled), HBM bytes, on-chip bytes, FLOPs; then the all-reduce of a step's tokens (its cycles)
PJ_QKV, PJ_O, PJ_ROUTER, PJ_HEAD, PJ_ALLREDUCE = range(5)
#: rows of the pieces scratch ``pc`` (int64 ``[PC_ROWS, pieces]``)
(PC_CYCLES, PC_HBM, PC_WEIGHT, PC_ON_CHIP, PC_FLOPS, PC_STREAMS, PC_KIND, PC_PREFETCHED, PC_FLOOR, PC_UNREAD,
 PC_READ_CYCLES, PC_ROWS) = range(12)
#: (``PC_FLOOR``, ``PC_UNREAD``, ``PC_READ_CYCLES``: written by :func:`_hidden`, a piece's compute floor, the bytes
#: it still reads and their cycles at the HBM's peak)
#: piece kinds (``pc[PC_KIND]``)
K_PROJECTION, K_ATTENTION, K_FFN, K_COLLECTIVE = range(4)
#: ``need`` (int64 ``[4]``): the step's tokens, sequences, decode requests (every KV head's) and prefill size (one
#: head's query tiles in positions, 0 without a prefill chunk)
#: results of :func:`price_mapped`
PRICED, NEED, UNSUPPORTED = range(3)
#: entries of ``res`` (int64): the step's cycles by kind, experts touched, the decode requests (every KV head's)
#: and query tiles (one head's) its buckets are noted by
R_ATTENTION, R_FFN, R_WEIGHTS, R_HIDDEN, R_TOTAL, R_TOUCHED, R_DECODE_REQUESTS, R_QUERY_TILES, R_ROWS = range(9)


@kernel
def log2_bucket(size):
    """``log2(bucket(size))`` (:func:`stepsim.mapping.mapper.bucket`: the next power of two, at least 1)."""
    b = 0
    s = size - 1
    while s > 0:
        s >>= 1
        b += 1
    return b


@kernel
def _predict(x, theta, length, n, bound, scratch):
    """:func:`stepsim.serve.fast.predict`: ``max(rint(theta . x), 1)``, or ``ceil(x[bound])`` without coefficients;
    -1.0 when not exact (a length other than the regressors', or beyond 2^53)."""
    if length < 0:
        v = np.ceil(x[bound])
    else:
        if length != n:
            return -1.0
        v = np.rint(_dot(x, theta, n, scratch))
        if v < 1.0:
            v = 1.0
    if not -EXACT < v < EXACT:
        return -1.0
    return v


@kernel
def _line(x, x0, y0, x1, y1):
    """:func:`stepsim.serve.fast_mapped._line` of one value, operation for operation."""
    if x1 - x0 <= 1e-9:
        return y1 * x / x1
    v = y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return v if v >= 0.0 else 0.0  # np.maximum(v, 0.0)


@kernel
def _log2_exact(x):
    """``k`` when ``x == 2**k`` (``x`` > 0), else -1: a divisor the hot loops then apply as a shift."""
    if x <= 0 or x & (x - 1):
        return -1
    return log2_bucket(x)  # a power of two is its own bucket


@kernel
def _quotient(a, d, shift):
    """``a // d`` for ``a`` >= 0, by ``shift`` (:func:`_log2_exact` of ``d``) when it is >= 0: an integer division
    in a loop over the experts of every layer of every step cost more than the rest of the step."""
    return a >> shift if shift >= 0 else a // d


@kernel
def _counts(prefix, start, tokens, experts, counts):
    """Each rank's tokens in the window of ``tokens`` pool tokens from ``start`` (wrapping, whole turns), as
    :meth:`stepsim.serve.routing.SyntheticRouting.window`'s rows count them (:func:`stepsim.kernels.serve_fast.
    window_count`)."""
    stop, turns = window_rows(prefix.shape[1] - 1, start, tokens)
    for e in range(experts):
        counts[e] = window_count(prefix, 0, start, stop, turns, e)


#: MoE layers whose prefix rows :func:`price_mapped` asks for ahead of the layer it counts (:func:`_prefetch_window`;
#: of 4, 8 and 16 ahead, 4 the fastest: bench/README.md, session 48)
PREFETCH_LAYERS = 4


@kernel
def _by_prefix(tokens, top_k, experts):
    """Whether :func:`_layer_loads` counts a window of ``tokens`` pool tokens from the pool's prefix counts rather
    than row by row: a row costs about four experts (bench/README.md, session 44)."""
    return 4 * tokens * top_k >= experts


@kernel
def _prefetch_window(prefix, start, tokens):
    """Ask for the cache lines of the two prefix rows :func:`_counts` reads for the window of ``tokens`` pool tokens
    from ``start`` (:func:`stepsim.kernels.cpu.prefetch`; the pool's last row, read by a window that turns, stays
    in cache). Every line of a row: its first element, one a line after it, and its last (a row need not start a
    line)."""
    experts = prefix.shape[2]
    stop, _ = window_rows(prefix.shape[1] - 1, start, tokens)
    step = max(1, 64 // prefix.itemsize)
    for e in range(0, experts, step):
        prefetch(prefix, 0, start, e)
        prefetch(prefix, 0, stop, e)
    prefetch(prefix, 0, start, experts - 1)
    prefetch(prefix, 0, stop, experts - 1)


@kernel
def _ready(buckets_i, proj, tokens, m, decode, prefill_size, moe, allreduces):
    """Whether the tables hold what a step of ``tokens`` tokens, ``m`` sequences, ``decode`` decode requests
    (every KV head's) and a prefill attention of ``prefill_size`` (0: none) needs."""
    n = proj.shape[2]
    if tokens >= n or m >= n:
        return False
    if proj[PJ_QKV, 0, tokens] < 0 or proj[PJ_O, 0, tokens] < 0 or proj[PJ_HEAD, 0, m] < 0:
        return False
    if moe and proj[PJ_ROUTER, 0, tokens] < 0:
        return False
    if allreduces and proj[PJ_ALLREDUCE, 0, tokens] < 0:
        return False
    if buckets_i[B_FFN, log2_bucket(tokens)] == 0:
        return False
    if prefill_size and buckets_i[B_PREFILL, log2_bucket(prefill_size)] == 0:
        return False
    return decode == 0 or buckets_i[B_DECODE, log2_bucket(decode)] != 0


@kernel
def _span(prefix, rank, begin, n, pool_shift):
    """Pool tokens routed to ``rank`` among the ``n`` pool tokens from ``begin`` (any offset: taken modulo the pool;
    wrapping, whole turns), as :func:`_counts` counts a window; ``pool_shift``: :func:`_log2_exact` of the pool's
    tokens (shifts and masks for a pool of a power of two: this runs for every rank and chip of a layer)."""
    pool = prefix.shape[1] - 1
    if pool_shift >= 0:
        begin, turns, rest = begin & (pool - 1), n >> pool_shift, n & (pool - 1)
    else:
        begin, turns, rest = begin % pool, n // pool, n % pool
    stop, turns = window_stop(pool, begin, turns, rest)
    return window_count(prefix, 0, begin, stop, turns, rank)


@kernel
def chip_columns(prefix, pool_rows, counts, counted, expert_of_rank, chip_of, per_chip, start, tokens, chips,
                 chip_rows, xl, at):
    """:func:`stepsim.serve.fast.chip_features` of one layer's window (``tokens`` pool tokens from ``start``, ranks
    to experts by ``expert_of_rank``, experts to chips by ``chip_of``, or with ``per_chip`` > 0 contiguously,
    ``per_chip`` experts a chip; token ``t`` at home on its shard's chip,
    :func:`stepsim.workloads.moe.sharded.shard_bounds`) into ``xl[at:at + 3]``; ``chip_rows``: scratch of ``chips``,
    left holding each chip's received rows. ``counts``: each rank's tokens in the window (:func:`_counts`) when
    ``counted``, else counted here.

    A window of fewer (token, expert) rows than experts is counted row by row (``pool_rows``, the pool's ranks);
    a larger one from the pool's prefix counts, O(experts) a layer: a rank's rows go to its expert's chip, and those
    of its rows whose token is at home there are the rank's count over that chip's shard of the window (a contiguous
    run of tokens). Row by row, a 2,048-token step of a 48-layer model is 786,432 rows."""
    chip_shift = _log2_exact(per_chip)
    base, extra = tokens // chips, tokens % chips
    for c in range(chips):
        chip_rows[c] = 0
    top_k = pool_rows.shape[1]
    if tokens * top_k < expert_of_rank.shape[0]:  # fewer tokens than the pool: one wrap at most
        home, bound = 0, base + (1 if extra > 0 else 0)  # shard_bounds: the first `extra` chips one token more
        remote = 0
        row = start
        for t in range(tokens):
            while t >= bound:
                home += 1
                bound += base + (1 if home < extra else 0)
            for slot in range(top_k):
                expert = expert_of_rank[pool_rows[row, slot]]
                dest = _quotient(expert, per_chip, chip_shift) if per_chip > 0 else chip_of[expert]
                chip_rows[dest] += 1
                remote += 1 if dest != home else 0
            row = row + 1 if row + 1 < pool_rows.shape[0] else 0
        _link_columns(remote, chip_rows, chips, xl, at)
        return
    pool = prefix.shape[1] - 1
    pool_shift = _log2_exact(pool)
    rows = 0
    local = 0
    for rank in range(expert_of_rank.shape[0]):
        routed = counts[rank] if counted else _span(prefix, rank, start, tokens, pool_shift)
        if routed == 0:
            continue
        expert = expert_of_rank[rank]
        dest = _quotient(expert, per_chip, chip_shift) if per_chip > 0 else chip_of[expert]
        chip_rows[dest] += routed
        rows += routed
        shard = base + (1 if dest < extra else 0)
        if shard > 0:
            local += _span(prefix, rank, start + dest * base + min(dest, extra), shard, pool_shift)
    _link_columns(rows - local, chip_rows, chips, xl, at)


@kernel
def _link_columns(remote, chip_rows, chips, xl, at):
    """:func:`stepsim.serve.fast.chip_features`' three columns: whether any row crosses a link, how many do, and
    the busiest chip's rows."""
    busiest = 0
    for c in range(chips):
        busiest = max(busiest, chip_rows[c])
    xl[at] = 1.0 if remote > 0 else 0.0
    xl[at + 1] = np.float64(remote)
    xl[at + 2] = np.float64(busiest)


@kernel
def _layer_loads(prefix, pool_rows, expert_of_rank, rank_of_expert, start, tokens, tile_n, tile_shift, per_region,
                 n_regions, ep, chips, per_chip, chip_shift, counts, regions, loads, xf, at):
    """One MoE layer's routing window (``tokens`` pool tokens from ``start``; ranks to experts by ``expert_of_rank``,
    its inverse ``rank_of_expert``) as :func:`stepsim.serve.fast_mapped.ffn_regressors` and
    :func:`stepsim.serve.fast_mapped_ep.ep_loads` count it: returns (expert tiles at ``tile_n``, active experts, the
    busiest expert's tiles) and leaves each region's tiles in ``regions[:n_regions]`` (``per_region`` contiguous
    experts a region); with ``ep`` (``per_chip`` contiguous experts a chip) each chip's tiles, received rows and
    active experts in ``loads[:chips]``, ``loads[chips:2 * chips]`` and ``loads[2 * chips:3 * chips]``, and the link
    columns in ``xf[at:at + 3]`` (:func:`chip_columns`). ``counts``: scratch of twice the experts (each rank's
    tokens, then its tiles).

    A window of fewer (token, expert) rows than a quarter of the experts (a decode step of a few sequences: most
    steps of a lightly loaded replica) is counted row by row (:func:`_row_loads`), touching only its ranks; a larger
    one from the pool's prefix counts (:func:`_counts`), in loops over the experts: the tiles rank by rank (the
    prefix counts' order), then each region's sum (rank by rank into the region of the rank's expert when a region
    has a power of two experts, else expert by expert through ``rank_of_expert``), and on expert-parallel chips the
    chips' columns apart. One loop over the ranks making the tiles and adding into the regions (and the chips) made the compiled loop of the one-chip
    Qwen3-30B-A3B whole-trace replay 7.3-8.1 s against 6.9-7.4 s (with the heap of :func:`deal_least_loaded`;
    bench/README.md, session 44). The two paths give the same integers (tests/serve/test_replay_mapped.py)."""
    if ep:
        for j in range(3 * chips):
            loads[j] = 0
    experts = expert_of_rank.shape[0]
    if _by_prefix(tokens, pool_rows.shape[1], experts):
        total = 0
        active = 0
        busiest = 0
        _counts(prefix, start, tokens, experts, counts)
        tiles = counts[experts:2 * experts]
        for rank in range(experts):
            c = counts[rank]
            t = _quotient(c + tile_n - 1, tile_n, tile_shift)  # -(-c // tile_n), c >= 0
            tiles[rank] = t
            total += t
            active += 1 if c > 0 else 0
            busiest = max(busiest, t)
        # the regions' sums: with a power of two experts a region, each rank's tiles added into its expert's region
        # (a shift); else in one loop over the experts in order, which the compiler unrolls. A loop a region was a
        # vector loop of one pass and a reduction for 4 experts a region (the Qwen3-30B-A3B decode steps'), and
        # the loop over the experts 20 % more of _layer_loads' samples than the shift (bench/README.md, session 48)
        region_shift = _log2_exact(per_region)
        if region_shift >= 0:
            for j in range(n_regions):
                regions[j] = 0
            for rank in range(experts):
                regions[np.uint64(expert_of_rank[np.uint64(rank)] >> region_shift)] += tiles[np.uint64(rank)]
        else:
            s = 0
            k = 0
            j = 0
            for expert in range(experts):
                s += tiles[np.uint64(rank_of_expert[np.uint64(expert)])]  # unsigned: no test for a negative index
                k += 1
                if k == per_region:
                    regions[np.uint64(j)] = s
                    j += 1
                    s = 0
                    k = 0
        if ep:
            for rank in range(experts):
                if counts[rank] > 0:
                    chip = _quotient(expert_of_rank[rank], per_chip, chip_shift)
                    loads[chip] += tiles[rank]
                    loads[2 * chips + chip] += 1
            chip_columns(prefix, pool_rows, counts, True, expert_of_rank, expert_of_rank, per_chip, start, tokens,
                         chips, loads[chips:2 * chips], xf, at)
        return total, active, busiest
    total, active, busiest = _row_loads(pool_rows, expert_of_rank, start, tokens, tile_n, tile_shift, per_region,
                                        n_regions, ep, chips, per_chip, chip_shift, counts, regions, loads)
    if ep:  # row by row too (the window's counts are taken apart by now)
        chip_columns(prefix, pool_rows, counts, False, expert_of_rank, expert_of_rank, per_chip, start, tokens, chips,
                     loads[chips:2 * chips], xf, at)
    return total, active, busiest


@kernel
def _row_loads(pool_rows, expert_of_rank, start, tokens, tile_n, tile_shift, per_region, n_regions, ep, chips,
               per_chip, chip_shift, counts, regions, loads):
    """:func:`_layer_loads` of a window of few rows (fewer tokens than the pool: one wrap at most), row by row:
    zero the window's ranks' ``counts``, count them, then take each once (its count negated once taken). Returns
    (expert tiles, active experts, the busiest expert's tiles); each region's tiles in ``regions[:n_regions]``, with
    ``ep`` each chip's tiles and active experts added into ``loads`` (zeroed by the caller)."""
    for j in range(n_regions):
        regions[j] = 0
    pool, top_k = pool_rows.shape[0], pool_rows.shape[1]
    region_shift = _log2_exact(per_region)
    total = 0
    active = 0
    busiest = 0
    for step in range(3):
        row = start
        for _ in range(tokens):
            for slot in range(top_k):
                rank = pool_rows[row, slot]
                if step == 0:
                    counts[rank] = 0
                elif step == 1:
                    counts[rank] += 1
                elif counts[rank] > 0:
                    c = counts[rank]
                    counts[rank] = -c
                    t = _quotient(c + tile_n - 1, tile_n, tile_shift)
                    total += t
                    active += 1
                    busiest = max(busiest, t)
                    expert = expert_of_rank[rank]
                    regions[_quotient(expert, per_region, region_shift)] += t
                    if ep:
                        chip = _quotient(expert, per_chip, chip_shift)
                        loads[chip] += t
                        loads[2 * chips + chip] += 1
            row = row + 1 if row + 1 < pool else 0
    return total, active, busiest


@kernel
def deal_least_loaded(loads, heap, regions, t):
    """Add ``t`` to the least loaded of ``loads[:regions]``, the lowest index on a tie: what a scan of every region
    picks (:func:`stepsim.kernels.serve_fast.attention_features`, the provider's), in O(log regions). ``heap``: the
    regions as a binary min-heap by (load, index), made by :func:`least_loaded_heap`."""
    j = heap[0]
    loads[j] += t
    load = loads[j]
    i = 0
    while True:  # sift the root down: only its key grew
        c = 2 * i + 1
        if c >= regions:
            break
        if c + 1 < regions:
            a, b = heap[c], heap[c + 1]
            if loads[b] < loads[a] or (loads[b] == loads[a] and b < a):
                c += 1
        child = heap[c]
        if loads[child] < load or (loads[child] == load and child < j):
            heap[i] = child
            i = c
        else:
            break
    heap[i] = j


#: regions up to which a decode attention's requests are dealt by bits (:func:`deal_by_bits`): one word's
BIT_REGIONS = 64


@kernel
def bits_start(loads, ring, regions):
    """Zero ``loads[:regions]`` (at most :data:`BIT_REGIONS`) and ``ring``, then put every region in bucket 0 (load
    0) for :func:`deal_by_bits`."""
    for j in range(regions):
        loads[j] = 0
    for i in range(len(ring)):
        ring[i] = 0
    ring[0] = -1 if regions == BIT_REGIONS else ~(np.int64(-1) << regions)  # the low `regions` bits


@kernel
def deal_by_bits(loads, ring, low, t):
    """:func:`deal_least_loaded` with the regions kept by load: bit ``j`` of ``ring[load % len(ring)]`` is set when
    region ``j`` has that load, so the least loaded region of the lowest index is the lowest bit of the first
    nonempty bucket from ``low``, the least load, which only grows (returned, for the next call). Every load lies in
    ``[low, low + the largest t]`` (a region is dealt to when least loaded), so a ring longer than the largest
    ``t`` (a power of two: ``%`` is a mask) never holds two loads in one bucket. A few instructions a request where
    the heap's sift is a branch a level."""
    mask = len(ring) - 1
    while ring[low & mask] == 0:
        low += 1
    bucket = ring[low & mask]
    j = lowest_bit(bucket)
    ring[low & mask] = bucket & ~(np.int64(1) << j)
    loads[j] = low + t
    ring[(low + t) & mask] |= np.int64(1) << j
    return low


@kernel
def least_loaded_heap(loads, heap, regions):
    """Zero ``loads[:regions]`` and make ``heap`` their heap for :func:`deal_least_loaded` (in index order: every
    key is (0, index))."""
    for j in range(regions):
        loads[j] = 0
        heap[j] = j


@kernel
def _piece(pc, p, cycles, hbm, weight, on_chip, flops, streams, kind):
    pc[PC_CYCLES, p] = cycles
    pc[PC_HBM, p] = hbm
    pc[PC_WEIGHT, p] = weight
    pc[PC_ON_CHIP, p] = on_chip
    pc[PC_FLOPS, p] = flops
    pc[PC_STREAMS, p] = streams
    pc[PC_KIND, p] = kind
    pc[PC_PREFETCHED, p] = 0
    return p + 1


@kernel
def _hidden(pc, n, period, capacity, peak_bytes, peak_flops):
    """:func:`stepsim.serve.projections.stream_ahead` over the ``n`` pieces of ``pc``: the cycles streaming hid
    (the sum of every piece's ``saved``), or -1 when a product would leave int64's exact range.

    A piece's compute floor and the cycles of the bytes it still reads are taken from the piece ``period`` before
    when that piece's FLOPs (bytes) were the same: a model's layers repeat their pieces (``period`` of them a layer),
    and these divisions were most of this function's time."""
    held = 0
    front = 0
    hidden = 0
    limit = EXACT // peak_bytes
    for k in range(n):
        b = pc[PC_PREFETCHED, k]
        held -= b
        cycles = pc[PC_CYCLES, k]
        flops = pc[PC_FLOPS, k]
        if k >= period and flops == pc[PC_FLOPS, k - period]:
            floor = pc[PC_FLOOR, k - period]
        else:
            floor = -(-flops // peak_flops)
        pc[PC_FLOOR, k] = floor
        saved = 0
        if b:
            saved = min(b // peak_bytes, max(0, cycles - floor))
        t = cycles - saved
        hidden += saved
        pc[PC_UNREAD, k] = -1  # no bytes read: never matched
        if pc[PC_STREAMS, k] == 0:
            continue
        unread = max(0, pc[PC_HBM, k] - b)
        if k >= period and unread == pc[PC_UNREAD, k - period]:
            read = pc[PC_READ_CYCLES, k - period]
        else:
            read = -(-unread // peak_bytes)
        pc[PC_UNREAD, k] = unread
        pc[PC_READ_CYCLES, k] = read
        idle = t - read
        if idle >= limit:
            return -1
        budget = min(max(0, idle) * peak_bytes, max(0, capacity - pc[PC_ON_CHIP, k] - held))
        front = max(front, k + 1)
        while budget > 0 and front < n:
            more = 0
            if pc[PC_STREAMS, front]:
                more = min(budget, pc[PC_WEIGHT, front] - pc[PC_PREFETCHED, front])
            pc[PC_PREFETCHED, front] += more
            held += more
            budget -= more
            if budget > 0:
                front += 1
    return hidden


@kernel
def price_mapped(pm, forms, theta, buckets_i, buckets_f, proj, ctx, new, m, tokens, prefix, pool_rows,
                 expert_of_rank, rank_of_expert, starts, row_of_starts, need, res, loads, x, scratch, counts, regions,
                 pc):
    """The cycles of one step (module docstring) into ``res``: :data:`PRICED`; :data:`NEED` (``need`` says what the
    tables lack; nothing else changed); or :data:`UNSUPPORTED` (a number would not be exact)."""
    layers = pm[M_LAYERS]
    heads = pm[M_KV_HEADS]
    shift = pm[M_TILE_SHIFT]
    round_up = (1 << shift) - 1
    hbm_peak = np.float64(pm[M_HBM_PEAK])
    compute_bw = np.float64(pm[M_COMPUTE_BW])
    moe = pm[M_MOE] != 0
    # one pass over the batch: the untiled features (every KV head's are these times the heads, but the decode's
    # busiest region, dealt below over the tiled requests)
    n_dec = 0
    dec_tiles = 0
    dec_longest = 0
    read_tiles = 0
    context_plus = 0
    pre = np.int64(0)
    pre_q = np.int64(0)
    pre_kv = np.int64(0)
    for i in range(m):
        c = ctx[i]
        if c >= EXACT or tokens >= EXACT:
            return UNSUPPORTED
        if new[i] == 1:
            t = (c + 1 + round_up) >> shift
            n_dec += 1
            dec_tiles += t
            dec_longest = max(dec_longest, t)
            read_tiles += -(-(c + 1) // pm[M_READ_TILE]) * pm[M_READ_TILE]
            context_plus += c + 1
        else:
            first = c >> shift
            last = (c + new[i] - 1) >> shift
            pre += 1
            pre_q += last - first + 1
            pre_kv += ((last + 1) * (last + 2) - first * (first + 1)) // 2
    decode_requests = n_dec * heads
    prefill_size = pre_q << shift
    allreduces = pm[M_ALLREDUCES]
    if not _ready(buckets_i, proj, tokens, m, decode_requests, prefill_size, moe, allreduces):
        need[0] = tokens
        need[1] = m
        need[2] = decode_requests
        need[3] = prefill_size
        return NEED
    if pre_kv >= EXACT // max(heads, 1) or dec_tiles >= EXACT // max(heads, 1):
        return UNSUPPORTED
    # decode attention (fast_mapped.decode_regressors), one layer
    dec_cycles = 0
    if n_dec:
        b = log2_bucket(decode_requests)
        r = min(buckets_i[B_DECODE_REGIONS, b], decode_requests)
        if 2 * r > len(loads) or r < 1:
            return UNSUPPORTED
        ring_size = 1 << log2_bucket(dec_longest + 1)  # longer than the largest tiles
        if r <= BIT_REGIONS and BIT_REGIONS + ring_size <= len(loads):
            ring = loads[BIT_REGIONS:BIT_REGIONS + ring_size]
            bits_start(loads, ring, r)
            low = 0
            for h in range(heads):  # np.tile: every head's requests in batch order, dealt to the least loaded
                for i in range(m):
                    if new[i] == 1:
                        low = deal_by_bits(loads, ring, low, (ctx[i] + 1 + round_up) >> shift)
        else:
            heap = loads[r:2 * r]
            least_loaded_heap(loads, heap, r)
            for h in range(heads):
                for i in range(m):
                    if new[i] == 1:
                        deal_least_loaded(loads, heap, r, (ctx[i] + 1 + round_up) >> shift)
        most = 0
        for j in range(r):
            most = max(most, loads[j])
        xd = x[0]
        xd[0] = 1.0
        xd[1] = np.float64(decode_requests)
        xd[2] = np.float64(dec_tiles * heads)
        xd[3] = np.float64(dec_longest)
        hbm = _dot(xd, forms[0], 4, scratch) / hbm_peak
        compute = _dot(xd, forms[1], 4, scratch) / compute_bw
        xd[4] = np.float64(most)
        xd[5] = np.float64((decode_requests + r - 1) // r)
        xd[6] = buckets_f[BF_DECODE_CYCLES, b] * np.float64(most) / np.float64(buckets_i[B_DECODE_REP_LOAD, b])
        xd[7] = hbm
        xd[8] = compute
        xd[9] = compute if compute > hbm else hbm  # Python's max(hbm, compute)
        v = _predict(xd, theta[0], pm[M_THETA_LENGTH], 10, 9, scratch)
        if v < 0.0:
            return UNSUPPORTED
        dec_cycles = np.int64(v)
    # prefill attention (fast_mapped.prefill_regressors): every KV head's chunks in one attention, one layer;
    # query tile j (head by head, request by request) to region j % min(knob, query tiles)
    pre_cycles = 0
    if pre:
        pb = log2_bucket(prefill_size)
        r = min(buckets_i[B_PREFILL_REGIONS, pb], pre_q * heads)
        if r > len(loads) or r < 1:
            return UNSUPPORTED
        for j in range(r):
            loads[j] = 0
        j = 0
        for h in range(heads):
            for i in range(m):
                if new[i] == 1:
                    continue
                for g in range(ctx[i] >> shift, ((ctx[i] + new[i] - 1) >> shift) + 1):
                    loads[j % r] += g + 1
                    j += 1
        most = 0
        cached = 0.0  # 1.0 when a prefill chunk has cached tokens
        for i in range(m):
            if new[i] != 1 and ctx[i] > 0:
                cached = 1.0
        for j in range(r):
            most = max(most, loads[j])
        c = buckets_f[BF_PREFILL_CYCLES, pb]
        by_kv = c * np.float64(pre_kv * heads) / np.float64(buckets_i[B_PREFILL_REP_KV, pb])
        by_region = c * np.float64(most) / np.float64(buckets_i[B_PREFILL_REP_LOAD, pb])
        estimate = by_region if by_region > by_kv else by_kv  # Python's max(by_kv, by_region)
        xp = x[1]
        xp[0] = 1.0
        xp[1] = np.float64(pre_q * heads)
        xp[2] = np.float64(pre_kv * heads)
        xp[3] = np.float64(most)
        xp[4] = cached
        xp[5] = cached * xp[2]
        xp[6] = cached * xp[3]
        xp[7] = cached * estimate
        xp[8] = estimate
        v = _predict(xp, theta[1], pm[M_THETA_LENGTH + 1], PREFILL_COLUMNS, PREFILL_COLUMNS - 1, scratch)
        if v < 0.0:
            return UNSUPPORTED
        pre_cycles = np.int64(v)
    # the FFN (fast_mapped.ffn_regressors), every layer (a dense model: one row for every layer)
    fb = log2_bucket(tokens)
    tile_n = buckets_i[B_FFN_TILE_N, fb]
    n_regions = buckets_i[B_FFN_REGIONS, fb]
    cycles_b = buckets_f[BF_FFN_CYCLES, fb]
    tiles_rep = buckets_f[BF_FFN_TILES, fb]
    regions_rep = buckets_f[BF_FFN_REGIONS, fb]
    top_tokens = np.float64(buckets_i[B_FFN_TOP_TOKENS, fb])
    bottom_tokens = np.float64(buckets_i[B_FFN_BOTTOM_TOKENS, fb])
    top_load = buckets_f[BF_FFN_TOP_LOAD, fb]
    bottom_cycles = buckets_f[BF_FFN_BOTTOM_CYCLES, fb]
    experts = pm[M_EXPERTS]
    per_region = experts // n_regions
    few = pm[M_FEW]
    ffn_row = 3 if pre else 2
    rows = layers if moe else 1
    # on expert-parallel chips (fast_mapped_ep.ep_ffn_regressors) the busiest chip's tiles in column 6 and the
    # chips' columns last; the experts contiguous on the chips, per_chip each; mloads (the attention's, done with)
    # holds the chips' tiles, their received rows and their active experts (_layer_loads)
    ep = pm[M_EP] != 0
    chips = pm[M_CHIPS]
    per_chip = experts // chips
    tile_shift, chip_shift = _log2_exact(tile_n), _log2_exact(per_chip)
    chip_rep = buckets_f[BF_FFN_CHIPS, fb]
    columns = 8 + few + 1 + (3 if ep else 0)
    if ep and 3 * chips > len(loads):
        return UNSUPPORTED
    xf = x[2]
    touched = 0
    traffic_tile_n = buckets_i[B_FFN_TRAFFIC_TILE_N, fb]
    ffn_on_chip = buckets_i[B_FFN_ON_CHIP, fb]
    # the step's pieces (projections.step_pieces), FFN cycles and traffic filled in per layer
    p = 0
    ffn_total = 0
    weights = 0
    ffn_cycles = np.int64(0)  # a dense model's one row stands for every layer: set at layer 0
    ffn_reads = np.int64(0)
    ffn_weights = np.int64(0)
    ffn_flops = np.int64(0)
    if tokens >= EXACT // max(pm[M_ROW_BYTES], 1) or tokens >= EXACT // max(pm[M_FFN_FLOPS], 1):
        return UNSUPPORTED
    # the same for every layer of the step
    by_tokens = _line(np.float64(tokens), bottom_tokens, bottom_cycles, top_tokens, cycles_b)  # bucket_estimate's
    expert_limit = EXACT // max(pm[M_PER_EXPERT], 1)
    shared_tiles = -(-tokens // traffic_tile_n)
    ahead = PREFETCH_LAYERS if moe and _by_prefix(tokens, pool_rows.shape[1], experts) else 0
    for layer in range(min(ahead, layers)):
        _prefetch_window(prefix, starts[row_of_starts, layer], tokens)
    for layer in range(layers):
        if ahead and layer + ahead < layers:
            _prefetch_window(prefix, starts[row_of_starts, layer + ahead], tokens)
        if layer < rows:
            for j in range(columns):
                xf[j] = 0.0
            if moe:
                start = starts[row_of_starts, layer]
                total, active, busiest = _layer_loads(prefix, pool_rows, expert_of_rank[layer],
                                                      rank_of_expert[layer], start, tokens, tile_n, tile_shift,
                                                      per_region, n_regions, ep, chips, per_chip, chip_shift, counts,
                                                      regions, loads, xf, 8 + few + 1)
                region_most = 0
                for j in range(n_regions):
                    region_most = max(region_most, regions[j])
                chip_most = 0
                for j in range(chips):
                    chip_most = max(chip_most, loads[j])
            else:
                start = 0
                total = -(-tokens // tile_n)
                active = 1 if tokens > 0 else 0
                busiest = total
                region_most = total
                chip_most = total
            xf[0] = 1.0
            xf[1] = np.float64(tokens)
            xf[2] = np.float64(total)
            xf[3] = np.float64(active)
            xf[4] = np.float64(busiest)
            xf[5] = np.float64(region_most)
            if ep:  # fast_mapped_ep.ep_loads / ep_load: column 6 the busiest chip's tiles
                column6 = np.float64(chip_most)
                chip_ratio = np.float64(chip_most) / chip_rep
                region_ratio = np.float64(region_most) / regions_rep
                load = chip_ratio if chip_ratio >= region_ratio else region_ratio  # np.maximum
            else:  # column 6 the tile estimate
                column6 = cycles_b * np.float64(total) / tiles_rep
                tile_ratio = np.float64(total) / tiles_rep
                region_ratio = np.float64(region_most) / regions_rep
                load = tile_ratio if tile_ratio >= region_ratio else region_ratio  # np.maximum
            # fast_mapped.bucket_estimate, operation for operation
            by_load = cycles_b * load / top_load
            xf[6] = column6
            xf[7] = by_tokens if by_tokens >= by_load else by_load  # np.maximum
            if column6 != column6 or xf[7] != xf[7]:
                return UNSUPPORTED
            if tokens <= few:
                xf[7 + tokens] = 1.0
            if tokens == 2 and moe:  # pair_parity: experts the two tokens share (a bijection keeps them)
                pool = pool_rows.shape[0]
                a = start % pool
                bb = (start + 1) % pool
                same = 0
                for u in range(pool_rows.shape[1]):
                    for w in range(pool_rows.shape[1]):
                        if pool_rows[a, u] == pool_rows[bb, w]:
                            same += 1
                xf[8 + few] = np.float64(same % 2)
            v = _predict(xf, theta[ffn_row], pm[M_THETA_LENGTH + ffn_row], columns, 7, scratch)
            if v < 0.0:
                return UNSUPPORTED
            ffn_cycles = np.int64(v)
            touched += active
            # projections.ffn_traffic: each touched expert's matrices once per tile of its tokens
            if moe and (total >= expert_limit or active >= expert_limit):
                return UNSUPPORTED
            if ep:
                # projections.ep_block_traffic: the chip with the most expert tiles (the lowest on a tie), its
                # received rows and touched experts (_layer_loads left them in loads[chips:3 * chips]) and shard
                crit = 0
                for j in range(chips):
                    if loads[j] > loads[crit]:
                        crit = j
                crit_active = loads[2 * chips + crit]
                shard = tokens // chips + (1 if crit < tokens % chips else 0)
                ffn_reads = (loads[crit] * pm[M_PER_EXPERT] + -(-shard // traffic_tile_n) * pm[M_SHARED_W]
                             + shard * pm[M_ROW_BYTES])
                ffn_weights = crit_active * pm[M_PER_EXPERT] + (pm[M_SHARED_W] if shard > 0 else 0)
                ffn_flops = loads[chips + crit] * pm[M_EXPERT_ROW_FLOPS] + shard * pm[M_SHARED_ROW_FLOPS]
            elif moe:
                ffn_weights = active * pm[M_PER_EXPERT] + pm[M_SHARED_W]
                ffn_reads = total * pm[M_PER_EXPERT] + shared_tiles * pm[M_SHARED_W]
            else:
                ffn_weights = pm[M_SHARED_W]
                ffn_reads = shared_tiles * pm[M_SHARED_W]
            if not ep:
                ffn_reads += tokens * pm[M_ROW_BYTES]
                ffn_flops = tokens * pm[M_FFN_FLOPS]
        p = _piece(pc, p, proj[PJ_QKV, 0, tokens], proj[PJ_QKV, 1, tokens], pm[M_W_QKV], proj[PJ_QKV, 2, tokens],
                   proj[PJ_QKV, 3, tokens], 1, K_PROJECTION)
        weights += proj[PJ_QKV, 0, tokens]
        if n_dec:
            p = _piece(pc, p, dec_cycles, read_tiles * pm[M_KV_READ], 0,
                       buckets_i[B_DECODE_ON_CHIP, log2_bucket(decode_requests)],
                       pm[M_DECODE_FLOPS] * context_plus, 1, K_ATTENTION)
        if pre:
            p = _piece(pc, p, pre_cycles, 0, 0, 0, 0, 0, K_ATTENTION)
        p = _piece(pc, p, proj[PJ_O, 0, tokens], proj[PJ_O, 1, tokens], pm[M_W_O], proj[PJ_O, 2, tokens],
                   proj[PJ_O, 3, tokens], 1, K_PROJECTION)
        weights += proj[PJ_O, 0, tokens]
        if allreduces:  # HBM idle: the next weights stream in
            p = _piece(pc, p, proj[PJ_ALLREDUCE, 0, tokens], 0, 0, 0, 0, 1, K_COLLECTIVE)
        if moe:
            p = _piece(pc, p, proj[PJ_ROUTER, 0, tokens], proj[PJ_ROUTER, 1, tokens], pm[M_W_ROUTER],
                       proj[PJ_ROUTER, 2, tokens], proj[PJ_ROUTER, 3, tokens], 1, K_PROJECTION)
            weights += proj[PJ_ROUTER, 0, tokens]
        p = _piece(pc, p, ffn_cycles, ffn_reads, ffn_weights, ffn_on_chip, ffn_flops, 1, K_FFN)
        ffn_total += ffn_cycles
        if allreduces == 2:
            p = _piece(pc, p, proj[PJ_ALLREDUCE, 0, tokens], 0, 0, 0, 0, 1, K_COLLECTIVE)
    p = _piece(pc, p, proj[PJ_HEAD, 0, m], proj[PJ_HEAD, 1, m], pm[M_W_HEAD], proj[PJ_HEAD, 2, m],
               proj[PJ_HEAD, 3, m], 1, K_PROJECTION)
    weights += proj[PJ_HEAD, 0, m]
    if read_tiles >= EXACT // max(pm[M_KV_READ], 1) or context_plus >= EXACT // max(pm[M_DECODE_FLOPS], 1):
        return UNSUPPORTED
    hidden = _hidden(pc, p, max(1, (p - 1) // layers), pm[M_CAPACITY], pm[M_HBM_PEAK], pm[M_PEAK_FLOPS])  # head last
    if hidden < 0:
        return UNSUPPORTED
    if tokens >= EXACT // max(pm[M_EMBEDDING_BYTES], 1):
        return UNSUPPORTED
    embedding = -(-(tokens * pm[M_EMBEDDING_BYTES]) // pm[M_CHIPS])  # a chip's share of the rows' bytes
    weights += np.int64(np.ceil(np.float64(embedding) / hbm_peak))
    attention = layers * (dec_cycles + pre_cycles)
    if allreduces:  # counted with the attention (SystemEngineLatency.collective_cycles)
        attention += layers * allreduces * proj[PJ_ALLREDUCE, 0, tokens]
    res[R_ATTENTION] = attention
    res[R_FFN] = ffn_total
    res[R_WEIGHTS] = weights
    res[R_HIDDEN] = hidden
    res[R_TOTAL] = attention + ffn_total + weights - hidden
    res[R_TOUCHED] = touched if moe else 0
    res[R_DECODE_REQUESTS] = decode_requests
    res[R_QUERY_TILES] = pre_q
    return PRICED
