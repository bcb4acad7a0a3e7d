"""Expert parallelism of the decoder layer (``--ep N``, stepsim.workloads.decoder.expert_parallel): KV heads over N
chips and reduce-scattered, the MoE block's tokens sharded over the same chips and sent to their experts' chips by
the sharded all-to-all; values and KV caches equal to the one-chip layer, bytes per link equal to the metric and to
the trace's pairs plus the reduce-scatter's chunks, both engines agree, cycles pinned, one-line errors."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from engines_agree import both_engines, link_unit_bytes

from stepsim.base.errors import ArgumentError, ConfigError
from stepsim.cli import main
from stepsim.graph.lower import lower
from stepsim.models.presets import resolve_model
from stepsim.simulation.simulate import simulate
from stepsim.workloads.config import workload_from_config
from stepsim.workloads.decoder.build import build_decoder
from stepsim.workloads.reference import check_outputs, make_inputs

KV = np.array([5, 40, 17, 64, 3, 33, 100, 31])
#: four KV heads of two query heads each, so 2 and 4 chips both own whole KV heads; 8 experts, top-2
QWEN_EP = dataclasses.replace(resolve_model("qwen"), hidden=64, heads=8, kv_heads=4, head_dim=16,
                              expert_intermediate=64, experts=8, top_k=2)
SHARED_EP = dataclasses.replace(QWEN_EP, shared_experts=1, shared_intermediate=32)
DENSE = dataclasses.replace(resolve_model("llama"), hidden=64, heads=8, kv_heads=4, head_dim=16,
                            dense_intermediate=64)
#: bytes of one token row over a link: D = 64 values timed at 2 bytes (fp32 streams of bf16 tensors)
ROW = 64 * 2


def _routing(batch=8, seed=0):
    rng = np.random.default_rng(seed)
    return np.stack([rng.choice(8, 2, replace=False) for _ in range(batch)])


#: every token to experts 0 and 1: with --ep 4 contiguous (two experts a chip) chips 1-3 receive no token
HOT = np.array([[0, 1], [1, 0]] * 4)


def _build(model, routing=None, **kw):
    batch = kw.pop("batch", 8)
    if model.is_moe and routing is None:
        routing = _routing(batch)
    return build_decoder(model, KV[:batch], routing if model.is_moe else None, tile_f=16, **kw)


def _expected_link_bytes(w, routing):
    """The reduce-scatter's ring over the A = min(n, KV heads) attention chips ``a n/A`` (chip ``a n/A`` -> the
    next: A-1 chunks of B/A rows), each attention chip's shards of B/n rows to the n/A - 1 chips after it, plus,
    for every (token, expert on another chip) pair, one row home -> expert (dispatch) and one back (combine), on
    fully connected chips."""
    n, chips = w.params["ep"], w.params["expert_chips"]
    batch, attn = routing.shape[0], min(n, w.params["kv_heads"])
    spread = n // attn
    out: dict[str, int] = {}

    def add(a, b, nbytes):
        out[f"chip{a}->chip{b}"] = out.get(f"chip{a}->chip{b}", 0) + nbytes

    for a in range(attn if attn > 1 else 0):
        add(a * spread, (a + 1) % attn * spread, (attn - 1) * (batch // attn) * ROW)
        for j in range(1, spread):
            add(a * spread, a * spread + j, batch // n * ROW)
    for j in range(1, spread if attn == 1 else 0):
        add(0, j, batch // n * ROW)
    for t, experts in enumerate(routing):
        home = t // (batch // n)
        for e in experts:
            if chips[e] != home:
                add(home, chips[e], ROW)
                add(chips[e], home, ROW)
    return out


CASES = [  # (id, model, ep, placement, routing, kw)
    ("2-contiguous", QWEN_EP, 2, "contiguous", None, {}),
    ("2-round-robin", QWEN_EP, 2, "round-robin", None, {}),
    ("2-load-balanced", QWEN_EP, 2, "load-balanced", None, {}),
    ("4-contiguous", QWEN_EP, 4, "contiguous", None, {}),
    ("4-round-robin", QWEN_EP, 4, "round-robin", None, dict(strategy="interleave")),
    ("4-load-balanced", QWEN_EP, 4, "load-balanced", None, {}),
    ("2-shared-expert", SHARED_EP, 2, "load-balanced", None, dict(strategy="coarse")),
    ("4-dynamic-tiling", QWEN_EP, 4, "round-robin", None, dict(tiling="dynamic")),
    ("4-chips-without-tokens", QWEN_EP, 4, "contiguous", HOT, {}),
    ("4-chips-2-kv-heads", QWEN_EP, 4, "round-robin", None, dict(kv_heads=2)),  # more chips than KV heads
    ("2-chips-1-kv-head", SHARED_EP, 2, "contiguous", None, dict(kv_heads=1)),
    ("2-chips-4-regions", QWEN_EP, 2, "round-robin", None, dict(regions=4)),  # each chip's 4 experts on 2 regions
    ("4-chips-4-regions-dynamic", SHARED_EP, 4, "load-balanced", None, dict(regions=4, tiling="dynamic")),
]


@pytest.mark.parametrize("model, ep, placement, routing, kw", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_values_and_kv_caches_equal_the_one_chip_layer(model, ep, placement, routing, kw):
    routing = _routing() if routing is None else routing
    one = _build(model, routing, softmax="stable", **kw)
    w = _build(model, routing, softmax="stable", ep=ep, placement=placement, **kw)
    inputs, whole = make_inputs(w, seed=3), make_inputs(one, seed=3)
    rows = 8 // ep
    for c in range(ep):  # chip c holds its shard's rows of x and of the routing weights, drawn as one chip's
        np.testing.assert_array_equal(inputs[f"x.{c}"], whole["x"][c * rows:(c + 1) * rows])
        np.testing.assert_array_equal(inputs[f"routing_weights.{c}"], whole["routing_weights"][c * rows:(c + 1) * rows])
    assert "x" not in inputs and "routing_weights" not in inputs
    r = simulate(w, functional=True, inputs=inputs)
    checks = check_outputs(w, r.inputs, r.outputs)
    heads = kw.get("kv_heads", 4)
    assert sorted(checks) == sorted([f"h{h}_{c}_cache" for h in range(heads) for c in "kv"]
                                    + [f"y.{c}" for c in range(ep)])
    assert all(c.passed for c in checks.values()), checks
    r1 = simulate(one, functional=True, inputs=whole)
    for name in (f"h{h}_{c}_cache" for h in range(heads) for c in "kv"):  # written by the chip owning the head
        np.testing.assert_array_equal(r.outputs[name], r1.outputs[name])
    y = np.concatenate([r.outputs[f"y.{c}"] for c in range(ep)])
    np.testing.assert_allclose(y, r1.outputs["y"], rtol=0, atol=1e-5)
    assert np.abs(y).max() > 0.1  # the comparison above is not between two near-zero outputs


@pytest.mark.parametrize("ep, placement, routing, cycles, expert_chips, chip_tokens, kw", [
    (2, "contiguous", None, 2559, [0, 0, 0, 0, 1, 1, 1, 1], [5, 11], {}),
    (2, "round-robin", None, 2559, [0, 1, 0, 1, 0, 1, 0, 1], [3, 13], {}),
    # load-balanced keeps the contiguous halves: every expert with tokens is one tile, 4 on each chip
    (2, "load-balanced", None, 2559, [0, 0, 0, 0, 1, 1, 1, 1], [5, 11], {}),
    (4, "contiguous", None, 3510, [0, 0, 1, 1, 2, 2, 3, 3], [2, 3, 5, 6], {}),
    (4, "round-robin", None, 3510, [0, 1, 2, 3, 0, 1, 2, 3], [2, 5, 1, 8], {}),
    (4, "load-balanced", None, 3510, [0, 0, 1, 1, 2, 2, 3, 3], [2, 3, 5, 6], {}),
    (4, "contiguous", HOT, 3514, [0, 0, 1, 1, 2, 2, 3, 3], [16, 0, 0, 0], {}),
    # more chips than KV heads: chips 0 and 2 run the attention, each sends a shard to the chip after it
    (4, "round-robin", None, 3010, [0, 1, 2, 3, 0, 1, 2, 3], [2, 5, 1, 8], dict(kv_heads=2)),
    (2, "contiguous", None, 2540, [0, 0, 0, 0, 1, 1, 1, 1], [5, 11], dict(kv_heads=1)),
    # time-multiplexed: chip 0's experts 0, 2 on region 0 and 4, 6 on region 1; chip 1's on regions 2, 3
    (2, "round-robin", None, 2889, [0, 1, 0, 1, 0, 1, 0, 1], [3, 13], dict(regions=4)),
])
def test_link_bytes_token_counts_cycles_and_both_engines(ep, placement, routing, cycles, expert_chips, chip_tokens,
                                                         kw):
    routing = _routing() if routing is None else routing
    w = _build(QWEN_EP, routing, ep=ep, placement=placement, **kw)
    p = w.params
    assert p["expert_chips"] == expert_chips
    if "regions" in kw:
        assert p["region_experts"] == [[0, 2], [4, 6], [1, 3], [5, 7]]
    # the trace's per-chip rows: every (token, expert) pair counts on its expert's chip
    counted = [sum(int(p["expert_chips"][e] == c) for e in routing.ravel()) for c in range(ep)]
    assert p["chip_tokens"] == counted == chip_tokens
    assert p["shard_bounds"] == [c * 8 // ep for c in range(ep + 1)]
    # a link whose transfers carry no row of this trace is still built (a chip's merge takes every home chip)
    assert {k: b for k, b in p["link_bytes"].items() if b} == _expected_link_bytes(w, routing)
    program = lower(w.graph, channel_depth=w.channel_depth)
    fast = both_engines(program)
    assert fast.cycles == simulate(w).cycles == cycles
    assert link_unit_bytes(program, fast) == p["link_bytes"]


@pytest.mark.parametrize("seed", [11, 12, 13, 14, 15])
def test_both_engines_agree_on_random_multi_chip_layers(seed):
    """Random routing, chips, placement, strategy, tiling, reduce-scatter algorithm, KV heads (fewer than the
    chips or not) and time-multiplexed regions."""
    rng = np.random.default_rng(seed)
    ep = int(rng.choice([2, 4]))
    placement = str(rng.choice(["contiguous", "round-robin", "load-balanced"]))
    kw = dict(strategy=str(rng.choice(["dynamic", "interleave", "coarse"])),
              tiling=str(rng.choice(["static", "dynamic"])), algorithm=str(rng.choice(["ring", "direct"])),
              kv_heads=int(rng.choice([1, 2, 4])), regions=[None, 4][int(rng.integers(2))])
    w = _build(SHARED_EP if rng.random() < 0.5 else QWEN_EP, _routing(seed=seed), ep=ep, placement=placement, **kw)
    program = lower(w.graph, channel_depth=w.channel_depth)
    fast = both_engines(program)
    assert fast.cycles > 0
    assert sum(int(b) for b in fast.link_bytes) == sum(w.params["link_bytes"].values())


@pytest.mark.parametrize("model, kw, message", [
    (DENSE, dict(ep=2), "--ep 2: model 'llama-3.1-8b' is dense; expert parallelism needs routed experts (use --tp 2)"),
    (QWEN_EP, dict(ep=16), "--ep 16 places 8 experts on more chips than experts: a chip without experts has nothing "
                           "to do (use --ep 8 or fewer)"),
    (QWEN_EP, dict(ep=3), "--ep 3: the attention splits its 4 KV heads (--kv-heads) over the 3 chips; the chips "
                          "must divide them or be a multiple of them"),
    (QWEN_EP, dict(ep=4, kv_heads=3), "--ep 4: the attention splits its 3 KV heads (--kv-heads) over the 4 chips; "
                                      "the chips must divide them or be a multiple of them"),
    (QWEN_EP, dict(ep=4, batch=6), "--ep 4: the reduce-scatter cuts the 6 rows into 4 shards; the batch must be a "
                                   "multiple of 4"),
    (QWEN_EP, dict(ep=4, regions=2), "--regions 2 must be a multiple of --ep 4: every chip time-multiplexes its "
                                     "experts on the same number of regions"),
    (QWEN_EP, dict(ep=2, tp=2, regions=4), "--tp does not combine with --regions (time-multiplexed expert regions) "
                                           "yet"),
    (QWEN_EP, dict(ep=2, tp=3), "--tp 3 --ep 2: each of the 2 expert groups' shards of the batch is cut into 3 "
                                "all-reduce chunks; the batch of 8 tokens must be a multiple of 6"),
    (QWEN_EP, dict(ep=2, tp=3, kv_heads=4, batch=6), "--tp 3 --ep 2: the attention splits its 4 KV heads "
                                                     "(--kv-heads) over the 6 chips; the chips must divide them or be "
                                                     "a multiple of them"),
    (QWEN_EP, dict(ep=2, tp=2, layers=2), "--tp does not combine with --ep in a stack of decoder layers yet"),
    (QWEN_EP, dict(ep=2, placement="random"), "placement must be one of contiguous, round-robin, load-balanced, "
                                              "got 'random'"),
    (QWEN_EP, dict(ep=1), "--ep must be an int >= 2 (chips), got 1"),
])
def test_bad_expert_parallel_layers_are_one_line(model, kw, message):
    with pytest.raises(ArgumentError) as info:
        _build(model, **kw)
    assert str(info.value) == message


@pytest.mark.parametrize("extra, message", [
    ({"ep": 4, "system": "ring-2"}, "--ep 4 needs a system of 4 chips; system 'ring-2' has 2"),
    ({"placement": "round-robin"}, "--placement applies to the decoder layer with --ep N (expert parallelism)"),
    ({"ep": 2, "tp": 2, "system": "ring-2"}, "--tp 2 --ep 2 needs a system of 4 chips (tp x ep); system 'ring-2' "
                                             "has 2"),
    ({"ep": 2, "system": "ring-2", "hardware": "sn40l"}, "--hardware does not apply with --system: the system file "
                                                         "names the chips' hardware"),
])
def test_bad_configs_are_one_line(qwen_b64_traces, extra, message):
    with pytest.raises(ConfigError) as info:
        workload_from_config({"workload": "decoder", "model": "qwen", **qwen_b64_traces, **extra})
    assert str(info.value) == message


@pytest.mark.parametrize("argv, message", [
    (["--ep", "6"], "--ep 6: the attention splits its 4 KV heads (--kv-heads) over the 6 chips; the chips "
                    "must divide them or be a multiple of them"),
    (["--model", "llama", "--ep", "2"], "--ep 2: model 'llama-3.1-8b' is dense; expert parallelism needs routed "
                                        "experts (use --tp 2)"),
])
def test_cli_errors_are_one_line_exit_2(qwen_b64_traces, capsys, argv, message):
    routing = [] if "llama" in argv else ["--routing", qwen_b64_traces["routing"]]
    model = [] if "--model" in argv else ["--model", "qwen"]
    assert main(["run", "decoder", *model, *routing, "--kv-lengths", qwen_b64_traces["kv_lengths"], *argv, "--json"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"stepsim: error: {message}"]


@pytest.mark.parametrize("flags, cycles, chip_tokens", [
    (["--ep", "2", "--placement", "contiguous"], 418500, [227, 285]),
    # load-balanced by the no-regions cost model (moe/ep_cost.py): expert 104 (2 tiles) shares chip 0 with the
    # fewest one-tile experts, the busiest chip's modelled time is not its tokens
    (["--ep", "4", "--placement", "load-balanced", "--system", "ring-4"], 258074, [72, 147, 147, 146]),
    # 8 chips, 4 KV heads: chips 0, 2, 4, 6 run the attention
    (["--ep", "8", "--placement", "load-balanced"], 197462, [42, 68, 67, 67, 67, 67, 67, 67]),
])
def test_qwen_on_the_shared_b64_traces(qwen_b64_traces, capsys, flags, cycles, chip_tokens):
    """Every KV head and all 128 experts of Qwen3-30B-A3B; the off-chip bytes are the one-chip layer's (x and the
    routing weights are read once, in shards)."""
    assert main(["run", "decoder", "--model", "qwen", "--routing", qwen_b64_traces["routing"], "--kv-lengths",
                 qwen_b64_traces["kv_lengths"], *flags, "--json"]) == 0
    row = json.loads(capsys.readouterr().out)
    params = json.loads(row["params"])
    assert (row["cycles"], row["off_chip_bytes_measured"], row["off_chip_bytes_symbolic"]) == (cycles, 730989568,
                                                                                                 730989568)
    assert params["chip_tokens"] == chip_tokens
    assert sum(params["chip_tokens"]) == 64 * 8  # top-8 of 64 tokens
    assert (params["ep"], params["placement"], params["algorithm"]) == (int(flags[1]), flags[3], "ring")


TP_EP = [  # (id, model, tp, ep, placement, kw)
    ("2x2-contiguous", QWEN_EP, 2, 2, "contiguous", {}),
    ("2x2-shared-load-balanced", SHARED_EP, 2, 2, "load-balanced", dict(algorithm="direct")),
    ("2x4-round-robin", QWEN_EP, 2, 4, "round-robin", {}),
    ("4x2-2-kv-heads", QWEN_EP, 4, 2, "contiguous", dict(kv_heads=2, tiling="dynamic")),
]


@pytest.mark.parametrize("model, tp, ep, placement, kw", [c[1:] for c in TP_EP], ids=[c[0] for c in TP_EP])
def test_tp_x_ep_values_equal_the_one_chip_layer(model, tp, ep, placement, kw):
    """--tp T --ep E: the shards' groups of T chips run the MoE block tensor-parallel; every chip of group s holds
    chunk k of shard s's rows of y as y<s T + t>.<k>."""
    routing = _routing()
    one = _build(model, routing, softmax="stable", **kw)
    w = _build(model, routing, softmax="stable", tp=tp, ep=ep, placement=placement, **kw)
    inputs, whole = make_inputs(w, seed=3), make_inputs(one, seed=3)
    cols = 64 // tp
    np.testing.assert_array_equal(inputs["expert005_up.1"], whole["expert005_up"][:, cols:2 * cols])
    r = simulate(w, functional=True, inputs=inputs)
    checks = check_outputs(w, r.inputs, r.outputs)
    heads = kw.get("kv_heads", 4)
    assert sorted(checks) == sorted([f"h{h}_{c}_cache" for h in range(heads) for c in "kv"]
                                    + [f"y{p}.{k}" for p in range(tp * ep) for k in range(tp)])
    assert all(c.passed for c in checks.values()), checks
    r1 = simulate(one, functional=True, inputs=whole)
    for name in (f"h{h}_{c}_cache" for h in range(heads) for c in "kv"):
        np.testing.assert_array_equal(r.outputs[name], r1.outputs[name])
    for t in range(tp):  # every chip of a group holds all its shard's rows, bit-equal to the group's first chip
        y = np.concatenate([r.outputs[f"y{s * tp + t}.{k}"] for s in range(ep) for k in range(tp)])
        np.testing.assert_allclose(y, r1.outputs["y"], rtol=0, atol=1e-5)
        np.testing.assert_array_equal(y, np.concatenate([r.outputs[f"y{s * tp}.{k}"] for s in range(ep)
                                                         for k in range(tp)]))
    assert np.abs(r1.outputs["y"]).max() > 0.1


@pytest.mark.parametrize("tp, ep, placement, cycles, kw", [
    (2, 2, "contiguous", 4859, {}),
    (2, 4, "load-balanced", 4836, {}),
    (4, 2, "round-robin", 3769, dict(algorithm="direct")),
])
def test_tp_x_ep_link_bytes_and_both_engines(tp, ep, placement, cycles, kw):
    w = _build(QWEN_EP, _routing(), tp=tp, ep=ep, placement=placement, **kw)
    p = w.params
    assert (p["tp"], p["ep"], p["system"]) == (tp, ep, f"fully-connected-{tp * ep}")
    program = lower(w.graph, channel_depth=w.channel_depth)
    fast = both_engines(program)
    assert fast.cycles == simulate(w).cycles == cycles
    assert link_unit_bytes(program, fast) == p["link_bytes"]


@pytest.mark.parametrize("seed", [21, 22, 23])
def test_both_engines_agree_on_random_tp_x_ep_layers(seed):
    """Random routing, tp x ep (4 or 8 chips), placement, strategy, tiling, collectives' algorithm and KV heads."""
    rng = np.random.default_rng(seed)
    tp, ep = (int(v) for v in rng.choice([(2, 2), (2, 4), (4, 2)]))
    placement = str(rng.choice(["contiguous", "round-robin", "load-balanced"]))
    kw = dict(strategy=str(rng.choice(["dynamic", "interleave", "coarse"])),
              tiling=str(rng.choice(["static", "dynamic"])), algorithm=str(rng.choice(["ring", "direct"])),
              kv_heads=int(rng.choice([1, 2, 4])))
    w = _build(SHARED_EP if rng.random() < 0.5 else QWEN_EP, _routing(seed=seed), tp=tp, ep=ep, placement=placement,
               **kw)
    program = lower(w.graph, channel_depth=w.channel_depth)
    fast = both_engines(program)
    assert fast.cycles > 0
    assert sum(int(b) for b in fast.link_bytes) == sum(w.params["link_bytes"].values())


def test_qwen_tp_x_ep_on_the_shared_b64_traces(qwen_b64_traces, capsys):
    """--tp 4 --ep 2 on 8 chips: 4 KV heads on chips 0, 2, 4, 6; every chip reads its rows of x (each shard's on
    the 4 chips of its group), so the off-chip bytes are --tp 4's."""
    assert main(["run", "decoder", "--model", "qwen", "--routing", qwen_b64_traces["routing"], "--kv-lengths",
                 qwen_b64_traces["kv_lengths"], "--tp", "4", "--ep", "2", "--placement", "load-balanced", "--json"]) == 0
    row = json.loads(capsys.readouterr().out)
    params = json.loads(row["params"])
    assert (row["cycles"], row["off_chip_bytes_measured"], row["off_chip_bytes_symbolic"]) == (183901, 733351936,
                                                                                                 733351936)
    # load-balanced keeps contiguous (the shard's cost model: within one shared pass of the least)
    assert (params["tp"], params["ep"], params["system"], params["chip_tokens"]) == (
        4, 2, "fully-connected-8", [227] * 4 + [285] * 4)


@pytest.fixture
def small_layer(tmp_path) -> list[str]:
    """The small layer's files for the CLI: a Qwen3-MoE config (D = 64, 4 KV heads, 8 experts of 64, top-2), its
    routing and KV lengths."""
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "qwen3_moe", "hidden_size": 64, "intermediate_size": 128, "moe_intermediate_size": 64,
        "num_experts": 8, "num_experts_per_tok": 2, "num_attention_heads": 8, "num_key_value_heads": 4,
        "head_dim": 16, "num_hidden_layers": 2}))
    np.savez(tmp_path / "routing.npz", data=_routing())
    np.save(tmp_path / "kv.npy", KV)
    return ["--model", str(tmp_path / "config.json"), "--routing", str(tmp_path / "routing.npz"), "--kv-lengths",
            str(tmp_path / "kv.npy"), "--tile-f", "16"]


@pytest.mark.parametrize("flags, cycles", [
    (["--ep", "4", "--placement", "round-robin"], 3506),
    (["--tp", "2", "--ep", "2", "--placement", "load-balanced", "--system", "ring-4"], 5859),
])
def test_cli_functional_check_passes(small_layer, capsys, flags, cycles):
    """``stepsim run decoder --ep N --functional --check``: the chips' y and KV caches against the NumPy reference
    of the one-chip layer."""
    assert main(["run", "decoder", *small_layer, *flags, "--functional", "--check", "--json"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert (row["cycles"], row["check_passed"]) == (cycles, True)
    assert row["check_max_rel_error"] < row["check_tolerance"]


@pytest.mark.parametrize("placement", ["contiguous", "load-balanced"])
def test_tp_x_ep_link_bytes_are_the_collectives_and_the_trace_pairs(placement):
    """--tp 2 --ep 2, 4 KV heads on the 4 chips (ring collectives): link c -> c+1 carries the reduce-scatter's 3
    chunks of 2 rows; the chips of a group swap their 2-row chunks of the shard (the gather) and run a 2-chip ring
    all-reduce of their 4 rows (one 2-row chunk each way in each half); rank t's all-to-all moves one row each way
    per (token, expert in the other group) pair between chips ``g 2 + t``."""
    routing = _routing()
    w = _build(QWEN_EP, routing, tp=2, ep=2, placement=placement)
    group_of = [chip // 2 for chip in w.params["expert_chips"]]
    expected: dict[str, int] = {}

    def add(a, b, rows):
        expected[f"chip{a}->chip{b}"] = expected.get(f"chip{a}->chip{b}", 0) + rows * ROW

    for c in range(4):
        add(c, (c + 1) % 4, 3 * 2)  # the attention's reduce-scatter
    for s in range(2):
        add(2 * s, 2 * s + 1, 2 + 2 * 2)  # the gather, then the all-reduce (2 halves of one 2-row chunk)
        add(2 * s + 1, 2 * s, 2 + 2 * 2)
    for token, experts in enumerate(routing):
        home = token // 4
        for e in experts:
            if group_of[e] != home:
                for t in range(2):
                    add(home * 2 + t, group_of[e] * 2 + t, 1)
                    add(group_of[e] * 2 + t, home * 2 + t, 1)
    assert {k: b for k, b in w.params["link_bytes"].items() if b} == expected
