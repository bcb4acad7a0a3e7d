"""``stepsim run model.onnx --trace FILE [--iteration I] [--layer L]`` (issue 33): an ONNX model's MoE blocks routed
by a routing trace file, the flag the moe workload reads its trace with; a model with several blocks reads layer
``i`` for its ``i``-th block. Exact cycles against the Python API on the same expert ids, the trace in the run's
identity, and one-line errors with status 2."""

import json
import sys
from pathlib import Path

import numpy as np
import onnx
import pyarrow as pa
import pytest

from stepsim.cli import main
from stepsim.frontend import RoutingTrace, from_onnx
from stepsim.results.records import run_identity
from stepsim.simulation.simulate import simulate
from stepsim.trace_io.load import load_routing
from stepsim.trace_io.synthetic import synthetic_routing
from stepsim.trace_io.writers import write_trace

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from onnx_models import MODELS  # noqa: E402
from test_moe_vs_builder import E, K, T, moe_onnx  # noqa: E402


def _json(capsys, *args) -> dict:
    assert main([*args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.fixture
def files(tmp_path):
    """The one-block MoE layer (16 tokens, 8 experts, top-2), the two-layer Qwen3-MoE-shaped model (2 x 8 tokens
    per block), a one-batch trace and a two-layer trace of 16 tokens each."""
    layer, model = tmp_path / "moe.onnx", tmp_path / "qwen3_moe.onnx"
    onnx.save(moe_onnx(), layer)
    onnx.save(MODELS["qwen3_moe"](), model)
    one, two = tmp_path / "one.arrow", tmp_path / "two.arrow"
    write_trace(synthetic_routing(T, E, K, seed=0), one)
    write_trace(pa.concat_tables([synthetic_routing(T, E, K, seed=s, layer=s) for s in (0, 1)]), two)
    return layer, model, one, two


def test_a_one_block_model_runs_on_the_trace(files, capsys):
    layer, _, one, _ = files
    routing = load_routing(one, E)
    row = _json(capsys, "run", str(layer), "--trace", str(one))
    assert row["cycles"] == simulate(from_onnx(layer, routing=routing)).cycles == 1224
    assert row["cycles"] != simulate(from_onnx(layer, routing="teacher")).cycles  # the trace, not the router
    metrics = _json(capsys, "metrics", str(layer), "--trace", str(one))
    assert metrics["off_chip_bytes"] == from_onnx(layer, routing=routing).metrics()["off_chip_bytes"] == 169472
    # the trace's content is in the run's identity (its path is not)
    cfg = {"workload": "program", "program": str(layer)}
    assert run_identity({**cfg, "trace": str(one)})[0] != run_identity(cfg)[0]


def test_each_block_reads_its_layer(files, capsys):
    _, model, _, two = files
    by_block = {f"l{i}.moe.topk": load_routing(two, E, layer=i) for i in range(2)}
    assert not np.array_equal(by_block["l0.moe.topk"], by_block["l1.moe.topk"])
    want = simulate(from_onnx(model, values="seeded", routing=by_block)).cycles
    swapped = simulate(from_onnx(model, values="seeded", routing={"l0.moe.topk": by_block["l1.moe.topk"],
                                                                   "l1.moe.topk": by_block["l0.moe.topk"]})).cycles
    row = _json(capsys, "run", str(model), "--trace", str(two))
    assert row["cycles"] == want != swapped
    assert simulate(from_onnx(model, values="seeded", routing=RoutingTrace(str(two)))).cycles == want


@pytest.mark.parametrize("args, message", [
    ("run {layer} --layer 1", "--layer picks a batch of the routing trace; give the trace with --trace"),
    ("run {layer} --trace {two}", "{two}: the trace holds 2 (iteration, layer) batches ((0, 0), (0, 1)); choose one "
                                  "with --iteration and --layer"),
    ("run {layer} --trace {two} --layer 2", "{two}: no rows for iteration=None layer=2"),
    ("run {model} --trace {two} --layer 1", "{two}: model 'qwen3_moe' has 2 MoE blocks, which read the trace's "
                                            "layers 0..1 in order; --layer picks one layer and applies to a model "
                                            "with one block"),
    ("run {model} --trace {one}", "{one}: no rows for iteration=None layer=1"),
    ("metrics {other} --trace {one}", "{one}: a routing trace was given but model 'swiglu' has no MoE block (TopK of "
                                      "router probabilities, expert selection, weighted sum)"),
    ("run {big} --trace {one}", "{one}: routes 16 tokens to 2 experts each; node 'moe.topk' (TopK) routes 4 tokens "
                                "to 2"),
    ("run {py} --trace {one}", "--trace applies to a program only when it is an ONNX model (.onnx: the routing of "
                               "its MoE blocks), got '{py}'"),
])
def test_bad_flags_are_one_line_and_status_2(files, tmp_path, capsys, args, message):
    from onnx import helper
    from test_vs_builders import swiglu_onnx

    layer, model, one, two = files
    other, big = tmp_path / "swiglu.onnx", tmp_path / "small.onnx"
    onnx.save(swiglu_onnx(), other)
    small = moe_onnx()
    for vi in (small.graph.input[0], small.graph.output[0]):
        vi.type.CopyFrom(helper.make_tensor_type_proto(onnx.TensorProto.FLOAT, [4, 32]))
    onnx.save(small, big)
    names = dict(layer=layer, model=model, one=one, two=two, other=other, big=big, py=tmp_path / "f.py:g")
    assert main(args.format(**names).split()) == 2
    assert capsys.readouterr().err == f"stepsim: error: {message.format(**names)}\n"
