"""Bad ONNX models and flags, as a hostile but fair user gives them (issue 44): one line naming the graph input /
initializer / node / flag and its shape, exit status 2, no traceback, nothing written; every input checked
before onnx's reference evaluator or NumPy allocates anything. A bf16 model (documented as supported) runs on
every command.

CLI cases run ``stepsim.cli.main`` in-process in a folder holding every model of :func:`write_models`, in the style
of tests/cli/test_bad_inputs.py."""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from stepsim.base.errors import FrontendError
from stepsim.cli import main
from stepsim.frontend import from_onnx

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(Path(__file__).parent))
from onnx_blocks import BLOCKS  # noqa: E402
from onnx_models import MODELS  # noqa: E402
from ort_check import model  # noqa: E402
from test_bf16 import to_bf16  # noqa: E402
from test_moe import moe_block  # noqa: E402

E = "stepsim: error: "
FP = "stepsim lowers float32 and bfloat16 models (bf16 storage, fp32 compute): convert the model's float tensors to one of those"


def _typed(m: onnx.ModelProto, elem: int, dtype, inits=True, io=True) -> onnx.ModelProto:
    """``m`` with its float initializers (``inits``) and graph inputs / outputs (``io``) stored as ``elem``."""
    m = onnx.ModelProto.FromString(m.SerializeToString())
    for i, t in enumerate(m.graph.initializer):
        if inits and t.data_type == TensorProto.FLOAT:
            m.graph.initializer[i].CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(dtype), t.name))
    for vi in list(m.graph.input) + list(m.graph.output):
        if io:
            vi.type.tensor_type.elem_type = elem
    return m


def relu(shape, elem=TensorProto.FLOAT, name="relu"):
    """y = Relu(x), x a graph input of ``shape`` and element type ``elem``."""
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="r0")], name,
                          [helper.make_tensor_value_info("x", elem, shape)],
                          [helper.make_tensor_value_info("y", elem, shape)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    m.ir_version = 10
    return m


def const_of_shape():
    """y = x + ConstantOfShape([2**20, 2**20, 64]): folding would allocate 2**46 elements."""
    nodes = [helper.make_node("ConstantOfShape", ["shape"], ["c"], name="big"),
             helper.make_node("Add", ["x", "c"], ["y"], name="add")]
    return model(nodes, {"x": [64]}, {"y": [2**20, 2**20, 64]}, {"shape": np.array([2**20, 2**20, 64], np.int64)},
                 name="const_of_shape")


def write_models(d: Path) -> None:
    llama = BLOCKS["llama"](2, 8, 16, 32)
    onnx.save(llama, d / "llama.onnx")
    onnx.save(to_bf16(llama), d / "bf16.onnx")
    onnx.save(_typed(llama, TensorProto.FLOAT16, np.float16), d / "fp16.onnx")
    onnx.save(_typed(llama, TensorProto.DOUBLE, np.float64), d / "fp64.onnx")
    onnx.save(_typed(llama, TensorProto.FLOAT16, np.float16, io=False), d / "fp16_weights.onnx")
    onnx.save(relu([4, 8], TensorProto.INT8), d / "int8.onnx")
    onnx.save(relu([-4, 8]), d / "negative.onnx")
    onnx.save(relu([0, 8]), d / "zero.onnx")
    onnx.save(relu([]), d / "scalar.onnx")
    onnx.save(relu([2**30, 2**30, 8]), d / "huge.onnx")
    onnx.save(MODELS["llama"](1, 2, 8, 64, 4, 64, 128, kv_heads=3), d / "kv3.onnx")  # 3 KV heads, 4 query heads
    onnx.save(const_of_shape(), d / "const_of_shape.onnx")
    onnx.save(moe_block(), d / "moe.onnx")
    for name, dims in (("short_init", [2**20, 2**20]), ("negative_init", [-4, -8])):  # declared, not stored
        m = model([helper.make_node("Add", ["x", "c"], ["y"], name="add")], {"x": [4, 8]}, {"y": [4, 8]},
                  {"c": np.ones((4, 8), np.float32)}, name=name)
        m.graph.initializer[0].dims[:] = dims
        onnx.save(m, d / f"{name}.onnx")
    os.mkfifo(d / "pipe.onnx")  # reading it would block forever
    (d / "folder.onnx").mkdir()


NEG = "graph input 'x' has shape [-4, 8]: every dim must be at least 1"
KV3 = ("node 'l0.attn.k_heads' (Reshape): cannot reshape 'l0.attn.k_rep' [2, 3, 1, 8, 16] (768 elements) into "
       "[2, 4, 8, 16] (1,024 elements, shape 'shape_q_heads')")
HUGE = ("graph input 'x' has shape [1073741824, 1073741824, 8]: 36,893,488 TB as fp32, more than the 1,126 TB a "
        "model's value may hold; a dim is wrong")
ONNX_OPT = "does not apply to optimize of an .onnx model: "

#: (command line, exit status, the exact last line of stderr)
CLI_CASES = [
    # --- files that are no model
    ("metrics pipe.onnx", 2, E + "pipe.onnx: not a regular file (a pipe, socket or device), not an ONNX file"),
    ("run folder.onnx", 2, E + "folder.onnx: a folder, not an ONNX file"),
    ("optimize pipe.onnx --out o", 2, E + "pipe.onnx: not a regular file (a pipe, socket or device), not an ONNX file"),
    # --- element types: one line, before shape inference or the evaluator
    ("metrics fp16.onnx", 2, E + f"graph input 'x' is float16; {FP}"),
    ("graph show fp16.onnx", 2, E + f"graph input 'x' is float16; {FP}"),
    ("run fp16.onnx --functional --check", 2, E + f"graph input 'x' is float16; {FP}"),
    ("optimize fp16.onnx --out o", 2, E + f"graph input 'x' is float16; {FP}"),
    ("metrics fp64.onnx", 2, E + f"graph input 'x' is float64; {FP}"),
    ("run fp64.onnx", 2, E + f"graph input 'x' is float64; {FP}"),
    ("metrics fp16_weights.onnx", 2, E + f"initializer 'w_gate' [16, 32] is float16; {FP}"),
    ("metrics int8.onnx", 2, E + "graph input 'x' is int8; supported graph inputs: float32, bfloat16, int32, int64 "
                                 "(float activations, integer token ids)"),
    # --- dims and sizes: before any array of the inputs' shapes exists
    ("metrics negative.onnx", 2, E + NEG),
    ("graph show negative.onnx", 2, E + NEG),
    ("run negative.onnx --functional", 2, E + NEG),
    ("metrics zero.onnx", 2, E + "graph input 'x' has shape [0, 8]: every dim must be at least 1"),
    ("metrics scalar.onnx", 2, E + "graph input 'x' is a scalar (shape []); stepsim streams graph inputs of at least "
                                   "one dim: give it shape [1]"),
    ("metrics huge.onnx", 2, E + HUGE),
    ("run huge.onnx --functional --check", 2, E + HUGE),
    ("metrics short_init.onnx", 2, E + "short_init.onnx: invalid ONNX model (TensorProto (tensor name: c) raw_data size "
                                       "(128 bytes) is too small for the declared shape and type (4398046511104 bytes "
                                       "required).)"),
    ("metrics negative_init.onnx", 2,
     E + "negative_init.onnx: invalid ONNX model (Negative dimension value (tensor name: c))"),
    ("metrics kv3.onnx", 2, E + KV3),
    ("run kv3.onnx --functional --check", 2, E + KV3),
    # --- optimize: the shared checks, then every flag the tile search would ignore
    ("optimize llama.onnx --out o --max-chips 4", 2,
     E + "--max-chips " + ONNX_OPT + "the tile search runs on one chip (no tensor or expert parallelism of a lowered "
                                     "model)"),
    ("optimize llama.onnx --out o --space space.toml", 2,
     E + "--space " + ONNX_OPT + "the tile search builds its own space from the model's shapes (tile_m x tile_n, "
                                 "fusion)"),
    ("optimize llama.onnx --out o --max-compute 512", 2,
     E + "--max-compute " + ONNX_OPT + "every tiling of a lowered model allocates the same compute (compute_bw per "
                                       "node)"),
    ("optimize llama.onnx --out o --jobs 2", 2,
     E + "--jobs " + ONNX_OPT + "the tile search simulates in this process, one tiling after another"),
    ("optimize llama.onnx --out o --executor dask", 2, E + "--executor " + ONNX_OPT + "the tile search simulates in "
                                                                                      "this process"),
    ("optimize llama.onnx --out o --force", 2,
     E + "--force " + ONNX_OPT + "the tile search never simulates past the run-size limit (10^9 engine events)"),
    ("optimize llama.onnx --out o --channel-depth 4", 2,
     E + "--channel-depth " + ONNX_OPT + "the tile search takes the model, --trace, --no-fuse and --hardware"),
    ("optimize llama.onnx --out o --convention paper", 2,
     E + "--convention " + ONNX_OPT + "the tile search takes the model, --trace, --no-fuse and --hardware"),
    ("optimize llama.onnx --out o --system ring-4", 2,
     E + "--system does not apply to workload 'program' (it applies to: moe, swiglu, decoder, collective)"),
    ("optimize llama.onnx --out o --model qwen", 2,
     E + "--model does not apply to workload 'program' (it applies to: moe, prefill_attention, mla_attention, mla_prefill, sliding_attention, decoder)"),
    ("optimize llama.onnx --out o --iteration 1", 2,
     E + "--iteration picks a batch of the routing trace; give the trace with --trace"),
    ("optimize llama.onnx --out o --max-on-chip 0", 2, E + "--max-on-chip must be an integer >= 1, got 0"),
    ("optimize llama.onnx --out o --trace routing.arrow", 2,
     E + "routing.arrow: a routing trace was given but model 'llama_block' has no MoE block (TopK of router "
         "probabilities, expert selection, weighted sum)"),
    ("optimize llama.onnx --out o --spill h", 2,
     E + "--spill does not apply to optimize: it searches which edges spill (--no-fuse fixes every edge spilled)"),
]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("models")
    write_models(d)
    return d


@pytest.fixture
def in_models(models, monkeypatch):
    monkeypatch.chdir(models)
    yield models
    written = [p for p in models.iterdir() if p.suffix != ".onnx"]
    assert written == []  # nothing half-written (no --out folder, no record)


def run_cli(command: str, capsys) -> tuple[int, str, str]:
    try:
        code = main(shlex.split(command))
    except SystemExit as exc:  # argparse's own errors
        code = exc.code
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, out, err


@pytest.mark.parametrize(("command", "status", "line"), CLI_CASES, ids=[c[0] for c in CLI_CASES])
def test_cli_bad_onnx_input(in_models, capsys, command, status, line):
    code, _, err = run_cli(command, capsys)
    assert (code, err.strip().splitlines()[-1]) == (status, line)


def test_folding_a_huge_constant_is_refused_before_it_is_allocated(in_models, capsys, monkeypatch):
    monkeypatch.setattr("stepsim.kernels.run_size.available_memory", lambda: 16 * 2**30)
    code, _, err = run_cli("metrics const_of_shape.onnx", capsys)
    assert (code, err.strip().splitlines()[-1]) == (2, E + (
        "node 'big' (ConstantOfShape): folding its constant inputs needs about 563 TB for its values, more than the "
        "17.2 GB of memory available; a dim of the model is wrong"))


def test_teacher_routing_is_refused_when_its_evaluation_does_not_fit(in_models, capsys, monkeypatch):
    monkeypatch.setattr("stepsim.kernels.run_size.available_memory", lambda: 1000)
    code, _, err = run_cli("metrics moe.onnx", capsys)
    assert (code, err.strip().splitlines()[-1]) == (2, E + (
        "model 'moe_block': evaluating its routers on seeded inputs (teacher routing) needs about 3.33 kB for its "
        "values, more than the 1.00 kB of memory available; give the routing with a trace (--trace FILE, or "
        "from_onnx(..., routing=...))"))


def test_teacher_routing_evaluates_only_the_routers(monkeypatch):
    """The evaluator runs the nodes the routers' top-k depend on: none of the experts' MatMuls."""
    from onnx.reference import ReferenceEvaluator

    seen = []
    real = ReferenceEvaluator.__init__

    def spy(self, proto, *a, **kw):
        if len(proto.graph.node) > 1:  # not a one-node constant fold
            seen.append([n.op_type for n in proto.graph.node])
        real(self, proto, *a, **kw)

    monkeypatch.setattr(ReferenceEvaluator, "__init__", spy)
    from_onnx(moe_block(), routing="teacher")
    assert seen == [["MatMul", "Softmax", "TopK"]]


def test_a_model_without_moe_is_never_evaluated(monkeypatch):
    from onnx.reference import ReferenceEvaluator

    def refuse(*a, **kw):
        raise AssertionError("evaluated")

    monkeypatch.setattr(ReferenceEvaluator, "run", refuse)
    w = from_onnx(BLOCKS["llama"](2, 8, 16, 32), values="seeded", routing="teacher")
    assert w.frontend.tile_m == 8


# --- a bf16 model on every command ------------------------------------------------------------------------------
def test_a_bf16_model_runs_on_run_metrics_check_and_optimize(in_models, capsys):
    from stepsim.simulation.simulate import simulate

    w = from_onnx(in_models / "bf16.onnx")
    code, out, _ = run_cli("metrics bf16.onnx --json", capsys)
    assert code == 0 and json.loads(out)["off_chip_bytes"] == w.metrics()["off_chip_bytes"]
    code, out, _ = run_cli("run bf16.onnx --json", capsys)
    assert code == 0 and json.loads(out)["cycles"] == simulate(w).cycles
    code, out, _ = run_cli("run bf16.onnx --functional --check --json", capsys)
    row = json.loads(out)
    assert code == 0 and row["check_passed"] is True and row["check_max_rel_error"] < 1e-6
    code, out, _ = run_cli("graph show bf16.onnx", capsys)
    assert code == 0 and out.startswith("graph llama_block: ")
    import shutil

    try:
        code, out, _ = run_cli("optimize bf16.onnx --out opt --json", capsys)
        doc = json.loads(out)
        assert code == 0 and doc["recommended"] is not None
        assert json.loads((in_models / "opt" / "optimize.json").read_text()) == doc
    finally:
        shutil.rmtree(in_models / "opt", ignore_errors=True)


def test_optimize_of_a_moe_model_honours_its_routing_trace(tmp_path, capsys):
    from stepsim.frontend import RoutingTrace
    from stepsim.optimize.onnx_search import search

    path = tmp_path / "moe.onnx"
    onnx.save(moe_block(), path)
    ids = np.array([[i % 8, (i + 3) % 8] for i in range(16)], np.int64)
    np.savez(tmp_path / "routing.npz", data=ids)
    code, out, _ = run_cli(f"optimize {path} --out {tmp_path / 'o'} --trace {tmp_path / 'routing.npz'} --json", capsys)
    doc = json.loads(out)
    want = search(str(path), routing=RoutingTrace(str(tmp_path / "routing.npz")))
    assert code == 0 and [p["cycles"] for p in doc["pareto"]] == [p.cycles for p in want.front]
    teacher = search(str(path))
    assert [p.cycles for p in want.front] != [p.cycles for p in teacher.front]  # the trace was used


# --- the Python API: tiling, dims and knobs -----------------------------------------------------------------------
def _relu_dyn():
    return model([helper.make_node("Relu", ["x"], ["y"], name="r0")], {"x": ["batch", 8]}, {"y": ["batch", 8]})


API_CASES = [
    ("tile_m 0", dict(tiling={"tile_m": 0}), "tiling: tile_m must be an integer of at least 1 or None, got 0"),
    ("tile_m -8", dict(tiling={"tile_m": -8}), "tiling: tile_m must be an integer of at least 1 or None, got -8"),
    ("tile_m 2.0", dict(tiling={"tile_m": 2.0}), "tiling: tile_m must be an integer of at least 1 or None, got 2.0"),
    ("tile_n 0", dict(tiling={"tile_n": 0}), "tiling: tile_n must be an integer of at least 1 or None, got 0"),
    ("per_node 0", dict(tiling={"per_node": {"mm": 0}}), "tiling: per_node['mm'] must be an integer of at least 1, got 0"),
    ("compute_bw 0", dict(tiling={"compute_bw": 0}), "tiling: compute_bw must be an integer of at least 1, got 0"),
    ("par_dispatch -1", dict(tiling={"par_dispatch": -1}),
     "tiling: par_dispatch must be an integer of at least 1, got -1"),
    ("reread_inputs 1", dict(tiling={"reread_inputs": 1}), "tiling: reread_inputs must be True or False, got 1"),
    ("unknown field", dict(tiling={"tile_k": 4}),
     "tiling: unknown field 'tile_k' (fields: tile_m, tile_n, per_node, compute_bw, par_dispatch, reread_inputs)"),
    ("tiling list", dict(tiling=[8]), "tiling must be a Tiling or a dict of its fields, got list"),
    ("budget -1", dict(budget=-1), "from_onnx: budget must be an integer of at least 0, got -1"),
    ("channel_depth 0", dict(channel_depth=0), "from_onnx: channel_depth must be an integer of at least 1, got 0"),
    ("seed -1", dict(seed=-1), "from_onnx: seed must be an integer of at least 0, got -1"),
    ("fuse 'no'", dict(fuse="no"), "from_onnx: fuse must be True or False, got 'no'"),
    ("hardware 3", dict(hardware=3), "from_onnx: hardware must be a preset name or a TOML path (a string), got 3"),
    ("routing without MoE", dict(routing=[[0, 1]]),
     "from_onnx: routing was given but model 'llama_block' has no MoE block (TopK of router probabilities, expert "
     "selection, weighted sum)"),
    ("routing 'teach'", dict(routing="teach"),
     "from_onnx: routing must be expert ids, a dict of them, a RoutingTrace or 'teacher', got 'teach'"),
    ("unknown dim", dict(dims={"batch": 2}), "dims: 'batch' is no dynamic dim of the inputs of model 'llama_block' "
                                             "(those: none)"),
    ("spill as one string", dict(spill="nope"),
     "spill: 'nope' is no edge of model 'llama_block'; its edges' values: sq, ms, mse, rms, inv, xn, h, gate, silu, up, z, "
     "down (a value spills all its edges, VALUE->CONSUMER one)"),
]


@pytest.mark.parametrize(("name", "kw", "message"), API_CASES, ids=[c[0] for c in API_CASES])
def test_python_api_bad_knob(name, kw, message):
    with pytest.raises(FrontendError) as err:
        from_onnx(BLOCKS["llama"](2, 8, 16, 32), **kw)
    assert str(err.value) == message


@pytest.mark.parametrize(("size", "shown"), [(0, "0"), (-2, "-2"), (2.5, "2.5"), (True, "True"), ("4", "'4'")])
def test_python_api_bad_dims(size, shown):
    with pytest.raises(FrontendError) as err:
        from_onnx(_relu_dyn(), dims={"batch": size})
    assert str(err.value) == f"dims: 'batch' must be an integer of at least 1, got {shown}"


def test_numpy_integers_are_sizes():
    w = from_onnx(_relu_dyn(), dims={"batch": np.int64(4)}, tiling={"tile_m": np.int32(2)})
    assert w.frontend.tile_m == 2


def test_the_checks_reference_is_refused_before_the_run_when_it_does_not_fit(in_models, capsys, monkeypatch):
    monkeypatch.setattr("stepsim.kernels.run_size.available_memory", lambda: 4096)  # the model's values: 4,160 fp32
    simulated = []
    monkeypatch.setattr("stepsim.simulation.simulate.simulate", lambda *a, **kw: simulated.append(1))
    code, _, err = run_cli("run llama.onnx --functional --check", capsys)
    assert (code, err.strip().splitlines()[-1], simulated) == (2, E + (
        "model 'llama_block': the check's reference (onnx's evaluator) needs about 16.6 kB for its values, more than "
        "the 4.10 kB of memory available; check a model with smaller dims (the timing run needs no reference: drop "
        "--check)"), [])
    code, _, _ = run_cli("metrics llama.onnx", capsys)  # no reference, no refusal
    assert code == 0


@pytest.mark.parametrize("command", ["metrics fp16.onnx", "run kv3.onnx --functional --check", "metrics huge.onnx"])
def test_cli_bad_onnx_input_in_a_new_process(in_models, command):
    import subprocess

    [(status, line)] = [(c[1], c[2]) for c in CLI_CASES if c[0] == command]
    proc = subprocess.run([sys.executable, "-m", "stepsim", *shlex.split(command)], cwd=in_models,
                          capture_output=True, text=True, timeout=120)
    assert "Traceback" not in proc.stderr
    assert (proc.returncode, proc.stderr.strip().splitlines()[-1], proc.stdout) == (status, line, "")
