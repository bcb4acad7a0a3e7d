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
    assert [r["cycles"] for r in all_rows] == [17_271, 12_127, 6_983, 4_779, 3_481]
    assert chosen.cycles == exhaustive.cycles == 3_481
    assert chosen.knobs == exhaustive.knobs == {"regions": 16}
    assert chosen.candidates == {"simulated": 3, "pruned": 2, "infeasible": 0}  # 1 and 2 regions: bound 8,480, 4,240
    for row in rows:  # a pruned candidate's bound reaches the optimum: it could not have won
        if row["status"] == "pruned":
            assert row["bound_cycles"] >= 3_481
    for row in all_rows:  # the bound from the knobs alone is below the engine's cycles
        assert prefill_bound(row["knobs"], prefill_data(64, LLAMA), LLAMA, SN40L) <= row["cycles"]


def test_the_prefill_space_and_size_follow_the_query_tiles():
    assert prefill_space(64, LLAMA) == [{"regions": r} for r in (1, 2, 4, 8, 16)]
    # a chunk of 40 tokens after 20 cached spans position tiles 0 and 1: 2 query tiles a head, 64 positions
    data = (np.full(8, 20), np.full(8, 40))
    assert prefill_size(data, LLAMA) == 64
    assert prefill_bound({"regions": 16}, prefill_data(64, LLAMA), LLAMA, SN40L) == 128 * 2  # busiest: 2 KV tiles


def test_regions_compute_the_prefill_reference():
    w = build_prefill_attention([5, 40], [59, 30], head_dim=16, query_per_kv_head=2, tile_n=8, regions=4)
    assert w.params["regions"] == 4 and w.params["query_tiles"] == 12
    inputs = make_inputs(w, seed=3)
    result = simulate(w, functional=True, inputs=inputs)
    check = check_outputs(w, inputs, result.outputs)["out"]
    assert check.passed, check


def test_one_region_is_the_paper_graph_and_regions_must_divide_the_query_tiles():
    paper = build_prefill_attention([5, 40], [59, 30], head_dim=16, query_per_kv_head=2, tile_n=8)
    one = build_prefill_attention([5, 40], [59, 30], head_dim=16, query_per_kv_head=2, tile_n=8, regions=1)
    assert [(op.name, op.kind) for op in one.graph.ops] == [(op.name, op.kind) for op in paper.graph.ops]
    assert "regions" not in paper.params
    with pytest.raises(ArgumentError) as exc:
        build_prefill_attention([5, 40], [59, 30], head_dim=16, query_per_kv_head=2, tile_n=8, regions=5)
    assert str(exc.value) == "regions=5 must divide the 12 query tiles (dealt round-robin)"


def test_mapped_regions_read_and_compute_what_one_pipeline_does():
    """Metrics stay exact with regions: the same FLOPs, the same bytes but the mask each region reads."""
    paper = build_prefill_attention([5, 40], [59, 30], head_dim=16, query_per_kv_head=2, tile_n=8).metrics()
    four = build_prefill_attention([5, 40], [59, 30], head_dim=16, query_per_kv_head=2, tile_n=8,
                                   regions=4).metrics()
    assert four["graph_flops"] == paper["graph_flops"]
    assert four["off_chip_bytes"] - paper["off_chip_bytes"] == 3 * (2 * 8) * 8 * 2  # 3 more mask tiles, bf16


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
    chunks a layer (3,481 cycles, counted for the 32 layers: 111,392), where the paper's schedule runs one head of
    4,185 cycles 8 x 32 times (1,071,360): TTFT 11.887 -> 10.927 ms on one sn40l. Its roofline: the layer's K and V
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
    assert (auto, 32 * auto, paper, 8 * 32 * paper) == (3_481, 111_392, 4_185, 1_071_360)
    kv_bytes, flops = 8 * 64 * 2 * 128 * 2, 32 * 4 * 128 * (64 * 65 // 2)
    roofline = max(-(-kv_bytes // SN40L.hbm_peak_bytes_per_cycle), -(-flops // SN40L.peak_flops_per_cycle))
    assert (kv_bytes, flops, roofline) == (262_144, 34_078_720, 164)
    assert (round(auto / roofline), round(8 * paper / roofline)) == (21, 204)


def test_a_mapped_prefill_template_rebound_to_a_steps_chunks_is_the_layer_built_for_them():
    """serve builds a (requests, query tiles) shape once from marker data and rebinds it: with 16 regions the
    dealt metadata sources are still one source each, so the rebound program runs the step's own chunks."""
    from stepsim.models.presets import resolve_model
    from stepsim.serve.layers import LayerRunner, LayerSpec

    spec = LayerSpec(resolve_model("llama-3.1-8b"), SN40L, 131_104, schedule="auto")
    data = (np.tile([20], 8), np.tile([40], 8))  # 2 query tiles a head: size 64, 16 regions
    runner = LayerRunner(spec)
    # the chunks cover position tiles 0 and 1, as the mapper's 64-token prompts do: its 3,481 cycles
    assert (runner.cycles("prefill", data), runner.fresh_cycles("prefill", data)) == (3_481, 3_481)
    assert runner.builds == 2  # the template (marker data) and the fresh build
