"""The MoE pattern (issue 33): a Qwen3-MoE-style FFN written densely (router softmax, top-k renormalized gates,
every expert weighted by its gate) is recognized and lowered to Partition / Reassemble routing on a trace; with
the router's own top-k as the trace (teacher forcing) the outputs equal onnxruntime's, and only the experts that
receive tokens are loaded and computed."""

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from stepsim.base.errors import FrontendError
from stepsim.frontend import from_onnx
from stepsim.frontend.check import check_outputs
from stepsim.simulation.simulate import simulate

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(Path(__file__).parent))
from onnx_models import MODELS, _Builder, _moe_ffn  # noqa: E402
from ort_check import ort_run, rand  # noqa: E402

T, D, F, E, K = 16, 32, 48, 8, 2


def moe_block():
    """y = x + MoE(x), x [T, D]."""
    b = _Builder(3)
    y = _moe_ffn(b, "moe", "x", D, E, K, F)
    b.op("Add", ["x", y], "y")
    graph = helper.make_graph(b.nodes, "moe_block", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [T, D])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [T, D])],
                              [onnx.numpy_helper.from_array(v, k) for k, v in b.init.items()])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    m.ir_version = 10
    return m


def teacher_forced(m, feeds, topk_outputs):
    """onnxruntime's outputs and the routing its TopK chose (the trace), by TopK node name."""
    probe = onnx.ModelProto.FromString(m.SerializeToString())
    for node, out in topk_outputs.items():
        probe.graph.output.append(helper.make_tensor_value_info(out, TensorProto.INT64, None))
    got = ort_run(probe, feeds)
    return got, {node: got[out].reshape(-1, K) for node, out in topk_outputs.items()}


def test_moe_block_matches_onnxruntime_and_loads_only_routed_experts():
    x = rand((T, D), 5)
    want, routing = teacher_forced(moe_block(), {"x": x}, {"moe.topk": "moe.topi"})
    w = from_onnx(moe_block(), routing=routing)
    assert any(op.group == ("node", "moe.topk.moe") for op in w.graph)  # the block became one MoE node
    r = simulate(w, functional=True, inputs={"x": x})
    err = np.abs(r.outputs["y"] - want["y"]).max() / np.abs(want["y"]).max()
    (c,) = check_outputs(w, r.inputs, r.outputs).values()
    print(f"moe block: max rel error vs onnxruntime {err:.2e} (tolerance {c.tolerance:.2e})")
    assert c.passed and err <= c.tolerance
    counts = np.bincount(routing["moe.topk"].ravel(), minlength=E)
    active = int((counts > 0).sum())
    # x, the router (once per one-token row tile), the 3 weights of each expert with tokens (once: its tokens are
    # packed into one tile), the trace's mask, each expert's one-hot gate column per token, y
    want_bytes = 4 * (T * D + T * D * E + active * 3 * D * F + T * E + E * int(counts.sum()) + T * D)
    assert w.metrics()["off_chip_bytes"] == want_bytes


def test_an_idle_expert_costs_nothing():
    x = rand((T, D), 5)
    _, routing = teacher_forced(moe_block(), {"x": x}, {"moe.topk": "moe.topi"})
    skewed = np.stack([np.arange(T) % 2, 2 + np.arange(T) % 3], axis=1)  # experts 0..4 only
    lean = from_onnx(moe_block(), routing={"moe.topk": skewed}).metrics()["off_chip_bytes"]
    full = from_onnx(moe_block(), routing=routing).metrics()["off_chip_bytes"]
    active = int((np.bincount(routing["moe.topk"].ravel(), minlength=E) > 0).sum())
    assert full - lean == (active - 5) * 3 * D * F * 4


def test_whole_qwen3_moe_model():
    ids = np.random.default_rng(0).integers(0, 128, (2, 8))
    m = MODELS["qwen3_moe"]()
    want, routing = teacher_forced(m, {"input_ids": ids}, {f"l{i}.moe.topk": f"l{i}.moe.topi" for i in range(2)})
    w = from_onnx(m, values={"input_ids": ids}, routing=routing)
    r = simulate(w, functional=True)
    err = np.abs(r.outputs["logits"].reshape(want["logits"].shape) - want["logits"]).max() / np.abs(
        want["logits"]).max()
    (c,) = check_outputs(w, r.inputs, r.outputs).values()
    print(f"qwen3_moe: max rel error vs onnxruntime {err:.2e} (tolerance {c.tolerance:.2e}), {r.cycles} cycles")
    assert c.passed and err <= c.tolerance


def test_routing_errors():
    with pytest.raises(FrontendError) as err:
        from_onnx(moe_block())
    assert str(err.value) == ("node 'moe.topk' (TopK): a MoE block's routing is data dependent; give the trace with "
                              "from_onnx(..., routing=[16, 2] expert ids)")
    with pytest.raises(FrontendError) as err:
        from_onnx(moe_block(), routing=np.zeros((T, 3), np.int64))
    assert str(err.value) == ("node 'moe.topk' (TopK): routing must be integers in [0, 8) of shape [16, 2], got "
                              "int64 [16, 3]")
    with pytest.raises(FrontendError) as err:
        from_onnx(moe_block(), routing=np.zeros((T, 2), np.int64))
    assert str(err.value) == "node 'moe.topk' (TopK): routing repeats an expert within a token"
    with pytest.raises(FrontendError) as err:
        from_onnx(moe_block(), routing=np.tile([0, 1], (T, 1)), tiling={"tile_m": 2})
    assert str(err.value) == "node 'moe.topk' (TopK): routing tokens needs one-token tiles (tile_m=1), got tile_m 2"


def test_qwen3_moe_decode_step():
    ids = np.random.default_rng(1).integers(0, 128, (2, 1))
    m = MODELS["qwen3_moe"](past=7)
    feeds = {i.name: rand([d.dim_value for d in i.type.tensor_type.shape.dim], k)
             for k, i in enumerate(m.graph.input) if i.name != "input_ids"}
    want, routing = teacher_forced(m, {"input_ids": ids, **feeds},
                                   {f"l{i}.moe.topk": f"l{i}.moe.topi" for i in range(2)})
    w = from_onnx(m, values={"input_ids": ids}, routing=routing)
    r = simulate(w, functional=True, inputs=feeds)
    for out, ref in want.items():
        if out.endswith("topi"):
            continue
        err = np.abs(r.outputs[out].reshape(ref.shape) - ref).max() / np.abs(ref).max()
        print(f"qwen3_moe decode {out}: max rel error {err:.2e}")
        assert err < 2e-6


def test_teacher_routing_is_the_routers_choice_on_the_seeded_inputs():
    w = from_onnx(moe_block(), routing="teacher", seed=4)
    x = next(op.tensor.data for op in w.graph if op.kind == "LinearOffChipLoad" and op.tensor.name == "x")
    import zlib

    rng = np.random.default_rng(np.random.SeedSequence([4, zlib.crc32(b"x")]))
    assert np.array_equal(x, rng.standard_normal((T, D)).astype(np.float32))
    _, routing = teacher_forced(moe_block(), {"x": x}, {"moe.topk": "moe.topi"})
    r = simulate(w, functional=True)  # the default inputs: the loads' data
    assert np.array_equal(r.inputs["x"], x)
    assert all(c.passed for c in check_outputs(w, r.inputs, r.outputs).values())
    explicit = from_onnx(moe_block(), routing=routing)
    assert simulate(explicit).cycles == simulate(w).cycles  # the same routing


def test_cli_runs_a_moe_model_with_teacher_routing(tmp_path, capsys):
    import json

    from stepsim.cli import main

    path = tmp_path / "qwen3_moe.onnx"
    onnx.save(MODELS["qwen3_moe"](), path)
    assert main(["run", str(path), "--functional", "--check", "--json"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["check_passed"] is True and row["check_max_rel_error"] < 2e-6
