"""The exact numeric evaluator of metric expressions equals sympy substitution on every operator of the paper's
workloads (and falls back to sympy for what it does not handle)."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
import sympy as sp

from stepsim.graph.graph import PAPER, PUBLISHED, convention
from stepsim.graph.numeric import Unbound, Unsupported, exact_value
from stepsim.workloads.attention import build_attention
from stepsim.workloads.base import substitute
from stepsim.workloads.models import moe_model
from stepsim.workloads.moe import build_moe
from stepsim.workloads.swiglu import build_swiglu

ROUTING = np.random.default_rng(5).integers(0, 8, size=(64, 2))
ROUTING[:, 1] = (ROUTING[:, 0] + 1 + ROUTING[:, 1] % 7) % 8


WORKLOADS = [
    lambda: build_moe(moe_model("mixtral"), ROUTING, tiling="static", tile_n=16),
    lambda: build_moe(moe_model("mixtral"), ROUTING, tiling="dynamic"),
    lambda: build_moe(moe_model("mixtral"), ROUTING, tiling="static", tile_n=32, regions=2, tile_f=64),
    lambda: build_moe(moe_model("mixtral"), ROUTING, tiling="dynamic", regions=4, tile_f=64),
    lambda: build_attention(np.array([100, 900, 3000, 40, 64, 1200, 7, 2500, 333, 4000, 50, 61, 800, 90, 1, 2048]),
                            "dynamic"),
    lambda: build_attention(np.arange(1, 65) * 37, "coarse"),
    lambda: build_attention(np.arange(1, 17) * 211, "interleave", softmax="stable"),
    lambda: build_swiglu(tile_m=32, tile_n=64),
]
IDS = ["moe-static", "moe-dynamic", "moe-timeshared-static", "moe-timeshared-dynamic", "attention-dynamic",
       "attention-coarse", "attention-interleave-stable", "swiglu"]


@pytest.mark.parametrize("make", WORKLOADS, ids=IDS)
def test_numeric_equals_sympy_on_every_operator(make):
    w = make()
    w.graph.finalize()
    checked = 0
    for op in w.graph.ops:
        for expr in (op.off_chip_bytes(), op.on_chip_bytes(convention(PUBLISHED)), op.on_chip_bytes(convention(PAPER)),
                     op.flops()):
            by_sympy = substitute(expr, w.bindings)
            value = exact_value(expr, w.bindings)
            assert value == by_sympy and int(value) == int(by_sympy), (op.name, expr)
            checked += 1
    assert checked == 4 * len(w.graph.ops)


def test_numeric_exactness_and_fallbacks():
    x, y = sp.Symbol("x", integer=True, nonnegative=True), sp.Symbol("y", integer=True, nonnegative=True)
    expr = sp.floor((x + 15) / sp.Integer(16)) * 16 + sp.Piecewise((1, x >= 1), (0, True)) * y
    assert exact_value(expr, {x: 17, y: 5}) == 37
    assert exact_value(x / sp.Integer(3), {x: 2}) == Fraction(2, 3)  # exact, no float
    assert exact_value(sp.Max(x, y) - sp.Min(x, y) + sp.Mod(x, 4), {x: 10, y: 3}) == 9
    with pytest.raises(Unbound):
        exact_value(x + y, {x: 1})
    with pytest.raises(Unsupported):
        exact_value(sp.sin(x), {x: 1})


@pytest.mark.parametrize("make", WORKLOADS, ids=IDS)
def test_op_values_evaluated_factor_by_factor_equal_sympy_substitution(make):
    """op_values evaluates FLOPs and off-chip bytes from their factors (firing count dims x one firing's FLOPs,
    stream dims x bytes per element) without building the product: the same ints as substituting into the
    whole expression, and for exact FLOPs the same value under the tile_rows means."""
    w = make()
    values = w.op_values()
    means = w.flop_bindings()
    factored = 0
    for op in w.graph.ops:
        v = values[op.name]
        assert v.off_chip_bytes == int(substitute(op.off_chip_bytes(), w.bindings)), op.name
        assert v.on_chip_bytes == int(substitute(op.on_chip_bytes(convention(PUBLISHED)), w.bindings)), op.name
        assert v.flops == int(substitute(op.flops(), w.bindings)), op.name
        if v.exact_flops is not None:
            exact = sp.sympify(substitute(op.flops(), means))
            assert v.exact_flops == Fraction(int(exact.p), int(exact.q)), op.name
            assert type(v.exact_flops) is (int if exact.q == 1 else Fraction), op.name
        factored += len(op.flops_factors()) > 1 or len(op.off_chip_bytes_factors()) > 1
    assert factored > len(w.graph.ops) // 10  # the factor path is the one exercised
