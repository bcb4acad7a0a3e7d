"""Whole scaled-down models (issue 33): GPT-2- and Llama-shaped forward passes (all layers, causal attention,
RoPE for Llama, the LM head) from examples/onnx_models.py, lowered and run in functional mode against
onnxruntime, with per-layer metrics."""

import sys
from pathlib import Path

import numpy as np
import pytest

from stepsim.frontend import from_onnx
from stepsim.frontend.check import check_outputs
from stepsim.frontend.layers import per_part
from stepsim.simulation.simulate import simulate

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(Path(__file__).parent))
from onnx_models import MODELS  # noqa: E402
from ort_check import ort_run  # noqa: E402

IDS = np.random.default_rng(0).integers(0, 128, (2, 8))
DENSE = ["gpt2", "llama"]  # the MoE model needs its routing trace: tests/frontend/test_moe.py


@pytest.mark.parametrize("name", DENSE)
@pytest.mark.parametrize("tiling", [{}, {"tile_m": 2, "tile_n": 32}])
def test_model_matches_onnxruntime(name, tiling):
    m = MODELS[name]()
    w = from_onnx(m, values={"input_ids": IDS}, tiling=tiling)
    r = simulate(w, functional=True)
    want = ort_run(m, {"input_ids": IDS})["logits"]
    (c,) = check_outputs(w, r.inputs, r.outputs).values()
    err = np.abs(r.outputs["logits"].reshape(want.shape) - want).max() / np.abs(want).max()
    print(f"{name} {tiling}: max rel error vs onnxruntime {err:.2e}, vs onnx reference {c.error:.2e} "
          f"(tolerance {c.tolerance:.2e}), {r.cycles} cycles")
    assert c.passed and err <= c.tolerance


@pytest.mark.parametrize("name", DENSE)
def test_per_layer_metrics(name):
    w = from_onnx(MODELS[name](layers=3), values={"input_ids": IDS})
    sim = simulate(w)
    parts = per_part(w, sim)
    assert set(parts) == {"embed", "l0", "l1", "l2", "head", "-"}  # "-": the logits' store
    total = w.metrics()
    for key in ("off_chip_bytes", "on_chip_bytes"):
        assert sum(p[key] for p in parts.values()) == total[key], key
    # the layers are built alike: the same bytes and FLOPs each, finishing one after another; the constants every
    # layer reads the same way (the causal mask; RoPE's cos and sin) are loaded once, by layer 0, and shared
    layers = [parts[f"l{i}"] for i in range(3)]
    assert layers[0]["flops"] == layers[1]["flops"] == layers[2]["flops"] > 0
    groups, s, hd = 2 * 4, 8, 64 // 4  # batch x heads, sequence (= tile_m here: one row block), head dim
    rope = name == "llama"
    shared_off = 4 * groups * s * s + (2 * 4 * groups * s * hd if rope else 0)  # mask (+ cos, sin) per group
    shared_on = 4 * s * s + (2 * 4 * s * hd if rope else 0)  # each load's one tile
    for key, shared in (("off_chip_bytes", shared_off), ("on_chip_bytes", shared_on)):
        assert layers[0][key] - shared == layers[1][key] == layers[2][key], key
    assert 0 < layers[0]["last_cycle"] < layers[1]["last_cycle"] < layers[2]["last_cycle"] <= sim.cycles
    print(name, {k: v for k, v in parts.items()}, sim.cycles)


@pytest.mark.parametrize("name", DENSE)
def test_spilling_every_edge_keeps_the_logits(name):
    fused = simulate(from_onnx(MODELS[name](), values={"input_ids": IDS}), functional=True)
    spilled_w = from_onnx(MODELS[name](), values={"input_ids": IDS}, fuse=False)
    spilled = simulate(spilled_w, functional=True)
    assert np.array_equal(fused.outputs["logits"], spilled.outputs["logits"])
    extra = spilled_w.metrics()["off_chip_bytes"] - from_onnx(MODELS[name](), values={"input_ids": IDS}).metrics()[
        "off_chip_bytes"]
    # the spills, and the tables every layer shares (the causal mask [S, S] read per (batch, head) group, RoPE's
    # cos and sin [S, hd] per group): one load while fused, one per layer once spills put the layers in phases of
    # their own (stepsim.frontend.fusion.phases); the model's defaults: 2 layers, batch 2, 8 tokens, 4 heads of 16
    layers, b, s, h, hd = 2, 2, 8, 4, 16
    shared = b * h * s * s * 4 + (2 * b * h * s * hd * 4 if name == "llama" else 0)
    assert extra == sum(2 * e.bytes for e in spilled_w.frontend.edges) + (layers - 1) * shared


def _decode_feeds(m, seed=0):
    from ort_check import rand

    return {i.name: rand([d.dim_value for d in i.type.tensor_type.shape.dim], seed + k)
            for k, i in enumerate(m.graph.input) if i.name != "input_ids"}


@pytest.mark.parametrize("name", DENSE)
def test_decode_step_against_a_kv_cache(name):
    ids = IDS[:, :1]
    m = MODELS[name](past=7)
    feeds = _decode_feeds(m)
    w = from_onnx(m, values={"input_ids": ids})
    r = simulate(w, functional=True, inputs=feeds)
    want = ort_run(m, {"input_ids": ids, **feeds})
    assert sorted(want) == sorted(["logits"] + [f"l{i}.attn.present_{t}" for i in range(2) for t in "kv"])
    for out, ref in want.items():
        err = np.abs(r.outputs[out].reshape(ref.shape) - ref).max() / np.abs(ref).max()
        print(f"{name} decode {out}: max rel error {err:.2e}")
        assert err < 2e-6
    assert all(c.passed for c in check_outputs(w, r.inputs, r.outputs).values())


@pytest.mark.parametrize("name", DENSE)
def test_decode_step_traffic_grows_with_the_cache_exactly(name):
    ids = IDS[:, :1]
    layers, batch, heads, hd = 2, 2, 4, 64 // 4
    off = {past: from_onnx(MODELS[name](past=past), values={"input_ids": ids}).metrics()["off_chip_bytes"]
           for past in (7, 15)}
    # per layer, keys and values: the cache read (past rows) and the present written back (past + 1 rows)
    assert off[15] - off[7] == layers * 2 * 2 * (15 - 7) * batch * heads * hd * 4
    sim = simulate(from_onnx(MODELS[name](past=15), values={"input_ids": ids}))
    print(name, "decode step, cache 15:", sim.cycles, "cycles,", off[15], "B off chip")


@pytest.mark.parametrize("past", [0, 7])
def test_grouped_query_attention(past):
    """Llama with 2 key / value heads for 4 query heads (transformers' repeat_kv: Unsqueeze, Expand, Reshape)."""
    ids = IDS[:, :1] if past else IDS
    m = MODELS["llama"](kv_heads=2, past=past)
    feeds = _decode_feeds(m) if past else {}
    w = from_onnx(m, values={"input_ids": ids})
    r = simulate(w, functional=True, inputs=feeds)
    want = ort_run(m, {"input_ids": ids, **feeds})
    for out, ref in want.items():
        err = np.abs(r.outputs[out].reshape(ref.shape) - ref).max() / np.abs(ref).max()
        print(f"llama gqa past {past} {out}: max rel error {err:.2e}")
        assert err < 2e-6
    # each layer repeats its keys and values: one buffered block per key / value head, streamed twice
    sequence, hd = (past + 1) if past else 8, 16
    repeats = [op for op in w.graph if op.kind == "Bufferize" and not op.off_chip]
    assert len(repeats) == 2 * 2 and all(op.stream.dtype.size_in_bytes() == sequence * hd * 4 for op in repeats)
