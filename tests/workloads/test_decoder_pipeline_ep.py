"""Expert-parallel decoder stacks (``stepsim run decoder --layers L --ep E [--pp P] [--micro-batches M]``,
decoder/pipeline_ep.py): values and every KV cache against the one-chip stack and the NumPy reference, bytes over
every link equal to the symbolic metric, symbolic off-chip bytes equal to the engine's, both engines agree (cycles
pinned), the CLI record read back, one-line errors."""

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


def _routing(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.stack([rng.choice(8, 2, replace=False) for _ in range(8)])


def _system(chips: int):
    return from_dict({"name": "s", "chips": chips, "topology": "fully-connected", "link_bandwidth": 64,
                      "link_latency": 500}, source="test", name="s")


def _build(**kw):
    chips = kw.get("pp", 1) * kw.get("ep", 1)
    system = _system(chips) if chips > 1 else None
    return build_decoder(QWEN, KV, [_routing(i) for i in range(kw["layers"])], tile_f=16, softmax="stable",
                         system=system, **kw)


CASES = [
    dict(layers=2, ep=2),
    dict(layers=2, ep=4, placement="round-robin"),
    dict(layers=2, ep=8),  # more chips than KV heads: chips 0, 2, 4, 6 run the attention, each feeds two shards
    dict(layers=2, pp=2, ep=2),
    dict(layers=4, pp=2, ep=2, micro_batches=2, tiling="dynamic", strategy="interleave"),
    dict(layers=2, ep=2, micro_batches=4, placement="load-balanced"),
]


@pytest.mark.parametrize("kw", CASES)
def test_values_and_kv_caches_against_the_one_chip_stack_and_the_reference(kw):
    """Layer 0's KV caches are the one-chip stack's bit for bit (the same projections of the same x); y and later
    layers' caches to the one-layer --ep tests' tolerance: the attention's partial sums are added in the
    reduce-scatter's order, not the one-chip stack's pairwise tree (float32 rounding)."""
    w = _build(**kw)
    one = _build(layers=kw["layers"], **{k: v for k, v in kw.items() if k in ("tiling", "strategy")})
    inputs, whole = make_inputs(w, seed=3), make_inputs(one, seed=3)
    ep, rows = kw["ep"], 8 // kw["ep"]
    for c in range(ep):  # chip c holds its shard's rows of x and of every layer's routing weights
        np.testing.assert_array_equal(inputs[f"x.{c}"], whole["x"][c * rows:(c + 1) * rows])
        np.testing.assert_array_equal(inputs[f"layer1.routing_weights.{c}"],
                                      whole["layer1.routing_weights"][c * rows:(c + 1) * rows])
    r = simulate(w, functional=True, inputs=inputs)
    checks = check_outputs(w, r.inputs, r.outputs)
    caches = [f"layer{i}.h{h}_{c}_cache" for i in range(kw["layers"]) for h in range(4) for c in "kv"]
    assert sorted(checks) == sorted(caches + [f"y.{c}" for c in range(ep)])
    assert all(c.passed for c in checks.values()), checks
    r1 = simulate(one, functional=True, inputs=whole)
    for name in caches:
        if name.startswith("layer0."):
            np.testing.assert_array_equal(r.outputs[name], r1.outputs[name])
        else:
            np.testing.assert_allclose(r.outputs[name], r1.outputs[name], rtol=0, atol=1e-5)
    y = np.concatenate([r.outputs[f"y.{c}"] for c in range(ep)])
    np.testing.assert_allclose(y, r1.outputs["y"], rtol=0, atol=1e-5)
    assert np.abs(y).max() > 0.1  # the comparison above is not between two near-zero outputs
    last = (kw.get("pp", 1) - 1) * ep  # the last stage's chips store y
    assert {op.chip for op in w.graph.ops if op.kind == "LinearOffChipStore" and op.tensor_name.startswith("y.")} \
        == set(range(last, last + ep))


@pytest.mark.parametrize("kw, cycles", [
    (dict(layers=2, ep=2), 5761),
    (dict(layers=2, pp=2, ep=2), 6231),
    (dict(layers=2, ep=2, micro_batches=2), 6420),
    (dict(layers=2, ep=8), 8621),
])
def test_link_bytes_off_chip_bytes_and_both_engines(kw, cycles):
    w = _build(**kw)
    program = lower(w.graph, Hardware.preset(w.hardware), channel_depth=w.channel_depth)
    fast, r = both_engines(program), simulate(w)
    assert fast.cycles == r.cycles == cycles
    links = {op.name for op in w.graph.ops if op.kind == "Link"}
    measured = {r.unit_names[u]: int(b) for u, b in enumerate(r.link_bytes) if r.unit_names[u] in links}
    assert w.params["link_bytes"] == measured and sum(measured.values()) > 0
    assert w.metrics()["off_chip_bytes"] == r.off_chip_bytes_read + r.off_chip_bytes_written


@pytest.mark.parametrize("kw", [dict(layers=2, ep=2), dict(layers=2, pp=2, ep=2), dict(layers=2, ep=8)])
def test_off_chip_bytes_are_the_one_chip_stack_s(kw):
    """Sharding reads every tensor once, as one chip does: 713,792 bytes read, 133,120 written (the gathered rows
    are packed into the one-chip stack's projection tiles: a shard's end does not close a tile)."""
    w, one = _build(**kw), _build(layers=2)
    r, r1 = simulate(w), simulate(one)
    assert (r.off_chip_bytes_read, r.off_chip_bytes_written) == (r1.off_chip_bytes_read, r1.off_chip_bytes_written) \
        == (713792, 133120)
    assert w.metrics()["off_chip_bytes"] == one.metrics()["off_chip_bytes"] == 713792 + 133120


def test_a_stage_boundary_carries_every_shard_once():
    """--pp 2 --ep 2 on 4 fully connected chips: shard c crosses from chip c to chip 2 + c once (its 4 rows of
    D = 64 at 2 bytes a value), then fans out on its new stage."""
    w = _build(layers=2, pp=2, ep=2)
    assert w.params["link_bytes"]["chip0->chip2"] == w.params["link_bytes"]["chip1->chip3"] == 4 * 64 * 2
    assert "chip0->chip3" not in w.params["link_bytes"] and "chip1->chip2" not in w.params["link_bytes"]


@pytest.mark.parametrize("kw, message", [
    (dict(layers=2, ep=2, micro_batches=4 * 2), "--micro-batches 8 --ep 2: each chip's shard of the batch of 8 "
                                                "requests must split into 8 equal micro-batches (the batch a "
                                                "multiple of 16)"),
    (dict(layers=2, ep=3), "--ep 3: the attention splits its 4 KV heads (--kv-heads) over the 3 chips; the chips "
                           "must divide them or be a multiple of them"),
    (dict(layers=2, ep=2, regions=4), "--regions does not combine with --layers / --pp / --micro-batches (a "
                                      "stack's MoE layers have one region per expert)"),
])
def test_bad_stacks_are_one_line(kw, message):
    with pytest.raises(ArgumentError) as info:
        _build(**kw)
    assert str(info.value) == message


def test_run_decoder_with_pp_and_ep_from_the_cli_and_the_record_reads_back(tmp_path, capsys):
    import pyarrow.parquet as pq

    routing, kv = write_decoder_stack_inputs(tmp_path)
    out = tmp_path / "run.parquet"
    assert main(["run", "decoder", "--model", "qwen", "--routing", str(routing), "--kv-lengths", str(kv),
                 "--kv-heads", "1", "--layers", "2", "--pp", "2", "--ep", "2", "--placement", "round-robin",
                 "--system", "ring-4", "--out", str(out), "--json"]) == 0
    row = json.loads(capsys.readouterr().out)
    params = json.loads(row["params"])
    assert (row["layers"], row["pp"], row["ep"], row["placement"], params["system"]) == (2, 2, 2, "round-robin",
                                                                                         "ring-4")
    assert params["shard_bounds"] == [0, 16, 32]
    assert row["off_chip_bytes_symbolic"] == row["off_chip_bytes_measured"] == row["off_chip_bytes"]
    (back,) = pq.read_table(out).to_pylist()
    assert (back["layers"], back["pp"], back["ep"], back["cycles"]) == (2, 2, 2, row["cycles"])
    links = [u for u in pq.read_table(tmp_path / "run_units.parquet").to_pylist() if u["kind"] == "Link"]
    assert {u["name"]: u["bytes"] for u in links} == params["link_bytes"]
