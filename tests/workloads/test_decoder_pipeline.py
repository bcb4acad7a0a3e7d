"""Pipeline parallelism of a stack of decoder layers (``stepsim run decoder --layers L --pp N --micro-batches M``):
q / k / v computed from each layer's input, values equal to the one-chip stack (bit for bit) and the NumPy
reference (every layer's KV caches too), bytes over every link equal to the symbolic metric, both engines agree,
one-line errors."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from engines_agree import both_engines
from small_routing import write_decoder_stack_inputs

from stepsim.base.errors import ArgumentError
from stepsim.base.hardware import Hardware
from stepsim.base.system import from_dict
from stepsim.cli import main
from stepsim.graph.lower import lower
from stepsim.models.presets import resolve_model
from stepsim.simulation.simulate import simulate
from stepsim.workloads.decoder.build import build_decoder
from stepsim.workloads.reference import check_outputs, make_inputs

KV = np.array([5, 40, 17, 64, 3, 33, 100, 31])
QWEN = dataclasses.replace(resolve_model("qwen"), hidden=64, heads=8, kv_heads=4, head_dim=16, expert_intermediate=64,
                           experts=8, top_k=2)
DENSE = dataclasses.replace(resolve_model("llama"), hidden=64, heads=8, kv_heads=4, head_dim=16, dense_intermediate=64)
ROWS = 8 * 64 * 2  # a stage boundary carries the batch's 8 rows of D = 64 once, at 2 bytes a value


def _routing(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.stack([rng.choice(8, 2, replace=False) for _ in range(8)])


def _system(chips: int):
    return from_dict({"name": "s", "chips": chips, "topology": "fully-connected", "link_bandwidth": 64,
                      "link_latency": 500}, source="test", name="s")


def _build(model, **kw):
    routing = None
    if model.is_moe:  # a stack: one routing per layer; one layer: the array
        routing = [_routing(i) for i in range(kw["layers"])] if "layers" in kw else _routing(0)
    return build_decoder(model, KV, routing, tile_f=16, softmax="stable", **kw)


@pytest.mark.parametrize("model, kw", [
    (QWEN, dict(layers=2, pp=2)),
    (QWEN, dict(layers=2, pp=2, micro_batches=2)),
    (QWEN, dict(layers=4, pp=2, micro_batches=4, strategy="interleave")),
    (DENSE, dict(layers=4, pp=4, micro_batches=2)),
    (QWEN, dict(layers=2, pp=2, micro_batches=2, tiling="dynamic")),  # a dynamic tile per expert and micro-batch
    (QWEN, dict(layers=4, pp=4, micro_batches=4, tiling="dynamic", strategy="interleave")),
])
def test_values_equal_the_one_chip_stack_and_the_reference(model, kw):
    one = _build(model, **{k: v for k, v in kw.items() if k != "pp"})
    w = _build(model, system=_system(kw["pp"]), **kw)
    inputs = make_inputs(w, seed=3)
    assert {"layer1.wq_h3_q1", "layer1.wk_h0", "layer1.wv_h2", "layer1.wo_h0_q0", "layer1.h2_k_cache"} <= set(inputs)
    r = simulate(w, functional=True, inputs=inputs)
    checks = check_outputs(w, r.inputs, r.outputs)
    layers = kw["layers"]
    assert sorted(checks) == sorted(["y"] + [f"layer{i}.h{h}_{c}_cache" for i in range(layers) for h in range(4)
                                             for c in ("k", "v")])
    assert all(c.passed for c in checks.values()), checks
    r1 = simulate(one, functional=True, inputs=make_inputs(one, 3))
    for name in checks:  # the same operators, only placed on chips
        np.testing.assert_array_equal(r.outputs[name], r1.outputs[name])
    assert {op.chip for op in w.graph.ops if op.kind == "LinearOffChipStore"} == {kw["pp"] - 1}


def test_q_k_v_come_from_the_layer_input():
    """A stack reads no q / k / v tensor: the projections' weights instead (the one-layer decoder loads h<h>_q ...)."""
    w = _build(QWEN, layers=2)
    loaded = {op.tensor.name for op in w.graph.ops if op.kind == "LinearOffChipLoad"}
    assert not {n for n in loaded if n.endswith(("_q", "_k", "_v"))}
    assert {"layer0.wq_h0_q0", "layer0.wq_h0_q1", "layer0.wk_h0", "layer0.wv_h0", "x"} <= loaded
    assert "h0_q" in {op.tensor.name for op in _build(QWEN).graph.ops if op.kind == "LinearOffChipLoad"}


@pytest.mark.parametrize("pp, tiling", [(2, "static"), (4, "static"), (2, "dynamic")])
def test_bytes_over_each_link_equal_the_metric(pp, tiling):
    w = _build(QWEN, layers=4, pp=pp, micro_batches=2, system=_system(pp), tiling=tiling)
    per_link = {f"chip{s}->chip{s + 1}": ROWS for s in range(pp - 1)}
    assert w.params["link_bytes"] == per_link
    r = simulate(w)
    links = {op.name for op in w.graph.ops if op.kind == "Link"}
    assert {r.unit_names[u]: int(b) for u, b in enumerate(r.link_bytes) if r.unit_names[u] in links} == per_link


@pytest.mark.parametrize("model, kw, cycles", [
    (QWEN, dict(layers=2, pp=2, micro_batches=2), 3233),
    (DENSE, dict(layers=4, pp=4, micro_batches=4), 6624),
    (QWEN, dict(layers=2, pp=2, micro_batches=2, tiling="dynamic"), 3171),
])
def test_both_engines_agree_and_the_cycles_are_pinned(model, kw, cycles):
    w = _build(model, system=_system(kw["pp"]), **kw)
    program = lower(w.graph, Hardware.preset(w.hardware), channel_depth=w.channel_depth)
    fast, r = both_engines(program), simulate(w)
    assert fast.cycles == r.cycles == cycles
    # the symbolic off-chip bytes (per-micro-batch expert tiles bound from the trace) are the engine's
    assert w.metrics()["off_chip_bytes"] == r.off_chip_bytes_read + r.off_chip_bytes_written


def test_run_decoder_with_pp_from_the_cli(tmp_path, capsys):
    routing, kv = write_decoder_stack_inputs(tmp_path)
    assert main(["run", "decoder", "--model", "qwen", "--routing", str(routing), "--kv-lengths", str(kv),
                 "--kv-heads", "1", "--layers", "2", "--pp", "2", "--micro-batches", "2", "--system", "ring-2",
                 "--json"]) == 0
    row = json.loads(capsys.readouterr().out)
    params = json.loads(row["params"])
    assert (row["layers"], row["pp"], row["micro_batches"], params["links_used"]) == (2, 2, 2, 1)
    assert params["link_bytes"] == {"chip0->chip1": 32 * 2048 * 2}
    # the symbolic off-chip bytes (every layer's heads, projections and per-micro-batch expert tiles bound) are the
    # engine's
    assert row["off_chip_bytes_symbolic"] == row["off_chip_bytes_measured"] == row["off_chip_bytes"]


@pytest.mark.parametrize("kw, message", [
    (dict(layers=2, pp=4), "--pp 4: more stages than the 2 layers (--layers); a stage holds at least one layer"),
    (dict(layers=3, pp=2), "--pp 2: the 3 layers (--layers) must split into 2 stages of equal size (a multiple of 2)"),
    (dict(layers=2, micro_batches=3), "--micro-batches 3: the batch of 8 requests must split into 3 equal "
                                      "micro-batches"),
    (dict(layers=2, strategy="coarse"),
     "--strategy coarse does not combine with --layers / --pp / --micro-batches (its regions load their own q / k / "
     "v tensors; a stack computes them from its input: dynamic or interleave)"),
    (dict(layers=2, tp=2, micro_batches=2), "--micro-batches 2 does not combine with --tp yet (a tensor-parallel "
                                            "stack's layer all-reduces the whole batch)"),
])
def test_bad_stacks_are_one_line(kw, message):
    with pytest.raises(ArgumentError) as info:
        _build(QWEN, **kw)
    assert str(info.value) == message


@pytest.mark.parametrize("argv, message", [
    (["--layers", "2", "--pp", "2"], "--pp 2 needs --system FILE|PRESET (the chips and links the stages run on)"),
    (["--layers", "2", "--system", "ring-2"],
     "--system applies to a stack of decoder layers with --pp N (pipeline parallelism)"),
    (["--layers", "2", "--pp", "2", "--system", "ring-4"], "--pp 2 needs a system of 2 chips; system 'ring-4' has 4"),
    (["--layers", "2", "--tp", "2", "--micro-batches", "2"],
     "--micro-batches 2 does not combine with --tp yet (a tensor-parallel stack's layer all-reduces the whole "
     "batch)"),
])
def test_bad_pp_flags_are_one_line_with_status_2(tmp_path, capsys, argv, message):
    routing, kv = tmp_path / "routing.npz", tmp_path / "kv.npy"
    rng = np.random.default_rng(5)
    np.savez(routing, data=np.stack([rng.choice(128, 8, replace=False) for _ in range(32)]))
    np.save(kv, np.arange(1, 33))
    assert main(["run", "decoder", "--model", "qwen", "--routing", str(routing), "--kv-lengths", str(kv)]
                + argv) == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"stepsim: error: {message}"]
