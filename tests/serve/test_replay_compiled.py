"""The compiled replay (stepsim/serve/replay_compiled.py, stepsim/kernels/serve_replay.py) against the Python
reference (stepsim.serve.replay.replay_reference): random traces under random scheduler settings, priced by a
constant and by the fast model (random coefficients, every FFN variant), give the same per-step and per-request
tables bit for bit, and the routing ends in the same state; what the compiled path does not take goes to the
reference, errors included."""

from __future__ import annotations

import json

import numpy as np
import pytest
from serve_requests import requests_file
from test_exact import SMALL

from stepsim.base.errors import SimulationError
from stepsim.base.hardware import PRESETS
from stepsim.models.presets import resolve_model
from stepsim.serve.fast import FastLatency, MetricForm
from stepsim.serve.kv_cache import kv_capacity
from stepsim.serve.latency import ConstantLatency
from stepsim.serve.replay import ReplayResult, replay, replay_reference
from stepsim.serve.replay_compiled import compiled_replay
from stepsim.serve.routing import SyntheticRouting
from stepsim.serve.scheduler import Scheduler, SchedulerConfig


def _bits(a: np.ndarray) -> tuple:
    """An array as (dtype, shape, raw bytes): equal only when every value is the same bit for bit."""
    return str(a.dtype), a.shape, np.ascontiguousarray(a).tobytes()


def assert_same_result(got: ReplayResult, want: ReplayResult) -> None:
    for name in ("first_scheduled", "first_token", "finish", "preemptions", "itl"):
        assert _bits(getattr(got, name)) == _bits(getattr(want, name)), name
    assert list(got.iterations) == list(want.iterations)
    for name, column in want.iterations.items():
        assert _bits(got.iterations[name]) == _bits(column), name
    assert got.max_blocks_used == want.max_blocks_used


def _random_run(rng: np.random.Generator) -> tuple:
    """A random trace and scheduler: ``(arrival, prompt, output, make_scheduler, settings)``; small KV caches so
    that vLLM and Sarathi preempt."""
    policy = str(rng.choice(["vllm", "sarathi", "orca"]))
    block_size = int(rng.choice([1, 4, 16, 32]))
    seqs = int(rng.integers(1, 40))
    kwargs = {"max_num_seqs": seqs, "block_size": block_size}
    if policy == "vllm":
        kwargs["max_num_batched_tokens"] = int(rng.integers(8, 1500))
        kwargs["chunk_tokens"] = int(rng.choice([0, 0, int(rng.integers(1, 300))]))
    elif policy == "sarathi":
        kwargs["chunk_tokens"] = int(rng.integers(2, 700))
    config = SchedulerConfig.make(policy, **kwargs)
    max_len = int(rng.integers(64, 900))
    blocks = -(-max_len // block_size) * int(rng.integers(1, 5)) + int(rng.integers(2, 40))
    capacity = kv_capacity(blocks * block_size, 0, 1, block_size)
    usable = capacity.usable_blocks - (int(0.01 * capacity.num_blocks) if policy != "vllm" else 0)
    max_len = min(max_len, usable * block_size)
    n = int(rng.integers(1, 160))
    output = rng.integers(1, max(2, min(60, max_len // 2)), n)
    prompt = np.minimum(rng.integers(1, max_len, n), max_len - output)
    gaps = rng.exponential(rng.choice([0.001, 0.05, 1.0]), n) * (rng.random(n) < 0.8)  # bursts: equal arrivals
    arrival = np.cumsum(gaps)
    settings = (policy, kwargs, max_len, blocks)
    return arrival, prompt.astype(np.int64), output.astype(np.int64), \
        (lambda: Scheduler(config, capacity, max_len)), settings


@pytest.mark.parametrize("seed", range(8))
def test_the_compiled_loop_is_the_reference_under_a_constant_step(seed):
    """25 random traces and scheduler settings per seed (the three policies, chunking, preemption, bursts), a
    random step time (not binary-exact: the clock's sums round as the reference's)."""
    rng = np.random.default_rng(seed)
    for _ in range(25):
        arrival, prompt, output, make, settings = _random_run(rng)
        step = ConstantLatency(float(rng.choice([2.0**-6, 0.0173, rng.uniform(1e-4, 0.3)])))
        got = compiled_replay(arrival, prompt, output, make(), step)
        assert got is not None, settings
        assert_same_result(got, replay_reference(arrival, prompt, output, make(), step))


def _model(tmp_path, variant: str):
    config = dict(SMALL)
    if variant == "dense":
        config = {k: v for k, v in SMALL.items() if k not in ("num_experts", "moe_intermediate_size",
                                                               "num_experts_per_tok")}
        config["model_type"] = "qwen3"
    config.update({"shared": {"n_shared_experts": 2}, "many": {"num_experts": 32, "num_experts_per_tok": 4},
                   "deep": {"num_hidden_layers": 6}}.get(variant, {}))
    (tmp_path / f"{variant}.json").write_text(json.dumps(config))
    return resolve_model(str(tmp_path / f"{variant}.json"))


def _fast(model, rng_seed: int, forms: dict, theta) -> FastLatency:
    routing = SyntheticRouting(model.experts, model.top_k, model.layers, seed=rng_seed) if model.is_moe else None
    return FastLatency(model, PRESETS["sn40l"], routing, max_model_len=4096, vocab=1000, forms=forms, theta=theta)


def _random_coefficients(rng, provider_columns: int, shared: bool) -> tuple[dict, dict]:
    """Metric forms and coefficients of the right widths with random values (the pricing's arithmetic is what is
    compared, not a calibration); some kinds without coefficients (priced by their bound)."""
    forms = {k: MetricForm(tuple(rng.uniform(0, 5000, w).tolist()), tuple(rng.uniform(0, 9e5, w).tolist()))
             for k, w in (("decode", 4), ("prefill", 4), ("ffn", 6 if shared else 5))}
    widths = {"decode": 9, "prefill": 7, "ffn": provider_columns, "ffn_prefill": provider_columns}
    theta = {k: (None if rng.random() < 0.15 else (rng.standard_normal(w) * 10.0 ** rng.integers(-2, 4, w)).tolist())
             for k, w in widths.items()}
    return forms, theta


@pytest.mark.parametrize("variant, columns", [("moe", 17 + 16), ("dense", 17), ("shared", 18 + 16), ("many", 17),
                                              ("deep", 17 + 16)])
def test_the_compiled_fast_pricing_is_the_providers(tmp_path, variant, columns):
    """The fast model's steps (attention regressors, every layer's FFN window, few-token and two-token columns,
    the shared experts' tiles, expert rounds, the roofline) on random runs: the same tables as the provider
    called step by step, and the routing's window generator left where the provider leaves it."""
    model = _model(tmp_path, variant)
    rng = np.random.default_rng(11)
    for trial in range(5):
        arrival, prompt, output, make, settings = _random_run(rng)
        forms, theta = _random_coefficients(rng, columns, variant == "shared")
        theta = None if trial == 0 else theta  # the first calibration pass: every piece at its bound
        seed = int(rng.integers(0, 1000))
        compiled, reference = _fast(model, seed, forms, theta), _fast(model, seed, forms, theta)
        got = compiled_replay(arrival, prompt, output, make(), compiled)
        assert got is not None, settings
        assert_same_result(got, replay_reference(arrival, prompt, output, make(), reference))
        if model.is_moe:
            a, b = compiled.routing, reference.routing
            assert a._used == b._used and np.array_equal(a._starts, b._starts)
            assert a._windows.bit_generator.state == b._windows.bit_generator.state


def test_what_the_compiled_path_does_not_take_goes_to_the_reference():
    """A scheduler subclass and a provider of its own are replayed by the reference; a request no idle engine
    can schedule makes the compiled loop step aside and the reference raise its error."""
    capacity = kv_capacity(64 * 16, 0, 1, 16)
    config = SchedulerConfig.make("vllm")

    class Mine(Scheduler):
        pass

    arrival, prompt, output = np.array([0.0, 0.1]), np.array([10, 20]), np.array([3, 2])
    step = ConstantLatency(0.01)
    assert compiled_replay(arrival, prompt, output, Mine(config, capacity, 500), step) is None
    assert compiled_replay(arrival, prompt, output, Scheduler(config, capacity, 500), lambda batch: None) is None
    assert_same_result(replay(arrival, prompt, output, Mine(config, capacity, 500), step),
                       replay_reference(arrival, prompt, output, Scheduler(config, capacity, 500), step))
    big = np.array([10, 2000])  # more blocks than the cache has: vLLM admits it never
    assert compiled_replay(arrival, big, output, Scheduler(config, capacity, 4000), step) is None
    with pytest.raises(SimulationError) as e:
        replay(arrival, big, output, Scheduler(config, capacity, 4000), step)
    assert str(e.value) == "request 1 (2000 prompt + 2 output tokens) cannot be scheduled on an idle engine"


def test_progress_is_reported_on_the_compiled_path():
    rng = np.random.default_rng(5)
    n = 3000
    arrival, prompt, output = np.sort(rng.uniform(0, 60, n)), rng.integers(1, 200, n), rng.integers(1, 30, n)
    capacity = kv_capacity(4000 * 16, 0, 1, 16)
    seen = []
    result = replay(arrival, prompt, output, Scheduler(SchedulerConfig.make("vllm"), capacity, 4096),
                    ConstantLatency(0.01), lambda done, steps: seen.append((done, steps)))
    steps = len(result.iterations["start_s"])
    assert seen[-1] == (n, steps) and steps > 2048 and [s for _, s in seen[:-1]][:1] == [2048]


@pytest.mark.parametrize("keep", [False, True])
def test_a_compiled_window_is_the_routings(keep):
    """The compiled loop's FFN window (stepsim.kernels.serve_replay._window) against the Python path's
    (window_features): inside the pool, across its end, and longer than the pool (whole turns)."""
    from stepsim.kernels.serve_fast import window_features
    from stepsim.kernels.serve_replay import _window
    from stepsim.serve.routing import POOL_TOKENS

    routing = SyntheticRouting(128, 8, 1, seed=3)
    routing.window(1, 32)
    _, prefix, _ = routing._pool
    rng = np.random.default_rng(4)
    tiles, want = np.zeros(129, dtype=np.int64), np.empty((1, 3))
    for tokens in (1, 2, 9, 2048, POOL_TOKENS - 1, POOL_TOKENS, POOL_TOKENS + 70, 3 * POOL_TOKENS + 5):
        for start in [0, POOL_TOKENS - 1, *rng.integers(0, POOL_TOKENS, 6).tolist()]:
            window_features(prefix, np.array([start]), tokens, 5, want)
            assert list(_window(prefix, start, tokens, 5, 128, tiles, keep)) == want[0].tolist(), (tokens, start)
            if keep:
                assert int(tiles[:128].sum()) == int(want[0, 0]) and int(tiles[:128].max()) == int(want[0, 2])


def test_the_first_compiled_replay_says_it_compiles(monkeypatch, capsys):
    """A command (notices armed) whose replay kernel is not in numba's cache says so once on stderr; a Python
    caller (nothing armed) hears nothing."""
    import stepsim.serve.replay_compiled as compiled
    from stepsim.base import compile_notice

    monkeypatch.setattr(compiled, "_cached", lambda: False)
    monkeypatch.setattr(compile_notice, "_said", set())
    compile_notice.arm(None)  # a command an earlier test ran in this process may have left the notices armed
    compiled.warm()
    assert capsys.readouterr().err == ""
    compile_notice.arm(lambda functional, timeline: False)
    try:
        compiled.warm()
        compiled.warm()
    finally:
        compile_notice.arm(None)
    assert capsys.readouterr().err == ("stepsim: compiling the serving replay kernels once, about 30 s "
                                       "(`stepsim cache warm` does it ahead)\n")


def test_a_fast_provider_it_was_not_written_for_goes_to_the_reference(tmp_path):
    """Coefficients of another shape (an unknown kind), a recorder other than a calibration's reservoir, a routing
    dump: the compiled path steps aside (None), the reference replays."""
    from stepsim.serve.fast import Reservoir

    model = _model(tmp_path, "moe")
    forms, theta = _random_coefficients(np.random.default_rng(2), 33, False)
    arrival, prompt, output = np.array([0.0, 0.01]), np.array([30, 5]), np.array([4, 3])
    capacity = kv_capacity(200 * 16, 0, 1, 16)

    def scheduler():
        return Scheduler(SchedulerConfig.make("vllm"), capacity, 1000)

    assert compiled_replay(arrival, prompt, output, scheduler(), _fast(model, 0, forms, theta)) is not None
    other = _fast(model, 0, forms, {**theta, "ffn_auto": theta["ffn"]})
    assert compiled_replay(arrival, prompt, output, scheduler(), other) is None
    recording = _fast(model, 0, forms, theta)
    recording.recorder = Reservoir(3, seed=0)  # a calibration's: fed step by step (tests/serve/test_fast_mapped.py)
    fed = compiled_replay(arrival, prompt, output, scheduler(), recording)
    assert recording.recorder.steps == len(fed.iterations["start_s"]) == 7  # every step offered
    recording.recorder = lambda batch, prefill_step, tasks: None  # any other recorder
    assert compiled_replay(arrival, prompt, output, scheduler(), recording) is None
    dump = _fast(model, 0, forms, theta)
    dump.routing = object()
    assert compiled_replay(arrival, prompt, output, scheduler(), dump) is None
    assert_same_result(replay(arrival, prompt, output, scheduler(), _fast(model, 0, forms, theta)),
                       replay_reference(arrival, prompt, output, scheduler(), _fast(model, 0, forms, theta)))


@pytest.mark.parametrize("scheduler", ["vllm", "sarathi", "orca"])
def test_every_file_serve_writes_is_the_reference_loops(tmp_path, monkeypatch, scheduler):
    """``stepsim.serve(..., out=DIR)`` on a random request file with the compiled loop and with the reference
    (``api.replay`` replaced): the same bytes in every file, summary.json but for its wall time."""
    import stepsim
    import stepsim.serve.api as api

    (tmp_path / "m.json").write_text(json.dumps(SMALL))
    rng = np.random.default_rng(8)
    n = 300
    trace = requests_file(tmp_path / "t.parquet", np.sort(rng.uniform(0, 2, n)), rng.integers(1, 900, n),
                          rng.integers(1, 80, n))
    import stepsim.serve.replay as replay_module

    def not_here(*args, **kwargs):
        raise AssertionError("the compiled loop handed this run to the reference")

    for name, loop in (("new", replay), ("old", replay_reference)):
        monkeypatch.setattr(api, "replay", loop)
        monkeypatch.setattr(replay_module, "replay_reference", not_here if name == "new" else replay_reference)
        stepsim.serve(str(tmp_path / "m.json"), trace, out=tmp_path / name, iteration_latency=0.0123,
                      scheduler=scheduler, max_seqs=24, hbm_bytes=2_000_000_000)
    names = sorted(p.name for p in (tmp_path / "old").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "new").iterdir()) and "iterations.parquet" in names
    for name in names:
        old, new = (tmp_path / "old" / name).read_bytes(), (tmp_path / "new" / name).read_bytes()
        if name == "summary.json":
            old, new = ({k: v for k, v in json.loads(b).items() if k != "wall_s"} for b in (old, new))
        assert old == new, name
