"""``--fidelity fast`` on mapped layers (``--schedule auto``, docs/serving.md §10.7): the regressors of the pieces
:mod:`stepsim.mapping` maps, computed with the schedule the mapper chose for the piece's shape bucket.

With ``schedule="auto"`` the exact provider builds each FFN and decode attention with the schedule mapped at its
bucket (the next power of two of its tokens or requests, :func:`stepsim.mapping.mapper.bucket`): the tile sizes,
lanes and regions, and so the cycles a tile costs, change from one bucket to the next. The fast model therefore
knows each piece's bucket and computes its features with that bucket's schedule:

* ``ffn`` (``[layers, FFN_COLUMNS]``): ``[1, tokens, expert tiles at the bucket's tile_n, active experts, the
  busiest expert's tiles, the busiest region's tiles (the bucket's time-multiplexed regions: contiguous experts,
  as the builder groups them), the tile estimate, the estimate]``, then :func:`stepsim.serve.fast.few_tokens` and
  the two-token :func:`~stepsim.serve.fast.pair_parity`. The *tile estimate* is the mapper's own cycles for the
  bucket (the mean over its representative routings, :attr:`stepsim.mapping.Schedule.cycles`) scaled by the
  piece's expert tiles against theirs. The *estimate* (:func:`bucket_estimate`) is the larger of the bucket's line
  in tokens through two simulated points, its top (``b`` tokens: the mapper's cycles) and its bottom (``b / 2 + 1``
  tokens under the bucket's schedule, simulated once and stored, :mod:`stepsim.serve.ffn_points`), and its top scaled by the
  piece's load, ``max(tiles / tiles_rep, region tiles / region tiles_rep)`` against the representative's. The top
  scaled alone (until 2026-11-26) priced a piece near the bucket's bottom by its share of the top, but the weight
  reads of the touched experts and the graph's fill do not shrink with the tokens: tests/plan/test_plan.py's
  one-chip calibration, held-out step p95 / max 7.81 / 15.52 % with it (its 73-token FFN pieces at 6,418 cycles
  were estimated at 8,179 and fitted to 5,439), 1.66 / 1.86 % now. The estimates carry the bucket into one pooled
  fit: per-bucket offsets and slopes were tried and left out (a held-out step of a bucket no fitted step had was
  priced by the pooled part alone: on the tests' 16-expert model a 40-token FFN at 953 cycles for 4,724, held-out
  p95 25 %; with the estimate alone 1.95 %). Without coefficients (the first calibration pass) a piece is priced at
  its estimate. No metric forms: their bounds assume one tiling for every shape.
* ``decode`` (``[10]``): the KV heads' caches as requests of one attention (as the exact provider builds it),
  ``[1, requests, KV tiles, the longest's tiles, the busiest of the bucket's regions when the requests are dealt
  greedily, requests per region, the estimate]`` (the mapper's cycles for the bucket scaled by the busiest region's
  load against its representative requests'), then the HBM bound, compute bound and their maximum from the
  piece's metric forms (a mapped decode attention's metrics are linear in the same features as the paper's,
  :func:`stepsim.serve.fast.metric_forms` checks it).
* ``prefill``: the KV heads' chunks as requests of one attention (as the exact provider builds it), ``[1, query
  tiles, KV tiles, the busiest region's KV tiles, c, c x KV tiles, c x the busiest region's, c x the estimate, the
  estimate]`` (``c`` 1 when a chunk has cached tokens, else 0) with the bucket's regions as the builder deals them (:func:`prefill_regressors`),
  priced once for every KV head.

The same functions make a calibration sample's regressors and a step's (:class:`MappedFastLatency`), so they are
equal float for float.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np

from stepsim.kernels.serve_fast import attention_features
from stepsim.serve.fast import (
    _TILE_SHIFT,
    BOUND_COMPUTE_BW,
    FEW_TOKENS,
    FastLatency,
    few_tokens,
    layer_counts,
    pair_parity,
    predict,
    predict_rows,
)
from stepsim.serve.latency import IterationBatch, IterationCost
from stepsim.serve.layers import KV_TILE, MAPPED_KINDS, LayerSpec

#: the FFN's structural columns (the estimate last), as many as the paper's: :func:`stepsim.serve.fast.span` and
#: :func:`stepsim.serve.fast.bound_column` read the same places
FFN_STRUCTURAL = 8
#: the mapped FFN's regressors: structural, few_tokens(), pair_parity()
FFN_COLUMNS = FFN_STRUCTURAL + FEW_TOKENS + 1


_MEMO: dict = {}


def _memo(key: tuple, make):
    value = _MEMO.get(key)
    if value is None:
        value = _MEMO[key] = make()
    return value


def schedule_of(kind: str, size: int, spec: LayerSpec):
    """The :class:`~stepsim.mapping.Schedule` a ``kind`` piece of ``size`` is built with (its bucket's), memoised
    per bucket (the mapper's own memo hashes its key on every call)."""
    from stepsim.mapping import schedule_for
    from stepsim.mapping.mapper import bucket
    from stepsim.serve.layers import piece_dims

    b = bucket(size)
    return _memo(("schedule", kind, b, repr(spec.model), spec.hardware),
                 lambda: schedule_for(kind, b, piece_dims(kind, spec.model), spec.hardware))


class Point(NamedTuple):
    """An FFN bucket's layer at one token count: its tokens, mean load (:func:`bucket_estimate`) and mean cycles
    over the mapper's representative routings of that many tokens."""

    tokens: int
    load: float
    cycles: float


def _line(x: np.ndarray, x0: float, y0: float, x1: float, y1: float) -> np.ndarray:
    """The line through ``(x0, y0)`` and ``(x1, y1)`` at ``x``, at least 0 (through the origin and ``(x1, y1)`` when
    ``x1 <= x0``)."""  # serve_mapped._line is this, operation for operation
    if x1 - x0 <= 1e-9:
        return y1 * x / x1
    return np.maximum(y0 + (y1 - y0) * (x - x0) / (x1 - x0), 0.0)


def bucket_estimate(tokens: int, load: np.ndarray, bottom: Point, top: Point) -> np.ndarray:
    """Cycles of FFN layers of ``tokens`` tokens and ``load`` (the piece's against the bucket's representative
    routings): the larger of the bucket's line in tokens through its two simulated points (what does not shrink with
    the load: the weight reads of the touched experts, the graph's fill, every token's rows) and its top scaled by
    the load (``top.cycles x load / top.load``: the tiles' weight reads of an HBM-bound layer). With ``bottom`` =
    ``top`` (a bucket of one or two token counts) the line goes through the origin.

    Why this form, held-out step p95 / max of four calibrations (tests/serve/test_fast_mapped.py's tiny one-chip
    model; tests/plan/test_plan.py's one-chip shape; the small MoE on ``ring-2``,
    tests/serve/test_serve_system_mapped_ep.py; the tiny DeepSeek-V3 on ``ring-2`` served on
    tests/plan/test_plan_layer_list.py's trace), the last two with the loads not fitted
    (:meth:`stepsim.serve.fast_mapped_ep.MappedEPFastLatency.fitted_columns`):

    ============================================================  ===========  ===========  ===========  ===========
    estimate                                                       tiny         plan         EP small     DS tiny
    ============================================================  ===========  ===========  ===========  ===========
    the top scaled by load (until 2026-11-26)                      4.00 / 7.92  7.81 / 15.5  13.6 / 16.4  9.65 / 14.0
    the larger of the lines in tokens and in load (two points)     8.29 / 15.7  1.97 / 2.12  2.29 / 2.70  5.86 / 6.00
    the line in tokens scaled by load over the representative's   5.22 / 6.93  3.17 / 5.14  2.67 / 2.71  6.41 / 6.90
    the same, scaled up only                                       4.33 / 6.52  1.90 / 2.05  2.29 / 2.74  5.92 / 6.09
    the larger of the line in tokens and the top scaled (this)     4.48 / 6.26  1.66 / 1.86  2.30 / 2.63  5.59 / 5.79
    ============================================================  ===========  ===========  ===========  ===========

    (the EP cases' first row with the loads fitted, as they were until then; every EP row measured while an exact
    expert-parallel piece took knobs searched at its own token count: since it takes its bucket's, as the two
    points are priced, this form's EP small is 1.60 / 1.74, :func:`stepsim.mapping.expert_parallel.ep_schedule`).
    A line in load through the two points
    is steep where their loads nearly agree (the tiny model's bucket 8: 1.019 and 1.038; its 5-token pieces +73 %).
    """
    by_tokens = _line(np.full(len(load), float(tokens)), bottom.tokens, bottom.cycles, top.tokens, top.cycles)
    return np.maximum(by_tokens, top.cycles * load / top.load)


def simulated_point(tokens: int, spec: LayerSpec, loads) -> Point:
    """The FFN layer of ``spec`` at ``tokens`` tokens under its bucket's schedule, on the mapper's representative
    routings of that many tokens (:func:`stepsim.mapping.kinds.ffn.ffn_samples` of them): their mean ``loads(routing)``
    (the caller's load of one ``[tokens, top_k]`` routing) and mean engine cycles (a fresh build, as the exact
    provider runs the bucket; stored in the mapping cache, :mod:`stepsim.serve.ffn_points`)."""
    from stepsim.mapping import kinds
    from stepsim.serve.ffn_points import point_cycles

    dims = spec.ffn_model
    routings = [kinds.ffn.ffn_routing(tokens, dims, s) for s in range(kinds.ffn.ffn_samples(tokens))]
    return Point(tokens, float(np.mean([loads(r) for r in routings])),
                 float(np.mean(point_cycles(tokens, dims, spec.hardware, spec.system))))


class Reference(NamedTuple):
    """What an FFN bucket's regressors need (:func:`ffn_reference`)."""

    bottom: Point  # b / 2 + 1 tokens (the top itself when b <= 2)
    top: Point  # b tokens: the mapper's cycles
    tiles_rep: float  # the representative routings' mean expert tiles
    regions_rep: float  # and mean busiest region's tiles
    knobs: dict  # the bucket's schedule's


def ffn_reference(size: int, spec: LayerSpec) -> Reference:
    """The FFN bucket of ``size`` tokens (module docstring): the mapper's cycles at its top, the layer simulated at
    its bottom, the representative routings' mean tiles and busiest region's tiles at the schedule's ``tile_n``
    and regions, and the schedule's knobs. Memoised a process."""
    from stepsim.mapping import kinds
    from stepsim.mapping.mapper import bucket

    b = bucket(size)

    def make():
        schedule = schedule_of("ffn", b, spec)
        dims = kinds.layer_dims("ffn", spec.model)
        knobs = dict(schedule.knobs)
        routings = [kinds.ffn.ffn_routing(b, dims, s) for s in range(kinds.ffn.ffn_samples(b))]
        loads = np.array([_ffn_loads(r[:, None, :], dims.experts, knobs)[0, :2] for r in routings])
        tiles, regions = loads.mean(axis=0)

        def load(routing) -> float:
            x = _ffn_loads(routing[:, None, :], dims.experts, knobs)[0]
            return float(max(x[0] / tiles, x[1] / regions))
        top = Point(b, float(np.mean([load(r) for r in routings])), float(schedule.cycles))
        bottom = simulated_point(b // 2 + 1, spec, load) if b > 2 else top
        return Reference(bottom, top, float(tiles), float(regions), knobs)
    return _memo(("ffn", b, repr(spec.model), spec.hardware), make)


def _ffn_loads(routing: np.ndarray, experts: int, knobs: dict) -> np.ndarray:
    """``[layers, 4]``: expert tiles at ``tile_n``, the busiest region's tiles, active experts, the busiest expert's
    tiles (``routing`` ``[tokens, layers, top_k]``)."""
    counts = layer_counts(routing, experts)
    tiles = -(-counts // knobs["tile_n"])
    regions = knobs["regions"] if experts > 1 else 1
    region_tiles = tiles.reshape(len(tiles), regions, experts // regions).sum(axis=2)
    return np.column_stack([tiles.sum(axis=1), region_tiles.max(axis=1), (counts > 0).sum(axis=1),
                            tiles.max(axis=1)]).astype(np.float64)


def ffn_regressors(routing: np.ndarray, spec: LayerSpec) -> np.ndarray:
    """The mapped FFN's regressors of every layer (module docstring): ``routing`` ``[tokens, layers, top_k]`` ->
    ``[layers, FFN_COLUMNS]`` (a dense FFN: one expert, ``[tokens, 1, 1]`` zeros)."""
    tokens, layers, _ = routing.shape
    ref = ffn_reference(tokens, spec)
    experts = spec.ffn_model.experts
    loads = _ffn_loads(routing, experts, ref.knobs)
    tile_estimate = ref.top.cycles * loads[:, 0] / ref.tiles_rep
    estimate = bucket_estimate(tokens, np.maximum(loads[:, 0] / ref.tiles_rep, loads[:, 1] / ref.regions_rep),
                               ref.bottom, ref.top)
    out = np.zeros((layers, FFN_COLUMNS))
    out[:, 0] = 1.0
    out[:, 1] = tokens
    out[:, 2], out[:, 3], out[:, 4], out[:, 5] = loads[:, 0], loads[:, 2], loads[:, 3], loads[:, 1]
    out[:, 6], out[:, 7] = tile_estimate, estimate
    out[:, FFN_STRUCTURAL:FFN_STRUCTURAL + FEW_TOKENS] = few_tokens(tokens, layers)
    if spec.model.is_moe:
        out[:, FFN_STRUCTURAL + FEW_TOKENS] = pair_parity(routing)
    return out


def decode_regressors(kv: np.ndarray, form, spec: LayerSpec) -> np.ndarray:
    """The mapped decode attention's regressors (module docstring) of KV lengths ``kv`` (every KV head's requests,
    as :meth:`stepsim.serve.exact.EngineLatency.tasks` makes them)."""
    from stepsim.mapping.kinds.decode import DECODE_KV_LENGTH
    from stepsim.mapping.mapper import bucket

    kv = np.ascontiguousarray(kv, dtype=np.int64)
    regions = min(schedule_of("decode", len(kv), spec).knobs["regions"], len(kv))
    decode, prefill = np.zeros(5, dtype=np.int64), np.zeros(3, dtype=np.int64)
    attention_features(kv, np.ones(len(kv), dtype=np.int64), _TILE_SHIFT, np.empty(regions, dtype=np.int64), decode,
                       prefill)
    x = np.array([1.0, *decode[:3].tolist()])
    hbm = float((x * np.array(form.off_chip)).sum()) / spec.hardware.hbm_peak_bytes_per_cycle
    compute = float((x * np.array(form.flops)).sum()) / BOUND_COMPUTE_BW
    schedule = schedule_of("decode", len(kv), spec)
    b = bucket(len(kv))  # the mapper's representative requests: DECODE_KV_LENGTH tokens each, dealt evenly
    rep_load = -(-(DECODE_KV_LENGTH + 1) // KV_TILE) * -(-b // min(schedule.knobs["regions"], b))
    return np.array([*x.tolist(), *decode[3:].tolist(), schedule.cycles * float(decode[3]) / rep_load, hbm, compute,
                     max(hbm, compute)])


def prefill_reference(size: int, spec: LayerSpec) -> tuple[float, int, int, int]:
    """``(cycles, regions knob, busiest region's KV tiles, KV tiles)`` of the prefill bucket of ``size`` (query
    positions one KV head computes, :func:`stepsim.mapping.kinds.prefill.prefill_size`): the mapper's cycles on its
    representative data (every KV head one prompt of the bucket's tokens, nothing cached), that data's busiest region
    load as the builder deals it (:func:`prefill_load`) and its KV tiles read over every head."""
    from stepsim.mapping.kinds.prefill import prefill_data
    from stepsim.mapping.mapper import bucket
    from stepsim.workloads.prefill_attention.build import query_tiles

    b = bucket(size)

    def make():
        schedule = schedule_of("prefill", b, spec)
        knob = int(schedule.knobs["regions"])
        _, group = query_tiles(*prefill_data(b, {"kv_heads": spec.model.kv_heads}), KV_TILE)
        return float(schedule.cycles), knob, prefill_load(group, knob), int((group + 1).sum())
    return _memo(("prefill", b, repr(spec.model), spec.hardware), make)


def prefill_load(group: np.ndarray, knob: int) -> int:
    """KV tiles the busiest region reads when query tile ``j`` (position tile ``group[j]``, reading KV tiles
    ``0 .. group[j]``) goes to region ``j % regions``, ``regions = min(knob, query tiles)``
    (:func:`stepsim.mapping.kinds.prefill.prefill_regions`, as the builder deals them)."""
    regions = min(knob, len(group))
    loads = np.zeros(regions, dtype=np.int64)
    np.add.at(loads, np.arange(len(group)) % regions, np.asarray(group, dtype=np.int64) + 1)
    return int(loads.max())


def prefill_regressors(cached, chunk, spec: LayerSpec) -> np.ndarray:
    """The mapped prefill attention's regressors of ``(cached, chunk)`` (every KV head's requests, as the exact
    provider builds them): ``[1, query tiles, KV tiles, the busiest region's KV tiles, c, c x KV tiles, c x the
    busiest region's, c x the estimate, the estimate]`` with ``c`` 1 when a chunk has cached tokens, else 0
    (:data:`stepsim.kernels.serve_mapped.PREFILL_COLUMNS`). The estimate is the bucket's mapper cycles scaled by
    the larger of two ratios to its representative data's (:func:`prefill_reference`): every region's KV tiles
    (many regions share the HBM) and the busiest region's (few regions: each reads its tiles in turn); the first
    calibration pass prices a piece at it.

    Why these: a region reads its KV tiles in turn at about 1,130-1,180 cycles each, so the busiest region's tiles
    carry the cost, and which region gets which tiles follows the builder's dealing (``min(knob, query tiles)``
    regions, query tile ``j`` to region ``j % regions``, :func:`prefill_load`). Until 2026-11-26 the builder took
    ``gcd(knob, query tiles)`` regions (a 1,028-token prompt of the 4-layer Qwen3 shape ran on 4 of its bucket's 128
    regions, 654,057 cycles a layer where 1,024 tokens took 51,127). The paper regressors (requests, tiles and their
    metric forms' bounds) cannot see the regions: with them fast priced that prompt at 88,486 cycles and TTFT p99
    came out -66.9 % against exact; with the estimate alone as a column the held-out prefill pieces of requests
    200-399 erred by 13-43 %, with these by at most 2.9 % (docs/serving.md §10.8; measured on the gcd dealing).

    Why ``c``: a chunk after cached tokens (a long prompt's second chunk) is another regime. Nothing cached, the
    busiest region's tiles and the KV tiles grow together, and a fit of those pieces alone put its weight on the
    busiest region; with a cache every region reads many more tiles and the HBM's random K / V reads bound the
    layer (18-26 cycles a KV tile where the busiest region's 1,160 a tile would give less). On the 4-layer Qwen3
    shape (4 KV heads, sn40l) 2,035 new tokens after 2,048 cached take 531,226 cycles where that fit said 360,363
    (-32 %), 1,000 after 2,048 257,344 against 142,813 (-45 %); the uniform calibration sample of requests 200-399 had
    no cached chunk. Its own columns give a cached chunk its own offset and slopes, fitted on the steps
    :class:`stepsim.serve.fast.Reservoir` samples by their cached context, and leave the rest's fit as it was."""
    from stepsim.workloads.prefill_attention.build import query_tiles

    _, group = query_tiles(np.asarray(cached), np.asarray(chunk), KV_TILE)
    cycles, knob, rep_load, rep_kv = prefill_reference(KV_TILE * len(group) // spec.model.kv_heads, spec)
    kv, load = int((group + 1).sum()), prefill_load(group, knob)
    by_kv, by_region = cycles * float(kv) / float(rep_kv), cycles * float(load) / float(rep_load)
    estimate = max(by_kv, by_region)
    c = 1.0 if (np.asarray(cached) > 0).any() else 0.0
    return np.array([1.0, float(len(group)), float(kv), float(load), c, c * kv, c * load, c * estimate, estimate])


def regressors(kind: str, data, form, spec: LayerSpec) -> np.ndarray:
    """The regressors of a mapped piece (``kind`` ``decode``, ``prefill`` or ``ffn``), as
    :func:`stepsim.serve.fast.regressors` gives a paper-schedule piece's (``form``: the decode attention's metric
    form; None for the other kinds, which have none)."""
    if kind == "ffn":
        return ffn_regressors(np.asarray(data)[:, None, :], spec)[0]
    if kind == "prefill":
        return prefill_regressors(data[0], data[1], spec)
    return decode_regressors(data, form, spec)


class MappedFastLatency(FastLatency):
    """:class:`~stepsim.serve.fast.FastLatency` on mapped layers (``schedule="auto"``): the decode attention and
    FFN regressors of :func:`decode_regressors` and :func:`ffn_regressors`, and the decode and prefill attention
    priced once for every KV head (they run side by side, as the exact provider prices them)."""

    cached_prefill_samples = True  # prefill_regressors' cached-chunk columns need such samples

    def piece_regressors(self, kind: str, data) -> np.ndarray:
        if kind == "ffn":
            return self.ffn_regressors(np.asarray(data)[:, None, :])[0]
        if kind in MAPPED_KINDS:
            return regressors(kind, data, self.forms.get(kind), self.spec)
        return super().piece_regressors(kind, data)

    def ffn_regressors(self, routing: np.ndarray) -> np.ndarray:
        """The FFN regressors of every layer of ``routing`` (``[tokens, layers, top_k]`` expert ids) ->
        ``[layers, columns]``: :func:`ffn_regressors` of the bucket's schedule (a subclass whose FFN is another
        block, the expert-parallel chips', gives its own: :class:`stepsim.serve.fast_mapped_ep.MappedEPFastLatency`)."""
        return ffn_regressors(routing, self.spec)

    def attention_regressors(self, batch: IterationBatch) -> tuple[np.ndarray | None, np.ndarray | None]:
        context = np.fromiter(batch.context_tokens, dtype=np.int64, count=len(batch.new_tokens))
        new = np.fromiter(batch.new_tokens, dtype=np.int64, count=len(batch.new_tokens))
        decode = None
        if (new == 1).any():
            decode = decode_regressors(np.tile(context[new == 1], self.spec.model.kv_heads), self.forms["decode"],
                                       self.spec)
        prefill = None
        if (new != 1).any():  # every KV head's chunks in one attention (module docstring)
            heads = self.spec.model.kv_heads
            prefill = prefill_regressors(np.tile(context[new != 1], heads), np.tile(new[new != 1], heads), self.spec)
        return decode, prefill

    def ffn_rows(self, tokens: int):
        if self.model.is_moe:
            _, make_rows = self.routing.window(tokens, KV_TILE)
            rows = functools.cache(make_rows)

            def tasks() -> list:
                routing = rows()
                return [("ffn", np.ascontiguousarray(routing[:, layer, :])) for layer in range(self.model.layers)]
            return self.ffn_regressors(rows()), tasks

        def dense() -> list:
            return [("ffn", np.zeros((tokens, 1), dtype=np.int64))]
        return self.ffn_regressors(np.zeros((tokens, 1, 1), dtype=np.int64)), dense

    def __call__(self, batch: IterationBatch) -> IterationCost:
        from stepsim.serve.fast import model_of

        tokens = batch.prefill_tokens + batch.decode_tokens
        decode, prefill = self.attention_regressors(batch)
        x, ffn_tasks = self.ffn_rows(tokens)
        prefill_step = prefill is not None
        self.layer_use.note(batch)
        if self.recorder is not None:
            self.recorder(batch, prefill_step, lambda: self.tasks(batch, ffn_tasks()))
        theta = self.theta or {}
        layers = self.model.layers
        if self.streams_weights:
            return self._streamed(batch, decode, prefill, x, ffn_tasks, prefill_step, theta)
        attention = 0
        if decode is not None:  # every KV head in one mapped attention, once a layer
            attention += layers * predict(decode, theta.get("decode"), "decode")
        if prefill is not None:  # every KV head in one mapped attention too
            attention += layers * predict(prefill, theta.get("prefill"), "prefill")
        count = 1 if self.model.is_moe else layers
        cycles = {"attention": attention + self.collective_cycles(batch),
                  "ffn": int(count * predict_rows(x, theta.get(model_of("ffn", prefill_step)), "ffn").sum()),
                  "weights": self.weight_cycles(batch)}
        touched = int(x[:, 3].sum()) if self.model.is_moe else 0
        return self._floored(batch, cycles, sum(cycles.values()), touched)

    def _streamed(self, batch: IterationBatch, decode, prefill, x: np.ndarray, ffn_tasks, prefill_step: bool,
                  theta: dict) -> IterationCost:
        """The step priced as the exact provider prices a mapped one-chip step: its pieces, each layer's attention and
        FFN predicted, the projections, routers and LM head on the engine, the weights streamed ahead
        (:mod:`stepsim.serve.projections`). ``ffn_tasks``: the layers' routings (:meth:`ffn_rows`)."""
        from stepsim.mapping import schedule_for
        from stepsim.serve.fast import model_of
        from stepsim.serve.layers import piece_dims
        from stepsim.serve.projections import step_pieces

        decoded = None
        if decode is not None:
            context = np.fromiter(batch.context_tokens, dtype=np.int64, count=len(batch.new_tokens))
            new = np.fromiter(batch.new_tokens, dtype=np.int64, count=len(batch.new_tokens))
            requests = int((new == 1).sum()) * self.spec.model.kv_heads  # the heads of the layer one chip runs
            on_chip = schedule_for("decode", requests, piece_dims("decode", self.spec.model),
                                   self.hardware).on_chip_bytes
            decoded = (int(predict(decode, theta.get("decode"), "decode")), context[new == 1], on_chip)
        prefilled = None
        if prefill is not None:
            prefilled = int(predict(prefill, theta.get("prefill"), "prefill"))  # every KV head in one attention
        ffn_cycles = predict_rows(x, theta.get(model_of("ffn", prefill_step)), "ffn")
        ffn = self.ffn_entries(batch.prefill_tokens + batch.decode_tokens, x, ffn_cycles, ffn_tasks)
        pieces = step_pieces(self, batch, decoded, prefilled, ffn)
        weights, hidden = self.streamed_weight_cycles(batch, pieces)
        cycles = {"attention": sum(p.cycles for p in pieces if p.kind == "attention") + self.collective_cycles(batch),
                  "ffn": sum(p.cycles for p in pieces if p.kind == "ffn"), "weights": weights, "hidden": hidden}
        touched = int(x[:, 3].sum()) if self.model.is_moe else 0
        return self._floored(batch, cycles, cycles["attention"] + cycles["ffn"] + weights - hidden, touched)

    def ffn_entries(self, tokens: int, x: np.ndarray, ffn_cycles: np.ndarray, ffn_tasks) -> list:
        """The ``ffn`` entries :func:`stepsim.serve.projections.step_pieces` takes: per layer ``(cycles, expert tiles,
        active experts)`` from the regressors ``x`` (an expert-parallel block's are its busiest chip's traffic:
        :class:`stepsim.serve.fast_mapped_ep.MappedEPFastLatency`)."""
        return [(int(c), int(x[i, 2]), int(x[i, 3])) for i, c in enumerate(ffn_cycles)]

    def describe(self) -> dict:
        return {**super().describe(), "schedule": self.spec.schedule}
