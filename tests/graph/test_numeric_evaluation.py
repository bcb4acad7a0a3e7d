"""The exact numeric evaluator of metric expressions equals sympy substitution on every operator of the paper's
workloads (and falls back to sympy for what it does not handle); ``op_values`` evaluates every metric from its
factors and builds no sympy expression."""

from __future__ import annotations

import dataclasses
from fractions import Fraction

import numpy as np
import pytest
import sympy as sp

from stepsim.graph.dims import make_symbol, product, sum_of_products
from stepsim.graph.dtypes import BF16, FP32, DynTile, Tile
from stepsim.graph.functions import Add, Exp, Matmul, RowSum, Silu, SoftmaxNormalize
from stepsim.graph.graph import CONVENTIONS, PAPER, PUBLISHED, convention
from stepsim.graph.numeric import Unbound, Unsupported, exact_value, python_bindings, sympy_expressions_built
from stepsim.models.presets import moe_model, resolve_model
from stepsim.workloads.attention.build import build_attention
from stepsim.workloads.base import substitute
from stepsim.workloads.decoder.build import build_decoder
from stepsim.workloads.moe.build import build_moe
from stepsim.workloads.swiglu.build import build_swiglu

ROUTING = np.random.default_rng(5).integers(0, 8, size=(64, 2))
ROUTING[:, 1] = (ROUTING[:, 0] + 1 + ROUTING[:, 1] % 7) % 8
QWEN_ROUTING = np.argsort(np.random.default_rng(7).random((16, 128)), axis=1)[:, :8]  # 16 tokens, 8 of 128 experts
DECODER_MODEL = dataclasses.replace(resolve_model("qwen"), hidden=64, heads=8, kv_heads=2, head_dim=16,
                                    expert_intermediate=32, experts=8, top_k=2)
_rng = np.random.default_rng(0)
DECODER_ROUTING = np.stack([_rng.choice(8, 2, replace=False) for _ in range(32)])
DECODER_KV = _rng.integers(1, 300, 32)


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
    lambda: build_moe(moe_model("qwen"), QWEN_ROUTING, tiling="static", tile_n=16),
    lambda: build_moe(moe_model("qwen"), QWEN_ROUTING, tiling="dynamic"),
    # attention's per-region counts are bound to sympy numbers, the MoE regions' tile rows to Fraction means
    lambda: build_decoder(DECODER_MODEL, DECODER_KV, DECODER_ROUTING, strategy="dynamic", tiling="dynamic",
                          regions=2, tile_f=16),
]
IDS = ["moe-static", "moe-dynamic", "moe-timeshared-static", "moe-timeshared-dynamic", "attention-dynamic",
       "attention-coarse", "attention-interleave-stable", "swiglu", "qwen-static", "qwen-dynamic",
       "decoder-dynamic-timeshared"]


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


def test_python_bindings_remember_sub_expressions():
    """python_bindings' result remembers each composite sub-expression's value (exact_value walks a shared one
    once); a plain dict gives the same values and remembers nothing; an error is raised again, not remembered."""
    from stepsim.graph.numeric import Bindings

    x, y = sp.Symbol("x", integer=True, nonnegative=True), sp.Symbol("y", integer=True, nonnegative=True)
    tiles = sp.ceiling(x / sp.Integer(16))
    exprs = [tiles * y, tiles + sp.Max(y, 3), tiles * y + 1]
    b = python_bindings({x: sp.Integer(33), y: np.int64(5)})
    assert type(b) is Bindings and b == {x: 33, y: 5}
    assert [exact_value(e, b) for e in exprs] == [exact_value(e, {x: 33, y: 5}) for e in exprs] == [15, 8, 16]
    assert b.memo[tiles] == 3 and b.memo[tiles * y] == 15 and x not in b.memo  # composites only
    unbound = python_bindings({x: 1})
    for _ in range(2):
        with pytest.raises(Unbound):
            exact_value(sp.ceiling(y / sp.Integer(2)), unbound)
    assert unbound.memo == {}


@pytest.mark.parametrize("make", WORKLOADS, ids=IDS)
def test_op_values_evaluated_factor_by_factor_equal_sympy_substitution(make):
    """op_values evaluates FLOPs and off-chip bytes from their factors (firing count dims x one firing's FLOP
    factors, stream dims x bytes per element) and on-chip bytes from terms of factors (a dynamic tile's rows x
    cols x bytes) without building a sympy expression: the same ints as substituting into the whole expression
    in every on-chip convention, and for exact FLOPs the same value, an int or a Fraction, under the tile_rows
    means."""
    w = make()
    by_convention = {name: w.op_values(c) for name, c in CONVENTIONS.items()}
    values = by_convention["published"]
    means = w.flop_bindings()
    factored = 0
    for op in w.graph.ops:
        v = values[op.name]
        assert v.off_chip_bytes == int(substitute(op.off_chip_bytes(), w.bindings)), op.name
        for name, c in CONVENTIONS.items():
            on_chip = by_convention[name][op.name].on_chip_bytes
            assert type(on_chip) is int and on_chip == int(substitute(op.on_chip_bytes(c), w.bindings)), (op.name, name)
        assert type(v.flops) is int and v.flops == int(substitute(op.flops(), w.bindings)), op.name
        if v.exact_flops is not None:
            exact = sp.sympify(substitute(op.flops(), means))
            assert v.exact_flops == Fraction(int(exact.p), int(exact.q)), op.name
            assert type(v.exact_flops) is (int if exact.q == 1 else Fraction), op.name
        factored += len(op.flops_factors()) > 1 or len(op.off_chip_bytes_factors()) > 1
    assert factored > len(w.graph.ops) // 10  # the factor path is the one exercised


def _mapped_ep():
    """An expert-parallel layer as the mapper's search builds its candidates (two lanes, time-multiplexed regions)."""
    from stepsim.base.system import System
    from stepsim.workloads.moe.mapped_ep import build_mapped_ep

    return build_mapped_ep(moe_model("mixtral"), ROUTING, system=System.preset("ring-2"), tile_n=16, tile_f=64,
                           lanes=2, regions=4)


@pytest.mark.parametrize("make", [*WORKLOADS, _mapped_ep], ids=[*IDS, "mapped-ep"])
def test_op_flops_alone_equal_op_values_exact_flops(make):
    """op_flops() evaluates the FLOP-based operators' FLOPs alone (the mapper's unit plan calls it on every
    candidate): the same names in the same order and the same values and types (an int, or a Fraction under the
    tile_rows means) as op_values()' exact FLOPs, which a fresh workload computes after it."""
    alone = make().op_flops()
    w = make()
    from_values = w.op_flops(w.op_values())
    assert list(alone) == list(from_values) and len(alone) > 0
    assert [(v, type(v)) for v in alone.values()] == [(v, type(v)) for v in from_values.values()]


@pytest.mark.parametrize("make", [*WORKLOADS, _mapped_ep], ids=[*IDS, "mapped-ep"])
def test_stream_elements_dim_by_dim_equal_sympy_product(make):
    """The bounds' element counts (:func:`stepsim.analysis.bounds.product_value`: a stream's dims evaluated one by
    one with a shared memo, as load_tiles and link_cycles count a load's tiles and a link's elements) equal sympy's
    substitution into the product of the dims, on every stream of the graph, and load_tiles holds every load."""
    from stepsim.analysis.bounds import LOAD_KINDS, load_tiles, product_value

    w = make()
    w.graph.finalize()
    bindings = python_bindings(w.bindings)
    streams = [stream for op in w.graph.ops for stream in op.outputs]
    for stream in streams:
        value = product_value(stream.shape, bindings)
        assert type(value) is int and value == int(substitute(stream.total_elements(), w.bindings)), stream
    loads = [op.name for op in w.graph.ops if op.kind in LOAD_KINDS]
    assert list(load_tiles(w)) == loads and len(streams) > len(loads) > 0


@pytest.mark.parametrize("make", WORKLOADS, ids=IDS)
def test_on_chip_terms_and_flop_factors_are_the_metrics(make):
    """Each operator's on-chip bytes are the sum of products of its terms (the same sympy tree) in every
    convention, and its FLOP factors multiply to its FLOPs (a firing's factors are flattened into the product,
    so the value is compared)."""
    w = make()
    w.graph.finalize()
    for op in w.graph.ops:
        for name, c in CONVENTIONS.items():
            assert sum_of_products(op.on_chip_bytes_terms(c)) == op.on_chip_bytes(c), (op.name, name)
        assert substitute(product(op.flops_factors()), w.bindings) == substitute(op.flops(), w.bindings), op.name


@pytest.mark.parametrize("make", WORKLOADS, ids=IDS)
def test_metrics_build_no_sympy_expression(make):
    """Metric evaluation is numeric only, in every on-chip convention: no sympy sum or product per operator (under
    dynamic tiling each holds another expert's symbol, so sympy's cache cannot reuse it, and building them was
    most of the metrics' time)."""
    w = make()
    w.metrics()  # inserts the broadcasts
    for c in CONVENTIONS.values():
        assert sympy_expressions_built(lambda: w.metrics(c)) == 0, c


def test_function_flop_factors():
    """A function's FLOPs per application are the product of its factors, on static and dynamic tiles; a
    function whose FLOPs are a sum gives the sum as its one factor."""
    n = make_symbol("n")
    a, w = DynTile(BF16, n, 64), Tile(BF16, 64, 32)
    assert Matmul().flops_factors((a, w)) == (2, n, 64, 32) and Matmul().flops((a, w)) == 4096 * n
    assert Silu().flops_factors((a,)) == (8, n, 64) and Silu().flops((a,)) == 512 * n
    assert Exp().flops((Tile(FP32, 4, 8),)) == 128 and RowSum().flops_factors((a,)) == (1, n, 64)
    assert Add().flops_factors((a, DynTile(BF16, n, 1))) == (n, 64)
    assert SoftmaxNormalize().flops_factors((DynTile(FP32, n, 18),)) == (n, 16)


def test_python_bindings_convert_numbers_exactly():
    """sympy and numpy numbers become Python ints and Fractions of the same value; other values stay as they are."""
    expr = sp.Symbol("k") + 1
    values = [sp.Integer(7), sp.Rational(7, 3), np.int64(2**62), expr, Fraction(1, 2), 5]
    out = python_bindings({sp.Symbol(f"s{i}"): v for i, v in enumerate(values)})
    assert [(type(v), v) for v in out.values()] == [
        (int, 7), (Fraction, Fraction(7, 3)), (int, 2**62), (type(expr), expr), (Fraction, Fraction(1, 2)), (int, 5)]
