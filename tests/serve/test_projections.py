"""Weights streamed ahead (stepsim/serve/projections.py): a step's pieces by hand, and a mapped exact step priced by
them: its projections, router and LM head on the engine, the cycles streaming hid subtracted."""

from __future__ import annotations

import json

import numpy as np

from stepsim.base.hardware import PRESETS
from stepsim.models.presets import resolve_model
from stepsim.serve.latency import IterationBatch
from stepsim.serve.projections import Piece, Streamed, projection_shapes, stream_ahead

#: 10 B/cycle of HBM, 100 B on chip, 100 FLOPs/cycle
PEAK_BYTES, CAPACITY, PEAK_FLOPS = 10, 100, 100


def _pieces():
    return [Piece("a", 50, 100, 100, 20, 0), Piece("b", 40, 300, 300, 30, 0), Piece("c", 60, 200, 200, 10, 2000),
            Piece("prefill", 30, 0, 0, 0, 0, streams=False, kind="attention"), Piece("e", 25, 50, 50, 0, 0)]


def test_weights_stream_into_the_idle_hbm_and_free_memory_of_the_pieces_before():
    # a: 50 cycles, its 100 B take 10: 40 idle (400 B), 100 - 20 B free: b gets 80 B
    # b: 80 B on chip saves 8 cycles: 32; it still reads 220 B (22 cycles): 10 idle (100 B), 70 B free: c gets 70
    # c: 70 B save 7 (its FLOPs' floor 20 is far): 53; reads 130 B (13): 40 idle, 90 B free; the prefill attention
    #    takes none, e gets its 50 B
    # the prefill attention: 30 cycles, streams nothing; e: 50 B save 5: 20
    assert stream_ahead(_pieces(), CAPACITY, PEAK_BYTES, PEAK_FLOPS) == [
        Streamed("a", 0, 50, 0, 0), Streamed("b", 50, 32, 80, 8), Streamed("c", 82, 53, 70, 7),
        Streamed("prefill", 135, 30, 0, 0), Streamed("e", 165, 20, 50, 5)]


def test_nothing_streams_without_free_memory_and_no_piece_goes_below_its_flops():
    full = [Piece(p.name, p.cycles, p.hbm_bytes, p.weight_bytes, CAPACITY, p.flops, p.streams, p.kind)
            for p in _pieces()]
    assert [s.cycles for s in stream_ahead(full, CAPACITY, PEAK_BYTES, PEAK_FLOPS)] == [50, 40, 60, 30, 25]
    # 12 cycles, 1,000 FLOPs (10 at the peak): 50 B on chip would save 5, the floor leaves 2
    bound = [Piece("a", 50, 0, 0, 0, 0), Piece("f", 12, 50, 50, 0, 1000)]
    assert stream_ahead(bound, CAPACITY, PEAK_BYTES, PEAK_FLOPS)[1] == Streamed("f", 50, 10, 50, 2)


def test_the_projections_of_a_layer_and_the_lm_head():
    llama = resolve_model("llama-3.1-8b")
    assert projection_shapes(llama, 128_256) == ([("qkv", 4096, 6144), ("o", 4096, 4096)], ("lm_head", 4096, 128_256))
    qwen = resolve_model("qwen3-30b-a3b")
    assert projection_shapes(qwen, 151_936) == ([("qkv", 2048, 5120), ("o", 4096, 2048), ("router", 2048, 128)],
                                                ("lm_head", 2048, 151_936))


#: a dense model small enough to map in seconds: 2 layers, d 128, 4 / 2 heads of 32, FFN 256
TINY_DENSE = {"model_type": "llama", "hidden_size": 128, "intermediate_size": 256, "num_attention_heads": 4,
              "num_key_value_heads": 2, "head_dim": 32, "num_hidden_layers": 2, "vocab_size": 1000,
              "max_position_embeddings": 2048}


def test_a_mapped_exact_step_prices_its_weights_on_the_engine_and_subtracts_what_streaming_hid(tmp_path):
    from stepsim.serve.exact import EngineLatency
    from stepsim.serve.projections import projection_cost

    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(TINY_DENSE))
    model = resolve_model(str(path))
    hw = PRESETS["sn40l"]
    provider = EngineLatency(model, hw, None, max_model_len=2048, vocab=1000, schedule="auto")
    batch = IterationBatch([100, 40], [1, 1], 0, 2)
    cost = provider(batch)
    streamed = provider.last_streamed
    assert [s.name for s in streamed] == [f"layer {i} {p}" for i in (0, 1)
                                          for p in ("qkv", "decode attention", "o", "ffn")] + ["lm_head"]
    qkv, o = projection_cost(2, 128, 256, hw), projection_cost(2, 128, 128, hw)
    head = projection_cost(2, 128, 1000, hw)  # one row per sequence
    embedding = -(-2 * 128 * 2 // hw.hbm_peak_bytes_per_cycle)
    assert cost.cycles["weights"] == 2 * (qkv[0] + o[0]) + head[0] + embedding
    assert cost.cycles["hidden"] == sum(s.saved for s in streamed) > 0
    step = cost.cycles["attention"] + cost.cycles["ffn"] + cost.cycles["weights"] - cost.cycles["hidden"]
    assert step == streamed[-1].start + streamed[-1].cycles + embedding
    assert cost.seconds == step / hw.clock_hz
    assert cost.cycles == {"attention": 2 * streamed[1].cycles, "ffn": sum(s.cycles + s.saved for s in streamed
                                                                           if s.name.endswith("ffn")),
                           "weights": cost.cycles["weights"], "hidden": cost.cycles["hidden"]}
    # the paper's schedules keep the closed-form weights, no hidden cycles
    paper = EngineLatency(model, hw, None, max_model_len=2048, vocab=1000)(batch)
    assert set(paper.cycles) == {"attention", "ffn", "weights"}
    assert np.isclose(paper.cycles["weights"], provider.weight_cycles(batch))


def test_the_busiest_chips_share_of_an_expert_parallel_block_by_hand():
    """:func:`ep_block_traffic`: 8 experts of d 4, F 8 (192 B each), a shared expert of width 2 (48 B), on 2 chips
    (experts 0-3 and 4-7), tile_n 2. Five tokens: chip 0's experts get 2 + 1 rows (2 tiles), chip 1's 3 + 2 + 1 + 1
    (5 tiles): chip 1 is the busiest, its shard the last 2 tokens (the first chip takes the odd one)."""
    from stepsim.models.presets import MoEModel
    from stepsim.serve.projections import ep_block_traffic

    model = MoEModel("t", hidden=4, intermediate=8, experts=8, top_k=2, shared_intermediate=2)
    routing = np.array([[0, 4], [0, 5], [1, 4], [5, 6], [7, 4]])
    # reads: 5 tiles x 192 + 1 shared tile x 48 + 2 rows x 4 x (2 + 4); weights: 4 touched experts + the shared;
    # FLOPs: 7 rows through F 8 and 2 through the shared 2, 2 x 3 x d each
    assert ep_block_traffic(model, routing, 2, 2) == (5 * 192 + 48 + 2 * 4 * 6, 4 * 192 + 48, 24 * (7 * 8 + 2 * 2))
    # a tie goes to the lower chip: chip 0 (expert 0, 2 rows, its shard 1 token) against chip 1 (expert 4)
    assert ep_block_traffic(model, np.array([[0, 4], [0, 4]]), 2, 1) == (
        2 * 192 + 48 + 4 * 6, 192 + 48, 24 * (2 * 8 + 1 * 2))
    # one token on two chips: chip 1's shard is empty, so it reads no shared expert and no rows of its own
    assert ep_block_traffic(model, np.array([[4, 5]]), 2, 2) == (2 * 192, 2 * 192, 24 * 2 * 8)


def test_an_expert_parallel_block_streams_its_weights_ahead_on_mapped_chips():
    """On an MoE model's mapped expert-parallel chips (small MoE, ring-2 of sn40l) a decode step's MoE blocks are
    pieces like one chip's FFN: each holds its busiest chip's traffic of the step's routing, the weights of its
    experts stream in during the pieces before it, and the next layer's stream in while it runs."""
    import dataclasses

    from stepsim.base.system import System
    from stepsim.mapping.expert_parallel import search_knobs
    from stepsim.serve.projections import ep_block_traffic
    from stepsim.serve.routing import SyntheticRouting
    from stepsim.serve.system import SystemEngineLatency

    model = resolve_model("examples/small-moe.json")
    system = dataclasses.replace(System.preset("ring-2"), hardware=PRESETS["sn40l"])

    def provider_of_seed_0():
        routing = SyntheticRouting(model.experts, model.top_k, model.layers, seed=0)
        return SystemEngineLatency(model, system, routing, max_model_len=2048, vocab=1000, schedule="auto")

    provider, twin = provider_of_seed_0(), provider_of_seed_0()
    batch = IterationBatch([100, 40, 7], [1, 1, 1], 0, 3)
    cost = provider(batch)
    tasks, _ = twin.tasks(batch)  # the same routing draws as the provider's step
    streamed = {s.name: s for s in provider.last_streamed}
    tile_n = search_knobs(4, provider.spec.ffn_model, system, system.hardware)["tile_n"]
    ffn = [data for kind, data in tasks if kind == "ffn"]
    assert len(ffn) == model.layers
    for layer, data in enumerate(ffn):
        reads, weights, _ = ep_block_traffic(provider.spec.ffn_model, data, 2, tile_n)
        assert 0 < weights <= reads
        block = streamed[f"layer {layer} ffn"]
        assert 0 < block.prefetched_bytes <= weights and block.saved > 0
    assert cost.cycles["hidden"] == sum(s.saved for s in provider.last_streamed)
