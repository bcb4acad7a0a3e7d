"""``stepsim optimize --max-chips``: tensor, expert and pipeline parallelism as axes (stepsim/optimize/chips.py).

The combinations ``(tp, ep, pp)`` within the budget, the tile grids each can build, and the pruned search over
tp x ep on one to four chips: its front equals the exhaustive front within the budget, every candidate's cycle
bound holds on its run, and the JSON and Parquet outputs record tp / ep / pp per candidate (read back).
"""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest
from small_routing import write_small_routing

from stepsim.base.system import System
from stepsim.optimize import optimize
from stepsim.optimize.chips import parallel_combos, parallel_grids

#: a small MoE layer: 8 experts, top-2, 24 tokens (fast enough to simulate every candidate)
SMALL = {"model": "custom", "hidden": 512, "intermediate": 512, "experts": 8, "top_k": 2}
TILES = [{"tiling": ("dynamic",), "tile_f": (64, 128)},
         {"tiling": ("static",), "tile_n": (8,), "tile_f": (128,), "regions": (4,)}]
PLACEMENTS = ("contiguous", "round-robin", "load-balanced")


@pytest.fixture
def trace(tmp_path):
    return write_small_routing(tmp_path)[0]


@pytest.mark.parametrize("axes, max_chips, kw, combos", [
    # tp divides the 64 columns and the 24 tokens (3 divides 24, not 64); tp x ep divides 24
    (("tp", "ep"), 8, {"experts": 8, "widths": (64,), "batch": 24},
     [{"ep": 2}, {"tp": 2}, {"ep": 4}, {"tp": 2, "ep": 2}, {"tp": 4}, {"ep": 8}, {"tp": 2, "ep": 4},
      {"tp": 4, "ep": 2}, {"tp": 8}]),
    # 20 tokens: tp x ep must divide them (tp 2 x ep 4 = 8 does not), tp 8 does not divide 20
    (("tp", "ep"), 8, {"experts": 8, "widths": (64,), "batch": 20},
     [{"ep": 2}, {"tp": 2}, {"ep": 4}, {"tp": 2, "ep": 2}, {"tp": 4}, {"ep": 8}]),
    # a shared expert's width must split too: 50 columns rule out tp 4
    (("tp", "ep"), 4, {"experts": 8, "widths": (64, 50), "batch": 24},
     [{"ep": 2}, {"tp": 2}, {"ep": 4}, {"tp": 2, "ep": 2}]),
    # a kind that declares pp: the divisors of its 4 layers; a stack takes neither tp nor ep (its builders refuse)
    (("tp", "ep", "pp"), 4, {"experts": 8, "widths": (64,), "batch": 24, "layers": 4}, [{"pp": 2}, {"pp": 4}]),
    (("tp", "pp"), 4, {"experts": 8, "widths": (64,), "batch": 24, "layers": 3}, [{"pp": 3}]),
    # a system that cannot be scaled: its own chip count only
    (("tp", "ep"), 16, {"experts": 8, "widths": (64,), "batch": 64, "system": System.preset("torus-4x4")},
     [{"tp": 2, "ep": 8}, {"tp": 4, "ep": 4}, {"tp": 8, "ep": 2}, {"tp": 16}]),
])
def test_combinations_within_the_budget(axes, max_chips, kw, combos):
    assert parallel_combos(axes, max_chips, **kw) == combos


def test_each_combination_keeps_the_tiles_it_can_build():
    """tp 2 splits 512 columns into tiles of 64 or 128; tp 4 only of 64 (4 x 128 = 512 is fine too: both stay);
    a grid with time-multiplexed regions is dropped under tp (the builder refuses it)."""
    grids = parallel_grids(TILES, 4, axes=("tp", "ep"), experts=8, widths=(512,), batch=24)
    assert grids == [
        TILES[0], TILES[1],
        {**TILES[0], "ep": (2,), "placement": PLACEMENTS}, {**TILES[1], "ep": (2,), "placement": PLACEMENTS},
        {**TILES[0], "tp": (2,)},
        {**TILES[0], "ep": (4,), "placement": PLACEMENTS}, {**TILES[1], "ep": (4,), "placement": PLACEMENTS},
        {**TILES[0], "tp": (2,), "ep": (2,), "placement": PLACEMENTS},
        {**TILES[0], "tp": (4,)}]
    narrow = parallel_grids([{"tiling": ("dynamic",), "tile_f": (32, 64, 128)}], 4, axes=("tp",), experts=8,
                            widths=(256,), batch=24)
    assert narrow[1:] == [{"tiling": ("dynamic",), "tile_f": (32, 64, 128), "tp": (2,)},
                          {"tiling": ("dynamic",), "tile_f": (32, 64), "tp": (4,)}]


def test_pruned_search_over_tp_and_ep_equals_exhaustive(trace, tmp_path, serial, exhaustive_front):
    grids = parallel_grids(TILES, 4, axes=("tp", "ep"), experts=8, widths=(512,), batch=24)
    out = tmp_path / "opt"
    r = optimize("moe", out=out, executor=serial, max_chips=4, space=grids, trace=trace, **SMALL)
    assert r.candidates == 31
    assert [c.index for c in r.candidate_list if c.status == "pruned"] == [17, 18, 19]  # ep 4, tile_f 128
    assert all(c.status in ("simulated", "pruned") for c in r.candidate_list)
    front, cycles = exhaustive_front(r)
    assert sorted((c.run_id, *c.objectives) for c in r.front) == front
    # the bound holds on every candidate's run, the pruned ones' too (static tiling: each expert is one tile, so load-balanced keeps
    # the contiguous blocks and runs as contiguous)
    assert [(c.lower_bound, cycles[c.run_id]) for c in r.candidate_list] == [
        (14148, 16144), (15172, 18129), (29524, 29790), (10265, 12327), (10265, 12342), (10265, 12342),
        (12314, 14302), (12314, 14316), (12314, 14316), (28704, 30348), (28704, 30690), (28704, 30348),
        (8004, 10890), (9036, 12903), (10265, 11899), (10265, 11886), (10265, 11899), (12314, 13875),
        (12314, 13862), (12314, 13875), (28704, 30212), (28704, 30080), (28704, 30212), (6169, 9021),
        (6169, 9034), (6169, 9034), (8218, 11031), (8218, 11047), (8218, 11047), (4939, 9865), (6991, 11896)]
    # tp 2 x ep 2 is the fastest on four chips: it beats ep 4 (11,886) and tp 4 (9,865, off the front: tp x ep
    # is faster on as many chips with fewer bytes and less compute). With dynamic tiling load-balanced keeps
    # contiguous or round-robin here (the ragged model: within one shared pass of its least), 12-32 cycles behind
    # the fastest placement on these 24 tokens
    assert [(c.cycles, c.chips, c.config.get("tp"), c.config.get("ep"), c.config.get("placement"))
            for c in r.front] == [
        (9021, 4, 2, 2, "contiguous"), (10890, 2, 2, None, None), (11886, 4, None, 4, "round-robin"),
        (12327, 2, None, 2, "contiguous"), (16144, 1, None, None, None), (29790, 1, None, None, None)]
    assert {n: p["cycles"] for n, p in r.per_chips().items()} == {1: 16144, 2: 10890, 4: 9021}
    # JSON: every front point and the recommendation name their tp / ep / pp (1: unused), product = chips
    doc = json.loads((out / "optimize.json").read_text())
    assert [(p["tp"], p["ep"], p["pp"], p["chips"]) for p in doc["pareto"]] == [
        (2, 2, 1, 4), (2, 1, 1, 2), (1, 4, 1, 4), (1, 2, 1, 2), (1, 1, 1, 1), (1, 1, 1, 1)]
    assert (doc["recommended"]["tp"], doc["recommended"]["ep"], doc["recommended"]["cycles"]) == (2, 2, 9021)
    assert "--tp 2" in doc["recommended"]["command"] and "--ep 2" in doc["recommended"]["command"]
    # Parquet: tp / ep / pp columns for every candidate (null: unused), read back
    table = pq.read_table(out / "candidates.parquet")
    for knob in ("tp", "ep", "pp"):
        assert table.column(knob).to_pylist() == [c.config.get(knob) for c in r.candidate_list], knob
    assert table.column("pp").null_count == 31
    assert pq.read_table(out / "pareto.parquet").column("tp").to_pylist() == [2, 2, None, None, None, None]


def test_a_budget_of_two_chips_leaves_the_four_chip_combinations_over_it(trace, tmp_path, serial):
    grids = parallel_grids(TILES[:1], 4, axes=("tp", "ep"), experts=8, widths=(512,), batch=24)
    r = optimize("moe", out=tmp_path / "opt", executor=serial, max_chips=2, space=grids, trace=trace, **SMALL)
    over = {(c.config.get("tp"), c.config.get("ep")) for c in r.candidate_list if c.status == "over-budget"}
    assert over == {(None, 4), (2, 2), (4, None)}
    assert [(c.cycles, c.chips) for c in r.front] == [(10890, 2), (12327, 2), (16144, 1)]


#: a Qwen3-like decoder layer with small dims (D=64, 8 query and 2 KV heads of 16, 8 experts of 64, top-2)
DECODER = {"model_type": "qwen3_moe", "hidden_size": 64, "intermediate_size": 128, "moe_intermediate_size": 64,
           "num_experts": 8, "num_experts_per_tok": 2, "num_attention_heads": 8, "num_key_value_heads": 2,
           "head_dim": 16, "num_hidden_layers": 2}


@pytest.fixture
def decoder_layer(tmp_path) -> dict:
    rng = np.random.default_rng(3)
    (tmp_path / "config.json").write_text(json.dumps(DECODER))
    skew = [0.3, 0.2, 0.15, 0.1, 0.1, 0.05, 0.05, 0.05]
    np.savez(tmp_path / "routing.npz", data=np.stack([rng.choice(8, 2, replace=False, p=skew) for _ in range(16)]))
    np.save(tmp_path / "kv.npy", rng.integers(1, 300, 16))
    return {"workload": "decoder", "model": str(tmp_path / "config.json"), "routing": str(tmp_path / "routing.npz"),
            "kv_lengths": str(tmp_path / "kv.npy")}


def test_the_decoder_searches_tp_and_ep_in_its_ffn_stage(decoder_layer):
    """--max-chips 4 on 2 KV heads: ep 2, tp 2, ep 4 and tp 2 x ep 2 (tp 4 does not split the heads; the decoder's
    ep 4 runs the attention on 2 of 4 chips); with ep every tile_f, the three placements and the regions that are a
    multiple of ep; with tp tile_f 32 (2 x 32 divides the experts' 64 columns, 2 x 64 does not), no regions. Stage 1
    (the strategies) stays on one chip."""
    from stepsim.optimize import _default_stages
    from stepsim.workloads.config import normalize_config

    cfg = normalize_config({**decoder_layer, "mode": "metrics"})
    one = _default_stages(cfg)
    stages = _default_stages(cfg, max_chips=4)
    assert stages[0] == one[0] and stages[1][1][:len(one[1][1])] == one[1][1]
    static = {"tiling": ("static",), "tile_n": (1, 2, 4, 8, 16)}
    assert stages[1][1][len(one[1][1]):] == [
        {"tiling": ("dynamic",), "tile_f": (32, 64), "ep": (2,), "placement": PLACEMENTS},
        {"tiling": ("dynamic",), "tile_f": (32, 64), "regions": (2, 4), "ep": (2,), "placement": PLACEMENTS},
        {**static, "tile_f": (32, 64), "ep": (2,), "placement": PLACEMENTS},
        {**static, "tile_f": (32, 64), "regions": (2, 4), "ep": (2,), "placement": PLACEMENTS},
        {"tiling": ("dynamic",), "tile_f": (32,), "tp": (2,)},
        {"tiling": ("static",), "tile_n": (1, 2, 4, 8, 16), "tile_f": (32,), "tp": (2,)},
        {"tiling": ("dynamic",), "tile_f": (32, 64), "ep": (4,), "placement": PLACEMENTS},
        {"tiling": ("dynamic",), "tile_f": (32, 64), "regions": (4,), "ep": (4,), "placement": PLACEMENTS},
        {**static, "tile_f": (32, 64), "ep": (4,), "placement": PLACEMENTS},
        {**static, "tile_f": (32, 64), "regions": (4,), "ep": (4,), "placement": PLACEMENTS},
        {"tiling": ("dynamic",), "tile_f": (32,), "tp": (2,), "ep": (2,), "placement": PLACEMENTS},
        {"tiling": ("static",), "tile_n": (1, 2, 4, 8, 16), "tile_f": (32,), "tp": (2,), "ep": (2,),
         "placement": PLACEMENTS}]


def test_decoder_tp_candidates_keep_the_bound_and_the_exhaustive_front(decoder_layer, tmp_path, serial,
                                                                        exhaustive_front):
    """A decoder space over one and two chips (tp 2, ring all-reduces of 500-cycle hops): every bound holds on its
    run and the pruned front equals the exhaustive one."""
    base = {k: v for k, v in decoder_layer.items() if k != "workload"}
    space = [{"strategy": ("dynamic", "coarse"), "tiling": ("static",), "tile_n": (4,), "tile_f": (32,)},
             {"strategy": ("dynamic", "coarse"), "tiling": ("static",), "tile_n": (4,), "tile_f": (32,),
              "tp": (2,)}]
    r = optimize("decoder", out=tmp_path / "opt", executor=serial, max_chips=2, space=space, **base)
    front, cycles = exhaustive_front(r)
    assert sorted((c.run_id, *c.objectives) for c in r.front) == front
    assert [(c.chips, c.status, c.lower_bound, cycles[c.run_id]) for c in r.candidate_list] == [
        (1, "simulated", 1133, 2397), (1, "simulated", 4404, 5436), (2, "simulated", 1101, 4631),
        (2, "pruned", 4404, 7727)]
    # this small layer is latency-bound: the two all-reduces' hops make tp 2 slower than one chip (off the front)
    assert [(c.cycles, c.chips, c.config["strategy"]) for c in r.front] == [(2397, 1, "dynamic"), (5436, 1, "coarse")]
    assert [(p["tp"], p["ep"], p["pp"]) for p in r.to_json()["pareto"]] == [(1, 1, 1), (1, 1, 1)]


def test_decoder_ep_candidates_keep_the_bound_and_the_exhaustive_front(decoder_layer, tmp_path, serial,
                                                                        exhaustive_front):
    """A decoder space over one and two chips with ep 2 (its KV heads reduce-scattered, its tokens dispatched to
    their experts' chips by the sharded all-to-all; every placement): every bound holds on its run and the pruned
    front equals the exhaustive one."""
    base = {k: v for k, v in decoder_layer.items() if k != "workload"}
    space = [{"strategy": ("dynamic",), "tiling": ("static",), "tile_n": (4,), "tile_f": (32,)},
             {"strategy": ("dynamic",), "tiling": ("static",), "tile_n": (4,), "tile_f": (32,), "ep": (2,),
              "placement": PLACEMENTS}]
    r = optimize("decoder", out=tmp_path / "opt", executor=serial, max_chips=2, space=space, **base)
    front, cycles = exhaustive_front(r)
    assert sorted((c.run_id, *c.objectives) for c in r.front) == front
    assert [(c.chips, c.config.get("placement"), c.status, c.lower_bound, cycles[c.run_id])
            for c in r.candidate_list] == [
        (1, None, "simulated", 1133, 2397), (2, "contiguous", "simulated", 1101, 3585),
        (2, "round-robin", "simulated", 1101, 3581), (2, "load-balanced", "simulated", 1101, 3585)]
    # latency-bound like tp 2 above; the fastest ep 2 (round-robin) stays on the front by its on-chip bytes.
    # Load-balanced keeps contiguous: no placement is modelled a shared pass faster (moe/ep_cost.py)
    assert [c.objectives for c in r.candidate_list] == [(2397, 240578, 368640, 1), (3585, 239300, 417792, 2),
                                                        (3581, 239300, 417792, 2), (3585, 239300, 417792, 2)]
    assert [(c.cycles, c.chips, c.config.get("placement")) for c in r.front] == [(2397, 1, None),
                                                                                (3581, 2, "round-robin")]
    assert [(p["tp"], p["ep"], p["pp"]) for p in r.to_json()["pareto"]] == [(1, 1, 1), (1, 2, 1)]


def test_a_stack_searches_pipeline_stages_on_default_chips(trace, tmp_path, serial, exhaustive_front):
    """A 2-layer MoE stack under a 2-chip budget: one chip or two pipeline stages (no --system: the stages run on
    the default fully connected chips, written as a system file the candidates' commands name). With one
    micro-batch a stage boundary only adds its link, so one chip stays the fastest; the front is the exhaustive
    one and every bound holds."""
    grids = parallel_grids(TILES[:1], 2, axes=("tp", "ep", "pp"), experts=8, widths=(512,), batch=24, layers=2)
    assert grids == [TILES[0], {**TILES[0], "pp": (2,)}]
    out = tmp_path / "opt"
    r = optimize("moe", out=out, executor=serial, max_chips=2, space=grids, trace=trace, layers=2, **SMALL)
    system = (out / "systems" / "fully-connected-2.toml").resolve()
    assert [(c.config.get("pp"), c.config.get("system"), c.status) for c in r.candidate_list] == [
        (None, None, "simulated"), (None, None, "simulated"), (2, system.as_posix(), "simulated"),
        (2, system.as_posix(), "simulated")]
    front, cycles = exhaustive_front(r)
    assert sorted((c.run_id, *c.objectives) for c in r.front) == front
    assert [(c.lower_bound, cycles[c.run_id]) for c in r.candidate_list] == [
        (25624, 31292), (26648, 35282), (14148, 31807), (15172, 35797)]
    assert [(c.cycles, c.chips) for c in r.front] == [(31292, 1)]
    written = System.load(system)
    assert (written.chips, written.dimensions[0].topology, written.dimensions[0].link_bandwidth,
            written.dimensions[0].link_latency) == (2, "fully-connected", 64, 500)
    doc = json.loads((out / "optimize.json").read_text())
    assert [(p["tp"], p["ep"], p["pp"]) for p in doc["pareto"]] == [(1, 1, 1)]
