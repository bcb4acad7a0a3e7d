"""``--fidelity fast``: per-layer latencies from a model calibrated on exact simulations of the same run
(docs/serving.md §10).

**Features.** Each layer piece (:mod:`stepsim.serve.layers`: decode attention, prefill attention, FFN) is
described by the quantities its graph's symbolic metrics and stepsim's cycle bounds are made of, computed in
closed form from the step's data in microseconds:

* decode: requests, KV tiles ``sum(ceil((x + 1) / 32))``, the longest request's tiles, and the largest load of
  the graph's 4 regions when the requests are dealt greedily (its dynamic dispatcher), requests per region;
* prefill: requests, query tiles, KV tiles read (``sum(g + 1)`` over query tiles ``g``);
* ffn: tokens, expert tiles ``sum(ceil(c_e / 32))`` over the per-expert token counts ``c_e`` (every tile reads
  its expert's weights), active experts, the busiest expert's tiles;

and by two bounds from the workload's exact symbolic metrics: ``off_chip_bytes / hbm_peak_bytes_per_cycle``
(the HBM bound) and ``flops / compute_bw`` (the compute bound of a node running every FLOP). Those metrics are
linear in the features above; :func:`metric_forms` finds the coefficients from builds of the piece and
refuses them unless they reproduce every build's ``Workload.metrics()`` exactly. The regressors are
``[1, features, HBM bound, compute bound, max(HBM bound, compute bound)]``, for the FFN followed by one indicator
per token count 1..:data:`FEW_TOKENS` (:func:`few_tokens`) and, from the step's routing rows, whether two tokens
share an odd number of experts (:func:`pair_parity`); a model with shared experts also has their tiles
(:func:`shared_tiles`, a feature of the metrics too), and one of at most :data:`FEW_EXPERTS` experts on one chip the
rounds by busy experts (:func:`expert_rounds`).

**Per step** the provider computes these in machine code (:mod:`stepsim.kernels.serve_fast`): the attention
features in one pass over the batch, the FFN features of every layer from a routing window
(:meth:`stepsim.serve.routing.SyntheticRouting.window`), so a step costs tens of microseconds whatever its
token count; the numbers are :func:`regressors`' float for float (``tests/serve/test_fast_path.py``).

**Calibration** (:func:`calibrated`, :func:`calibrate`), in two passes. The bounds are far from the engine's
cycles (the compute bound runs every FLOP on one node), so a replay priced by them serves a different run:
slower steps, fuller batches. The first pass replays the run priced by ``max(HBM bound, compute bound)``, keeps
seeded reservoirs of :data:`FIRST_PASS_ITERATIONS` steps per stratum and fits them all. The second replays it
priced by that fit, so its steps look like the final run's, and keeps reservoirs of :data:`SAMPLED_ITERATIONS`
steps (their batches and routing) with a prefill chunk and as many decode-only ones. Of those, :data:`HELD_OUT`
(half from each) are simulated exactly, every layer, and held out; from the others each step's decode and
prefill attention and :data:`FFN_LAYERS` of its FFN layers are simulated exactly and fitted per piece by least
squares on relative error (the FFN pieces of steps with a prefill chunk get their own coefficients when both
kinds of step give at least twice as many samples as regressors and each spans what both do, :func:`span`). The summary's ``fidelity.error`` is the held-out steps' relative error of the whole
step's cycles (p50, p95, max); a run with no held-out step is refused. The calibration (coefficients and
error) is cached under a key that hashes everything that determines it
(:mod:`stepsim.serve.calibration_cache`).

**Mapped layers** (``schedule="auto"``): the decode attention's and the FFN's regressors are computed with the
schedule the mapper chose for the piece's bucket (:mod:`stepsim.serve.fast_mapped`, :func:`forms_of`).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from stepsim.base.errors import ConfigError
from stepsim.kernels.serve_fast import attention_features
from stepsim.serve.exact import EngineLatency
from stepsim.serve.exact_lstsq import numeric_rank, solve
from stepsim.serve.latency import IterationBatch, IterationCost
from stepsim.serve.layers import KINDS, KV_TILE, LayerSpec, build
from stepsim.workloads.prefill_attention.build import query_tiles

#: steps kept by the pilot's reservoir, per stratum (steps with a prefill chunk; decode-only steps)
SAMPLED_ITERATIONS = 30
#: steps kept per stratum by the first pass (priced by the bound), all fitted (module docstring)
FIRST_PASS_ITERATIONS = 10
#: decode-only steps kept per batch-size bucket and fitted besides (:class:`Reservoir`)
BUCKET_ITERATIONS = 3
#: of those, steps simulated exactly (every layer) and held out to measure the error (half per stratum)
HELD_OUT = 12
#: FFN layers simulated per calibration step (the first ones of the model)
FFN_LAYERS = 4
#: FLOPs/cycle of the compute bound (one node running every FLOP at the attention's rate)
BOUND_COMPUTE_BW = 2048
#: bump when the model or the calibration changes: part of the cache key (3: :func:`pair_parity`; 4: the shared
#: experts' tiles, :func:`expert_rounds`; 5: mapped layers, :mod:`stepsim.serve.fast_mapped`)
CALIBRATION_VERSION = 5
#: parallel regions of the decode attention graph (build_attention's default)
DECODE_REGIONS = 4
#: the FFN regressors' column of the experts a layer's tokens touch (:func:`ffn_regressors`)
ACTIVE_EXPERTS = 3
#: the coefficient sets of the model: FFN pieces of steps with a prefill chunk have their own
MODELS = ("decode", "prefill", "ffn", "ffn_prefill")
#: log2 of KV_TILE (the kernels' tiles)
_TILE_SHIFT = KV_TILE.bit_length() - 1
#: regressors of an FFN piece; with fewer than twice as many samples on either side of the split, both sides
#: share one fit
FFN_REGRESSORS = 8
#: token counts up to which an FFN piece gets an offset of its own (:func:`few_tokens`)
FEW_TOKENS = 8
#: models with at most this many routed experts get a column per count of busy experts (:func:`expert_rounds`)
FEW_EXPERTS = 16


def model_of(kind: str, prefill_step: bool) -> str:
    """Which coefficients price a piece: its kind; the FFN of a step with a prefill chunk ``ffn_prefill``."""
    return "ffn_prefill" if kind == "ffn" and prefill_step else kind


# ----------------------------------------------------------------------------------------------- features
def features(kind: str, data, shared: bool = False, chips: int = 1) -> np.ndarray:
    """The structural features of one piece its symbolic metrics are linear in (module docstring), float64;
    ``shared``: the FFN of a model with shared experts also has their tiles (:func:`shared_tiles`, over
    ``chips`` chips' shards)."""
    if kind == "decode":
        tiles = (np.asarray(data) + 1 + KV_TILE - 1) // KV_TILE
        return np.array([len(tiles), tiles.sum(), tiles.max()], dtype=np.float64)
    if kind == "prefill":
        _, group = query_tiles(np.asarray(data[0]), np.asarray(data[1]), KV_TILE)
        return np.array([len(data[0]), len(group), (group + 1).sum()], dtype=np.float64)
    routing = np.asarray(data)
    counts = np.bincount(routing.ravel(), minlength=1)
    tiles = (counts + KV_TILE - 1) // KV_TILE
    f = [len(routing), tiles.sum(), (counts > 0).sum(), tiles.max()]
    return np.array([*f, shared_tiles(len(routing), chips)] if shared else f, dtype=np.float64)


def shared_tiles(tokens: int, chips: int = 1) -> int:
    """Tiles of a model's shared experts in an FFN piece of ``tokens`` tokens: ``ceil(tokens / 32)``. Every token
    visits them, so they read their weights and compute once per tile of the step's tokens: their metrics are
    linear in this, not in the routed experts' features (DeepSeek-MoE's two shared experts).
    On a system of ``chips`` chips (expert parallelism) each chip runs them on its shard of the tokens
    (:func:`stepsim.workloads.moe.sharded.shard_bounds`): the chips' tiles added."""
    if chips > 1:
        base, extra = divmod(tokens, chips)
        return extra * -(-(base + 1) // KV_TILE) + (chips - extra) * -(-base // KV_TILE)
    return -(-tokens // KV_TILE)


def system_chips(spec: LayerSpec) -> int:
    """The chips an FFN piece of ``spec`` is sharded over: the system's, 1 on one chip."""
    return spec.system.chips if spec.system is not None else 1


def has_shared(spec: LayerSpec) -> bool:
    """Whether the FFN pieces of ``spec`` have shared experts (a :func:`shared_tiles` feature)."""
    return spec.model.is_moe and spec.ffn_model.shared_intermediate > 0


def extra_features(kind: str, data) -> np.ndarray:
    """Features beyond the metrics' basis: decode: the largest region load when the requests' KV tiles are
    dealt greedily (each to the least-loaded of the graph's 4 regions, as its dynamic dispatcher does), and
    the requests per region rounded up; none for the other pieces."""
    if kind != "decode":
        return np.zeros(0)
    tiles = ((np.asarray(data) + 1 + KV_TILE - 1) // KV_TILE).tolist()
    loads = [0] * DECODE_REGIONS
    for t in tiles:
        loads[loads.index(min(loads))] += t
    return np.array([max(loads), -(-len(tiles) // DECODE_REGIONS)], dtype=np.float64)


def _metric_samples(kind: str, spec: LayerSpec) -> list:
    rng = np.random.default_rng(7)
    if kind == "decode":
        return [rng.integers(0, 2000, b) for b in (1, 2, 3, 5, 8, 13)]
    if kind == "prefill":
        return [(rng.integers(0, 400, r), rng.integers(2, 300, r)) for r in (1, 1, 2, 2, 3, 4)]
    m = spec.ffn_model
    # uniform routings only: no expert gets a second tile, so the forms cannot tell an expert's tiles from the
    # expert (nor the busiest expert's tiles from the constant) and split them; exact on such pieces, the bounds
    # of a long step are not its metrics (a 2,048-token step's are 0.61x on the Qwen3 shape, 0.53x on Mixtral's).
    # Only the pilot is priced by them (the fit's columns span the same directions); two skewed samples fixed
    # that but moved Qwen3's pilot sample, and its held-out p95, by chance (docs/serving.md §10.6)
    return [np.stack([rng.choice(m.experts, m.top_k, replace=False) for _ in range(t)]) for t in (1, 3, 7, 20, 40, 65)]


@dataclass(frozen=True)
class MetricForm:
    """``off_chip_bytes`` and ``flops`` of a piece as exact linear forms over ``[1, features]``."""

    off_chip: tuple
    flops: tuple


def metric_forms(kind: str, spec: LayerSpec) -> MetricForm:
    """Coefficients of the piece's symbolic metrics over its features, from builds; refused unless exact."""
    samples = _metric_samples(kind, spec)
    a = np.array([[1.0, *features(kind, d, kind == "ffn" and has_shared(spec), system_chips(spec))] for d in samples])
    metrics = [build(kind, d, spec).metrics() for d in samples]
    y = np.array([[m["off_chip_bytes"], m["graph_flops"]] for m in metrics], dtype=np.float64)
    coef = np.column_stack([solve(a, y[:, 0]), solve(a, y[:, 1])])
    coef = np.round(coef * 64) / 64  # the metrics are integer combinations (bytes per tile, FLOPs per tile)
    if not np.array_equal(a @ coef, y):
        raise ConfigError(f"serving layer {kind!r}: its metrics are not linear in {kind} features (stepsim bug)")
    return MetricForm(tuple(coef[:, 0].tolist()), tuple(coef[:, 1].tolist()))


def forms_of(spec: LayerSpec) -> dict:
    """The metric forms of ``spec``'s pieces (:func:`metric_forms`): every kind's on the paper's schedules; on mapped
    layers (``schedule="auto"``) the decode attention's only (the FFN's and the prefill attention's regressors are
    the mapper's bucket estimates and the regions' loads, :mod:`stepsim.serve.fast_mapped`, no metric forms)."""
    kinds = ("decode",) if spec.schedule == "auto" else KINDS
    return {kind: metric_forms(kind, spec) for kind in kinds}


def regressors(kind: str, data, form: MetricForm, spec: LayerSpec) -> np.ndarray:
    """``[1, features, extra features, HBM bound, compute bound, max of both]`` of one piece (the last is the
    pilot's estimate); a mapped piece's (``schedule="auto"``) are :func:`stepsim.serve.fast_mapped.regressors`
    (:meth:`FastLatency.piece_regressors` chooses)."""
    if kind == "ffn":
        return ffn_regressors(np.asarray(data)[:, None, :], form, spec)[0]
    f = np.array([1.0, *features(kind, data)])
    hbm = float((f * np.array(form.off_chip)).sum()) / spec.hardware.hbm_peak_bytes_per_cycle
    compute = float((f * np.array(form.flops)).sum()) / BOUND_COMPUTE_BW
    return np.array([*f, *extra_features(kind, data), hbm, compute, max(hbm, compute)])


def ffn_regressors(routing: np.ndarray, form: MetricForm, spec: LayerSpec) -> np.ndarray:
    """The FFN regressors of every layer at once: ``routing`` ``[tokens, layers, top_k]`` -> ``[layers, 8 +
    FEW_TOKENS + 1]`` (the structural eight, :func:`few_tokens`, :func:`pair_parity`; then, where the model and
    system have them, :func:`shared_tiles`, :func:`expert_rounds` and a system's chip columns)
    (the same numbers :func:`regressors` gives layer by layer)."""
    tokens, layers, _ = routing.shape
    experts = spec.ffn_model.experts
    shared = has_shared(spec)
    counts = layer_counts(routing, experts)
    tiles = (counts + KV_TILE - 1) // KV_TILE
    f = np.column_stack([np.ones(layers), np.full(layers, float(tokens)), tiles.sum(axis=1), (counts > 0).sum(axis=1),
                         tiles.max(axis=1)]).astype(np.float64)
    basis = np.column_stack([f, np.full(layers, float(shared_tiles(tokens, system_chips(spec))))]) if shared else f
    hbm = (basis * np.array(form.off_chip)).sum(axis=1) / spec.hardware.hbm_peak_bytes_per_cycle
    compute = (basis * np.array(form.flops)).sum(axis=1) / BOUND_COMPUTE_BW
    out = np.column_stack([f, hbm, compute, np.maximum(hbm, compute), few_tokens(tokens, layers),
                           pair_parity(routing) if spec.model.is_moe else np.zeros(layers)])
    if shared:  # after the pair column, so every other column keeps its place
        out = np.column_stack([out, basis[:, 5]])
    if few_experts(spec):
        out = np.column_stack([out, expert_rounds(routing, experts)])
    if spec.system is not None:
        out = np.column_stack([out, chip_features(routing, spec.system.chips, experts)])
    return out


def chip_features(routing: np.ndarray, chips: int, experts: int) -> np.ndarray:
    """The FFN's per-chip regressors on a system, ``routing`` ``[tokens, layers, top_k]`` -> ``[layers, 3]``:
    whether any (token, expert) row crosses a link, how many do (each crosses twice: dispatch and combine), and
    the busiest chip's rows (its experts' share of the step), for the sharded block of
    :class:`stepsim.serve.system.SystemEngineLatency` (experts contiguous, tokens in ``shard_bounds``). A step
    whose rows all stay home skips two link latencies (on ring-2, 2 x 500 cycles a layer), which the one-chip
    features cannot tell."""
    from stepsim.workloads.moe.parallel import place_experts
    from stepsim.workloads.moe.sharded import shard_bounds

    tokens = routing.shape[0]
    chip_of = np.array(place_experts([0] * experts, chips, "contiguous"), dtype=np.int64)
    home = np.repeat(np.arange(chips), np.diff(shard_bounds(tokens, chips)))
    dest = chip_of[routing]
    remote = (dest != home[:, None, None]).sum(axis=(0, 2))
    busiest = np.stack([(dest == c).sum(axis=(0, 2)) for c in range(chips)]).max(axis=0)
    return np.column_stack([remote > 0, remote, busiest]).astype(np.float64)


def layer_counts(routing: np.ndarray, experts: int) -> np.ndarray:
    """Tokens per expert in every layer: ``routing`` ``[tokens, layers, top_k]`` -> ``[layers, experts]`` (int64),
    one bincount over the layers' ids offset apart."""
    layers = routing.shape[1]
    offsets = (np.arange(layers, dtype=np.int64) * experts)[None, :, None]
    return np.bincount((routing + offsets).ravel(), minlength=layers * experts).reshape(layers, experts)


def few_experts(spec: LayerSpec) -> bool:
    """Whether the FFN pieces of ``spec`` get :func:`expert_rounds`: an MoE model of at most :data:`FEW_EXPERTS`
    routed experts on one chip (a system's sharded block splits the experts over chips, whose rounds these columns
    do not count: on ring-2 they moved the tests' 16-expert model's held-out max from 1.01 to 1.38 %)."""
    return spec.model.is_moe and spec.ffn_model.experts <= FEW_EXPERTS and spec.system is None


def expert_rounds(routing: np.ndarray, experts: int) -> np.ndarray:
    """The FFN's regressors of a model with few experts (at most :data:`FEW_EXPERTS`), ``routing`` ``[tokens,
    layers, top_k]`` -> ``[layers, experts]``: column ``a - 1`` counts the rounds in which ``a`` experts have a
    tile, when every active expert computes one tile a round (with the experts' tiles sorted, ``t_1 >= t_2 >=
    ..``, it is ``t_a - t_(a+1)``; the columns sum to the busiest expert's tiles and, weighted by ``a``, to the
    expert tiles; a decode step whose experts have one tile each has a 1 at its active experts).

    Why: with few experts the MoE block's cycles follow how many experts are busy at once, not monotonically.
    On the Mixtral-8x7B shape (8 experts, top-2) 16 tokens on 4, 5, 6, 7, 8 experts (one tile each) take
    1,860,253 / 2,338,371 / 1,860,259 / 1,860,266 / 6,052,500 cycles: a decode step of 8 sequences has 7 or 8
    active experts by chance, a factor 3. Over 60 synthetic layers of 64-1,023 tokens a fit on tokens and these
    columns errs by 1.8 % rms (4.3 % at most), about 2.0 M cycles a round with up to 7 experts busy and 5.4 M
    with all 8, against 6.5 % (18.8 %) on the tokens, tiles and busiest tiles alone: with the same tiles, the
    layers whose least-loaded expert has more tiles are slower (tests/serve/test_fast_accuracy_models.py pins
    such cycles). With many experts (Qwen3's 128, DeepSeek-MoE's 64) these columns are not made."""
    layers = routing.shape[1]
    tiles = -np.sort(-((layer_counts(routing, experts) + KV_TILE - 1) // KV_TILE), axis=1)
    return (tiles - np.column_stack([tiles[:, 1:], np.zeros(layers, dtype=np.int64)])).astype(np.float64)


def few_tokens(tokens: int, rows: int) -> np.ndarray:
    """The FFN's indicator regressors ``[rows, FEW_TOKENS]``: column ``t - 1`` is 1 when the piece has ``t``
    tokens. Over a handful of tokens the MoE block's cycles do not follow its features (on the Qwen3 shape one
    token takes 150,316 cycles, two 88-112 thousand: the graph's tiles are padded differently), so each small
    token count gets an offset of its own; a count no sample had keeps 0 (the linear part alone)."""
    out = np.zeros((rows, FEW_TOKENS))
    if tokens <= FEW_TOKENS:
        out[:, tokens - 1] = 1.0
    return out


def pair_parity(routing: np.ndarray) -> np.ndarray:
    """The FFN's two-token regressor ``[layers]``: 1 when a two-token piece's tokens share an odd number of
    experts, else 0 (``routing`` ``[tokens, layers, top_k]``; 0 for any other token count).

    Why: over two tokens the MoE block's cycles follow neither the active experts nor their ids but the experts the
    two tokens share, and by parity. 184 two-token pieces of the Qwen3 shape routed by the synthetic law, by shared
    experts 0 / 1 / 2 / 3 / 4: 109,227 / 139,940 / 96,246 / 122,265 / 87,205 cycles on average, 3-9 % apart within
    a group; shifting every expert id, or giving the second token other unshared experts, leaves a piece's cycles
    unchanged (docs/serving.md §10.1). Fitted on the active experts alone these pieces err by 15.7 % (rms), 7.2 %
    with this column. Over 3 or more tokens no count of shared experts (by multiplicity, with or without parity)
    explained the cycles (124 pieces each of 3 and 4 tokens)."""
    if routing.shape[0] != 2:
        return np.zeros(routing.shape[1])
    first, second = routing[0], routing[1]  # [layers, top_k] each; a token's experts are distinct
    shared = (first[:, :, None] == second[:, None, :]).sum(axis=(1, 2))
    return (shared % 2).astype(np.float64)


def bound_column(kind: str) -> int:
    """Where ``max(HBM bound, compute bound)`` is in ``kind``'s regressors: last for the attention; the FFN's
    indicator (:func:`few_tokens`) and per-chip (:func:`chip_features`) columns come after it."""
    return FFN_REGRESSORS - 1 if kind == "ffn" else -1


def predict(x: np.ndarray, theta, kind: str) -> int:
    """Cycles of a ``kind`` piece from its regressors: ``theta . x`` (at least 1), or without coefficients for
    its kind (the first calibration pass, or none of its pieces was in the calibration sample) the bound
    ``ceil(max(HBM bound, compute bound))``."""
    return int(predict_rows(x[None, :], theta, kind)[0])


def predict_rows(x: np.ndarray, theta, kind: str) -> np.ndarray:
    """:func:`predict` of every row of ``x`` (int64)."""
    if theta is None:
        return np.ceil(x[:, bound_column(kind)]).astype(np.int64)
    return np.maximum(np.rint((x * np.array(theta)).sum(axis=1)), 1).astype(np.int64)


# ----------------------------------------------------------------------------------------------- the provider
class FastLatency(EngineLatency):
    """Prices a step like :class:`~stepsim.serve.exact.EngineLatency`, each piece's cycles predicted by
    ``theta[kind] . regressors`` (``theta`` None: the pilot's ``max(HBM bound, compute bound)``)."""

    mode = "fast"

    #: whether the calibration samples prefill steps by their chunks' cached context too (:class:`Reservoir`)
    cached_prefill_samples = False

    def __init__(self, *args, forms: dict, theta: dict | None = None, error: dict | None = None, **kw):
        super().__init__(*args, **kw)
        self.forms, self.theta, self.error = forms, theta, error
        self.recorder = None

    @property
    def forms(self) -> dict:
        return self._forms

    @forms.setter
    def forms(self, forms: dict) -> None:
        """The metric forms, also as arrays (the bounds are computed as :func:`regressors` computes them, in
        the same order: the same floats)."""
        self._forms = forms
        self._off_chip = {k: np.array(f.off_chip) for k, f in (forms or {}).items()}
        self._flops = {k: np.array(f.flops) for k, f in (forms or {}).items()}

    def piece_regressors(self, kind: str, data) -> np.ndarray:
        """The regressors :func:`calibrate` fits and checks a piece on: :func:`regressors` (a mapped provider's:
        :class:`stepsim.serve.fast_mapped.MappedFastLatency`)."""
        return regressors(kind, data, self.forms.get(kind), self.spec)

    def fitted_columns(self, model: str, width: int) -> np.ndarray:
        """The columns of ``model``'s regressors (:data:`MODELS`; ``width`` of them) that :func:`calibrate` fits; the
        others get coefficient 0 (they stay in the rows: the provider reads some as data). Every column here."""
        return np.ones(width, dtype=bool)

    def attention_regressors(self, batch: IterationBatch) -> tuple[np.ndarray | None, np.ndarray | None]:
        """``(decode, prefill)`` regressors of a step's attention pieces (None for a piece it has not): the same
        numbers :func:`regressors` gives, from one pass over the batch
        (:func:`stepsim.kernels.serve_fast.attention_features`)."""
        n = len(batch.new_tokens)
        context = np.fromiter(batch.context_tokens, dtype=np.int64, count=n)
        new = np.fromiter(batch.new_tokens, dtype=np.int64, count=n)
        decode, prefill = np.zeros(5, dtype=np.int64), np.zeros(3, dtype=np.int64)
        attention_features(context, new, _TILE_SHIFT, np.empty(DECODE_REGIONS, dtype=np.int64), decode, prefill)
        out = []
        for kind, f, extra in (("decode", decode[:3], decode[3:]), ("prefill", prefill, prefill[:0])):
            if not f[0]:
                out.append(None)
                continue
            x = np.array([1.0, *f.tolist()])
            hbm = float((x * self._off_chip[kind]).sum()) / self.spec.hardware.hbm_peak_bytes_per_cycle
            compute = float((x * self._flops[kind]).sum()) / BOUND_COMPUTE_BW
            out.append(np.array([*x.tolist(), *extra.tolist(), hbm, compute, max(hbm, compute)]))
        return out[0], out[1]

    def ffn_rows(self, tokens: int) -> tuple[np.ndarray, Callable[[], list]]:
        """``(x, tasks)``: the FFN regressors of every layer ``[layers, 8 + FEW_TOKENS + 1]`` (then the shared
        experts' tiles, :func:`expert_rounds` and a system's chip columns, where the model and system have them)
        of a step of ``tokens`` tokens (one
        row for a dense FFN) and ``tasks()`` its FFN tasks, as :meth:`EngineLatency.tasks` makes them."""
        if self.model.is_moe:
            f, make_rows = self.routing.window(tokens, KV_TILE)
            rows = functools.cache(make_rows)  # made once a step: pair_parity, expert_rounds, chip columns, tasks

            def tasks() -> list:
                routing = rows()
                return [("ffn", np.ascontiguousarray(routing[:, layer, :])) for layer in range(self.model.layers)]
            chips = self.chip_columns(rows)
        else:
            t = -(-tokens // KV_TILE)
            f = np.array([[t, 1.0, t]])

            def tasks() -> list:
                return [("ffn", np.zeros((tokens, 1), dtype=np.int64))]
            chips = None
        x = np.zeros((len(f), 8 + FEW_TOKENS + 1))
        x[:, 0] = 1.0
        x[:, 1] = tokens
        x[:, 2:5] = f
        if has_shared(self.spec):  # the shared experts' tiles are a basis column of the bounds, the regressors' last
            basis = np.column_stack([x[:, :5], np.full(len(x), float(shared_tiles(tokens, system_chips(self.spec))))])
            x = np.column_stack([x, basis[:, 5]])
        else:
            basis = x[:, :5]
        x[:, 5] = (basis * self._off_chip["ffn"]).sum(axis=1) / self.spec.hardware.hbm_peak_bytes_per_cycle
        x[:, 6] = (basis * self._flops["ffn"]).sum(axis=1) / BOUND_COMPUTE_BW
        np.maximum(x[:, 5], x[:, 6], out=x[:, 7])
        if tokens <= FEW_TOKENS:
            x[:, 7 + tokens] = 1.0  # few_tokens()
        if tokens == 2 and self.model.is_moe:  # pair_parity(): two tokens' rows are cheap to make
            x[:, 8 + FEW_TOKENS] = pair_parity(rows())
        if few_experts(self.spec):  # the rows of few experts: cheap enough (a system's spec is set after __init__)
            x = np.column_stack([x, expert_rounds(rows(), self.model.experts)])
        if chips is not None:
            x = np.column_stack([x, chips])
        return x, tasks

    def chip_columns(self, rows: Callable[[], np.ndarray]) -> np.ndarray | None:
        """The FFN's per-chip regressors (:func:`chip_features`) from the step's ``rows()``; none on one chip."""
        return None

    def __call__(self, batch: IterationBatch) -> IterationCost:
        tokens = batch.prefill_tokens + batch.decode_tokens
        decode, prefill = self.attention_regressors(batch)
        x, ffn_tasks = self.ffn_rows(tokens)
        prefill_step = prefill is not None
        if self.recorder is not None:
            self.recorder(batch, prefill_step, lambda: self.tasks(batch, ffn_tasks()))
        theta = self.theta or {}
        attention = sum(predict(r, theta.get(kind), kind) for kind, r in (("decode", decode), ("prefill", prefill))
                        if r is not None)
        count = 1 if self.model.is_moe else self.model.layers
        cycles = {"attention": self.attention_heads() * self.model.layers * attention + self.collective_cycles(batch),
                  "ffn": int(count * predict_rows(x, theta.get(model_of("ffn", prefill_step)), "ffn").sum()),
                  "weights": self.weight_cycles(batch)}
        touched = int(x[:, ACTIVE_EXPERTS].sum()) if self.model.is_moe else 0
        return self._floored(batch, cycles, sum(cycles.values()), touched)

    def _floored(self, batch: IterationBatch, cycles: dict, total: int, touched: int) -> IterationCost:
        """The step's cost at ``total`` cycles, or at its roofline (:meth:`~stepsim.mapping.roofline.StepWork.
        bound_cycles` of the step's must-read bytes and FLOPs, :meth:`step_work`; on a system its chips' HBM and
        FLOPs side by side) when ``total`` is below it; ``cycles["floor"]``: what the floor added (0 on most steps).
        Every fast provider prices its steps through here (one chip or a system, paper or mapped layers, each
        group of a layer list on its own group's roofline). The pieces are fits, and a fit can price a step below
        a physical bound: DeepSeek-V3 on 16 sn40l sockets priced lone prefills of a few tens of tokens at up to
        1.80x their roofline, its MoE group's ``ffn_prefill`` coefficients (fitted on chunks of hundreds to 2,048
        tokens) extrapolating every layer's FFN to the 1-cycle minimum; on tests/plan's small mapped model one step
        came out at 1.0125x.
        Plan's floors (:mod:`stepsim.plan.pricing`) and every utilisation column assume no step does. The exact
        provider needs no floor: the engine's reads cannot beat its own HBM bandwidth."""
        work = self.step_work(batch, touched, total)
        bound = self.roofline.bound_cycles(work["hbm_bytes"], work["flops"])
        cycles["floor"] = max(0, bound - total)
        if cycles["floor"]:
            total = bound
            work = self.step_work(batch, touched, total)
        return IterationCost(total / self.hardware.clock_hz, cycles, work)

    def attention_heads(self) -> int:
        """KV heads one step's attention runs one after another per layer (all of them on one chip)."""
        return self.model.kv_heads

    def describe(self) -> dict:
        routing = self.routing.describe() if self.routing is not None else None
        return {"routing": routing, "theta": self.theta}


class Reservoir:
    """Seeded reservoir samples of ``size`` steps per stratum (steps with a prefill chunk, decode-only steps),
    each kept with its batch and layer pieces: prefill steps are rare in a long run but decide TTFT.

    Besides, :data:`BUCKET_ITERATIONS` decode-only steps per batch-size bucket (1, 2, .., :data:`FEW_TOKENS`
    sequences, then 9-15, 16-31, ...; a seeded reservoir of their own): fitted, never held out (:attr:`extra`). A uniform sample of a run whose
    decode steps mostly have one sequence may hold no other kind, and a fit on it extrapolates along the
    directions it never saw (how the decode attention's regions share requests); the held-out error stays a
    uniform sample's. With ``cached_prefill`` (mapped layers) also :data:`BUCKET_ITERATIONS` steps per bucket of
    the largest cached context of their prefill chunks (a chunk after the first of a long prompt: 1, 2-3, 4-7, ...
    tokens cached), for the same reason: on requests 200-399 of the conversation trace the uniform sample held none,
    and the mapped prefill's fit priced a 2,035-token chunk after 2,048 cached tokens 32 % under the engine
    (:func:`stepsim.serve.fast_mapped.prefill_regressors`)."""

    def __init__(self, size: int, seed: int, cached_prefill: bool = False):
        self.size = size
        self.cached_prefill = cached_prefill
        self.strata = {"prefill": [], "decode": []}
        self.seen = {"prefill": 0, "decode": 0}
        self.buckets: dict[int, list] = {}
        self.bucket_seen: dict[int, int] = {}
        self.steps = 0
        self._rng = np.random.default_rng(np.random.SeedSequence([seed, 0xCA1]))
        self._bucket_rng = np.random.default_rng(np.random.SeedSequence([seed, 0xCA2]))
        self._cached_rng = np.random.default_rng(np.random.SeedSequence([seed, 0xCA3]))

    @staticmethod
    def _offer(items: list, seen: int, size: int, rng, make: Callable[[], tuple]) -> None:
        if len(items) < size:
            items.append(make())
            return
        j = int(rng.integers(0, seen))
        if j < size:
            items[j] = make()

    def __call__(self, batch, prefill_step: bool, tasks: Callable[[], tuple]) -> None:
        """Offer a step; ``tasks()`` gives its ``(tasks, roles)`` and is called only for a step kept."""
        stratum = "prefill" if prefill_step else "decode"
        self.seen[stratum] += 1
        step = self.steps
        self.steps += 1
        made = []

        def make() -> tuple:
            if not made:
                made.append((step, stratum, batch, tasks()[0]))
            return made[0]

        self._offer(self.strata[stratum], self.seen[stratum], self.size, self._rng, make)
        if prefill_step and self.cached_prefill:
            cached = max((c for c, n in zip(batch.context_tokens, batch.new_tokens) if n != 1), default=0)
            if cached:
                bucket = _cached_bucket(cached)
                self.bucket_seen[bucket] = self.bucket_seen.get(bucket, 0) + 1
                self._offer(self.buckets.setdefault(bucket, []), self.bucket_seen[bucket], BUCKET_ITERATIONS,
                            self._cached_rng, make)
        if not prefill_step:
            bucket = _decode_bucket(len(batch.new_tokens))  # = the FFN's tokens: one per decoding sequence
            self.bucket_seen[bucket] = self.bucket_seen.get(bucket, 0) + 1
            self._offer(self.buckets.setdefault(bucket, []), self.bucket_seen[bucket], BUCKET_ITERATIONS,
                        self._bucket_rng, make)

    def offer_steps(self, prefill_step: np.ndarray, sequences: np.ndarray, cached: np.ndarray,
                    make: Callable[[int], tuple]) -> None:
        """Offer ``n`` steps at once, leaving the reservoirs as ``n`` calls of :meth:`__call__` in step order leave
        them: step ``i`` has a prefill chunk when ``prefill_step[i]``, ``sequences[i]`` sequences, and ``cached[i]``
        the largest cached context of its prefill chunks' sequences (0: none; what :meth:`__call__` takes from the
        batch); ``make(i)`` gives its ``(batch, tasks())`` and is called only for the steps kept once all ``n`` are
        offered.

        Each generator draws for the same offers, with the same bounds, in the same order as the calls (an offer to a
        full reservoir draws from 0 to its offers so far), and NumPy draws an array of bounds as it draws them one
        by one (tests/serve/test_fast_path.py checks both). Why: the compiled pilot offered each step to
        :meth:`__call__` from Python, 1.3 million steps of the whole conversation trace, 12 s of a 16-chip pilot's
        48 s (bench/README.md, session 55)."""
        prefill_step = np.asarray(prefill_step, dtype=bool)
        n = len(prefill_step)
        first, self.steps = self.steps, self.steps + n
        strata = {name: np.flatnonzero(prefill_step == (name == "prefill")) for name in ("prefill", "decode")}
        strata_writes = self._offer_group(self._rng, self.size,
                                          [(self.strata[name], self.seen[name], at) for name, at in strata.items()])
        for name, at in strata.items():
            self.seen[name] += len(at)
        # each step's bucket, the buckets taken in the order __call__ meets them (it inserts each on its first offer)
        keys = np.zeros(n, dtype=np.int64)
        decode = ~prefill_step
        keys[decode] = _bucket_keys(np.asarray(sequences, dtype=np.int64)[decode], _decode_bucket)
        with_cached = prefill_step & (np.asarray(cached) > 0) if self.cached_prefill else np.zeros(n, dtype=bool)
        keys[with_cached] = _bucket_keys(np.asarray(cached, dtype=np.int64)[with_cached], _cached_bucket)
        bucketed = np.flatnonzero(decode | with_cached)
        found, first_at = np.unique(keys[bucketed], return_index=True)
        groups: dict[bool, list] = {False: [], True: []}  # decode buckets, cached-context buckets (keys below 0)
        for key in found[np.argsort(first_at)].tolist():
            at = bucketed[keys[bucketed] == key]
            offers = self.bucket_seen.get(key, 0)
            self.bucket_seen[key] = offers + len(at)
            groups[key < 0].append((self.buckets.setdefault(key, []), offers, at))
        writes = (strata_writes + self._offer_group(self._bucket_rng, BUCKET_ITERATIONS, groups[False])
                  + self._offer_group(self._cached_rng, BUCKET_ITERATIONS, groups[True]))
        for items, slot, i in writes:
            if slot is None:
                items.append(i)
            else:
                items[slot] = i
        made: dict[int, tuple] = {}
        written = {id(items): items for items, _, _ in writes}
        for items in written.values():  # the kept steps, made once each (a step may be in a stratum and a bucket)
            for slot, item in enumerate(items):
                if isinstance(item, int):
                    if item not in made:
                        batch, tasks = make(item)
                        made[item] = (first + item, "prefill" if prefill_step[item] else "decode", batch, tasks)
                    items[slot] = made[item]

    @staticmethod
    def _offer_group(rng, size: int, reservoirs: list) -> list:
        """The writes of the offers to reservoirs of ``size`` steps drawing from one generator ``rng``, each given
        as ``(items, its offers so far, the positions of the steps offered to it)``: ``(items, slot, position)`` in
        step order (slot None: appended), as :meth:`_offer` makes them one step at a time."""
        if not reservoirs:
            return []
        positions = np.concatenate([at for _, _, at in reservoirs])
        seen = np.concatenate([offers + 1 + np.arange(len(at)) for _, offers, at in reservoirs])
        owner = np.concatenate([np.full(len(at), r) for r, (_, _, at) in enumerate(reservoirs)])
        order = np.argsort(positions, kind="stable")
        positions, seen, owner = positions[order], seen[order], owner[order]
        full = seen > size  # the reservoir held `size` steps before this offer: it draws
        slots = np.full(len(positions), -1, dtype=np.int64)
        if full.any():
            slots[full] = rng.integers(0, seen[full])
        return [(reservoirs[r][0], int(j) if f else None, i)
                for r, f, j, i in zip(owner.tolist(), full.tolist(), slots.tolist(), positions.tolist())
                if not f or j < size]

    @property
    def items(self) -> list:
        """Every step of the uniform reservoirs, in step order."""
        return sorted(self.strata["prefill"] + self.strata["decode"], key=lambda item: item[0])

    @property
    def extra(self) -> list:
        """The bucket reservoirs' steps not in :attr:`items`, in step order."""
        kept = {item[0] for item in self.items}
        steps = {item[0]: item for items in self.buckets.values() for item in items if item[0] not in kept}
        return [steps[k] for k in sorted(steps)]


def _decode_bucket(sequences: int) -> int:
    """The bucket reservoir of a decode-only step of ``sequences`` sequences (its FFN's tokens): each
    :func:`few_tokens` count its own, then one a power of two."""
    return sequences if sequences <= FEW_TOKENS else FEW_TOKENS + sequences.bit_length()


def _cached_bucket(cached: int) -> int:
    """The bucket reservoir of a prefill step whose chunks' largest cached context is ``cached`` > 0 tokens: one a
    power of two, keys below 0 (apart from the decode buckets')."""
    return -int(cached).bit_length()


def _bucket_keys(values: np.ndarray, key: Callable[[int], int]) -> np.ndarray:
    """``key`` of each of ``values`` (int64; computed once per distinct value)."""
    distinct, inverse = np.unique(values, return_inverse=True)
    return np.array([key(int(v)) for v in distinct], dtype=np.int64)[inverse]


def calibrate(exact: FastLatency, samples: list, seed: int, hold_out: bool = True,
              extra: list = ()) -> tuple[dict, dict | None]:
    """``(theta, error)`` from the reservoir's ``samples`` (module docstring); ``exact`` runs the exact
    simulations (its templates and workers) and holds the metric forms. ``hold_out=False`` (the first pass):
    every sample is fitted and the error is None. ``extra`` steps are fitted too, never held out."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0xE44]))
    held = set()
    for stratum in ("prefill", "decode") if hold_out else ():  # HELD_OUT / 2 of each stratum, at most half
        members = [i for i, item in enumerate(samples) if item[1] == stratum]
        n = min(HELD_OUT // 2, len(members) // 2)
        held.update(int(members[j]) for j in rng.choice(len(members), size=n, replace=False))
    if hold_out and not held:
        raise ConfigError(f"--fidelity fast: the run has {len(samples)} steps, too few to hold any out for "
                          "measuring the model's error; use --fidelity exact")
    rows: dict[str, list] = {k: [] for k in MODELS}
    targets: dict[str, list] = {k: [] for k in MODELS}
    fit_tasks = []
    fit_models = []
    for i, (_, stratum, batch, tasks) in enumerate([*samples, *extra]):
        if i in held:
            continue
        ffn_seen = 0
        for kind, data in tasks:
            if kind == "ffn":
                ffn_seen += 1
                if ffn_seen > FFN_LAYERS:
                    continue
            fit_tasks.append((kind, data))
            fit_models.append(model_of(kind, stratum == "prefill"))
    cycles = [r[0] for r in exact.run_tasks(fit_tasks)]
    for (kind, data), model, c in zip(fit_tasks, fit_models, cycles):
        rows[model].append(exact.piece_regressors(kind, data))
        targets[model].append(c)
    pooled = rows["ffn"] + rows["ffn_prefill"]
    if (min(len(rows["ffn"]), len(rows["ffn_prefill"])) < 2 * FFN_REGRESSORS
            or min(span(rows["ffn"]), span(rows["ffn_prefill"])) < span(pooled)):  # one FFN model (span of the
        # structural regressors: a prefill step's FFN has many tokens, never a few_tokens() indicator
        rows["ffn"] = rows["ffn_prefill"] = pooled
        targets["ffn"] = targets["ffn_prefill"] = targets["ffn"] + targets["ffn_prefill"]
    theta = {}
    for kind in MODELS:
        if not rows[kind]:
            theta[kind] = None
            continue
        a, y = np.array(rows[kind]), np.array(targets[kind], dtype=np.float64)
        w = 1.0 / np.maximum(y, 1.0)  # least squares on relative error
        fitted = exact.fitted_columns(kind, a.shape[1])
        coefficients = np.zeros(a.shape[1])
        coefficients[fitted] = solve(a[:, fitted] * w[:, None], y * w)  # the same bits on every machine (exact_lstsq)
        theta[kind] = coefficients.tolist()
    if not hold_out:
        return theta, None
    errors, strata = [], []
    for i in sorted(held):
        _, stratum, batch, tasks = samples[i]
        strata.append(stratum)
        roles = exact.roles(tasks)
        exact_cycles = [r[0] for r in exact.run_tasks(tasks)]
        truth = sum(count * c for (_, count), c in zip(roles, exact_cycles))
        predicted = sum(count * predict(exact.piece_regressors(kind, data),
                                        theta[model_of(kind, stratum == "prefill")], kind)
                        for (kind, data), (_, count) in zip(tasks, roles))
        weights = exact.weight_cycles(batch) + exact.collective_cycles(batch)  # exact terms, in both
        errors.append(abs((predicted + weights) - (truth + weights)) / (truth + weights))
    errors, strata = np.array(errors), np.array(strata)
    error = {"iteration_p50": float(np.percentile(errors, 50)), "iteration_p95": float(np.percentile(errors, 95)),
             "iteration_max": float(errors.max()), "held_out_iterations": int(len(errors)),
             "held_out_prefill_iterations": int((strata == "prefill").sum()),
             "calibration_simulations": len(fit_tasks)}
    return theta, error


def calibrated(make: Callable, pilot: Callable, seed: int) -> tuple[FastLatency, dict, dict, dict]:
    """Calibrate in two passes (module docstring): ``make(theta)`` gives a provider (``theta`` None: priced by the
    bound), ``pilot(provider)`` replays the run with it. Returns ``(last pilot's provider, theta, error,
    stats)``; the caller closes nothing (both pilots' providers are closed here)."""
    clock = [time.perf_counter()]

    def lap() -> float:
        clock.append(time.perf_counter())
        return round(clock[-1] - clock[-2], 3)

    first = make(None)
    first.recorder = Reservoir(FIRST_PASS_ITERATIONS, seed, first.cached_prefill_samples)
    try:
        pilot(first)
        laps = [lap()]
        theta, _ = calibrate(first, first.recorder.items, seed, hold_out=False, extra=first.recorder.extra)
        laps.append(lap())
    finally:
        first.close()
    second = make(theta)
    second.recorder = Reservoir(SAMPLED_ITERATIONS, seed, second.cached_prefill_samples)
    try:
        pilot(second)
        laps.append(lap())
        theta, error = calibrate(second, second.recorder.items, seed, extra=second.recorder.extra)
        laps.append(lap())
    finally:
        second.close()
    stats = {k: first.stats()[k] + second.stats()[k] for k in ("templates", "simulations", "build_s", "engine_s")}
    # wall seconds of pass 1's replay and simulations, then pass 2's (not part of any output file but the cache)
    stats.update(simulations_per_pass=[first.simulations, second.simulations], pass_wall_s=laps)
    return second, theta, error, stats


def span(rows: list) -> int:
    """Rank of FFN regressor rows' first :data:`FFN_REGRESSORS` columns (not the :func:`few_tokens`
    indicators), scaled to at most 1: how many directions the samples vary in. A side of
    the FFN split whose samples span less than both sides together (e.g. decode steps that all had one token)
    would extrapolate along the missing directions: both sides share one fit then."""
    if not rows:
        return 0
    a = np.array(rows)[:, :FFN_REGRESSORS]
    return numeric_rank(a / np.maximum(np.abs(a).max(axis=0), 1.0))
