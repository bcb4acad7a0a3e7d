"""The fast provider's per-step path (stepsim/kernels/serve_fast.py, SyntheticRouting.window): the machine-code
draws follow the synthetic model's law, a routing window's features are those of its rows, the provider's
regressors are the calibration's float for float (two-token steps too, whose column reads the rows), and the fast
path is seeded; the engine facts behind the two-token column."""

from __future__ import annotations

import json

import numpy as np
import pytest
from test_exact import SMALL

from stepsim.base.hardware import PRESETS
from stepsim.kernels.serve_fast import alias_tables, draw_routing
from stepsim.models.presets import resolve_model
from stepsim.serve.fast import FEW_TOKENS, FastLatency, features, ffn_regressors, metric_forms, pair_parity, regressors
from stepsim.serve.latency import IterationBatch
from stepsim.serve.layers import KINDS, KV_TILE
from stepsim.serve.routing import POOL_TOKENS, ReplayRouting, SyntheticRouting, sorted_counts


def test_alias_tables_give_each_column_its_probability():
    weights = np.exp(-0.3 * np.log(np.arange(128) + 1.0) - 0.05 * np.arange(128))[None, :]
    weights = np.vstack([weights, np.arange(1.0, 9.0).repeat(16)[None, :]])
    prob, alias = alias_tables(weights)
    for row in range(2):
        n = weights.shape[1]
        got = prob[row].copy()
        np.add.at(got, alias[row], 1.0 - prob[row])
        assert np.abs(got / n - weights[row] / weights[row].sum()).max() < 1e-15


def test_machine_code_draws_follow_the_synthetic_law():
    """Slot 0 is a categorical draw of the layer's probabilities; the eight slots are distinct; and the numbers
    the routing model was fitted on (mean idle experts and busiest expert of 64-token batches, route(): 60.03
    and 39.338 over 500 batches, tests/serve/test_routing.py) hold for the fast path's batches too."""
    model = SyntheticRouting(128, 8, 1, seed=0)
    p = np.exp(model._logits[0] - model._logits[0].max())
    prob, alias = alias_tables(p[None, :])
    state = np.array([12345], dtype=np.uint64)
    out = np.empty((200_000, 1, 8), dtype=np.int64)
    counts = np.zeros((1, 128), dtype=np.int64)
    draw_routing(prob, alias, state, 0.0, np.zeros((1, 8), dtype=np.int64), False, out, counts)
    assert np.array_equal(counts[0], np.bincount(out.ravel(), minlength=128))
    assert all(len(set(row)) == 8 for row in out[:2000, 0])
    expected = p / p.sum() * len(out)
    chi2 = float((((np.bincount(out[:, 0, 0], minlength=128) - expected) ** 2) / expected).sum())
    assert round(chi2, 2) == 109.38  # 127 degrees of freedom: p = 0.87
    batches = np.stack([sorted_counts(model.window(64, KV_TILE)[1]()[:, 0, :], 128) for _ in range(500)])
    idle, busiest = (batches == 0).sum(1).mean(), batches[:, 0].mean()
    assert (idle, busiest) == (60.232, 39.65)
    assert abs(idle / 60.03 - 1) < 0.01 and abs(busiest / 39.338 - 1) < 0.01  # route()'s, within sampling error


def test_a_windows_features_are_its_rows_features():
    routing = SyntheticRouting(16, 2, 3, seed=5)
    for tokens in (1, 7, 33, 500, POOL_TOKENS - 1, POOL_TOKENS + 70):  # the last wraps around the pool
        f, rows = routing.window(tokens, KV_TILE)
        r = rows()
        assert r.shape == (tokens, 3, 2) and (r[:, :, 0] != r[:, :, 1]).all()
        want = np.array([features("ffn", r[:, layer])[1:] for layer in range(3)])
        assert np.array_equal(f, want), tokens
    # each layer's most popular expert is its rank-0 expert (layers keep their own permutation)
    r = routing.window(4000, KV_TILE)[1]()
    assert [int(np.argmax(np.bincount(r[:, layer].ravel()))) for layer in range(3)] == \
        [int(np.argmin(routing._perms[layer])) for layer in range(3)]


def test_replay_windows_are_the_dump_rows_in_order(tmp_path):
    rng = np.random.default_rng(2)
    dump = np.stack([[rng.choice(128, 8, replace=False) for _ in range(3)] for _ in range(50)])  # [50, 3, 8]
    np.save(tmp_path / "r.npy", dump)
    a, b = ReplayRouting(tmp_path / "r.npy", "qwen3-30b-a3b", 2), ReplayRouting(tmp_path / "r.npy", "qwen3-30b-a3b", 2)
    for tokens in (4, 30, 49, 120):
        f, rows = a.window(tokens, KV_TILE)
        want = b.route(tokens)
        assert np.array_equal(rows(), want)
        assert np.array_equal(f, [features("ffn", want[:, layer])[1:] for layer in range(2)])


@pytest.mark.parametrize("variant", ["moe", "dense", "shared", "many"])
def test_the_providers_regressors_are_the_calibrations(tmp_path, variant):
    """16 experts (expert_rounds columns), a dense FFN, 16 experts with two shared ones (their tiles' column), 32
    experts (no rounds columns)."""
    moe = variant != "dense"
    config = dict(SMALL) if moe else {k: v for k, v in SMALL.items() if k not in ("num_experts", "moe_intermediate_size",
                                                                                    "num_experts_per_tok")}
    if not moe:
        config["model_type"] = "qwen3"
    config.update({"shared": {"n_shared_experts": 2}, "many": {"num_experts": 32}}.get(variant, {}))
    (tmp_path / "m.json").write_text(json.dumps(config))
    model = resolve_model(str(tmp_path / "m.json"))
    routing = SyntheticRouting(model.experts, model.top_k, model.layers, seed=0) if moe else None
    p = FastLatency(model, PRESETS["sn40l"], routing, max_model_len=4096, vocab=1000, forms=None)
    p.forms = {k: metric_forms(k, p.spec) for k in KINDS}
    rng = np.random.default_rng(1)
    for _ in range(40):
        n = int(rng.integers(1, 40))
        new = [1 if rng.random() < 0.7 else int(rng.integers(2, 600)) for _ in range(n)]
        batch = IterationBatch(rng.integers(0, 3000, n).tolist(), new, 0, 0)
        decode, prefill = p.attention_regressors(batch)
        x, ffn = p.ffn_rows(sum(new))
        tasks, _ = p.tasks(batch, ffn())
        got = {"decode": decode, "prefill": prefill}
        for kind, data in tasks:
            if kind != "ffn":
                assert np.array_equal(regressors(kind, data, p.forms[kind], p.spec), got.pop(kind))
        assert all(v is None for v in got.values())
        pieces = np.stack([data for kind, data in tasks if kind == "ffn"], axis=1)
        assert np.array_equal(ffn_regressors(pieces, p.forms["ffn"], p.spec), x)
    # the structural eight, few_tokens(), pair_parity(); then the shared experts' tiles, expert_rounds()
    assert x.shape[1] == 8 + FEW_TOKENS + 1 + {"moe": 16, "dense": 0, "shared": 1 + 16, "many": 0}[variant]


def test_the_fast_path_is_seeded():
    a, b, c = (SyntheticRouting(128, 8, 4, seed=s) for s in (3, 3, 4))
    for tokens in (5, 300):
        fa, ra = a.window(tokens, KV_TILE)
        fb, rb = b.window(tokens, KV_TILE)
        fc, rc = c.window(tokens, KV_TILE)
        assert np.array_equal(fa, fb) and np.array_equal(ra(), rb()) and not np.array_equal(ra(), rc())
    # the exact provider's stream is not touched by the fast path's
    d, e = SyntheticRouting(128, 8, 4, seed=3), SyntheticRouting(128, 8, 4, seed=3)
    d.window(100, KV_TILE)
    assert np.array_equal(d.route(10), e.route(10))


def test_the_reservoir_keeps_every_decode_batch_size_bucket():
    from stepsim.serve.fast import BUCKET_ITERATIONS, Reservoir

    made = []
    reservoir = Reservoir(5, seed=0)
    sizes = [1] * 200 + [2, 3] * 4 + [5] + [1] * 50 + [9, 40]  # one-sequence steps dominate; a single 5-step
    for step, n in enumerate(sizes):
        batch = IterationBatch([10] * n, [1] * n, 0, n)
        reservoir(batch, False, lambda step=step: made.append(step) or ([("decode", step)], None))
    for step in range(3):  # prefill steps: no bucket
        reservoir(IterationBatch([0], [40], 40, 0), True, lambda: ([("prefill", None)], None))
    assert reservoir.seen == {"prefill": 3, "decode": 261}
    assert {b: len(items) for b, items in reservoir.buckets.items()} == {1: BUCKET_ITERATIONS, 2: BUCKET_ITERATIONS,
                                                                         3: BUCKET_ITERATIONS, 5: 1, 12: 1, 14: 1}
    assert reservoir.bucket_seen == {1: 250, 2: 4, 3: 4, 5: 1, 12: 1, 14: 1}  # 9 -> 8 + 4, 40 -> 8 + 6
    items, extra = reservoir.items, reservoir.extra
    assert len(items) == 8 and {i[1] for i in items} == {"prefill", "decode"}
    assert not {i[0] for i in items} & {i[0] for i in extra}
    assert 208 in {i[0] for i in items + extra}  # the one 5-sequence step is fitted
    assert sorted(made) == sorted(set(made))  # tasks made once per kept step, also when both reservoirs keep it


def test_the_reservoir_keeps_prefill_steps_by_their_cached_context_on_mapped_layers():
    """With ``cached_prefill`` (mapped layers) a prefill step whose chunks have cached tokens is also kept by the
    largest cached context's bucket (bit length, keys below 0), BUCKET_ITERATIONS a bucket; a decode request's
    context does not count, nor a chunk from the start; without the flag no such bucket."""
    from stepsim.serve.fast import BUCKET_ITERATIONS, Reservoir

    steps = [IterationBatch([0], [64], 64, 0)] * 20  # first chunks: nothing cached
    steps += [IterationBatch([2048, 5000], [2035, 1], 2035, 1)] * 5  # a second chunk beside a long decode
    steps += [IterationBatch([300, 0], [100, 28], 128, 0), IterationBatch([5000], [1], 0, 1)]
    for flag, buckets in ((True, {-12: BUCKET_ITERATIONS, -9: 1, 1: 1}), (False, {1: 1})):
        reservoir = Reservoir(5, seed=0, cached_prefill=flag)
        for step, batch in enumerate(steps):
            reservoir(batch, batch.prefill_tokens > 0, lambda step=step: ([("step", step)], None))
        assert {b: len(items) for b, items in reservoir.buckets.items()} == buckets
        if flag:
            assert reservoir.bucket_seen == {-12: 5, -9: 1, 1: 1}
            assert [item[0] for item in reservoir.buckets[-9]] == [25]
            assert 25 in {item[0] for item in reservoir.items + reservoir.extra}


@pytest.mark.parametrize("cached_prefill", [False, True])
def test_steps_offered_many_at_a_time_leave_the_reservoir_as_one_by_one(cached_prefill):
    """``Reservoir.offer_steps`` (the compiled pilot's offers, many steps a call) leaves the reservoirs, their
    counts, their buckets in the order met and the generators as ``__call__`` step by step does, over thousands of
    steps (every reservoir full, most offers drawing) cut into random runs, and makes only the steps still kept."""
    from stepsim.serve.fast import Reservoir

    rng = np.random.default_rng(7)
    n = 4000
    prefill = rng.random(n) < 0.15
    sequences = np.where(rng.random(n) < 0.6, 1, rng.integers(1, 70, n))
    batches = []
    for i in range(n):
        if prefill[i]:
            context = rng.integers(0, 3000, sequences[i]) * (rng.random(sequences[i]) < 0.5)
            new = rng.integers(1, 300, sequences[i])
        else:
            context, new = rng.integers(1, 3000, sequences[i]), np.ones(sequences[i], dtype=np.int64)
        batches.append(IterationBatch(context.tolist(), new.tolist(), int(new[new != 1].sum()), int((new == 1).sum())))
    one = Reservoir(5, seed=3, cached_prefill=cached_prefill)
    for i, batch in enumerate(batches):
        one(batch, bool(prefill[i]), lambda i=i: ([("step", i)], None))
    many = Reservoir(5, seed=3, cached_prefill=cached_prefill)
    made = []
    cuts = np.sort(rng.choice(np.arange(1, n), size=40, replace=False))
    for begin, end in zip([0, *cuts], [*cuts, n]):
        cached = np.array([max((c for c, t in zip(b.context_tokens, b.new_tokens) if t != 1), default=0)
                           for b in batches[begin:end]])

        def make(i, begin=begin):
            made.append(begin + i)
            return batches[begin + i], [("step", begin + i)]
        many.offer_steps(prefill[begin:end], sequences[begin:end], cached, make)
    assert (many.strata, many.seen, many.steps) == (one.strata, one.seen, one.steps)
    assert list(many.buckets.items()) == list(one.buckets.items())
    assert list(many.bucket_seen.items()) == list(one.bucket_seen.items())
    for name in ("_rng", "_bucket_rng", "_cached_rng"):
        assert getattr(many, name).bit_generator.state == getattr(one, name).bit_generator.state
    assert one.seen["decode"] > 100 * 5 and len(one.buckets) > 8  # the reservoirs drew, most of the offers
    assert len(made) == len(set(made)) < 600  # the kept steps of each call, once each
    # what offer_steps rests on: NumPy draws an array of bounds as it draws them one at a time
    bounds = 1 + (rng.integers(1, 1 << 40, 3000) >> rng.integers(0, 41, 3000))  # 1 to 2^40
    scalar, array = np.random.default_rng(11), np.random.default_rng(11)
    assert [int(scalar.integers(0, int(b))) for b in bounds] == array.integers(0, bounds).tolist()
    assert scalar.bit_generator.state == array.bit_generator.state


def test_without_coefficients_every_piece_is_priced_at_its_bound(tmp_path):
    """The first calibration pass (theta None) prices each piece by ``ceil(max(HBM bound, compute bound))`` of
    its own metrics, the FFN too (its bound is not its last regressor: the few-token indicators follow it)."""
    import math

    from stepsim.serve.fast import BOUND_COMPUTE_BW
    from stepsim.serve.layers import build

    (tmp_path / "m.json").write_text(json.dumps(SMALL))
    model = resolve_model(str(tmp_path / "m.json"))

    def provider():
        p = FastLatency(model, PRESETS["sn40l"], SyntheticRouting(model.experts, model.top_k, model.layers, seed=0),
                        max_model_len=4096, vocab=1000, forms=None)
        p.forms = {k: metric_forms(k, p.spec) for k in KINDS}
        return p

    priced, pieces = provider(), provider()  # same seed: the same routing windows, step after step

    def bound(kind, data):
        m = build(kind, data, pieces.spec).metrics()
        return math.ceil(max(m["off_chip_bytes"] / pieces.hardware.hbm_peak_bytes_per_cycle,
                             m["graph_flops"] / BOUND_COMPUTE_BW))

    got, expected = [], []
    for new in ([1], [1, 1, 1], [40, 1], [17, 1]):
        prefill = sum(n for n in new if n > 1)
        batch = IterationBatch([100] * len(new), new, prefill, sum(new) - prefill)
        got.append(priced(batch).cycles["ffn"])
        _, ffn = pieces.ffn_rows(sum(new))
        tasks, _ = pieces.tasks(batch, ffn())
        expected.append(sum(bound(kind, data) for kind, data in tasks if kind == "ffn"))
    assert got == expected


def test_pair_parity_is_whether_two_tokens_share_an_odd_number_of_experts():
    first = np.array([[0, 1, 2, 3], [0, 1, 2, 3], [0, 1, 2, 3], [7, 6, 5, 4]])
    second = np.array([[4, 5, 6, 7], [3, 9, 8, 10], [1, 0, 9, 8], [4, 5, 6, 7]])  # shared: 0, 1, 2, 4
    assert pair_parity(np.stack([first, second])).tolist() == [0.0, 1.0, 0.0, 0.0]
    assert pair_parity(np.stack([first, second, first])).tolist() == [0.0] * 4  # 3 tokens: no column
    assert pair_parity(first[None]).tolist() == [0.0] * 4


def test_two_token_steps_regressors_are_the_calibrations(tmp_path):
    (tmp_path / "m.json").write_text(json.dumps(SMALL))
    model = resolve_model(str(tmp_path / "m.json"))
    p = FastLatency(model, PRESETS["sn40l"], SyntheticRouting(model.experts, model.top_k, model.layers, seed=0),
                    max_model_len=4096, vocab=1000, forms=None)
    p.forms = {k: metric_forms(k, p.spec) for k in KINDS}
    seen = []
    for _ in range(30):
        x, ffn = p.ffn_rows(2)
        tasks, _ = p.tasks(IterationBatch([5, 9], [1, 1], 0, 0), ffn())
        pieces = np.stack([data for kind, data in tasks if kind == "ffn"], axis=1)
        assert np.array_equal(ffn_regressors(pieces, p.forms["ffn"], p.spec), x)
        seen += x[:, 8 + FEW_TOKENS].tolist()  # pair_parity()
    assert set(seen) == {0.0, 1.0}


@pytest.mark.slow
def test_two_token_moe_cycles_follow_the_shared_experts_not_their_ids():
    """Why :func:`stepsim.serve.fast.pair_parity` exists: on the Qwen3-30B-A3B shape (sn40l) a two-token MoE
    layer's cycles do not move when every expert id shifts or the second token's unshared experts change, but do
    with how many experts the tokens share, not monotonically (6: 132,759; 7: 70,319; 8: 101,672), and with which
    token has the lower ids; one token takes 150,316 whatever its experts."""
    from pathlib import Path

    from stepsim.serve.exact import layer_task, max_kv_rows
    from stepsim.serve.layers import LayerSpec

    model = resolve_model(str(Path(__file__).resolve().parents[2] / "examples" / "qwen3-30b-a3b-4layers.json"))
    spec = LayerSpec(model, PRESETS["sn40l"], max_kv_rows(40960))

    def cycles(rows):
        return layer_task(spec, "ffn", np.array(rows, dtype=np.int64))[0]

    a = list(range(8))
    assert {cycles([a, a[:6] + [o, o + 1]]) for o in (8, 58, 100)} == {132759}
    assert {cycles([[e + d for e in a], [e + d for e in a[:6] + [8, 9]]]) for d in (1, 25, 100)} == {132759}
    assert [cycles([a, a[:s] + list(range(8, 16 - s))]) for s in (7, 8)] == [70319, 101672]
    assert [cycles([a, list(range(8, 16))]), cycles([list(range(8, 16)), a])] == [107864, 111910]
    assert {cycles([a]), cycles([list(range(120, 128))])} == {150316}
