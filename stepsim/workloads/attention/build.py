"""GQA FlashAttention decode with coarse, interleaved and dynamic parallelization (docs/semantics.md §6.3, §5.5).

One KV head is simulated: ``query_per_kv_head`` query rows (8 for Qwen3-30B-A3B) share it. Every request
reads its whole KV cache in tiles of ``tile_n`` rows, appends the new key/value at ``offset`` in its last
tile, writes that tile back, and computes attention in one of two softmax forms:

* ``softmax="plain"`` (default): ``exp(q K^T) V / rowsum(exp(q K^T))``, the artifact's exp-sum form (no
  running max, no 1/sqrt(d) scale). It is the graph the paper's cycle counts come from, so every cycle
  comparison and ``stepsim reproduce`` use it. Its ``exp`` overflows fp32 once a score passes ~88.7.
* ``softmax="stable"``: ``softmax(q K^T / sqrt(d)) V`` as FlashAttention computes it: one fused
  ``MapAccum(OnlineSoftmax)`` keeps a running row max and rescales its running sums whenever the max grows,
  and ``Map(SoftmaxNormalize)`` divides at the end. It replaces the plain form's Exp, P V MapAccum, row-sum
  Accum, RowSum and Div (five compute nodes) by two, so its cycles differ from the artifact's; use it for
  functional runs (``stepsim run attention --functional`` picks it unless ``softmax`` is given).

Neither form masks the rows after the new token in the last KV tile (the artifact does not either); they
take part in the softmax with whatever the cache holds there (see
:func:`stepsim.workloads.reference.gqa_decode_reference`, ``include_tile_padding``). Requests are spread over
``regions`` copies of the per-request subgraph:

* ``"dynamic"``: a feedback loop (EagerMerge over per-region "request fully read" signals) sends each request
  after the first ``regions`` ones to the region that most recently finished reading an earlier request's
  K cache (greedy dispatch); the first ``regions`` requests go round-robin;
* ``"interleave"``: ``Parallelize`` deals requests round-robin (request ``j`` to region ``j % regions``);
* ``"coarse"``: contiguous blocks of 16 requests, one set of loads per region. Block ``j`` goes to region
  ``j % n`` with ``n = min(ceil(B/16), regions)``: B=16 gives 1 region, B=64 gives 4, and B=80 gives 4 with
  region 0 holding requests 0-15 and 64-79 (the artifact's ``run_static_coarse_par_b80`` / batch sweep; for
  B > 128 the artifact's own rule differs and is not reproduced).

The graph is the artifact's operator for operator (``dynamic_parallel.py``, ``static_parallel.py``,
``static_coarse_parallel.py``, ``flashattn.py``), so after Broadcast insertion B=16 gives 208 operators /
295 edges (dynamic) and 194 / 272 (interleave), as the artifact. Differences that do not change any metric:
k and v are loaded from their own tensors (the artifact reads the query tensor), the feedback loop is closed
with a placeholder and ``graph.connect`` (the artifact's MockStreamOp + ``replace_full_input``), and the
metadata fan-out Broadcasts are inserted by stepsim (the artifact creates them by hand).

FIFO depths
-----------
The scripts run with ``channel_depth=1`` and put two overrides in ``config_dict``: 16 for the per-region
metadata Broadcasts (idx x5, seq_len x6, offset x2) and 4 for the Broadcast(1) feeding each KV-cache
write-back store (docs/semantics.md §5.5, §6.3). Neither takes effect in step-perf: a channel is created by
whichever endpoint is built first, and a Broadcast built before its consumers creates its input and output
channels with the plain ``channel_depth``, ignoring ``config_dict`` (docs/timing_model.md §2, "Channels between
operators"). The artifact builds both kinds of Broadcast by hand, before their consumers, so those FIFOs hold
1 element in the published runs. :func:`build_attention` therefore gives them the run's default depth unless
``metadata_fifo_depth`` / ``cache_write_back_channel_depth`` are given (16 / 4 model the intended design).
With the defaults the B=16 runs are within 1 cycle of the artifact's published CSVs; with metadata FIFOs of
16 they take 0-8 % fewer cycles. The write-back stores' ``buffer_depth`` of 4 is kept: it is not serialized,
so step-perf never sees it; it only sizes the stores' on-chip bytes (docs/semantics.md §2.1,
``RandomOffChipStore``), which §8.5's on-chip totals count (2 stores x 4096 B x 4 per region).

Storage types reproduce ``mock_bf16``: q/k/v, the KV caches and the output live in bf16 (2-byte off-chip
traffic and load/store buffers) while the streams carry fp32 tiles (4-byte accumulators and ExpandRef
buffer).

Shared K and V
--------------
With ``shared_kv=True`` one cache holds rows that are both the keys and the values: the per-region V loads, the V
cache's read, append and write-back are gone, and the K path's tiles (the new row appended) feed the ``P V``
product too. It is multi-head latent attention's absorbed decode as serving prices it
(:mod:`stepsim.serve.layer_list`): DeepSeek's score ``q_lat . c_KV + q_pe . k_pe`` is one dot product with the
``kv_lora_rank + qk_rope_head_dim``-wide row ``[c_KV, k_pe]``, and its values are that row's ``c_KV``, so the step
reads the latent cache once, as the real kernel does (FlashMLA), not a key and a value copy of it. The values are
the whole row: the ``qk_rope_head_dim`` output columns past ``c_KV`` (64 of DeepSeek-V3's 576, 11 % of ``P V``'s
FLOPs) are computed and not used; the exact absorbed form is :mod:`stepsim.workloads.mla_attention`.

Symbols and bindings
--------------------
Per region ``i`` the graph has a request count ``R_i`` (static for interleave/coarse; the symbol
``num_req_region{i}`` for dynamic, as the artifact names it) and a ragged KV-tile symbol ``T_i`` (the K-cache
``CacheReadAddrGen`` of the region; it stands for "tiles of one request"). Off-chip traffic of the cache reads
is ``8192 * R_i * T_i`` bytes (K and V; half with ``shared_kv``), which is exact when ``T_i`` is bound to the
*mean* tiles per request of the region, ``tiles_in_region / R_i`` as a sympy Rational. The builder binds them for a region assignment:
round-robin for interleave, contiguous blocks for coarse; dynamic's real assignment comes out of the
simulation (greedy), so its metrics use the round-robin assignment. Off-chip and on-chip totals do not depend
on the assignment (``sum_i R_i*T_i`` is always the batch's tile total), only per-region values do; use
:func:`assignment_bindings` to bind another assignment.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from stepsim.base.errors import ArgumentError
from stepsim.graph import (
    BF16,
    FP32,
    UINT64,
    Accum,
    AccumAdd,
    Broadcast,
    CacheReadAddrGen,
    CacheWriteAddr,
    Div,
    EagerMerge,
    Exp,
    Expand,
    FilterLastTile,
    Flatten,
    Graph,
    LinearOffChipLoad,
    Map,
    MapAccum,
    Matmul,
    MetadataSource,
    OnlineSoftmax,
    Parallelize,
    Partition,
    RandomOffChipLoad,
    RandomOffChipStore,
    Reassemble,
    RowAppend,
    RowSum,
    SelectorSource,
    SetOffset,
    SignalReqAllRead,
    Sink,
    SoftmaxNormalize,
    Stream,
    Tensor,
    Tile,
    Zero,
)
from stepsim.graph.dims import make_symbol, sp
from stepsim.graph.gcpause import gc_paused
from stepsim.workloads.base import Workload
from stepsim.workloads.kinds import WORKLOAD_CHANNEL_DEPTH, WORKLOAD_HARDWARE

STRATEGIES = ("dynamic", "interleave", "coarse")
SOFTMAX_FORMS = ("plain", "stable")
#: §5.5: every compute node (qkt, exp, multv, tile-wise rowsum, intra-tile rowsum, softmax div) runs at 2048
COMPUTE_BW = 2048
#: §5.5: requests per block of the static-coarse strategy
COARSE_BLOCK = 16
#: §5.5: the KV-cache capacity (tokens per request) the experiments allocate for each batch size
SPEC_MAX_N = {16: 4672, 64: 6464, 80: 6528}
#: FIFO depth of the shared key tiles' fan-out (``shared_kv``): each tile waits there as a value while its scores
#: are computed. Measured (8 decode requests of 5-1,500 tokens, a 3-request prefill, 576-wide rows): depth 1
#: serialises the loads with the scores (the prefill's cycles x 1.9), 2 is within 0.4 % of separate K and V loads,
#: 4 and more are equal to it (tests/workloads/test_shared_kv.py)
SHARED_KV_FIFO_DEPTH = 4
#: §5.5: attention experiments run with 1-element FIFOs; their ``config_dict`` overrides (metadata 16, cache
#: write-back 4) are dead in step-perf (docs/timing_model.md §2), so every FIFO of the published runs holds 1 element
CHANNEL_DEPTH = WORKLOAD_CHANNEL_DEPTH["attention"]


def _positive_int(name: str, value) -> int:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
        raise ArgumentError(f"{name} must be a positive int, got {value!r}")
    return int(value)


def _check_lengths(kv_lengths) -> np.ndarray:
    """Validate per-request KV lengths (tokens) and return them as int64."""
    try:
        arr = np.asarray(kv_lengths)
    except (TypeError, ValueError) as exc:  # ragged nested lists and the like
        raise ArgumentError(f"kv_lengths must be a 1-D sequence of non-negative ints: {exc}") from None
    if arr.ndim != 1:
        raise ArgumentError(f"kv_lengths must be 1-D (one KV length per request), got shape {arr.shape}")
    if arr.size == 0:
        raise ArgumentError("kv_lengths is empty: a decode batch needs at least one request")
    if arr.dtype == bool or not (np.issubdtype(arr.dtype, np.integer) or np.issubdtype(arr.dtype, np.floating)):
        raise ArgumentError(f"kv_lengths must hold integers, got dtype {arr.dtype}")
    if np.issubdtype(arr.dtype, np.floating):
        bad = np.flatnonzero(~np.isfinite(arr) | (arr != np.round(arr)))
        if bad.size:
            raise ArgumentError(f"kv_lengths[{bad[0]}] = {arr[bad[0]].item()!r} is not an integer")
    arr = arr.astype(np.int64)
    neg = np.flatnonzero(arr < 0)
    if neg.size:
        raise ArgumentError(f"kv_lengths[{neg[0]}] = {arr[neg[0]]} is negative (KV lengths count tokens)")
    return arr


def kv_metadata(kv_lengths, tile_n: int = 32) -> tuple[np.ndarray, np.ndarray]:
    """Per-request metadata of a decode batch (§5.2).

    Returns ``(seq_len_tiled, offset)``, int64 arrays: ``seq_len_tiled = ceil((x + 1) / tile_n)`` KV tiles
    including the slot of the token being generated, and ``offset = x mod tile_n``, where the new key/value
    goes in the last tile. Raises :class:`ArgumentError` for empty, non-integer or negative lengths.
    """
    tile_n = _positive_int("tile_n", tile_n)
    x = _check_lengths(kv_lengths)
    return (x + tile_n) // tile_n, x % tile_n


def spec_max_n(batch: int) -> int | None:
    """The KV-cache capacity per request (tokens) the paper's experiments use for ``batch`` requests:
    4672 for B=16, 6464 for B=64, 6528 for B=80; None for other batch sizes (§5.5)."""
    return SPEC_MAX_N.get(int(batch))


def _default_max_n(batch: int, seq_len_tiled: np.ndarray, tile_n: int) -> int:
    """The spec's maxN when it exists, is a multiple of ``tile_n`` and holds every request; otherwise the
    smallest capacity that does: ``max(seq_len_tiled) * tile_n``, i.e. max(x)+1 rounded up to ``tile_n``."""
    needed = int(seq_len_tiled.max()) * tile_n
    spec = spec_max_n(batch)
    if spec is not None and spec % tile_n == 0 and spec >= needed:
        return spec
    return needed


def region_assignment(batch: int, strategy: str, regions: int = 4) -> list[np.ndarray]:
    """Request indices of each region, in the order the region processes them.

    ``"interleave"`` and ``"dynamic"``: round-robin (request ``j`` to region ``j % regions``; for dynamic this
    is the assignment used for metrics, the simulated one is greedy). ``"coarse"``: blocks of 16 requests,
    block ``j`` to region ``j % n`` with ``n = min(ceil(batch/16), regions)`` regions.
    """
    batch = _positive_int("batch", batch)
    regions = _positive_int("regions", regions)
    _check_strategy(strategy)
    req = np.arange(batch, dtype=np.int64)
    if strategy == "coarse":
        blocks = -(-batch // COARSE_BLOCK)
        n = min(blocks, regions)
        block_of = req // COARSE_BLOCK
        return [req[block_of % n == r] for r in range(n)]
    return [req[r::regions] for r in range(regions)]


def attention_algorithmic_flops(seq_len_tiled, *, head_dim: int = 64, query_per_kv_head: int = 8,
                                tile_n: int = 32, softmax: str = "plain") -> int:
    """Decode-attention FLOPs over the real KV tiles (padding rows of the last tile included).

    With ``q`` = query_per_kv_head, ``d`` = head_dim, ``n`` = tile_n and ``T = sum(seq_len_tiled)``:

    * plain: per KV tile ``q K^T`` ``2*q*n*d``, ``exp`` ``4*q*n``, ``P V`` ``2*q*n*d``, tile-wise row-sum
      accumulation ``q*n``; per request the intra-tile row sum ``q*n`` and the division ``q*d``. Total
      ``T*(4*q*n*d + 5*q*n) + B*(q*n + q*d)``.
    * stable: per KV tile ``q K^T`` ``2*q*n*d`` and the online-softmax fold ``2*q*n*d + 8*q*n + 2*q*d + 6*q``
      (:class:`~stepsim.graph.OnlineSoftmax`); per request the normalization ``q*d``. Total
      ``T*(4*q*n*d + 8*q*n + 2*q*d + 6*q) + B*q*d``.

    Either equals the graph's FLOP sum under stepsim's FLOP convention.
    """
    s = np.asarray(seq_len_tiled, dtype=np.int64)
    q, d, n = query_per_kv_head, head_dim, tile_n
    if softmax == "stable":
        return int(s.sum()) * (4 * q * n * d + 8 * q * n + 2 * q * d + 6 * q) + len(s) * q * d
    return int(s.sum()) * (4 * q * n * d + 5 * q * n) + len(s) * (q * n + q * d)


def _check_strategy(strategy) -> str:
    if strategy not in STRATEGIES:
        raise ArgumentError(f"strategy must be one of {', '.join(map(repr, STRATEGIES))}; got {strategy!r}")
    return strategy


def region_symbols(workload: Workload) -> list[tuple]:
    """``[(R_i, T_i), ...]`` per region: the region's request-count dimension (an int, or the symbol
    ``num_req_region{i}`` for dynamic) and its ragged KV-tiles-per-request symbol (the K-cache
    CacheReadAddrGen of the region)."""
    out = []
    for i in range(workload.params["regions"]):
        crag = next(op for op in workload.graph.ops
                    if op.kind == "CacheReadAddrGen" and op.group == ("region", i))
        out.append((crag.stream.shape[0], crag.tiles_symbol))
    return out


def assignment_bindings(workload: Workload, assignment, kv_lengths) -> dict:
    """Bindings of ``workload``'s per-region symbols for a region assignment (one sequence of request
    indices per region, e.g. the greedy one a dynamic simulation produced) of the batch ``kv_lengths`` the
    workload was built for.

    ``R_i`` (when symbolic) is bound to the region's request count and ``T_i`` to
    ``Rational(tiles_in_region, R_i)`` (0 for an empty region), so linear totals come out exact.
    """
    seq, _ = kv_metadata(kv_lengths, workload.params["tile_n"])
    if len(seq) != workload.params["batch"]:
        raise ArgumentError(f"kv_lengths has {len(seq)} requests, the workload was built for {workload.params['batch']}")
    syms = region_symbols(workload)
    if len(assignment) != len(syms):
        raise ArgumentError(f"assignment has {len(assignment)} regions, the workload has {len(syms)}")
    seen = np.concatenate([np.asarray(a, dtype=np.int64).ravel() for a in assignment])
    if sorted(seen.tolist()) != list(range(len(seq))):
        raise ArgumentError(f"assignment must place each of the {len(seq)} requests in exactly one region")
    bindings = {}
    for (req_dim, tiles_sym), reqs in zip(syms, assignment):
        reqs = np.asarray(reqs, dtype=np.int64).ravel()
        count = len(reqs)
        if isinstance(req_dim, sp.Symbol):
            bindings[req_dim] = count
        elif req_dim != count:
            raise ArgumentError(f"region with a static {req_dim} requests cannot be assigned {count}")
        tiles = int(seq[reqs].sum())
        bindings[tiles_sym] = sp.Rational(tiles, count) if count else sp.Integer(0)
    return bindings


@gc_paused  # see stepsim.graph.gcpause: collections made large builds superlinear
def build_attention(kv_lengths, strategy: str = "dynamic", *, head_dim: int = 64, query_per_kv_head: int = 8,
                    tile_n: int = 32, max_n: int | None = None, regions: int = 4, compute_bw: int = COMPUTE_BW,
                    metadata_fifo_depth: int | None = None, cache_write_back_fifo_depth: int = 4,
                    cache_write_back_channel_depth: int | None = None, softmax: str = "plain",
                    shared_kv: bool = False) -> Workload:
    """Build the decode attention of one KV head for a batch of requests.

    Parameters
    ----------
    kv_lengths : array-like of int, length B
        Current KV-cache length (tokens) of each request (a ``b16``/``b64``/``b80`` trace window).
    strategy : {"dynamic", "interleave", "coarse"}
        How requests are spread over the parallel regions (see the module docstring).
    head_dim, query_per_kv_head : int
        Head dimension D (64) and query heads sharing the KV head (8); the query tile is
        ``(query_per_kv_head, head_dim)``.
    tile_n : int
        KV-cache rows per tile (32).
    max_n : int, optional
        KV-cache capacity per request in tokens (rows reserved per request in the ``[B*max_n, D]`` caches;
        the address stride is ``max_n / tile_n`` tiles). Default: :func:`spec_max_n` (4672 / 6464 / 6528 for
        B = 16 / 64 / 80) when it holds every request, else ``max(seq_len_tiled) * tile_n`` (max length + 1
        rounded up to ``tile_n``). Must be a multiple of ``tile_n`` holding every request.
    regions : int
        Parallel regions (4). Coarse uses ``min(ceil(B/16), regions)``; interleave needs ``B % regions == 0``.
    compute_bw : int
        FLOPs/cycle of the six compute nodes (2048); the helper maps and SignalReqAllRead use 0.
    metadata_fifo_depth : int, optional
        FIFO depth of the per-region metadata broadcasts. Default None: the run's default channel depth (1),
        which is what step-perf simulates for the artifact; the artifact asks for 16 in ``config_dict``, but a
        Broadcast built before its consumers ignores ``config_dict`` (docs/timing_model.md §2). Give 16 to model the
        intended design (0-8 % fewer cycles than the published runs).
    cache_write_back_fifo_depth : int
        The KV-cache write-back stores' ``buffer_depth`` (4): their on-chip bytes, as in §8.5. A metric only.
    cache_write_back_channel_depth : int, optional
        FIFO depth of the channel feeding each write-back store. Default None: the run's default (1), what
        step-perf simulates, for the same reason as the metadata FIFOs; the artifact's intended depth is 4
        (``cache_write_back_fifo_depth``). No measured run changes by a cycle between 1 and 4.
    softmax : {"plain", "stable"}
        ``"plain"``: the artifact's ``exp`` / row-sum form (its cycles); ``"stable"``: FlashAttention's running
        max with rescaling and the 1/sqrt(head_dim) scale (see the module docstring).
    shared_kv : bool
        One cache whose rows are both the keys and the values (module docstring, "Shared K and V"): multi-head
        latent attention's absorbed decode, whose ``head_dim``-wide row is the latent and the rope key. Off by
        default: a GQA head's K and V caches.

    Returns
    -------
    Workload
        name ``"attention"``, ``channel_depth`` 1, hardware ``"step-eval"``, bindings for the round-robin
        (interleave, dynamic) or block (coarse) assignment, and the algorithmic FLOPs of
        :func:`attention_algorithmic_flops`.
    """
    _check_strategy(strategy)
    if softmax not in SOFTMAX_FORMS:
        raise ArgumentError(f"softmax must be one of {', '.join(map(repr, SOFTMAX_FORMS))}; got {softmax!r}")
    head_dim = _positive_int("head_dim", head_dim)
    q_rows = _positive_int("query_per_kv_head", query_per_kv_head)
    tile_n = _positive_int("tile_n", tile_n)
    regions = _positive_int("regions", regions)
    if metadata_fifo_depth is not None:
        metadata_fifo_depth = _positive_int("metadata_fifo_depth", metadata_fifo_depth)
    cache_write_back_fifo_depth = _positive_int("cache_write_back_fifo_depth", cache_write_back_fifo_depth)
    if cache_write_back_channel_depth is not None:
        cache_write_back_channel_depth = _positive_int("cache_write_back_channel_depth",
                                                       cache_write_back_channel_depth)
    compute_bw = _positive_int("compute_bw", compute_bw)
    kv = _check_lengths(kv_lengths)
    seq_len_tiled, offset = kv_metadata(kv, tile_n)
    batch = len(kv)
    if max_n is None:
        max_n = _default_max_n(batch, seq_len_tiled, tile_n)
    max_n = _positive_int("max_n", max_n)
    if max_n % tile_n:
        raise ArgumentError(f"max_n must be a multiple of tile_n={tile_n}, got {max_n}")
    if int(seq_len_tiled.max()) * tile_n > max_n:
        j = int(np.argmax(seq_len_tiled))
        raise ArgumentError(f"max_n={max_n} cannot hold request {j} (KV length {kv[j]}, {seq_len_tiled[j]} tiles "
                            f"of {tile_n}); give max_n >= {int(seq_len_tiled[j]) * tile_n}")
    if strategy == "interleave" and batch % regions:
        raise ArgumentError(f"strategy 'interleave' deals requests round-robin in equal shares: batch {batch} is "
                            f"not divisible by regions={regions} (use 'dynamic' or 'coarse')")
    row_offset = max_n // tile_n

    g = Graph(f"attention-{strategy}-b{batch}")
    cfg = dict(head_dim=head_dim, q_rows=q_rows, tile_n=tile_n, row_offset=row_offset, compute_bw=compute_bw,
               wb_depth=cache_write_back_fifo_depth, wb_channel_depth=cache_write_back_channel_depth,
               softmax=softmax, shared_kv=bool(shared_kv))
    assignment, distributors, _ = attention_stage(g, seq_len_tiled, offset, strategy, regions, max_n,
                                                  metadata_fifo_depth, cfg)
    g.finalize()
    # fan-out broadcasts of a region's metadata belong to that region
    dist = {id(op) for op in distributors}
    for op in g.ops:
        if op.kind == "Broadcast" and op.group is None and id(op.inputs[0].op) in dist:
            op.group = ("region", op.inputs[0].index)

    workload = Workload(
        name="attention", graph=g, channel_depth=CHANNEL_DEPTH, hardware=WORKLOAD_HARDWARE["attention"],
        algorithmic_flops=attention_algorithmic_flops(seq_len_tiled, head_dim=head_dim, query_per_kv_head=q_rows,
                                                      tile_n=tile_n, softmax=softmax),
        params=dict(strategy=strategy, batch=batch, head_dim=head_dim, query_per_kv_head=q_rows, tile_n=tile_n,
                    max_n=max_n, cache_row_offset_tiled=row_offset, regions=len(assignment),
                    compute_bw=compute_bw, metadata_fifo_depth=metadata_fifo_depth,
                    cache_write_back_fifo_depth=cache_write_back_fifo_depth,
                    cache_write_back_channel_depth=cache_write_back_channel_depth, softmax=softmax,
                    channel_depth=CHANNEL_DEPTH, par_dispatch=1, kv_tiles=int(seq_len_tiled.sum())),
        trace={"kv_lengths": kv},  # _check_lengths' own int64 copy
    )
    if shared_kv:  # said only when set: a GQA head's params stay as they were
        workload.params["shared_kv"] = True
    kv.flags.writeable = False
    workload.bindings = assignment_bindings(workload, assignment, kv)
    workload.idle_groups = {("region", r) for r, reqs in enumerate(assignment) if len(reqs) == 0}
    if strategy == "dynamic":  # the dispatcher assigns requests during the run; `assignment` is nominal
        workload.balanced_units = [region_units(g.ops, len(assignment))]
    return workload


def attention_stage(g: Graph, seq_len_tiled, offset, strategy: str, regions: int, max_n: int,
                    metadata_fifo_depth, cfg: dict, *, prefix: str = "", collect: list | None = None,
                    qkv: tuple | None = None):
    """One KV head's decode attention as operators of ``g`` (the body of :func:`build_attention`).

    Tensors are named with ``prefix`` (``h2_k_cache`` for head 2 of a layer). With ``collect`` (a list) each
    region's result stream (``[requests of the region]`` of ``(query_per_kv_head, head_dim)`` tiles) is
    appended to it instead of being stored to ``<prefix>out``, so a caller can stream the output onward. With
    ``qkv`` (three streams of the loads' shapes and tiles: ``(q_rows, head_dim)``, ``(1, head_dim)`` twice, one per
    request; not with the coarse strategy) the new token's q, k and v come from them instead of HBM (a decoder
    stack computes them from its input rows, :mod:`stepsim.workloads.decoder.pipeline`).

    Returns ``(assignment, distributors, control)``: the region assignment, the operators whose outputs carry
    each region's metadata, and the dynamic dispatcher's one-hot region per request (None for static
    strategies).
    """
    stage_control = []
    batch = len(seq_len_tiled)
    head_dim, q_rows = cfg["head_dim"], cfg["q_rows"]
    shared = cfg.get("shared_kv", False)
    if shared and qkv is not None:
        raise ArgumentError("shared_kv reads one cache of keys and values; a decoder stack's q, k and v streams "
                            "are of a GQA head")
    k_cache = Tensor(f"{prefix}k_cache", (batch * max_n, head_dim), BF16)
    v_cache = None if shared else Tensor(f"{prefix}v_cache", (batch * max_n, head_dim), BF16)
    out = Tensor(f"{prefix}out", (batch * q_rows, head_dim), BF16)
    caches = (k_cache, v_cache, out)
    assignment = region_assignment(batch, strategy, regions)
    idx = np.arange(batch, dtype=np.int64)
    cfg = dict(cfg, collect=collect)

    distributors = []  # ops whose output i carries region i's metadata (their fan-out broadcasts join region i)
    if strategy == "coarse":
        k_loads = []
        for r, reqs in enumerate(assignment):
            before = len(g.ops)
            n = len(reqs)
            tensors = [(Tensor(f"{prefix}{x}_region{r}", (n * rows, head_dim), BF16), rows)
                       for x, rows in (("q", q_rows), ("k", 1), ("v", 1))[:2 if shared else 3]]
            q, k, *v = [Flatten(g, LinearOffChipLoad(g, t, (rows, head_dim), (n, 1), (1, 1), stream_dtype=FP32), 1, 2)
                        for t, rows in tensors]
            meta = []
            for values in (idx[reqs], seq_len_tiled[reqs], offset[reqs]):
                m = Flatten(g, MetadataSource(g, values), 0, 1)
                m.fanout_depth = metadata_fifo_depth
                meta.append(m)
            _label(g.ops[before:], r)
            k_loads.append(_flash_region(g, r, q, k, v[0] if v else None, *meta, caches, cfg))
    else:
        loads = qkv if qkv is not None else [
            LinearOffChipLoad(g, Tensor(f"{prefix}{x}", (batch * rows, head_dim), BF16), (rows, head_dim),
                              (batch, 1), (1, 1), stream_dtype=FP32)
            for x, rows in (("q", q_rows), ("k", 1), ("v", 1))[:2 if shared else 3]]
        meta_src = [MetadataSource(g, values) for values in (idx, seq_len_tiled, offset)]
        if strategy == "interleave":
            qkv = [Parallelize(g, Flatten(g, x, 1, 2), 1, regions) for x in loads]
            meta = [Parallelize(g, Flatten(g, m, 0, 1), 0, regions) for m in meta_src]
        else:
            control, signals = _dynamic_dispatch(g, batch, regions)
            stage_control.append(control)
            req_dims = [make_symbol(f"num_req_region{i}") for i in range(regions)]
            qkv = [Partition(g, x, control, 1, regions) for x in loads]
            meta = [Partition(g, m, control, 0, regions) for m in meta_src]
            for part in qkv + meta:
                for i, dim in enumerate(req_dims):
                    part.assume_shape(i, (dim,) + part.outputs[i].shape[1:])
        for m in meta:
            m.fanout_depth = metadata_fifo_depth
        distributors = meta
        k_loads = [_flash_region(g, r, qkv[0][r], qkv[1][r], None if shared else qkv[2][r], meta[0][r], meta[1][r],
                                 meta[2][r], caches, cfg) for r in range(regions)]
        if strategy == "dynamic":
            # one "request fully read" token per request and region closes the dispatch loop
            for r, (kl, ph) in enumerate(zip(k_loads, signals)):
                before = len(g.ops)
                sig = Accum(g, kl, SignalReqAllRead(), Zero(1, 1, UINT64), 1, compute_bw=0,
                            out_dtype=Tile(UINT64, 1, 1))
                _label(g.ops[before:], r)
                g.connect(ph, sig)

    return assignment, distributors, (stage_control[0] if stage_control else None)


def region_units(ops, regions: int, offset: int = 0) -> tuple:
    """Names of the operators of each region ``offset + r`` among ``ops``, one tuple per region
    (``Workload.balanced_units``)."""
    return tuple(tuple(op.name for op in ops if op.group == ("region", offset + r)) for r in range(regions))


def _label(ops, region: int) -> None:
    for op in ops:
        op.group = ("region", region)


def _dynamic_dispatch(g: Graph, batch: int, regions: int):
    """The greedy dispatcher (§6.3 step 2). Returns (control [1,B]: one-hot region per request, one
    placeholder per region for its "request fully read" signal stream, to be connected by the caller)."""
    first = min(batch, regions)  # requests dispatched round-robin before any feedback
    address = Tile(UINT64, 1, 1)
    signals = [g.placeholder(Stream(address, (make_symbol(f"num_req_region{i}"),))) for i in range(regions)]
    merge = EagerMerge(g, signals, 0)
    Sink(g, merge[0])
    merge.assume_shape(1, (batch,))
    # keep the completion order of the first B - first signals, drop the last `first`
    keep = np.eye(2, dtype=np.int8)[np.r_[np.ones(batch - first, np.int64), np.zeros(first, np.int64)]]
    drop_last = Partition(g, merge[1], Flatten(g, SelectorSource(g, keep, 2), 0, 1), 0, 2)
    drop_last.assume_shape(0, (first,))
    drop_last.assume_shape(1, (batch - first,))
    Sink(g, drop_last[0])
    initial = Flatten(g, SelectorSource(g, np.eye(regions, dtype=np.int8)[:first], regions), 0, 1)
    pick = np.eye(2, dtype=np.int8)[np.r_[np.zeros(first, np.int64), np.ones(batch - first, np.int64)]]
    raw = Reassemble(g, [initial, drop_last[1]], SelectorSource(g, pick, 2), 0)
    raw.assume_shape(0, (1, batch, 1))  # exactly one selector per request
    return Flatten(g, raw, 0, 1), signals


def _flash_region(g: Graph, r: int, q, k, v, idx, seq_len, offset, caches, cfg):
    """One region's FlashAttention decode subgraph (artifact ``build_flashattn_graph``); returns its K-cache
    load (the stream the dynamic dispatcher watches). ``q``: [R, 1] of (q_rows, D); ``k``/``v``: [R, 1] of
    (1, D) (``v`` None with ``shared_kv``); metadata [R] of u64."""
    before = len(g.ops)
    k_cache, v_cache, out = caches
    tile_n, d, row_offset = cfg["tile_n"], cfg["head_dim"], cfg["row_offset"]
    bw = cfg["compute_bw"]

    def kv_path(cache: Tensor, new_row, tiles_shape):
        addr = CacheReadAddrGen(g, idx, seq_len, row_offset)
        if tiles_shape is not None:  # V reads the same number of tiles as K (the artifact's shape overwrite)
            addr.assume_shape(0, tiles_shape)
        tiles = RandomOffChipLoad(g, addr, cache, (tile_n, d), stream_dtype=FP32)
        shape = tiles.stream.shape
        requests, per_request = shape
        last = FilterLastTile(g, seq_len)
        last.assume_shape(0, shape)
        split = Partition(g, tiles, last, 0, 2)
        split.assume_shape(0, (requests,))  # one last tile per request
        split.assume_shape(1, (requests * (per_request - 1),))
        appended_raw = Map(g, [Map(g, [split[0], offset], SetOffset(), compute_bw=0), Flatten(g, new_row, 0, 1)],
                           RowAppend(), compute_bw=0)
        appended = Broadcast(g, appended_raw, 2)
        merged = Reassemble(g, [appended[0], split[1]], last, 0)
        merged.assume_shape(0, shape + (1,))  # one tile per selector
        full = Flatten(g, merged, 0, 1)
        waddr = Map(g, [idx, seq_len], CacheWriteAddr(row_offset), compute_bw=0)
        wdata = Broadcast(g, appended[1], 1, channel_depth=cfg["wb_channel_depth"])
        Sink(g, RandomOffChipStore(g, wdata, waddr, cache, (tile_n, d), buffer_depth=cfg["wb_depth"]))
        return tiles, full

    k_tiles, keys = kv_path(k_cache, k, None)
    if v_cache is None:  # shared_kv: the key tiles are the values too (module docstring)
        values = keys
        keys.fanout_depth = SHARED_KV_FIFO_DEPTH
    else:
        _, values = kv_path(v_cache, v, k_tiles.stream.shape)
    q_rep = Expand(g, q, keys, 1)
    scores = Map(g, [q_rep, keys], Matmul(weight_transposed=True), compute_bw=bw)
    if cfg["softmax"] == "stable":
        state = MapAccum(g, scores, values, OnlineSoftmax(d), Zero(cfg["q_rows"], d + 2), 1, compute_bw=bw)
        result = Map(g, state, SoftmaxNormalize(), compute_bw=bw, write_back_mu=True)
    else:
        probs = Map(g, scores, Exp(), compute_bw=bw)
        pv = MapAccum(g, probs, values, Matmul(), Zero(cfg["q_rows"], d), 1, compute_bw=bw)
        row_tiles = Accum(g, probs, AccumAdd(), Zero(cfg["q_rows"], tile_n), 1, compute_bw=bw)
        denom = Map(g, row_tiles, RowSum(), compute_bw=bw)
        result = Map(g, [pv, denom], Div(), compute_bw=bw, write_back_mu=True)
    if cfg.get("collect") is not None:  # a decoder layer streams the result on (attention_stage)
        cfg["collect"].append(result)
    else:
        Sink(g, RandomOffChipStore(g, result, idx, out, (cfg["q_rows"], d)))
    _label(g.ops[before:], r)
    return k_tiles


def from_config(cfg: Mapping) -> Workload:
    """The attention workload of a normalized run config (:func:`stepsim.workloads.config.normalize_config`)."""
    from stepsim.trace_io.load import load_kv_lengths
    from stepsim.workloads.config import apply_channel_depth, compute_bw_kwargs, resolved_trace

    kv = load_kv_lengths(resolved_trace(cfg), cfg["batch_id"])
    kw = compute_bw_kwargs(cfg)  # build_attention fixes the experiment's depth: the knob's overrides it after
    if cfg.get("regions") is not None:  # parallel regions (builder default 4); set by stepsim optimize's space
        kw["regions"] = cfg["regions"]
    return apply_channel_depth(build_attention(kv, cfg["strategy"], softmax=cfg["softmax"], **kw), cfg)
