"""The compiled replay on mapped layers (stepsim/kernels/serve_mapped.py, stepsim/serve/replay_mapped.py) against
the Python loop (stepsim.serve.replay.replay_reference) with :class:`~stepsim.serve.fast_mapped.MappedFastLatency`:
random traces and scheduler settings, random coefficients and metric forms, every bucket's schedule random (tile_n,
regions, cycles, on-chip bytes up to the chip's capacity, so that streaming the weights ahead is bounded by both
the idle HBM and the free memory), the projections' costs a rule of the token count: the same per-step and
per-request tables bit for bit, the same buckets noted, the routing left in the same state, the same stop; a disaggregated decode pool likewise.

The mapper and the engine are replaced (``stepsim.mapping.schedule_for``, ``projections.projection_cost``,
``ffn_points.point_cycles``): what is compared is the pricing's arithmetic over whatever schedules the buckets get
(the mapper's search takes minutes a model; tests/mapping checks it; the FFN buckets' simulated points were 112 of
this file's 192 s, profiled, and tests/serve/test_ffn_points.py checks them), in both paths the same functions.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from test_fast_mapped import TINY
from test_replay_compiled import _random_run, assert_same_result

from stepsim.base.hardware import PRESETS
from stepsim.kernels.serve_mapped import PREFILL_COLUMNS
from stepsim.mapping.schedule import Schedule
from stepsim.models.presets import resolve_model
from stepsim.serve import fast_mapped, ffn_points, projections, replay_compiled
from stepsim.serve.fast import MetricForm
from stepsim.serve.fast_mapped import FFN_COLUMNS, MappedFastLatency
from stepsim.serve.replay import replay, replay_reference
from stepsim.serve.replay_compiled import compiled_replay
from stepsim.serve.replay_stop import ReplayStopped, StopRule
from stepsim.serve.routing import SyntheticRouting

CAPACITY = PRESETS["sn40l"].on_chip_capacity_bytes


class Mapper:
    """Random schedules per (kind, bucket), drawn once each from ``seed``; ``fail_at``: the FFN bucket whose
    mapping raises (as the mapper's "no schedule fits")."""

    def __init__(self, seed: int, experts: int, fail_at: int | None = None):
        self.rng, self.experts, self.fail_at, self.made = np.random.default_rng(seed), experts, fail_at, {}

    def __call__(self, kind, size, dims, hardware, *, cache=True):
        from stepsim.base.errors import ConfigError
        from stepsim.mapping.mapper import bucket

        b = bucket(size)
        if kind == "ffn" and b == self.fail_at:
            raise ConfigError(f"no schedule of the 'ffn' layer at size {b} fits hardware 'sn40l'")
        if (kind, b) not in self.made:
            rng = self.rng
            regions = [r for r in (1, 2, 4, 8) if self.experts % r == 0]
            if kind == "ffn":
                knobs = {"tile_n": int(rng.choice([t for t in (1, 2, 4, 8, 16, 32) if t <= b])), "tile_f": 32,
                         "lanes": int(rng.choice([1, 2])), "regions": int(rng.choice(regions))}
            else:
                knobs = {"regions": int(rng.choice([1, 2, 4, 8, 16]))}
            on_chip = int(rng.choice([0, int(rng.integers(0, 10**6)), CAPACITY - int(rng.integers(0, 40_000))]))
            cycles = float(rng.uniform(300, 40_000)) if rng.random() < 0.5 else int(rng.integers(300, 40_000))
            self.made[kind, b] = Schedule(kind, knobs, cycles=cycles, on_chip_bytes=on_chip)
        return self.made[kind, b]


def projection_cost(tokens, d_in, d_out, hardware):
    """A projection's ``(cycles, HBM bytes, on-chip bytes, FLOPs)``: a rule of its shape and token count (cycles
    well above its reads' at the HBM's peak some of the time: the HBM idles and later weights stream in)."""
    weights = d_in * d_out * 2
    cycles = 200 + (tokens * 7919 + d_in * 31 + d_out) % 60_000
    on_chip = [0, (tokens * 104_729) % 2_000_000, CAPACITY - 1000][(tokens + d_out) % 3]
    return cycles, weights + tokens * (d_in + d_out) * 2, on_chip, 2 * tokens * d_in * d_out


def point_cycles(tokens, dims, hardware, system=None):
    """An FFN point's engine cycles on each of its representative routings: a rule of the token count, the
    dimensions and the sample (above and below its bucket's top some of the time)."""
    from stepsim.mapping.kinds.ffn import ffn_samples

    return tuple(300 + (tokens * 7919 + dims.experts * 131 + s * 104_729) % 30_000 for s in range(ffn_samples(tokens)))


@pytest.fixture
def mapped(monkeypatch):
    """Installs a :class:`Mapper` (returned by the fixture's function) and the projections' and FFN points'
    rules."""
    import stepsim.mapping

    monkeypatch.setattr(projections, "projection_cost", projection_cost)
    monkeypatch.setattr(ffn_points, "point_cycles", point_cycles)

    def install(mapper: Mapper) -> Mapper:
        monkeypatch.setattr(stepsim.mapping, "schedule_for", mapper)
        monkeypatch.setattr(fast_mapped, "_MEMO", {})
        return mapper
    return install


def _model(tmp_path, variant: str):
    config = dict(TINY)
    if variant in ("dense", "tp"):
        config = {k: v for k, v in TINY.items() if k not in ("num_experts", "moe_intermediate_size",
                                                              "num_experts_per_tok")}
        config["model_type"] = "qwen3"
    config.update({"many": {"num_experts": 32, "num_experts_per_tok": 4},
                   "deep": {"num_hidden_layers": 5}}.get(variant, {}))
    (tmp_path / f"{variant}.json").write_text(json.dumps(config))
    return resolve_model(str(tmp_path / f"{variant}.json"))


def _provider(model, seed: int, forms: dict, theta, chips: int = 1) -> MappedFastLatency:
    """One chip's mapped provider, or with ``chips`` > 1 the ring of that many: a dense model's tensor-parallel
    chips (:class:`MappedSystemFastLatency`: each chip's shard, two all-reduces a layer), an MoE model's
    expert-parallel ones (:class:`MappedEPFastLatency`: the heads split, one all-reduce a layer, the block's
    regressors)."""
    routing = SyntheticRouting(model.experts, model.top_k, model.layers, seed=seed) if model.is_moe else None
    if chips > 1:
        from stepsim.base.system import System
        from stepsim.serve.fast_mapped_ep import MappedEPFastLatency
        from stepsim.serve.system_fast import MappedSystemFastLatency

        kind = MappedEPFastLatency if model.is_moe else MappedSystemFastLatency
        return kind(model, System.preset(f"ring-{chips}"), routing, max_model_len=4096, vocab=1000, forms=forms,
                    theta=theta)
    return MappedFastLatency(model, PRESETS["sn40l"], routing, max_model_len=4096, vocab=1000, forms=forms,
                             theta=theta, schedule="auto")


class EPReferences:
    """Random :func:`stepsim.serve.fast_mapped_ep.ep_reference` per bucket, drawn once each from ``seed``: the
    knobs, the representative loads and the two points (the real one maps the block on the system and simulates it
    at both points: minutes; tests/serve/test_serve_system_mapped_ep.py runs it)."""

    def __init__(self, seed: int, experts: int):
        self.rng, self.experts, self.made = np.random.default_rng(seed), experts, {}

    def __call__(self, size, spec):
        from stepsim.mapping.mapper import bucket
        from stepsim.serve.fast_mapped import Point
        from stepsim.serve.fast_mapped_ep import Reference

        b = bucket(size)
        if b not in self.made:
            rng = self.rng
            knobs = {"tile_n": int(rng.choice([t for t in (1, 2, 4, 8, 16, 32) if t <= b])),
                     "regions": int(rng.choice([r for r in (1, 2, 4) if self.experts % r == 0]))}
            top = Point(b, float(rng.uniform(0.5, 3)), float(rng.uniform(500, 40_000)))
            bottom = Point(b // 2 + 1, float(rng.uniform(0.5, 3)), float(rng.uniform(300, top.cycles))) \
                if b > 2 else top
            self.made[b] = Reference(bottom, top, float(rng.uniform(1, 20)), float(rng.uniform(1, 20)), knobs)
        return self.made[b]


def _random_coefficients(rng, ffn_width: int = FFN_COLUMNS) -> tuple[dict, dict]:
    """Metric forms of the decode and prefill attention and coefficients of every kind, random; some kinds
    without coefficients (priced by their bound or estimate)."""
    forms = {k: MetricForm(tuple(rng.uniform(0, 5000, 4).tolist()), tuple(rng.uniform(0, 9e5, 4).tolist()))
             for k in ("decode", "prefill")}
    widths = {"decode": 10, "prefill": PREFILL_COLUMNS, "ffn": ffn_width, "ffn_prefill": ffn_width}
    theta = {k: (None if rng.random() < 0.15 else (rng.standard_normal(w) * 10.0 ** rng.integers(-2, 3, w)).tolist())
             for k, w in widths.items()}
    return forms, theta


@pytest.mark.parametrize("variant", ["moe", "dense", "many", "deep", "tp", "ep", "ep-many"])
def test_the_compiled_mapped_pricing_is_the_providers(tmp_path, mapped, monkeypatch, variant):
    """Random runs: the same tables as the provider called step by step, the same buckets in ``layer_use``, the
    routing's window generator where the provider leaves it; streaming hid cycles in most runs; no step's
    utilisation above 1. ``tp``: the dense model's shards on a ring of two chips, with their all-reduces; ``ep`` /
    ``ep-many``: the MoE model (8 / 32 experts) on a ring of two / four chips, expert-parallel."""
    from stepsim.serve import fast_mapped_ep

    model = _model(tmp_path, {"ep": "moe", "ep-many": "many"}.get(variant, variant))
    rng = np.random.default_rng({"moe": 21, "dense": 22, "many": 23, "deep": 24, "tp": 25, "ep": 26,
                                 "ep-many": 27}[variant])
    chips = {"tp": 2, "ep": 2, "ep-many": 4}.get(variant, 1)
    expert_parallel = variant.startswith("ep")
    hidden_runs = 0
    for trial in range(6):
        mapped(Mapper(int(rng.integers(0, 1000)), model.experts if model.is_moe else 1))
        if expert_parallel:
            monkeypatch.setattr(fast_mapped_ep, "ep_reference", EPReferences(int(rng.integers(0, 1000)),
                                                                             model.experts))
        arrival, prompt, output, make, settings = _random_run(rng)
        forms, theta = _random_coefficients(rng, fast_mapped_ep.EP_COLUMNS if expert_parallel else FFN_COLUMNS)
        theta = None if trial == 0 else theta  # the first calibration pass: every piece at its bound or estimate
        seed = int(rng.integers(0, 1000))
        compiled, reference = (_provider(model, seed, forms, theta, chips) for _ in range(2))
        got = compiled_replay(arrival, prompt, output, make(), compiled)
        assert got is not None, (settings, replay_compiled._fallback_reason)
        want = replay_reference(arrival, prompt, output, make(), reference)
        assert_same_result(got, want)
        assert "cycles_hidden" in got.iterations and compiled.layer_use.steps == reference.layer_use.steps
        hidden_runs += bool(want.iterations["cycles_hidden"].any())
        assert max(want.iterations["hbm_utilisation"].max(), want.iterations["compute_utilisation"].max()) <= 1.0
        if model.is_moe:
            a, b = compiled.routing, reference.routing
            assert a._used == b._used and np.array_equal(a._starts, b._starts)
            assert a._windows.bit_generator.state == b._windows.bit_generator.state
    assert hidden_runs >= 4


@pytest.mark.parametrize("variant", ["moe", "dense"])
def test_a_step_priced_below_its_roofline_costs_its_roofline(tmp_path, mapped, monkeypatch, variant):
    """Coefficients that price every piece at one cycle and projections of one cycle: every step costs exactly
    its roofline, ``max(ceil(HBM bytes / peak), ceil(FLOPs / peak))`` (StepWork.bound_cycles), the floor's cycles
    are what it added, and the compiled loop's tables are the provider's, bit for bit."""
    monkeypatch.setattr(projections, "projection_cost", lambda tokens, d_in, d_out, hardware: (1, 0, 0, 0))
    model = _model(tmp_path, variant)
    rng = np.random.default_rng(31)
    mapped(Mapper(5, model.experts if model.is_moe else 1))
    arrival, prompt, output, make, _ = _random_run(rng)
    forms, _ = _random_coefficients(rng)
    theta = {"decode": [0.0] * 10, "prefill": [0.0] * PREFILL_COLUMNS, "ffn": [0.0] * FFN_COLUMNS,
             "ffn_prefill": [0.0] * FFN_COLUMNS}
    compiled, reference = _provider(model, 4, forms, theta), _provider(model, 4, forms, theta)
    got = compiled_replay(arrival, prompt, output, make(), compiled)
    assert got is not None, replay_compiled._fallback_reason
    want = replay_reference(arrival, prompt, output, make(), reference)
    assert_same_result(got, want)
    it = want.iterations
    roofline = reference.roofline
    bound = [roofline.bound_cycles(int(h), int(f)) for h, f in zip(it["hbm_bytes"], it["flops"])]
    total = it["cycles_attention"] + it["cycles_ffn"] + it["cycles_weights"] - it["cycles_hidden"]
    assert (it["cycles_floor"] > 0).all()
    assert (total + it["cycles_floor"]).tolist() == bound
    assert it["duration_s"].tolist() == [b / PRESETS["sn40l"].clock_hz for b in bound]


def test_a_compiled_mapped_replay_stops_where_the_python_one_does(tmp_path, mapped):
    """A stop rule at a fraction of the run's own TTFTs: both loops stop at the same step, time and utilisation,
    with the same buckets noted."""
    model = _model(tmp_path, "moe")
    rng = np.random.default_rng(31)
    stops = 0
    for _ in range(4):
        mapped(Mapper(int(rng.integers(0, 1000)), model.experts))
        arrival, prompt, output, make, settings = _random_run(rng)
        forms, theta = _random_coefficients(rng)
        full = replay_reference(arrival, prompt, output, make(), _provider(model, 5, forms, theta))
        ttft = full.first_token - arrival
        rule = StopRule(ttft=float(np.percentile(ttft, 50)) * 0.5, ttft_misses=max(1, len(arrival) // 10))
        results = []
        for loop in (compiled_replay, replay_reference):
            provider = _provider(model, 5, forms, theta)
            try:
                loop(arrival, prompt, output, make(), provider, None, rule)
                results.append((None, provider.layer_use.steps))
            except ReplayStopped as s:
                results.append(((s.metric, s.steps, s.now, s.max_utilisation), provider.layer_use.steps))
        assert results[0] == results[1], settings
        stops += results[0][0] is not None
    assert stops >= 2


def test_a_bucket_the_mapper_cannot_fill_is_the_python_loops_error(tmp_path, mapped):
    """The mapper failing on a bucket a step needs: the compiled loop hands the run over (None), and ``replay``
    raises the provider's own error from the Python loop."""
    from stepsim.base.errors import ConfigError

    model = _model(tmp_path, "moe")
    forms, theta = _random_coefficients(np.random.default_rng(41))
    arrival, prompt, output = np.array([0.0, 0.001, 0.002]), np.array([30, 200, 7]), np.array([5, 3, 4])

    def scheduler():
        from stepsim.serve.kv_cache import kv_capacity
        from stepsim.serve.scheduler import Scheduler, SchedulerConfig

        return Scheduler(SchedulerConfig.make("vllm"), kv_capacity(400 * 16, 0, 1, 16), 1000)

    mapped(Mapper(3, model.experts, fail_at=256))
    assert compiled_replay(arrival, prompt, output, scheduler(), _provider(model, 0, forms, theta)) is None
    with pytest.raises(ConfigError) as e:
        replay(arrival, prompt, output, scheduler(), _provider(model, 0, forms, theta))
    assert str(e.value) == "no schedule of the 'ffn' layer at size 256 fits hardware 'sn40l'"
    mapped(Mapper(3, model.experts))
    got = compiled_replay(arrival, prompt, output, scheduler(), _provider(model, 0, forms, theta))
    assert got is not None
    assert_same_result(got, replay_reference(arrival, prompt, output, scheduler(), _provider(model, 0, forms, theta)))


def test_a_compiled_decode_pool_prices_as_the_mapped_provider(tmp_path, mapped):
    """A disaggregated deployment's decode pool on mapped layers (both first-token definitions): the compiled pool's
    tables, buckets and routing state are the Python pool's."""
    from test_disaggregated_compiled import _both, _pool_trace

    from stepsim.base.errors import SimulationError

    model = _model(tmp_path, "moe")
    rng = np.random.default_rng(51)
    compiled = 0
    for trial in range(6):
        mapped(Mapper(int(rng.integers(0, 1000)), model.experts))
        arrival, prompt, output, make, settings = _random_run(rng)
        first_token = ("decode", "prefill")[trial % 2]
        arrive, prefill_end, moves = _pool_trace(rng, arrival, output, first_token)
        forms, theta = _random_coefficients(rng)
        a, b = _provider(model, 7, forms, theta), _provider(model, 7, forms, theta)
        try:
            got, want = _both(arrive, prompt, output, prefill_end, moves, make, a, b, first_token)
        except SimulationError:  # a request the idle pool cannot hold: the reference's error (tested elsewhere)
            continue
        assert got is not None, (settings, replay_compiled._fallback_reason)
        compiled += 1
        assert_same_result(got, want)
        assert a.layer_use.steps == b.layer_use.steps
        assert a.routing._used == b.routing._used and np.array_equal(a.routing._starts, b.routing._starts)
    assert compiled >= 4
