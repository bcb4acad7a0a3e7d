"""Pipeline parallelism of a stack of MoE layers (``stepsim run moe --layers L --pp N --micro-batches M``): per-layer
routing, values equal to the one-chip stack (bit for bit) and the NumPy reference, bytes over every link equal to
the symbolic metric, both engines agree, one-line errors."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest
from engines_agree import both_engines
from small_routing import small_routing, write_layered_routing

from stepsim.base.errors import ArgumentError, ConfigError
from stepsim.base.hardware import Hardware
from stepsim.cli import main
from stepsim.graph.lower import lower
from stepsim.simulation.simulate import simulate
from stepsim.workloads.config import workload_from_config
from stepsim.workloads.reference import check_outputs, make_inputs

B, D, LAYERS = 24, 16, 4
Y_BYTES = B * D * 2  # a stage boundary carries the batch's rows once, fp32 timed at 2 bytes a value


@pytest.fixture
def layered(tmp_path):
    """``(folder, routings)``: :func:`small_routing.write_layered_routing` of LAYERS layers."""
    return write_layered_routing(tmp_path, LAYERS)


def _config(path, **kw):
    return {"workload": "moe", "model": "custom", "hidden": D, "intermediate": 64, "experts": 8, "top_k": 2,
            "trace": path, "tile_n": 4, "tile_f": 16, **kw}


def test_each_layer_is_routed_by_its_trace_layer(layered, tmp_path):
    path, routings = layered
    w = workload_from_config(_config(path, layers=4))
    np.testing.assert_array_equal(w.trace["routing"], np.stack(routings))
    w = workload_from_config(_config(path, layers=2, layer=2))  # from --layer 2: the trace's layers 2, 3
    np.testing.assert_array_equal(w.trace["routing"], np.stack(routings[2:]))
    one = tmp_path / "one.npz"
    np.savez(one, data=routings[1])  # one batch: reused by every layer
    w = workload_from_config(_config(str(one), layers=3))
    np.testing.assert_array_equal(w.trace["routing"], np.stack([routings[1]] * 3))
    with pytest.raises(ConfigError) as info:
        workload_from_config(_config(path, layers=3, layer=2))
    assert str(info.value) == (f"{path}: --layers 3 from layer 2 needs the trace's layers 2..4; it has no layer 4 "
                               f"(layers 0..3)")


@pytest.mark.parametrize("pp, m", [(2, 1), (2, 4), (4, 2), (4, 3)])
def test_values_equal_the_one_chip_stack_and_the_reference(layered, pp, m):
    path, _ = layered
    one = workload_from_config(_config(path, layers=4, micro_batches=m))
    w = workload_from_config(_config(path, layers=4, micro_batches=m, pp=pp, system=f"ring-{pp}"))
    inputs = make_inputs(w, seed=7)
    assert sorted(inputs) == sorted(["x"] + [f"layer{i}.{name}" for i in range(4) for name in
                                             ["routing_weights"] + [f"expert{e:03d}_{p}" for e in range(8)
                                                                    for p in ("down", "gate", "up")]])
    r, r1 = simulate(w, functional=True, inputs=inputs), simulate(one, functional=True, inputs=make_inputs(one, 7))
    checks = check_outputs(w, r.inputs, r.outputs)
    assert list(checks) == ["y"] and checks["y"].passed, checks
    np.testing.assert_array_equal(r.outputs["y"], r1.outputs["y"])  # the same operators, only placed on chips
    assert {op.chip for op in w.graph.ops if op.kind == "LinearOffChipStore"} == {pp - 1}
    assert {op.chip for op in w.graph.ops if op.kind == "LinearOffChipLoad" and op.tensor.name == "x"} == {0}


def test_micro_batches_do_not_change_the_values(layered):
    """Packing tiles per micro-batch regroups the rows, never a row's arithmetic."""
    path, _ = layered
    ys = []
    for m in (1, 2, 3, 4, 6):
        w = workload_from_config(_config(path, layers=4, micro_batches=m))
        ys.append(simulate(w, functional=True, inputs=make_inputs(w, 7)).outputs["y"])
    for y in ys[1:]:
        np.testing.assert_array_equal(y, ys[0])


@pytest.mark.parametrize("tiling", ["static", "dynamic"])
@pytest.mark.parametrize("pp, m", [(2, 2), (4, 4)])
def test_bytes_over_each_link_equal_the_metric(layered, pp, m, tiling):
    """Either tiling: a stage boundary carries the batch's rows once, whatever the micro-batches."""
    path, _ = layered
    config = (_config if tiling == "static" else _dynamic)(path, layers=4, micro_batches=m, pp=pp, system=f"ring-{pp}")
    w = workload_from_config(config)
    per_link = {f"chip{s}->chip{s + 1}": Y_BYTES for s in range(pp - 1)}
    assert w.params["link_bytes"] == per_link
    r = simulate(w)
    links = {op.name for op in w.graph.ops if op.kind == "Link"}
    assert {r.unit_names[u]: int(b) for u, b in enumerate(r.link_bytes) if r.unit_names[u] in links} == per_link


@pytest.mark.parametrize("knobs, cycles", [
    ({"layers": 2, "pp": 2, "micro_batches": 2, "system": "ring-2"}, 1996),
    ({"layers": 4, "pp": 4, "micro_batches": 3, "system": "ring-4"}, 3499),
    ({"layers": 4, "pp": 2, "micro_batches": 1, "system": "ring-2"}, 3636),
])
def test_both_engines_agree_and_the_cycles_are_pinned(layered, knobs, cycles):
    path, _ = layered
    w = workload_from_config(_config(path, **knobs))
    program = lower(w.graph, Hardware.preset(w.hardware), channel_depth=w.channel_depth)
    fast = both_engines(program)
    assert fast.cycles == simulate(w).cycles == cycles


def test_a_one_layer_stack_is_the_layer(layered):
    """``--layers 1`` builds the same operators as the plain layer (its tensors named layer0.*): same cycles,
    events and values."""
    path, _ = layered
    one = workload_from_config(_config(path, layer=0))
    stack = workload_from_config(_config(path, layers=1, layer=0))
    ra, rb = simulate(one), simulate(stack)
    assert ra.cycles == rb.cycles
    np.testing.assert_array_equal(ra.unit_counters, rb.unit_counters)
    inputs = make_inputs(one, 7)
    renamed = {("layer0." + k if k != "x" else k): v for k, v in inputs.items()}
    np.testing.assert_array_equal(simulate(one, functional=True, inputs=inputs).outputs["y"],
                                  simulate(stack, functional=True, inputs=renamed).outputs["y"])


def test_run_moe_with_pp_functional_check_and_the_record_reads_back(layered, tmp_path, capsys):
    path, _ = layered
    out = tmp_path / "run.parquet"
    assert main(["run", "moe", "--model", "custom", "--hidden", "16", "--intermediate", "64", "--experts", "8",
                 "--top-k", "2", "--trace", path, "--tile-n", "4", "--tile-f", "16", "--layers", "4", "--pp", "2",
                 "--micro-batches", "2", "--system", "ring-2", "--functional", "--check", "--out", str(out),
                 "--json"]) == 0
    row = json.loads(capsys.readouterr().out)
    params = json.loads(row["params"])
    assert (row["layers"], row["pp"], row["micro_batches"], params["system"], params["links_used"]) == (4, 2, 2,
                                                                                                        "ring-2", 1)
    assert params["link_bytes"] == {"chip0->chip1": Y_BYTES}
    assert row["check_passed"] is True
    # the symbolic off-chip bytes (per-micro-batch tile counts bound from the trace) are the engine's
    assert row["off_chip_bytes_symbolic"] == row["off_chip_bytes_measured"] == row["off_chip_bytes"]
    (back,) = pq.read_table(out).to_pylist()
    assert (back["layers"], back["pp"], back["micro_batches"], back["cycles"]) == (4, 2, 2, row["cycles"])
    links = [u for u in pq.read_table(tmp_path / "run_units.parquet").to_pylist() if u["kind"] == "Link"]
    assert [(u["name"], u["bytes"]) for u in links] == [("chip0->chip1", Y_BYTES)]


@pytest.mark.parametrize("extra, message", [
    ({"layers": 2, "pp": 2}, "--pp 2 needs --system FILE|PRESET (the chips and links the stages run on)"),
    ({"layers": 2, "pp": 4, "system": "ring-4"},
     "--pp 4: more stages than the 2 layers (--layers); a stage holds at least one layer"),
    ({"layers": 3, "pp": 2, "system": "ring-2"},
     "--pp 2: the 3 layers (--layers) must split into 2 stages of equal size (a multiple of 2)"),
    ({"layers": 2, "pp": 2, "system": "ring-4"}, "--pp 2 needs a system of 2 chips; system 'ring-4' has 4"),
    ({"layers": 2, "micro_batches": 5}, "--micro-batches 5: the batch of 24 tokens must split into 5 equal "
                                        "micro-batches"),
    ({"layers": 2, "pp": 2, "system": "ring-2", "ep": 2},
     "--pp 2 --ep 2 needs a system of 4 chips (pp x ep); system 'ring-2' has 2"),
    ({"layers": 2, "ep": 2, "system": "ring-4"}, "--ep 2 needs a system of 2 chips; system 'ring-4' has 4"),
    ({"layers": 2, "ep": 2, "micro_batches": 8},
     "--micro-batches 8 --ep 2: each chip's shard of the batch of 24 tokens must split into 8 equal micro-batches "
     "(the batch a multiple of 16)"),
    ({"layers": 2, "placement": "round-robin"}, "--placement applies to the MoE layer with --ep N (expert "
                                                 "parallelism)"),
    ({"layers": 2, "pp": 2, "system": "ring-2", "tp": 2},
     "--pp 2 --tp 2 needs a system of 4 chips (pp x tp); system 'ring-2' has 2"),
    ({"layers": 2, "pp": 1, "system": "ring-2"}, "--pp must be an int >= 2 (chips), got 1"),
    ({"layers": 2, "system": "ring-2"}, "--system applies to a stack of MoE layers with --pp N (pipeline parallelism)"),
])
def test_bad_pipeline_configs_are_one_line(layered, extra, message):
    path, _ = layered
    with pytest.raises(ConfigError) as info:
        workload_from_config(_config(path, **extra))
    assert str(info.value) == message


def test_bad_pp_flag_is_one_line_with_status_2(capsys):
    assert main(["run", "moe", "--layers", "4", "--pp", "8", "--system", "ring-8"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["stepsim: error: --pp 8: more stages than the 4 layers (--layers); a stage holds at least one "
                   "layer"]


@pytest.mark.parametrize("hidden, latency, bandwidth", [(16, 500, 64), (64, 300, 16)])
def test_one_micro_batch_stages_do_not_overlap(hidden, latency, bandwidth):
    """With M = 1 and one tile per expert (``tile_n`` = B), an expert's only tile closes when the layer's last token
    arrives, so a layer is a barrier and a stage boundary only adds the hop of the last row:
    ``T(N, 1) = T(1, 1) + (N - 1)(alpha + sigma - 1)``, sigma = ``ceil(2 D / B)`` (a row at its timed width), to the
    cycle (docs/system.md: Qwen3-30B-A3B's 4-layer stack on ring-2 / ring-4 follows it too)."""
    from stepsim.base.system import from_dict
    from stepsim.models.presets import MoEModel
    from stepsim.workloads.moe.build import build_moe

    model = MoEModel("custom", hidden=hidden, intermediate=64, experts=8, top_k=2)
    routings = [small_routing(i) for i in range(4)]
    t11 = simulate(build_moe(model, routings, tile_n=B, tile_f=16, layers=4)).cycles
    sigma = -(-hidden * 2 // bandwidth)
    for n in (2, 4):
        system = from_dict({"name": "s", "chips": n, "topology": "fully-connected", "link_bandwidth": bandwidth,
                            "link_latency": latency}, source="test", name="s")
        got = simulate(build_moe(model, routings, tile_n=B, tile_f=16, layers=4, pp=n, system=system)).cycles
        assert got == t11 + (n - 1) * (latency + sigma - 1), n


def test_a_tokens_layers_top_k_array_routes_each_layer(layered, tmp_path):
    """A single .npz whose ``data`` is ``[tokens, layers, top_k]``: layer i of the stack takes ``data[:, --layer + i]``."""
    _, routings = layered
    path = tmp_path / "layers.npz"
    np.savez(path, data=np.stack(routings, axis=1))  # [24, 4, 2]
    w = workload_from_config(_config(str(path), layers=4, pp=2, system="ring-2"))
    np.testing.assert_array_equal(w.trace["routing"], np.stack(routings))
    w = workload_from_config(_config(str(path), layers=2, layer=1))
    np.testing.assert_array_equal(w.trace["routing"], np.stack(routings[1:3]))
    with pytest.raises(ConfigError) as info:
        workload_from_config(_config(str(path), layers=4, layer=1))
    assert str(info.value) == (f"{path}: --layers 4 from layer 1 needs layers 1..4 of array 'data' [tokens, layers, "
                               f"top_k], which has shape [24, 4, 2]")
    bad = np.stack(routings, axis=1)
    bad[5, 2, 1] = 9
    np.savez(path, data=bad)
    with pytest.raises(ConfigError) as info:
        workload_from_config(_config(str(path), layers=4))
    assert str(info.value) == f"{path} layer 2: row 5 column 1: expert id 9 outside 0..7"


@pytest.mark.parametrize("shared, tiling", [(0, "static"), (32, "static"), (0, "dynamic")])
def test_idle_experts_and_shared_experts_in_a_pipeline(shared, tiling):
    """Expert 7 gets no token in any layer, expert 6 only in the second micro-batch; with shared experts (tiles of
    4 tokens within micro-batches of 12): values equal the reference, both engines agree, link bytes as the metric.
    Dynamic tiling: expert 7 keeps micro-batch 0's one empty tile, expert 6 has one tile (micro-batch 1's)."""
    from stepsim.base.system import from_dict
    from stepsim.models.presets import MoEModel
    from stepsim.workloads.moe.build import build_moe

    routings = []
    for i in range(2):
        r = small_routing(10 + i) % 6  # experts 0..5 (two picks may now coincide: redraw those rows)
        r[:, 1] = (r[:, 0] + 1 + i) % 6
        r[B // 2 + 3, 1] = 6  # expert 6: one token of micro-batch 1
        routings.append(r)
    model = MoEModel("custom", hidden=D, intermediate=64, experts=8, top_k=2, shared_intermediate=shared)
    system = from_dict({"name": "s", "chips": 2, "topology": "fully-connected", "link_bandwidth": 64,
                        "link_latency": 500}, source="test", name="s")
    w = build_moe(model, routings, tiling=tiling, tile_n=4 if tiling == "static" else None, tile_f=16, layers=2,
                  pp=2, micro_batches=2, system=system)
    assert w.idle_groups == {("layer0.expert", 7), ("layer1.expert", 7)}
    r = simulate(w, functional=True, inputs=make_inputs(w, 3))
    checks = check_outputs(w, r.inputs, r.outputs)
    assert checks["y"].passed, checks
    program = lower(w.graph, Hardware.preset(w.hardware), channel_depth=w.channel_depth)
    assert both_engines(program).cycles == r.cycles
    assert w.params["link_bytes"] == {"chip0->chip1": Y_BYTES}


def test_shared_expert_tiles_must_not_span_micro_batches():
    from stepsim.models.presets import MoEModel
    from stepsim.workloads.moe.build import build_moe

    model = MoEModel("custom", hidden=D, intermediate=64, experts=8, top_k=2, shared_intermediate=32)
    with pytest.raises(ArgumentError) as info:
        build_moe(model, [small_routing(0)] * 2, tile_n=8, tile_f=16, layers=2, micro_batches=2)
    assert str(info.value) == ("--micro-batches 2: the shared experts' tiles of --tile-n 8 tokens must not span "
                               "micro-batches of 12 tokens (a multiple of 8)")


def test_dynamic_shared_expert_tiles_must_not_span_micro_batches():
    """Dynamic tiling packs the shared experts' tokens in the default tiles of 32 (it has no --tile-n)."""
    from stepsim.models.presets import MoEModel
    from stepsim.workloads.moe.build import build_moe

    model = MoEModel("custom", hidden=D, intermediate=64, experts=8, top_k=2, shared_intermediate=32)
    with pytest.raises(ArgumentError) as info:
        build_moe(model, [small_routing(0)] * 2, tiling="dynamic", tile_f=16, layers=2, micro_batches=2)
    assert str(info.value) == ("--micro-batches 2: the shared experts' tiles of 32 tokens (dynamic tiling's default) "
                               "must not span micro-batches of 12 tokens (a multiple of 32)")


def _dynamic(path, **kw):
    return _config(path, tiling="dynamic", tile_n=None, **kw)


@pytest.mark.parametrize("pp, m", [(2, 2), (4, 3)])
def test_dynamic_micro_batches_equal_the_one_chip_stack_and_the_reference(layered, pp, m):
    """Dynamic tiling, one tile per expert and micro-batch with tokens (moe/build.py ``_micro_batch_tiles``): the
    values are the one-chip stack's, bit for bit, and the reference's."""
    path, _ = layered
    one = workload_from_config(_dynamic(path, layers=4, micro_batches=m))
    w = workload_from_config(_dynamic(path, layers=4, micro_batches=m, pp=pp, system=f"ring-{pp}"))
    r, r1 = simulate(w, functional=True, inputs=make_inputs(w, 7)), simulate(one, functional=True,
                                                                             inputs=make_inputs(one, 7))
    checks = check_outputs(w, r.inputs, r.outputs)
    assert list(checks) == ["y"] and checks["y"].passed, checks
    np.testing.assert_array_equal(r.outputs["y"], r1.outputs["y"])


def test_dynamic_micro_batches_do_not_change_the_values_bytes_or_exact_flops(layered):
    """M = 1 .. 6 give the same y, bit for bit; the symbolic off-chip bytes are the engine's (each micro-batch's
    tile re-reads its expert's weights: more bytes with M); the exact FLOPs (ragged tiles at their mean rows) are
    M = 1's: for each of the 4 x 24 x 2 token-expert pairs the gate, up and down matmuls (6 D F), SiLU (8 F), the
    gate * up product (F), the routing-weight scale (D) and the sum over the slots (D)."""
    from stepsim.results.records import run_config

    path, _ = layered
    ys, offs, exact = [], [], []
    for m in (1, 2, 3, 4, 6):
        w = workload_from_config(_dynamic(path, layers=4, micro_batches=m))
        ys.append(simulate(w, functional=True, inputs=make_inputs(w, 7)).outputs["y"])
        exact.append(sum(w.op_flops().values()))
        row = run_config({**_dynamic(path, layers=4, micro_batches=m), "mode": "simulate"}).row
        assert row["off_chip_bytes_symbolic"] == row["off_chip_bytes_measured"], m
        offs.append(row["off_chip_bytes"])
    for y in ys[1:]:
        np.testing.assert_array_equal(y, ys[0])
    assert offs == [199296, 383616, 531072, 666240, 789120]
    assert exact == [4 * B * 2 * (6 * D * 64 + 8 * 64 + 64 + D + D)] * 5


@pytest.mark.parametrize("knobs, cycles", [
    ({"layers": 4, "micro_batches": 3}, 2173),
    ({"layers": 2, "pp": 2, "micro_batches": 2, "system": "ring-2"}, 2001),
    ({"layers": 4, "pp": 4, "micro_batches": 3, "system": "ring-4"}, 3502),
])
def test_dynamic_micro_batches_both_engines_agree_and_the_cycles_are_pinned(layered, knobs, cycles):
    path, _ = layered
    w = workload_from_config(_dynamic(path, **knobs))
    program = lower(w.graph, Hardware.preset(w.hardware), channel_depth=w.channel_depth)
    assert both_engines(program).cycles == simulate(w).cycles == cycles


def test_dynamic_micro_batch_bounds_hold(layered):
    """Every per-unit bound of a dynamic micro-batched stack (ragged tiles at their own rows) is below its run."""
    from stepsim.results.records import run_config

    path, _ = layered
    row = run_config({**_dynamic(path, layers=4, micro_batches=3, pp=2, system="ring-2"), "mode": "simulate"}).row
    assert (row["load_unit_cycles"], row["compute_unit_cycles"], row["hbm_request_cycles"], row["pipeline_cycles"],
            row["link_cycles"], row["cycles"]) == (912, 96, 553, 912, 523, 2635)
