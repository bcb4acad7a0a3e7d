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
