"""The decoder layer (stepsim.workloads.decoder.build): attention over every KV head, output projection and residual,
then an MoE block (with or without shared experts) or a dense FFN, and the second residual, in one graph."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from stepsim.base.errors import ArgumentError
from stepsim.cli import main
from stepsim.models.presets import resolve_model
from stepsim.simulation.simulate import simulate
from stepsim.workloads.attention.build import build_attention
from stepsim.workloads.decoder.build import build_decoder
from stepsim.workloads.moe.build import build_moe
from stepsim.workloads.reference import check_outputs, max_rel_error, workload_reference

KV = np.array([5, 40, 17, 64, 3, 33, 100, 31])
QWEN_SMALL = dataclasses.replace(resolve_model("qwen"), hidden=64, heads=8, kv_heads=2, head_dim=16,
                                 expert_intermediate=32, experts=8, top_k=2)
SHARED_SMALL = dataclasses.replace(QWEN_SMALL, shared_experts=1, shared_intermediate=32)
DENSE_SMALL = dataclasses.replace(resolve_model("llama"), hidden=64, heads=8, kv_heads=2, head_dim=16,
                                  dense_intermediate=64)


def _routing(batch=8, experts=8, top_k=2, seed=0):
    rng = np.random.default_rng(seed)
    return np.stack([rng.choice(experts, top_k, replace=False) for _ in range(batch)])


CASES = {
    "moe-dynamic": (QWEN_SMALL, dict(strategy="dynamic")),
    "moe-coarse-dynamic-tiling": (QWEN_SMALL, dict(strategy="coarse", tiling="dynamic")),
    "shared-interleave": (SHARED_SMALL, dict(strategy="interleave")),
    "shared-timeshared": (SHARED_SMALL, dict(strategy="dynamic", regions=4)),
    "dense": (DENSE_SMALL, dict(strategy="dynamic")),
}


@pytest.mark.parametrize("case", list(CASES))
def test_functional_run_matches_the_composed_reference(case):
    model, kw = CASES[case]
    w = build_decoder(model, KV, _routing() if model.is_moe else None, softmax="stable", tile_f=16, **kw)
    r = simulate(w, functional=True)
    checks = check_outputs(w, r.inputs, r.outputs)
    assert sorted(checks) == ["h0_k_cache", "h0_v_cache", "h1_k_cache", "h1_v_cache", "y"]
    assert all(c.passed for c in checks.values()) and checks["y"].error < 1e-6
    # the reference is sensitive to each stage: another output projection or no residual is far off
    changed = dict(r.inputs, wo_h1_q3=r.inputs["wo_h1_q3"] * 2)
    assert max_rel_error(r.outputs["y"], workload_reference(w, changed)["y"]) > 100 * checks["y"].tolerance
    no_residual = dict(r.inputs, x=np.zeros_like(r.inputs["x"]))
    assert max_rel_error(r.outputs["y"], workload_reference(w, no_residual)["y"]) > 100 * checks["y"].tolerance


@pytest.fixture(scope="module")
def b64(shared_traces):
    kv = np.load(shared_traces / "kv_lengths" / "b64" / "conv_stdev0477_0271_0334.npy")
    routing = np.load(shared_traces / "expert_routing" / "qwen_b64" / "032_012.npz")["data"]
    return kv, routing


def test_qwen_b64_off_chip_bytes_and_cycles_against_its_stages(b64):
    kv, routing = b64
    qwen = resolve_model("qwen")
    one = build_decoder(qwen, kv, routing, kv_heads=1)
    sim = simulate(one)
    assert sim.off_chip_bytes == one.metrics()["off_chip_bytes"]
    attention = simulate(build_attention(kv, "dynamic", head_dim=qwen.head_dim,
                                         query_per_kv_head=qwen.heads // qwen.kv_heads))
    ffn = simulate(build_moe(qwen.moe, routing))
    assert sim.cycles >= max(attention.cycles, ffn.cycles)
    every = build_decoder(qwen, kv, routing)  # all 4 KV heads: more attention traffic, more cycles
    sim_all = simulate(every)
    assert sim_all.off_chip_bytes == every.metrics()["off_chip_bytes"] > sim.off_chip_bytes
    assert sim_all.cycles > sim.cycles


def test_cli_runs_the_decoder_on_the_shared_traces(shared_traces, capsys):
    routing = shared_traces / "expert_routing" / "qwen_b64" / "032_012.npz"
    kv = shared_traces / "kv_lengths" / "b64" / "conv_stdev0477_0271_0334.npy"
    assert main(["run", "decoder", "--model", "qwen", "--routing", str(routing), "--kv-lengths", str(kv),
                 "--json"]) == 0
    row = json.loads(capsys.readouterr().out)
    params = json.loads(row["params"])
    assert (row["workload"], params["kv_heads"], params["heads"], params["head_dim"]) == ("decoder", 4, 32, 128)
    assert row["off_chip_bytes_measured"] == row["off_chip_bytes_symbolic"]
    assert main(["run", "decoder", "--model", "qwen", "--routing", str(routing), "--kv-lengths", str(kv),
                 "--one-head", "--json"]) == 0
    one = json.loads(capsys.readouterr().out)
    assert json.loads(one["params"])["kv_heads"] == 1 and one["cycles"] < row["cycles"]
    assert one["run_id"] != row["run_id"]


@pytest.mark.parametrize(("args", "message"), [
    ("--model qwen --routing R", "workload 'decoder' needs the KV lengths of its decode batch: --kv-lengths PATH "
                                 "(config key 'kv_lengths')"),
    ("--model qwen --kv-lengths K", "model 'qwen3-30b-a3b' has routed experts: give its routing, --routing PATH "
                                    "(config key 'routing')"),
    ("--model llama --routing R --kv-lengths K", "model 'llama-3.1-8b' is dense: --routing does not apply"),
    ("--model qwen --routing R --kv-lengths K16", "the routing has 64 tokens but the KV lengths 16 requests; a decode "
                                                  "batch has one token per request"),
    ("--model qwen --routing R --kv-lengths K --kv-heads 5", "kv_heads must be between 1 and the model's 4, got 5"),
    ("--trace R", "--trace does not apply to workload 'decoder' (it applies to: moe, attention, prefill_attention, "
                  "mla_attention, mla_prefill, sliding_attention, program)"),
    ("--model qwen --routing R --kv-lengths K --tiling dynamic --tile-n 8",
     "--tile-n does not apply to tiling 'dynamic' (dynamic tiling packs each expert's tokens into one tile)"),
])
def test_bad_decoder_input_is_one_line(shared_traces, capsys, args, message):
    paths = {"R": shared_traces / "expert_routing" / "qwen_b64" / "032_012.npz",
             "K": shared_traces / "kv_lengths" / "b64" / "conv_stdev0477_0271_0334.npy",
             "K16": shared_traces / "kv_lengths" / "b16" / "conv_stdev0174_1845_1860.npy"}
    argv = ["run", "decoder"] + [str(paths.get(a, a)) for a in args.split()]
    assert main(argv) == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"stepsim: error: {message}"]


def test_python_api_refuses_a_batch_that_does_not_tile():
    with pytest.raises(ArgumentError, match=r"^the decoder layer needs a batch that is a multiple of 32 \(or at "
                                            r"most 32\), got 40 requests$"):
        build_decoder(QWEN_SMALL, np.arange(40), _routing(batch=40))
