"""GPT-2- and Llama-shaped blocks, spelled as PyTorch's exporter spells them (issue 33; ../shared/design/FRONTEND.md
§2), lowered and run in functional mode against onnxruntime. Attention is not lowered yet, so a block is the
normalization, the MLP and the residual: GPT-2 LayerNormalization -> MatMul + bias -> tanh-GELU as Mul / Pow /
Tanh / Add -> MatMul + bias -> residual Add; Llama RMSNorm as Pow -> ReduceMean -> Add -> Sqrt -> Reciprocal -> Mul
-> gate / up MatMuls -> SiLU as Sigmoid x Mul -> down MatMul -> residual Add.

Tolerance: the fp32 rule with ``n`` the chained operations of the longest path (the norm's reductions, both
MatMuls' K, and the elementwise chain at Pointwise FLOPs per element)."""

import math
import sys
from pathlib import Path

import numpy as np
import pytest
from onnx import helper

sys.path.insert(0, str(Path(__file__).parent))
from ort_check import check, model, rand  # noqa: E402

B, S, D, F = 2, 8, 32, 64


def node(op, ins, outs, **attrs):
    return helper.make_node(op, ins, [outs] if isinstance(outs, str) else outs, **attrs)


def gpt2_block():
    c = {"half": np.array(0.5, np.float32), "one": np.array(1.0, np.float32), "three": np.array(3.0, np.float32),
         "k": np.array(0.044715, np.float32), "s2pi": np.array(math.sqrt(2 / math.pi), np.float32)}
    init = {"ln_g": 1 + rand((D,), 1, 0.1), "ln_b": rand((D,), 2, 0.1), "w_fc": rand((D, F), 3, D ** -0.5),
            "b_fc": rand((F,), 4, 0.1), "w_proj": rand((F, D), 5, F ** -0.5), "b_proj": rand((D,), 6, 0.1), **c}
    nodes = [node("LayerNormalization", ["x", "ln_g", "ln_b"], "h", axis=-1, epsilon=1e-5),
             node("MatMul", ["h", "w_fc"], "a0"), node("Add", ["a0", "b_fc"], "a"),
             node("Pow", ["a", "three"], "a3"), node("Mul", ["a3", "k"], "ka3"), node("Add", ["a", "ka3"], "inner"),
             node("Mul", ["inner", "s2pi"], "z"), node("Tanh", ["z"], "t"), node("Add", ["t", "one"], "t1"),
             node("Mul", ["a", "half"], "ha"), node("Mul", ["ha", "t1"], "g"),
             node("MatMul", ["g", "w_proj"], "m0"), node("Add", ["m0", "b_proj"], "m"), node("Add", ["x", "m"], "y")]
    return model(nodes, {"x": [B, S, D]}, {"y": [B, S, D]}, init, name="gpt2_block")


def llama_block():
    init = {"two": np.array(2.0, np.float32), "eps": np.array(1e-6, np.float32), "one": np.array(1.0, np.float32),
            "axes": np.array([-1], np.int64), "norm_w": 1 + rand((D,), 1, 0.1), "w_gate": rand((D, F), 2, D ** -0.5),
            "w_up": rand((D, F), 3, D ** -0.5), "w_down": rand((F, D), 4, F ** -0.5)}
    nodes = [node("Pow", ["x", "two"], "sq"), node("ReduceMean", ["sq", "axes"], "ms", keepdims=1),
             node("Add", ["ms", "eps"], "mse"), node("Sqrt", ["mse"], "rms"), node("Reciprocal", ["rms"], "inv"),
             node("Mul", ["x", "inv"], "xn"), node("Mul", ["xn", "norm_w"], "h"),
             node("MatMul", ["h", "w_gate"], "gate"), node("MatMul", ["h", "w_up"], "up"),
             node("Sigmoid", ["gate"], "sg"), node("Mul", ["gate", "sg"], "silu"), node("Mul", ["silu", "up"], "z"),
             node("MatMul", ["z", "w_down"], "down"), node("Add", ["x", "down"], "y")]
    return model(nodes, {"x": [B, S, D]}, {"y": [B, S, D]}, init, name="llama_block")


@pytest.mark.parametrize("tiling", [{}, {"tile_m": 4, "tile_n": 16}, {"tile_m": 2, "tile_n": 8}])
def test_gpt2_block(tiling):
    # LayerNorm 2 D + its 5 elementwise ops, K = D, GELU's chain (14), K = F, 2 adds
    check(gpt2_block(), {"x": rand((B, S, D), 7)}, 2 * D + 5 + D + 14 + F + 2, tiling=tiling)


@pytest.mark.parametrize("tiling", [{}, {"tile_m": 4, "tile_n": 16}, {"tile_m": 2, "tile_n": 8}])
def test_llama_block(tiling):
    # RMSNorm D + 8 (square, mean scale, eps, sqrt 4, reciprocal, 2 muls), K = D, SiLU 8 + 1, K = F, residual
    check(llama_block(), {"x": rand((B, S, D), 7)}, D + 8 + D + 9 + F + 1, tiling=tiling)


@pytest.mark.parametrize("build", [gpt2_block, llama_block])
def test_blocks_with_every_edge_spilled_give_the_same_values(build):
    from stepsim.frontend import from_onnx
    from stepsim.simulation.simulate import simulate

    x = {"x": rand((B, S, D), 7)}
    fused = simulate(from_onnx(build(), tiling={"tile_m": 4, "tile_n": 16}), functional=True, inputs=x)
    spilled_w = from_onnx(build(), tiling={"tile_m": 4, "tile_n": 16}, fuse=False)
    spilled = simulate(spilled_w, functional=True, inputs=x)
    assert np.array_equal(fused.outputs["y"], spilled.outputs["y"])
    assert len(spilled_w.frontend.spilled()) == len(spilled_w.frontend.edges) > 10
