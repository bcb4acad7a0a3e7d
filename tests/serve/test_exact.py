"""--fidelity exact: layer templates rebound per iteration give the programs (and cycles) of fresh builds; the
provider's step cycles are the documented sum of engine cycles; serve runs are deterministic, identical on
--jobs 2, and every bad combination is one line."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from serve_requests import requests_file

import stepsim
from stepsim.base.errors import ConfigError
from stepsim.base.hardware import PRESETS, Hardware
from stepsim.models.presets import resolve_model
from stepsim.serve.exact import EngineLatency, max_kv_rows, weight_cycles
from stepsim.serve.latency import IterationBatch
from stepsim.serve.layers import LayerRunner, LayerSpec, build, lowered, make_template, shape_of
from stepsim.serve.output import read_outputs
from stepsim.serve.routing import SyntheticRouting
from stepsim.simulation.simulate import simulate

SMALL = {"model_type": "qwen3_moe", "hidden_size": 256, "intermediate_size": 512, "moe_intermediate_size": 128,
         "num_experts": 16, "num_experts_per_tok": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
         "head_dim": 32, "num_hidden_layers": 2, "vocab_size": 1000, "max_position_embeddings": 4096}


@pytest.fixture
def small_model(tmp_path):
    path = tmp_path / "small.json"
    path.write_text(json.dumps(SMALL))
    return path


def _same_program(a, b) -> bool:
    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, np.ndarray):
            if x.shape != y.shape or not np.array_equal(x, y):
                return False
        elif f.name != "hardware" and x != y:
            return False
    return True


def _cases(rng):
    skewed = SyntheticRouting(128, 8, 1, seed=5)
    return [
        *(("decode", rng.integers(0, 3000, b)) for b in (1, 1, 2, 5, 5, 16)),
        ("decode", np.zeros(3, dtype=np.int64)),
        ("prefill", (np.array([0]), np.array([100]))),
        ("prefill", (np.array([37]), np.array([64]))),
        ("prefill", (np.array([0, 500]), np.array([70, 300]))),
        ("prefill", (np.array([100, 3]), np.array([250, 115]))),
        *(("ffn", np.stack([rng.choice(128, 8, replace=False) for _ in range(b)])) for b in (1, 1, 5, 5)),
        ("ffn", skewed.route(40)[:, 0, :]),
        ("ffn", skewed.route(40)[:, 0, :]),
    ]


def test_rebound_templates_are_fresh_builds_array_for_array_and_cycle_for_cycle():
    spec = LayerSpec(resolve_model("qwen3-30b-a3b"), PRESETS["sn40l"], 4096)
    runner = LayerRunner(spec)
    cycles = []
    for kind, data in _cases(np.random.default_rng(1)):
        template = make_template(kind, shape_of(kind, data), spec)
        workload = build(kind, data, spec)
        assert _same_program(template.bind(data), lowered(workload, spec.hardware)), (kind, shape_of(kind, data))
        c = runner.cycles(kind, data)
        assert c == simulate(workload, spec.hardware).cycles
        cycles.append(c)
    assert runner.builds == 12 and runner.runs == 17  # one template per shape, every case simulated
    assert cycles[:2] == [6876, 7314] and cycles[7:9] == [16014, 14859]


def test_provider_step_is_the_documented_sum(small_model):
    model = resolve_model(str(small_model))
    hw = PRESETS["sn40l"]
    routing = SyntheticRouting(16, 2, 2, seed=0)
    provider = EngineLatency(model, hw, routing, max_model_len=4096, vocab=1000)
    batch = IterationBatch([10, 200, 0], [1, 1, 50], 50, 2)
    cost = provider(batch)
    spec = LayerSpec(model, hw, max_kv_rows(4096))
    assert spec.max_n == 4128
    steps = SyntheticRouting(16, 2, 2, seed=0).route(52)
    decode = simulate(build("decode", np.array([10, 200]), spec), hw).cycles
    prefill = simulate(build("prefill", (np.array([0]), np.array([50])), spec), hw).cycles
    ffn = [simulate(build("ffn", steps[:, layer], spec), hw).cycles for layer in range(2)]
    per_layer, head, row_bytes = weight_cycles(model, hw, 1000)
    assert (per_layer, head, row_bytes) == (-(-(2 * 256 * 4 * 32 + 2 * 256 * 2 * 32 + 256 * 16) * 2 // 1600),
                                            -(-1000 * 256 * 2 // 1600), 512)
    assert cost.cycles == {"attention": 2 * 2 * (decode + prefill), "ffn": sum(ffn),
                           "weights": 2 * per_layer + head + -(-52 * 512 // 1600)}
    assert cost.seconds == sum(cost.cycles.values()) / 1e9
    assert provider.describe() == {"routing": {"mode": "synthetic", "alpha": 0.3, "beta": 0.05, "locality": 0.0},
                                   "simulations": 4}
    assert provider.stats()["templates"] == 3  # both layers share the FFN shape


def test_layer_tasks_go_to_the_workers_a_shape_at_a_time():
    """``shape_chunks``: every task once; the tasks of one (kind, shape) in one chunk (one worker builds its
    template) unless they are more than a worker's share, then split over the workers; largest chunks first."""
    from stepsim.serve.exact import shape_chunks

    ffn = lambda tokens: ("ffn", np.zeros((tokens, 2), dtype=np.int64))  # noqa: E731
    decode = ("decode", np.array([40, 70]))
    calibration = [decode, ffn(9), ffn(9), ffn(5), ffn(9), decode, ffn(5), ffn(7)] * 3  # no shape dominates
    chunks = shape_chunks(calibration, 2)
    assert sorted(i for c in chunks for i in c) == list(range(24))
    assert chunks == [[1, 2, 4, 9, 10, 12, 17, 18, 20], [0, 5, 8, 13, 16, 21], [3, 6, 11, 14, 19, 22], [7, 15, 23]]
    step = [decode, *[ffn(64)] * 48]  # an exact run's step: its 48 FFN pieces one shape
    assert shape_chunks(step, 2) == [list(range(1, 49, 2)), list(range(2, 49, 2)), [0]]
    assert shape_chunks(step, 4) == [list(range(1 + p, 49, 4)) for p in range(4)] + [[0]]


def _run(model, trace, out, **kw):
    return stepsim.serve(str(model), trace, out=out, fidelity="exact", schedule="paper", **kw)


def test_serve_exact_is_deterministic_and_the_same_on_two_workers(small_model, tmp_path):
    trace = requests_file(tmp_path / "t.parquet", [0.0, 0.0005, 0.001, 0.02], [40, 300, 7, 90], [6, 3, 9, 4])
    a = _run(small_model, trace, tmp_path / "a")
    b = _run(small_model, trace, tmp_path / "b", jobs=2)
    for name in ("requests.parquet", "iterations.parquet"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    req, it, summary = read_outputs(tmp_path / "a")
    assert req.equals(a.requests) and it.equals(a.iterations) and b.requests.equals(a.requests)
    cycles = sum(it[f"cycles_{k}"].to_numpy() for k in ("attention", "ffn", "weights"))
    assert np.array_equal(it["duration_s"].to_numpy(), cycles / 1e9)
    assert it.column_names[-7:] == ["cycles_attention", "cycles_ffn", "cycles_weights",
                                    "hbm_bytes", "flops", "hbm_utilisation", "compute_utilisation"]
    assert summary["fidelity"]["mode"] == "exact" and summary["fidelity"]["error"] is None
    assert summary["fidelity"]["simulations"] == 4 * it.num_rows - int((it["prefill_tokens"].to_numpy() == 0).sum()) \
        - int((it["decode_tokens"].to_numpy() == 0).sum())
    assert req["output_tokens"].to_pylist() == [6, 3, 9, 4] and summary["completed"] == 4
    c = _run(small_model, trace, tmp_path / "c", seed=1)  # another routing seed: other FFN cycles
    assert not c.iterations["cycles_ffn"].equals(a.iterations["cycles_ffn"])
    assert c.iterations["cycles_attention"].equals(a.iterations["cycles_attention"])


def test_serve_exact_replays_a_routing_dump(small_model, tmp_path):
    trace = requests_file(tmp_path / "t.parquet", [0.0, 0.0], [20, 5], [3, 2])
    dump = np.stack([np.stack([np.array([t % 16, (t + 3) % 16]), np.array([(t + 7) % 16, (t + 1) % 16])])
                     for t in range(9)])  # [9 tokens, 2 layers, top-2]
    np.save(tmp_path / "routing.npy", dump)
    r = _run(small_model, trace, tmp_path / "o", routing=str(tmp_path / "routing.npy"))
    assert r.summary["fidelity"]["routing"] == {"mode": "replay", "file": str(tmp_path / "routing.npy"), "tokens": 9}
    # the first step is both prompts (25 tokens): dump rows 0..8, 0..8, 0..6 in order
    spec = LayerSpec(resolve_model(str(small_model)), PRESETS["sn40l"], max_kv_rows(4096))
    rows = dump[np.arange(25) % 9]
    first = sum(simulate(build("ffn", rows[:, layer], spec), spec.hardware).cycles for layer in range(2))
    assert r.iterations["cycles_ffn"][0].as_py() == first


def test_a_layer_that_does_not_fit_on_chip_is_one_line(small_model, tmp_path):
    trace = requests_file(tmp_path / "t.parquet", [0.0], [20], [2])
    hw = Hardware.preset("sn40l", on_chip_capacity_bytes=100_000)
    with pytest.raises(ConfigError) as e:
        stepsim.serve(str(small_model), trace, fidelity="exact", schedule="paper", hardware=hw)
    assert str(e.value) == ("serving layer 'ffn' at shape (20,) needs 3,148,290 bytes on chip; hardware "
                            "'sn40l+on_chip_capacity_bytes=100000' has 100,000 (3,048,290 bytes short)")


@pytest.mark.parametrize("kw, message", [
    (dict(fidelity="exact", schedule="paper", iteration_latency=0.01), "--iteration-latency and --fidelity both price the steps; "
                                                     "give one"),
    (dict(iteration_latency=0.01, routing="synthetic"), "--routing is for the engine-backed latency (--fidelity "
                                                        "exact|fast); --iteration-latency does not simulate layers"),
    (dict(iteration_latency=0.01, jobs=2), "--jobs is for the engine-backed latency (--fidelity exact|fast); "
                                           "--iteration-latency does not simulate layers"),
    (dict(fidelity="exact", schedule="paper", jobs=0), "--jobs must be an int >= 1 (leave it out to use every CPU: {cpus}), got 0"),
    (dict(), "stepsim serve needs --iteration-latency SECONDS or --fidelity exact|fast"),
])
def test_bad_combinations_are_one_line(small_model, tmp_path, kw, message):
    from stepsim.batch.executors import default_jobs

    trace = requests_file(tmp_path / "t.parquet", [0.0], [20], [2])
    with pytest.raises(ConfigError) as e:
        stepsim.serve(str(small_model), trace, **kw)
    assert str(e.value) == message.format(cpus=default_jobs())


def test_dense_model_takes_no_routing(tmp_path):
    dense = {k: v for k, v in SMALL.items() if k not in ("moe_intermediate_size", "num_experts",
                                                          "num_experts_per_tok")}
    dense["model_type"] = "qwen3"
    (tmp_path / "dense.json").write_text(json.dumps(dense))
    trace = requests_file(tmp_path / "t.parquet", [0.0, 0.0], [20, 3], [2, 2])
    with pytest.raises(ConfigError) as e:
        stepsim.serve(str(tmp_path / "dense.json"), trace, fidelity="exact", schedule="paper", routing="synthetic")
    assert str(e.value) == f"--routing: model '{tmp_path / 'dense.json'}' is dense (no routed experts)"
    r = stepsim.serve(str(tmp_path / "dense.json"), trace, fidelity="exact", schedule="paper")
    assert r.summary["fidelity"]["routing"] is None and r.summary["completed"] == 2


def test_an_ffn_piece_that_deadlocks_runs_again_with_deeper_fifos(monkeypatch):
    import stepsim.serve.layers as layers
    from stepsim.base.errors import DeadlockError

    spec = LayerSpec(resolve_model("qwen3-30b-a3b"), PRESETS["sn40l"], 4096)
    routing = SyntheticRouting(128, 8, 1, seed=0).route(2048)[:, 0, :]  # skewed: deadlocks at depth 2
    with pytest.raises(DeadlockError):
        simulate(build("ffn", routing, spec, depth=2), spec.hardware)
    monkeypatch.setattr(layers, "FFN_DEPTHS", (2, 64))
    runner = LayerRunner(spec)
    assert runner.cycles("ffn", routing) == simulate(build("ffn", routing, spec, depth=64), spec.hardware).cycles
    assert (runner.builds, runner.runs) == (2, 2)
