"""Tensor-parallel decoder stacks (``stepsim run decoder --layers L --tp T [--pp P]``, decoder/pipeline_tp.py):
values and every KV cache against the one-chip stack (the all-reduces' sum order: float32 tolerance) and the NumPy
reference, bytes over every link equal to the symbolic metric, symbolic off-chip bytes equal to the engine's, both
engines agree (cycles pinned), the CLI record read back, one-line errors."""

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
ATOL = 1e-5  # as the one-layer --tp / --ep tests: float32 rounding of the all-reduces' sum order


def _routing(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.stack([rng.choice(8, 2, replace=False) for _ in range(8)])


def _system(chips: int):
    return from_dict({"name": "s", "chips": chips, "topology": "fully-connected", "link_bandwidth": 64,
                      "link_latency": 500}, source="test", name="s")


def _build(model, **kw):
    chips = kw.get("pp", 1) * kw.get("tp", 1)
    routing = [_routing(i) for i in range(kw["layers"])] if model.is_moe else None
    return build_decoder(model, KV, routing, tile_f=16, softmax="stable", system=_system(chips) if chips > 1 else None,
                         **kw)


CASES = [
    (QWEN, dict(layers=2, tp=2)),
    (QWEN, dict(layers=2, tp=4, tiling="dynamic")),
    (QWEN, dict(layers=2, pp=2, tp=2, algorithm="direct")),
    (DENSE, dict(layers=4, pp=2, tp=2, strategy="interleave")),
]


@pytest.mark.parametrize("model, kw", CASES)
def test_values_and_kv_caches_against_the_one_chip_stack_and_the_reference(model, kw):
    """Layer 0's KV caches are the one-chip stack's bit for bit (the same projections of the same x); y and later
    layers' caches within float32 rounding of the all-reduces' sum order."""
    w = _build(model, **kw)
    one = _build(model, layers=kw["layers"], **{k: v for k, v in kw.items() if k in ("tiling", "strategy")})
    inputs = make_inputs(w, seed=3)
    tp = kw["tp"]
    assert {"x", f"layer1.shared_gate.{tp - 1}" if not model.is_moe else f"layer1.expert007_down.{tp - 1}"} \
        <= set(inputs)
    r = simulate(w, functional=True, inputs=inputs)
    checks = check_outputs(w, r.inputs, r.outputs)
    caches = [f"layer{i}.h{h}_{c}_cache" for i in range(kw["layers"]) for h in range(4) for c in "kv"]
    assert sorted(checks) == sorted(caches + [f"y{t}.{k}" for t in range(tp) for k in range(tp)])
    assert all(c.passed for c in checks.values()), checks
    r1 = simulate(one, functional=True, inputs=make_inputs(one, seed=3))
    for name in caches:
        if name.startswith("layer0."):
            np.testing.assert_array_equal(r.outputs[name], r1.outputs[name])
        else:
            np.testing.assert_allclose(r.outputs[name], r1.outputs[name], rtol=0, atol=ATOL)
    for t in range(tp):
        np.testing.assert_allclose(np.concatenate([r.outputs[f"y{t}.{k}"] for k in range(tp)]), r1.outputs["y"],
                                   rtol=0, atol=ATOL)
    assert np.abs(r1.outputs["y"]).max() > 0.1  # the comparison above is not between two near-zero outputs
    last = (kw.get("pp", 1) - 1) * tp  # the last stage's chips store y
    assert {op.chip for op in w.graph.ops if op.kind == "LinearOffChipStore" and op.tensor_name.startswith("y")} \
        == set(range(last, last + tp))


@pytest.mark.parametrize("model, kw, cycles", [
    (QWEN, dict(layers=2, tp=2), 6220),
    (QWEN, dict(layers=2, tp=4), 13532),
    (QWEN, dict(layers=2, pp=2, tp=2), 6680),
    (DENSE, dict(layers=2, tp=2), 6014),
])
def test_link_bytes_off_chip_bytes_and_both_engines(model, kw, cycles):
    w = _build(model, **kw)
    program = lower(w.graph, Hardware.preset(w.hardware), channel_depth=w.channel_depth)
    fast, r = both_engines(program), simulate(w)
    assert fast.cycles == r.cycles == cycles
    links = {op.name for op in w.graph.ops if op.kind == "Link"}
    measured = {r.unit_names[u]: int(b) for u, b in enumerate(r.link_bytes) if r.unit_names[u] in links}
    assert w.params["link_bytes"] == measured and sum(measured.values()) > 0
    assert w.metrics()["off_chip_bytes"] == r.off_chip_bytes_read + r.off_chip_bytes_written


def test_a_stage_boundary_carries_each_chip_s_rows_once():
    """--pp 2 --tp 2 on 4 fully connected chips: chip t's rows of the layer's output (all 8 of D = 64, at 2 bytes
    a value) cross from chip t to chip 2 + t once; nothing crosses between the stages otherwise."""
    w = _build(QWEN, layers=2, pp=2, tp=2)
    assert w.params["link_bytes"]["chip0->chip2"] == w.params["link_bytes"]["chip1->chip3"] == 8 * 64 * 2
    assert not {"chip0->chip3", "chip1->chip2", "chip2->chip0", "chip3->chip1"} & set(w.params["link_bytes"])


@pytest.mark.parametrize("kw, message", [
    (dict(layers=2, tp=3), "--tp 3: the 4 KV heads (--kv-heads) must split evenly over 3 chips"),
    (dict(layers=2, tp=2, micro_batches=2), "--micro-batches 2 does not combine with --tp yet (a tensor-parallel "
                                            "stack's layer all-reduces the whole batch)"),
    (dict(layers=2, tp=2, ep=2), "--tp does not combine with --ep in a stack of decoder layers yet"),
])
def test_bad_stacks_are_one_line(kw, message):
    with pytest.raises(ArgumentError) as info:
        _build(QWEN, **kw)
    assert str(info.value) == message


def test_run_decoder_with_pp_and_tp_from_the_cli_and_the_record_reads_back(tmp_path, capsys):
    import pyarrow.parquet as pq

    routing, kv = write_decoder_stack_inputs(tmp_path)
    out = tmp_path / "run.parquet"
    assert main(["run", "decoder", "--model", "qwen", "--routing", str(routing), "--kv-lengths", str(kv),
                 "--kv-heads", "2", "--layers", "2", "--pp", "2", "--tp", "2", "--system", "ring-4",
                 "--out", str(out), "--json"]) == 0
    row = json.loads(capsys.readouterr().out)
    params = json.loads(row["params"])
    assert (row["layers"], row["pp"], row["tp"], params["system"], params["algorithm"]) == (2, 2, 2, "ring-4", "ring")
    assert row["off_chip_bytes_symbolic"] == row["off_chip_bytes_measured"] == row["off_chip_bytes"]
    (back,) = pq.read_table(out).to_pylist()
    assert (back["layers"], back["pp"], back["tp"], back["cycles"]) == (2, 2, 2, row["cycles"])
    links = [u for u in pq.read_table(tmp_path / "run_units.parquet").to_pylist() if u["kind"] == "Link"]
    assert {u["name"]: u["bytes"] for u in links} == params["link_bytes"]
