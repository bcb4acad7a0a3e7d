"""The mapped prefill attention (kind ``prefill``): optimal in its own space, its bound sound, its regions computing
the reference, and serve's exact mode pricing every KV head of a layer in one mapped attention."""

from __future__ import annotations

import numpy as np
import pytest

from stepsim.base.errors import ArgumentError
from stepsim.base.hardware import PRESETS
from stepsim.mapping import mapped_workload
from stepsim.mapping.kinds.prefill import prefill_bound, prefill_data, prefill_size, prefill_space
from stepsim.mapping.mapper import evaluate
from stepsim.simulation.simulate import simulate
from stepsim.workloads.prefill_attention.build import build_prefill_attention
from stepsim.workloads.reference import check_outputs, make_inputs

SN40L = PRESETS["sn40l"]
#: Llama-3.1-8B's attention: 8 KV heads of 4 query heads, head_dim 128
LLAMA = {"head_dim": 128, "query_per_kv_head": 4, "kv_heads": 8}


def test_the_mapper_chooses_the_best_prefill_schedule_of_an_exhaustive_enumeration():
    """A 64-token prompt of Llama-3.1-8B (8 heads x 2 query tiles): 16 regions, one query tile each."""
    chosen, rows = evaluate("prefill", 64, LLAMA, SN40L)
    exhaustive, all_rows = evaluate("prefill", 64, LLAMA, SN40L, exhaustive=True)
    assert [r["knobs"]["regions"] for r in all_rows] == [1, 2, 4, 8, 16]
    assert [r["cycles"] for r in all_rows] == [17_271, 12_127, 6_983, 4_851, 3_523]
    assert chosen.cycles == exhaustive.cycles == 3_523
    assert chosen.knobs == exhaustive.knobs == {"regions": 16}
    assert chosen.candidates == {"simulated": 3, "pruned": 2, "infeasible": 0}  # 1 and 2 regions: bound 8,480, 4,240
    for row in rows:  # a pruned candidate's bound reaches the optimum: it could not have won
        if row["status"] == "pruned":
            assert row["bound_cycles"] >= 3_523
    for row in all_rows:  # the bound from the knobs alone is below the engine's cycles
        assert prefill_bound(row["knobs"], prefill_data(64, LLAMA), LLAMA, SN40L) <= row["cycles"]


def test_the_prefill_space_and_size_follow_the_query_tiles():
    assert prefill_space(64, LLAMA) == [{"regions": r} for r in (1, 2, 4, 8, 16)]
    # a chunk of 40 tokens after 20 cached spans position tiles 0 and 1: 2 query tiles a head, 64 positions
    data = (np.full(8, 20), np.full(8, 40))
    assert prefill_size(data, LLAMA) == 64
    assert prefill_bound({"regions": 16}, prefill_data(64, LLAMA), LLAMA, SN40L) == 128 * 2  # busiest: 2 KV tiles


@pytest.mark.parametrize("regions", [4, 5, 12])
def test_regions_compute_the_prefill_reference(regions):
    """Even shares (4 regions of 3 query tiles), uneven ones (5 regions: 3, 3, 2, 2, 2) and one tile a region."""
    w = build_prefill_attention([5, 40], [59, 30], head_dim=16, query_per_kv_head=2, tile_n=8, regions=regions)
    assert w.params["regions"] == regions and w.params["query_tiles"] == 12
    inputs = make_inputs(w, seed=3)
    result = simulate(w, functional=True, inputs=inputs)
    check = check_outputs(w, inputs, result.outputs)["out"]
    assert check.passed, check


def test_one_region_is_the_paper_graph_and_regions_are_at_most_the_query_tiles():
    paper = build_prefill_attention([5, 40], [59, 30], head_dim=16, query_per_kv_head=2, tile_n=8)
    one = build_prefill_attention([5, 40], [59, 30], head_dim=16, query_per_kv_head=2, tile_n=8, regions=1)
    assert [(op.name, op.kind) for op in one.graph.ops] == [(op.name, op.kind) for op in paper.graph.ops]
    assert "regions" not in paper.params
    with pytest.raises(ArgumentError) as exc:
        build_prefill_attention([5, 40], [59, 30], head_dim=16, query_per_kv_head=2, tile_n=8, regions=13)
    assert str(exc.value) == "regions=13 must be at most the 12 query tiles (each region gets one)"


#: the 12 query tiles of ``([5, 40], [59, 30])`` at tile 8: request 0's position tiles 0..7, request 1's 5..8
GROUPS = [0, 1, 2, 3, 4, 5, 6, 7, 5, 6, 7, 8]


@pytest.mark.parametrize("regions, cycles", [(1, 1_796), (4, 631), (5, 555), (12, 336)])
def test_mapped_regions_read_and_compute_what_one_pipeline_does(regions, cycles):
    """Metrics stay exact with regions, even or not: the same FLOPs, the same bytes but the mask each region reads,
    the engine's bytes the symbolic ones; each region's KV-tiles-per-query-tile symbol is bound to its own mean
    (5 regions: tiles 0, 5, 10 read 1 + 6 + 8 KV tiles, tile 4 and 9 read 5 + 7)."""
    paper = build_prefill_attention([5, 40], [59, 30], head_dim=16, query_per_kv_head=2, tile_n=8).metrics()
    w = build_prefill_attention([5, 40], [59, 30], head_dim=16, query_per_kv_head=2, tile_n=8, regions=regions)
    m = w.metrics()
    assert m["graph_flops"] == paper["graph_flops"] == m["flops"] == w.algorithmic_flops
    assert m["off_chip_bytes"] - paper["off_chip_bytes"] == (regions - 1) * (2 * 8) * 8 * 2  # masks, bf16
    sim = simulate(w)
    assert sim.off_chip_bytes_read + sim.off_chip_bytes_written == m["off_chip_bytes"]
    assert sim.cycles == cycles
    means = sorted(w.bindings.values(), key=str)
    want = [sum(g + 1 for g in GROUPS[r::regions]) / len(GROUPS[r::regions]) for r in range(regions)]
    assert sorted(float(v) for v in means) == sorted(want)


def test_mapped_prefill_units_follow_the_shape_not_the_data():
    """Two steps of one shape (8 requests, 16 query tiles) get the same units: a template rebound to either is
    the layer built for it."""
    a, units_a = mapped_workload("prefill", (np.full(8, 20), np.full(8, 40)), LLAMA, SN40L, {"regions": 16})
    b, units_b = mapped_workload("prefill", (np.full(8, 0), np.full(8, 64)), LLAMA, SN40L, {"regions": 16})
    assert units_a == units_b == SN40L.compute_units
    assert [(op.name, op.compute_bw) for op in a.graph.ops if hasattr(op, "compute_bw")] == \
        [(op.name, op.compute_bw) for op in b.graph.ops if hasattr(op, "compute_bw")]


def test_a_prompts_attention_is_every_kv_head_in_one_mapped_attention():
    """serve --fidelity exact --schedule auto: a 64-token prompt of Llama-3.1-8B is one attention of its 8 KV heads'
    chunks a layer (3,523 cycles, counted for the 32 layers: 112,736), where the paper's schedule runs one head of
    4,185 cycles 8 x 32 times (1,071,360): TTFT 11.887 -> 10.93 ms on one sn40l. Its roofline: the layer's K and V
    (8 heads x 64 tokens, bf16) at 1,600 B/cycle, 164 cycles, and its FLOPs (32 query heads x 4 x 128 x 2,080
    causal pairs) at 638,000 FLOPs/cycle, 54 cycles: the mapped layer is 21x its roofline (the paper's 204x)."""
    from stepsim.models.presets import resolve_model
    from stepsim.serve.exact import EngineLatency
    from stepsim.serve.latency import IterationBatch
    from stepsim.serve.layers import LayerRunner, LayerSpec

    llama = resolve_model("llama-3.1-8b")
    exact = EngineLatency(llama, SN40L, None, max_model_len=131_072, vocab=128_256, schedule="auto")
    tasks, roles = exact.tasks(IterationBatch([0], [64], 0, 0), ffn=[])
    assert [kind for kind, _ in tasks] == ["prefill"] and roles == [("attention", 32)]
    cached, chunk = tasks[0][1]
    assert cached.tolist() == [0] * 8 and chunk.tolist() == [64] * 8
    auto = LayerRunner(exact.spec).cycles("prefill", (cached, chunk))
    paper = LayerRunner(LayerSpec(llama, SN40L, exact.spec.max_n)).cycles("prefill", (cached[:1], chunk[:1]))
    assert (auto, 32 * auto, paper, 8 * 32 * paper) == (3_523, 112_736, 4_185, 1_071_360)
    kv_bytes, flops = 8 * 64 * 2 * 128 * 2, 32 * 4 * 128 * (64 * 65 // 2)
    roofline = max(-(-kv_bytes // SN40L.hbm_peak_bytes_per_cycle), -(-flops // SN40L.peak_flops_per_cycle))
    assert (kv_bytes, flops, roofline) == (262_144, 34_078_720, 164)
    assert (round(auto / roofline), round(8 * paper / roofline)) == (21, 204)


def test_a_mapped_prefill_template_rebound_to_a_steps_chunks_is_the_layer_built_for_them():
    """serve builds a (requests, query tiles) shape once from marker data and rebinds it: with 16 regions each
    region's metadata sources (found by name) get the step's tiles of that region, so the rebound program runs the
    step's own chunks."""
    from stepsim.models.presets import resolve_model
    from stepsim.serve.layers import LayerRunner, LayerSpec

    spec = LayerSpec(resolve_model("llama-3.1-8b"), SN40L, 131_104, schedule="auto")
    data = (np.tile([20], 8), np.tile([40], 8))  # 2 query tiles a head: size 64, 16 regions
    runner = LayerRunner(spec)
    # the chunks cover position tiles 0 and 1, as the mapper's 64-token prompts do: its 3,523 cycles
    assert (runner.cycles("prefill", data), runner.fresh_cycles("prefill", data)) == (3_523, 3_523)
    assert runner.builds == 2  # the template (marker data) and the fresh build


def test_five_query_tiles_on_four_regions():
    """One prompt of 40 tokens at tile 8: 5 query tiles, regions 0..3 get tiles (0, 4), 1, 2, 3 (KV tiles 1 + 5,
    2, 3, 4): the reference's values, the engine's bytes the symbolic ones, exact cycles."""
    w = build_prefill_attention([0], [40], head_dim=16, query_per_kv_head=2, tile_n=8, regions=4)
    assert sorted(w.bindings.values()) == [2, 3, 3, 4]  # (1 + 5) / 2, 2, 3, 4
    inputs = make_inputs(w, seed=5)
    result = simulate(w, functional=True, inputs=inputs)
    assert check_outputs(w, inputs, result.outputs)["out"].passed
    m = w.metrics()
    assert result.off_chip_bytes_read + result.off_chip_bytes_written == m["off_chip_bytes"]
    assert (result.cycles, simulate(w).cycles, m["flops"]) == (237, 237, w.algorithmic_flops)


def test_the_bound_is_sound_for_uneven_regions():
    """Llama-3.1-8B's 8 KV heads of a 96-token prompt: 24 query tiles on the 64-token bucket's 16 regions (8 of 2
    tiles, 8 of 1): the bound from the knobs is below the engine's cycles, and so is the built graph's."""
    from stepsim.mapping.units import usage

    data = (np.zeros(8, dtype=np.int64), np.full(8, 96, dtype=np.int64))
    w, units = mapped_workload("prefill", data, LLAMA, SN40L, {"regions": 16})
    assert w.params["regions"] == 16 and w.params["query_tiles"] == 24
    cycles = simulate(w, SN40L).cycles
    bounds = (prefill_bound({"regions": 16}, data, LLAMA, SN40L), usage(w, SN40L, units).bound_cycles)
    assert (cycles, bounds) == (5_450, (640, 1_575))
    assert max(bounds) <= cycles


def test_a_prompt_between_buckets_runs_on_every_region_of_its_bucket():
    """The 4-layer Qwen3-30B-A3B shape on sn40l (4 KV heads): 2,000 and 2,048 tokens are both bucket 2,048, mapped
    with 128 regions. 2,000 tokens are 252 query tiles (63 a head): 124 regions of 2 and 4 of 1, 174,753 cycles a
    layer against 165,100 for 2,048 (1.06x for 0.98x the tokens; the units follow the bucket's representative
    prompt, whose regions' loads differ from these). With ``gcd(knob, query tiles)`` regions (until 2026-11-26)
    2,000 tokens ran on 4 regions: 2,365,767 cycles, 14.2x the 2,048 tokens' 167,033. The template (built from
    marker data, its regions' sources found by name) rebound to the prompt is the layer built for it."""
    from pathlib import Path

    from stepsim.models.presets import resolve_model
    from stepsim.serve.exact import max_kv_rows
    from stepsim.serve.layers import LayerRunner, LayerSpec, build

    qwen = resolve_model(str(Path(__file__).resolve().parents[2] / "examples" / "qwen3-30b-a3b-4layers.json"))
    spec = LayerSpec(qwen, SN40L, max_kv_rows(40960), schedule="auto")
    runner = LayerRunner(spec)
    got = {}
    for tokens in (2000, 2048):
        data = (np.zeros(4, dtype=np.int64), np.full(4, tokens, dtype=np.int64))
        w = build("prefill", data, spec)
        got[tokens] = (w.params["regions"], w.params["query_tiles"], runner.cycles("prefill", data),
                       runner.fresh_cycles("prefill", data))
    assert got == {2000: (128, 252, 174_753, 174_753), 2048: (128, 256, 165_100, 165_100)}
    assert round(got[2000][2] / got[2048][2], 3) == 1.058
