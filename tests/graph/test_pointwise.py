"""Pointwise functions (issue 33: the ONNX front end's unary ops) in both engines and in functional mode."""

import math

import numpy as np
import pytest

from stepsim.graph import FP32, Graph, LinearOffChipLoad, LinearOffChipStore, Map, Pointwise, Tensor
from stepsim.graph.functions import POINTWISE_KINDS
from stepsim.graph.lower import lower
from stepsim.kernels import abi
from stepsim.kernels.reference import run as ref_run
from stepsim.simulation.simulate import simulate

_ERF = np.vectorize(math.erf)
EXPECTED = {
    "neg": lambda x, c: -x, "sqrt": lambda x, c: np.sqrt(np.abs(x)), "relu": lambda x, c: np.maximum(x, 0),
    "sigmoid": lambda x, c: 1 / (1 + np.exp(-x)), "tanh": lambda x, c: np.tanh(x), "erf": lambda x, c: _ERF(x),
    "gelu": lambda x, c: 0.5 * x * (1 + _ERF(x / np.sqrt(2))), "add_c": lambda x, c: x + c,
    "mul_c": lambda x, c: x * c, "rsub_c": lambda x, c: c - x, "rdiv_c": lambda x, c: c / x,
    "pow_c": lambda x, c: np.abs(x) ** c, "max_c": lambda x, c: np.maximum(x, c), "min_c": lambda x, c: np.minimum(x, c),
    "sub_c": lambda x, c: x - c, "div_c": lambda x, c: x / c,
}


def test_kind_table_matches_the_engine():
    assert {k: (code, flops) for k, (code, flops, _) in POINTWISE_KINDS.items()} == {
        name: (i, abi.POINTWISE_FLOPS[i]) for i, name in enumerate(abi.POINTWISE_NAMES)}


@pytest.mark.parametrize("kind", sorted(POINTWISE_KINDS))
def test_values_and_cycles(kind):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((8, 16)).astype(np.float32)
    if kind in ("sqrt", "pow_c"):
        x = np.abs(x)
    c = 1.5
    g = Graph(kind)
    load = LinearOffChipLoad(g, Tensor("x", (8, 16), FP32), (4, 16), (2, 1), (1, 0))
    m = Map(g, load, Pointwise(kind, c), compute_bw=16)
    LinearOffChipStore(g, m, tensor_name="y")
    r = simulate(g, functional=True, inputs={"x": x})
    want = EXPECTED[kind](x.astype(np.float64), c)
    err = np.max(np.abs(r.outputs["y"] - want)) / np.max(np.abs(want))
    print(f"{kind}: max rel error {err:.2e}")
    assert err < 1e-6
    assert m.flops() == POINTWISE_KINDS[kind][1] * 8 * 16
    assert ref_run(lower(g)).cycles == r.cycles == simulate(g).cycles
