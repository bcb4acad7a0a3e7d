"""``--fidelity exact --system``: the sharded MoE block is built once per (tokens, system) shape and its routing
rebound per step (stepsim/serve/layers.py, the FIFO depths of stepsim/workloads/moe/sharded.py follow the token
count only): rebound programs equal fresh builds array for array and cycle for cycle on random routings, 2 and 4
chips, with and without shared experts, with empty shards (fewer tokens than chips); both engines agree."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from engines_agree import both_engines

from stepsim.base.system import System
from stepsim.kernels.api import run as fast_run
from stepsim.models.presets import resolve_model
from stepsim.serve.exact import max_kv_rows
from stepsim.serve.layers import LayerRunner, LayerSpec, build, lowered, make_template

SMALL = {"model_type": "qwen3_moe", "hidden_size": 256, "intermediate_size": 512, "moe_intermediate_size": 128,
         "num_experts": 16, "num_experts_per_tok": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
         "head_dim": 32, "num_hidden_layers": 2, "vocab_size": 1000, "max_position_embeddings": 4096}


def _spec(tmp_path, system: str, shared: bool) -> LayerSpec:
    config = dict(SMALL, shared_expert_intermediate_size=128) if shared else SMALL
    path = tmp_path / f"small{'-shared' if shared else ''}.json"
    path.write_text(json.dumps(config))
    s = System.preset(system)
    return LayerSpec(resolve_model(str(path)), s.hardware, max_kv_rows(4096), system=s)


def _same_program(a, b) -> bool:
    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, np.ndarray):
            if x.shape != y.shape or not np.array_equal(x, y):
                return False
        elif f.name != "hardware" and x != y:
            return False
    return True


def _routing(rng, tokens: int, experts: int = 16, top_k: int = 2) -> np.ndarray:
    return np.stack([rng.choice(experts, top_k, replace=False) for _ in range(tokens)])


@pytest.mark.parametrize("system, shared, tokens", [
    ("ring-2", False, (1, 2, 5, 40)),
    ("ring-2", True, (1, 3, 17)),
    ("ring-4", False, (1, 2, 3, 4, 9)),   # 1-3 tokens: empty shards
    ("ring-4", True, (2, 6)),
])
def test_rebound_sharded_templates_are_fresh_builds_array_for_array_and_cycle_for_cycle(tmp_path, system, shared,
                                                                                       tokens):
    spec = _spec(tmp_path, system, shared)
    rng = np.random.default_rng(7)
    runner = LayerRunner(spec)
    for b in tokens:
        template = make_template("ffn", (b,), spec)
        skewed = np.tile(_routing(rng, 1), (b, 1))  # every token to the same two experts
        for data in (*(_routing(rng, b) for _ in range(3)), skewed):
            fresh = lowered(build("ffn", data, spec), spec.hardware)
            assert _same_program(template.bind(data), fresh), (system, shared, data.tolist())
            assert runner.cycles("ffn", data) == fast_run(fresh).cycles
    # one template per token count, every routing run on it
    assert (runner.builds, runner.runs, len(runner.templates)) == (len(tokens), 4 * len(tokens), len(tokens))


@pytest.mark.parametrize("experts, top_k, system, tokens", [(2, 2, "ring-2", 4), (4, 4, "ring-4", 8),
                                                          (2, 1, "ring-2", 4), (4, 1, "ring-4", 8)])
def test_templates_of_every_expert_a_token_or_one(tmp_path, experts, top_k, system, tokens):
    """top_k = experts: every chip's sorted selectors are the same for any routing (kept as built, only the
    by-slot ones rebound); top-1: one selector array per chip. Rebound equal to fresh builds either way."""
    path = tmp_path / "m.json"
    path.write_text(json.dumps(dict(SMALL, num_experts=experts, num_experts_per_tok=top_k)))
    s = System.preset(system)
    spec = LayerSpec(resolve_model(str(path)), s.hardware, max_kv_rows(4096), system=s)
    template = make_template("ffn", (tokens,), spec)
    assert sorted({name for *_, name in template.sel_slots}) == [f"experts_by_slot.{c}" for c in range(s.chips)]
    rng = np.random.default_rng(experts + top_k)
    for _ in range(3):
        data = _routing(rng, tokens, experts, top_k)
        assert _same_program(template.bind(data), lowered(build("ffn", data, spec), spec.hardware))


def test_the_marker_locates_every_chips_selectors(tmp_path):
    """Every chip with tokens has its own selector sources (dispatch, routing weights, reassembly): a template
    records where each of them sits, by chip; a 1-token step on 4 chips has chip 0's only."""
    spec = _spec(tmp_path, "ring-4", False)
    names = lambda t: sorted({name for *_, name in t.sel_slots})  # noqa: E731
    assert names(make_template("ffn", (9,), spec)) == [f"{n}.{c}" for n in ("experts_by_slot", "experts_sorted")
                                                       for c in range(4)]
    one = make_template("ffn", (1,), spec)
    assert names(one) == ["experts_by_slot.0", "experts_sorted.0"]
    # per chip: two multi-hot selectors (the dispatch Partition's, the Reassemble's) and one by slot
    assert sorted(name for *_, name in one.sel_slots) == ["experts_by_slot.0", "experts_sorted.0",
                                                          "experts_sorted.0"]


@pytest.mark.parametrize("system, tokens", [("ring-2", 1), ("ring-4", 3), ("ring-4", 10)])
def test_both_engines_agree_on_rebound_sharded_programs(tmp_path, system, tokens):

    spec = _spec(tmp_path, system, True)
    template = make_template("ffn", (tokens,), spec)
    program = template.bind(_routing(np.random.default_rng(tokens), tokens))
    both_engines(program)


@pytest.mark.parametrize("system, tokens, expected", [
    ("ring-2", 40, [(562, 28332, 4531), (542, 29028, 4743)]),
    ("ring-4", 3, [(555, 32650, 4211), (551, 32938, 4213)]),
])
def test_token_count_depths_cost_no_cycles_against_the_routings_own_counts(tmp_path, system, tokens, expected):
    """The depth rule's claim: a FIFO never sent more elements than its depth never makes its producer wait, so
    the token-count depths (the sharded layer's rule) and the tightest such depths (every one of those channels
    cut to exactly the elements it carried; the routing's per-expert counts, the rule before, lie between) give
    the same cycles, engine counters and link bytes. Pinned: the channels cut, the slots removed, the cycles (a
    random routing, then every token to the same two experts)."""
    from stepsim.kernels import abi

    spec = _spec(tmp_path, system, False)
    skewed = np.tile(_routing(np.random.default_rng(1), 1), (tokens, 1))
    got = []
    for data in (_routing(np.random.default_rng(0), tokens), skewed):
        program = lowered(build("ffn", data, spec), spec.hardware)
        wide = fast_run(program)
        pushes = wide.channel_counters[:, abi.CCNT_PUSHES]
        roomy = program.ch_capacity >= pushes
        cut = np.where(roomy, np.maximum(pushes, 1), program.ch_capacity)
        got.append((int((cut < program.ch_capacity).sum()), int((program.ch_capacity - cut).sum()), wide.cycles))
        tight = fast_run(dataclasses.replace(program, ch_capacity=cut))
        assert tight.cycles == wide.cycles
        np.testing.assert_array_equal(tight.unit_counters, wide.unit_counters)
        np.testing.assert_array_equal(tight.link_bytes, wide.link_bytes)
    assert got == expected
