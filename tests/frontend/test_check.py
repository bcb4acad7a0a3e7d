"""The functional check of a lowered model against onnx's reference evaluator (what ``stepsim run model.onnx
--functional --check`` prints), and the chain lengths behind its tolerances."""

import sys
from pathlib import Path

import numpy as np

from stepsim.frontend import from_onnx
from stepsim.frontend.check import check_outputs
from stepsim.simulation.simulate import simulate
from stepsim.workloads.reference import tolerance_for

sys.path.insert(0, str(Path(__file__).parent))
from ort_check import rand  # noqa: E402
from test_blocks import B, D, F, S, gpt2_block, llama_block  # noqa: E402


def test_chain_lengths_of_the_blocks():
    # GPT-2: LayerNorm 2D + 13, fc K = D + its bias Add, GELU's Pow / Mul / Add / Mul / Tanh / Add / Mul (4+1+1+1+7+1+1),
    # proj K = F + bias, residual 1
    assert from_onnx(gpt2_block()).frontend.chain_length["y"] == (2 * D + 13) + (D + 1) + 16 + (F + 1) + 1
    # Llama: square 1, mean D + 1, eps 1, sqrt 4, reciprocal 1, two Muls, gate K = D, SiLU 8, Mul 1, down K = F,
    # residual 1
    assert from_onnx(llama_block()).frontend.chain_length["y"] == 1 + (D + 1) + 1 + 4 + 1 + 2 + D + 8 + 1 + F + 1


def test_check_passes_and_catches_a_wrong_value():
    w = from_onnx(llama_block(), tiling={"tile_m": 4, "tile_n": 16})
    r = simulate(w, functional=True, inputs={"x": rand((B, S, D), 7)})
    (c,) = check_outputs(w, r.inputs, r.outputs).values()
    print(f"llama_block: max rel error {c.error:.2e} (tolerance {c.tolerance:.2e})")
    assert c.passed and c.tolerance == tolerance_for("fp32", w.frontend.chain_length["y"]) and c.error < 1e-6
    wrong = dict(r.outputs, y=r.outputs["y"] + np.float32(1e-3) * np.abs(r.outputs["y"]).max())
    (bad,) = check_outputs(w, r.inputs, wrong).values()
    assert not bad.passed and bad.error > 9e-4


def test_default_inputs_are_the_initializers_and_seeded_graph_inputs():
    w = from_onnx(gpt2_block())
    r = simulate(w, functional=True, seed=3)
    assert set(r.inputs) == {"x", "ln_g", "ln_b", "w_fc", "b_fc", "w_proj", "b_proj"}
    assert all(c.passed for c in check_outputs(w, r.inputs, r.outputs).values())
