"""STEP_SEMANTICS §8.1: every single-operator shape / metric row, exactly.

Columns checked per row: output shape, on-chip bytes under the published convention (``on_chip_bytes()``),
on-chip bytes with FIFOs counted (``on_chip_bytes(convention("fifos"))``) and off-chip bytes. All numbers are
float32 without mock unless the row says otherwise (the bf16 random load uses a bf16 storage tensor).
"""

from __future__ import annotations

import numpy as np
import pytest
import sympy as sp

from stepsim.graph import (
    BF16,
    FP32,
    UINT64,
    Accum,
    AccumAdd,
    BinaryMap,
    BinaryMapAccum,
    Bufferize,
    BufferRef,
    EagerMerge,
    Empty,
    ExpertAddrGen,
    Flatten,
    Graph,
    LinearOffChipLoad,
    LinearOffChipStore,
    Matmul,
    Parallelize,
    Partition,
    Promote,
    RandomOffChipLoad,
    Reassemble,
    RepeatStatic,
    Reshape,
    RetileRow,
    RetileStreamify,
    Selector,
    SelectorSource,
    Silu,
    Streamify,
    Tensor,
    Tile,
    UnaryMap,
    Zero,
    is_ragged,
)
from stepsim.graph.graph import PUBLISHED, convention

FIFOS = convention("fifos")


def sym_equal(a, b) -> bool:
    """Semantic equality of two metric expressions (ints or sympy)."""
    return sp.simplify(sp.sympify(a) - sp.sympify(b)) == 0


def subs_equal(a, b, symbols, values=(0, 1, 2, 3, 4, 5, 7, 8, 9, 16, 17, 100)) -> bool:
    """Equality by substituting several values for every symbol (robust for Piecewise / floor)."""
    a, b = sp.sympify(a), sp.sympify(b)
    for v in values:
        env = {s: v + i for i, s in enumerate(symbols)}
        if sp.simplify(a.subs(env) - b.subs(env)) != 0:
            return False
    return True


def shape_equal(got, want) -> bool:
    return len(got) == len(want) and all(sym_equal(x, y) for x, y in zip(got, want))


# --- static base stream ------------------------------------------------------------------------------------
def base_load(g: Graph, out=(4, 8, 1), stride=(1, 0, 1)) -> LinearOffChipLoad:
    return LinearOffChipLoad(g, Tensor("x", (64, 256)), tile=(16, 256), out_shape_tiled=out, stride=stride)


def test_base_load_is_1x4x8x1_rank3_with_off_524288_and_on_16384():
    g = Graph()
    x = base_load(g)
    assert x.stream.shape == (1, 4, 8, 1)
    assert x.stream.rank == 3
    assert x.stream.dtype == Tile(FP32, 16, 256)
    assert x.off_chip_bytes() == 524_288 == 32 * 16_384
    assert x.on_chip_bytes() == 16_384
    assert x.on_chip_bytes(FIFOS) == 16_384
    assert g.off_chip_bytes() == 524_288
    assert g.on_chip_bytes() == 16_384


def _bufferize(g, x):
    return Bufferize(g, x, 2)


def _streamify(g, x):
    return Streamify(g, Bufferize(g, x, 2), [3], 2)


def _bufferize_off(g, x):
    return Bufferize(g, x, 2, off_chip=True)


def _streamify_off(g, x):
    return Streamify(g, Bufferize(g, x, 2, off_chip=True), [3], 2, off_chip=True)


# (row id, builder, output shape, on, on (fifos), off) -- spec §8.1 table, verbatim
ROWS = [
    ("Flatten(0,1)", lambda g, x: Flatten(g, x, 0, 1), (1, 4, 8), 0, 32_768, 0),
    ("Promote(1)", lambda g, x: Promote(g, x, 1), (1, 4, 8, 1, 1), 0, 32_768, 0),
    ("Promote(3)", lambda g, x: Promote(g, x, 3), (1, 1, 4, 8, 1), 0, 32_768, 0),
    ("Reshape(chunk 2, rank 2)", lambda g, x: Reshape(g, x, 2, 2), (1, 2, 2, 8, 1), 0, 32_768, 0),
    ("Bufferize(2)", _bufferize, (1, 4), 278_528, 278_528, 0),
    ("Streamify([3],2)", _streamify, (1, 4, 3, 8, 1), 147_456, 147_456, 0),
    ("Bufferize(2, off_chip)", _bufferize_off, (1, 4), 16_384, 16_384, 524_288),
    ("Streamify([3],2, off_chip)", _streamify_off, (1, 4, 3, 8, 1), 16_384, 16_384, 196_608),
    ("RepeatStatic(5)", lambda g, x: RepeatStatic(g, x, 5), (1, 4, 8, 1, 5), 16_384, 32_768, 0),
    ("UnaryMap(Silu)", lambda g, x: UnaryMap(g, x, Silu(), compute_bw=1024), (1, 4, 8, 1), 0, 32_768, 0),
]


@pytest.mark.parametrize("row", ROWS, ids=[r[0] for r in ROWS])
def test_spec_8_1_static_row_has_exact_shape_on_chip_fifos_and_off_chip(row):
    _, build, shape, on, on_fifos, off = row
    g = Graph()
    x = base_load(g)
    op = build(g, x)
    assert op.stream.shape == shape
    assert op.on_chip_bytes() == on
    assert op.on_chip_bytes(PUBLISHED) == on
    assert op.on_chip_bytes(FIFOS) == on_fifos
    assert op.off_chip_bytes() == off


def test_bufferize_2_emits_buffer_refs_of_16x256_tiles_over_8x1():
    g = Graph()
    b = Bufferize(g, base_load(g), 2)
    assert b.stream.dtype == BufferRef(Tile(FP32, 16, 256), (8, 1))
    assert b.stream.dtype.size_in_bytes() == 8 * 16_384


def test_streamify_off_chip_quirk_leaves_out_the_buffer_element_count():
    g = Graph()
    s = _streamify_off(g, base_load(g))
    # N(in) = 4 buffer refs, repeat 3, one 16 KiB tile: not multiplied by the 8 tiles per buffer
    assert s.off_chip_bytes() == 4 * 3 * 16_384 == 196_608
    assert s.off_chip_bytes() != 4 * 3 * 8 * 16_384


def test_graph_totals_add_base_load_and_spilling_bufferize_streamify():
    g = Graph()
    _streamify_off(g, base_load(g))
    assert g.off_chip_bytes() == 524_288 + 524_288 + 196_608
    assert g.on_chip_bytes() == 3 * 16_384


# --- matmul chain ------------------------------------------------------------------------------------------
def matmul_inputs(g: Graph):
    x = base_load(g, out=(4, 32, 1), stride=(1, 0, 1))
    w = LinearOffChipLoad(g, Tensor("w", (256, 512)), tile=(256, 16), out_shape_tiled=(4, 32, 1), stride=(0, 1, 32))
    return x, w


def test_matmul_chain_inputs_are_1x4x32x1_with_off_2097152_each():
    g = Graph()
    x, w = matmul_inputs(g)
    assert x.stream.shape == (1, 4, 32, 1)
    assert w.stream.shape == (1, 4, 32, 1)
    assert w.stream.dtype == Tile(FP32, 256, 16)
    assert x.off_chip_bytes() == 2_097_152
    assert w.off_chip_bytes() == 2_097_152


def test_binary_map_accum_matmul_gives_1x4x32_of_16x16_on_1024_fifos_49152():
    g = Graph()
    x, w = matmul_inputs(g)
    bma = BinaryMapAccum(g, x, w, Matmul(), Zero(16, 16), 1, compute_bw=1024)
    assert bma.stream.shape == (1, 4, 32)
    assert bma.stream.dtype == Tile(FP32, 16, 16)
    assert bma.on_chip_bytes() == 1_024
    assert bma.on_chip_bytes(FIFOS) == 49_152
    assert bma.off_chip_bytes() == 0


def test_binary_map_matmul_gives_1x4x32x1_on_0_fifos_33792():
    g = Graph()
    x, w = matmul_inputs(g)
    bm = BinaryMap(g, x, w, Matmul(), compute_bw=1024)
    assert bm.stream.shape == (1, 4, 32, 1)
    assert bm.stream.dtype == Tile(FP32, 16, 16)
    assert bm.on_chip_bytes() == 0
    assert bm.on_chip_bytes(FIFOS) == 33_792
    assert bm.off_chip_bytes() == 0


def test_accum_add_rank2_of_binary_map_gives_1x4_on_1024_fifos_2048():
    g = Graph()
    x, w = matmul_inputs(g)
    bm = BinaryMap(g, x, w, Matmul(), compute_bw=1024)
    acc = Accum(g, bm, AccumAdd(), Zero(16, 16), 2, compute_bw=1024)
    assert acc.stream.shape == (1, 4)
    assert acc.stream.dtype == Tile(FP32, 16, 16)
    assert acc.on_chip_bytes() == 1_024
    assert acc.on_chip_bytes(FIFOS) == 2_048
    assert acc.off_chip_bytes() == 0


def test_offchip_store_of_binary_map_accum_is_untiled_64x512_off_131072_on_1024():
    g = Graph()
    x, w = matmul_inputs(g)
    bma = BinaryMapAccum(g, x, w, Matmul(), Zero(16, 16), 1, compute_bw=1024)
    st = LinearOffChipStore(g, bma)
    assert st.tensor_shape == (64, 512)
    assert st.off_chip_bytes() == 131_072
    assert st.on_chip_bytes() == 1_024
    assert st.outputs == []
    # whole graph: two loads + store off-chip; two load tiles + accumulator + store tile on-chip
    assert g.off_chip_bytes() == 2 * 2_097_152 + 131_072
    assert g.on_chip_bytes() == 2 * 16_384 + 1_024 + 1_024


# --- dynamic part ------------------------------------------------------------------------------------------
ROUTE = [0, 1, 2, 3, 0, 1, 2, 3, 0, 1]


class Dyn:
    """The §8.1 dynamic graph, one op per attribute."""

    def __init__(self):
        g = self.g = Graph("dyn")
        # stream [1, 10] of (1, 64) tiles
        self.data = LinearOffChipLoad(g, Tensor("tok", (10, 64)), tile=(1, 64), out_shape_tiled=(10,), stride=(1,))
        self.sel = SelectorSource(g, np.eye(4, dtype=np.int64)[ROUTE], 4)
        self.part = Partition(g, self.data, self.sel, 0, 4)
        self.X = [sp.Symbol(f"{self.sel.name}_{i:03d}", integer=True, nonnegative=True) for i in range(4)]
        self.reshape = Reshape(g, self.part[0], 4, 0, pad=Zero(1, 64), add_outer_dim=True)
        self.flat = Flatten(g, self.reshape, 1, 2)
        self.acc = Accum(g, self.flat, RetileRow(), Empty(0, 64), 1, compute_bw=0, out_dtype=Tile(FP32, 4, 64))
        self.wload = LinearOffChipLoad(g, Tensor("w", (64, 128)), tile=(64, 32), out_shape_tiled=(4, 1),
                                       stride=(1, 0), ref=self.acc)
        self.merge = EagerMerge(g, [self.part[0], self.part[1]], 0)

    @property
    def piecewise(self):
        return sp.Piecewise((1, self.X[0] >= 1), (0, True))

    @property
    def ceil4(self):
        return sp.floor(self.X[0] / 4 + sp.Rational(3, 4))


@pytest.fixture
def dyn() -> Dyn:
    return Dyn()


def test_dynamic_base_stream_and_selector_are_1x10(dyn):
    assert dyn.data.stream.shape == (1, 10)
    assert dyn.data.stream.dtype == Tile(FP32, 1, 64)
    assert dyn.sel.stream.shape == (1, 10)
    assert dyn.sel.stream.dtype == Selector(4)


def test_partition_output_i_is_a_symbol_named_control_name_underscore_3_digits(dyn):
    names = [str(dyn.part.outputs[i].shape[0]) for i in range(4)]
    assert names == [f"SelectorSource_1_{i:03d}" for i in range(4)]
    assert [s.shape for s in dyn.part.outputs] == [(x,) for x in dyn.X]
    assert all(s.dtype == Tile(FP32, 1, 64) for s in dyn.part.outputs)
    assert tuple(dyn.part.count_symbols) == tuple(dyn.X)
    assert dyn.part.on_chip_bytes() == 0
    assert dyn.part.off_chip_bytes() == 0


def test_reshape_add_outer_dim_with_pad_gives_piecewise_floor_4(dyn):
    shape = dyn.reshape.stream.shape
    X = dyn.X[0]
    want = (sp.Piecewise((1, X >= 1), (0, True)), sp.floor(X / 4 + sp.Rational(3, 4)), 4)
    assert len(shape) == 3
    assert shape[2] == 4
    assert shape[0] == want[0]
    assert sym_equal(shape[1], want[1])
    assert subs_equal(shape[0], want[0], [X]) and subs_equal(shape[1], want[1], [X])
    # concrete: 0 tokens -> (0, 0, 4); 1 -> (1, 1, 4); 4 -> (1, 1, 4); 5 -> (1, 2, 4); 9 -> (1, 3, 4)
    for n, (outer, mid) in {0: (0, 0), 1: (1, 1), 4: (1, 1), 5: (1, 2), 9: (1, 3)}.items():
        assert sp.sympify(shape[0]).subs(X, n) == outer
        assert sp.sympify(shape[1]).subs(X, n) == mid
    assert dyn.reshape.on_chip_bytes() == 0
    assert dyn.reshape.on_chip_bytes(FIFOS) == 2 * 256


def test_flatten_1_2_of_reshape_gives_piecewise_times_floor_by_4(dyn):
    shape = dyn.flat.stream.shape
    assert len(shape) == 2 and shape[1] == 4
    assert sym_equal(shape[0], dyn.piecewise * dyn.ceil4)


def test_accum_retile_row_into_4x64_tiles_gives_piecewise_floor_with_on_chip_1024(dyn):
    shape = dyn.acc.stream.shape
    assert len(shape) == 1
    assert sym_equal(shape[0], dyn.piecewise * dyn.ceil4)
    assert dyn.acc.stream.dtype == Tile(FP32, 4, 64)
    assert dyn.acc.on_chip_bytes() == 1_024


def test_linear_load_with_ref_repeats_per_ref_element_off_32768_times_piecewise_floor(dyn):
    s = dyn.wload.stream
    assert len(s.shape) == 3 and s.shape[1:] == (4, 1)
    assert sym_equal(s.shape[0], dyn.piecewise * dyn.ceil4)
    assert dyn.wload.has_ref
    want = 32_768 * dyn.piecewise * dyn.ceil4
    assert sym_equal(dyn.wload.off_chip_bytes(), want)
    assert subs_equal(dyn.wload.off_chip_bytes(), want, [dyn.X[0]])
    assert dyn.wload.on_chip_bytes() == 64 * 32 * 4


def test_eager_merge_of_partitions_0_and_1_gives_x0_plus_x1_select_multihot2_fifos_774(dyn):
    data, select = dyn.merge.outputs
    X0, X1 = dyn.X[:2]
    assert len(data.shape) == 1 and sym_equal(data.shape[0], X0 + X1)
    assert data.dtype == Tile(FP32, 1, 64)
    assert len(select.shape) == 1 and sym_equal(select.shape[0], X0 + X1)
    assert select.dtype == Selector(2)
    assert dyn.merge.on_chip_bytes() == 0
    assert dyn.merge.on_chip_bytes(FIFOS) == 774 == (256 + 2) * 3


def test_parallelize_rank0_by_2_of_a_10_stream_gives_two_5_streams(dyn):
    flat10 = Flatten(dyn.g, dyn.data, 0, 1)
    assert flat10.stream.shape == (10,)
    par = Parallelize(dyn.g, flat10, 0, 2)
    assert [s.shape for s in par.outputs] == [(5,), (5,)]
    assert par.on_chip_bytes() == 0
    assert par.on_chip_bytes(FIFOS) == 256 * 3


def test_retile_streamify_split_row_of_4x64_tiles_gives_4_times_piecewise_floor_of_1x64(dyn):
    rs = RetileStreamify(dyn.g, dyn.acc, split_row=True)
    assert len(rs.stream.shape) == 1
    assert sym_equal(rs.stream.shape[0], 4 * dyn.piecewise * dyn.ceil4)
    assert rs.stream.dtype == Tile(FP32, 1, 64)
    assert rs.on_chip_bytes() == 0 and rs.off_chip_bytes() == 0


def test_retile_streamify_filter_mask_gives_a_ragged_name_dyn_symbol(dyn):
    rs = RetileStreamify(dyn.g, dyn.acc, split_row=True, filter_mask=True)
    (d,) = rs.stream.shape
    assert isinstance(d, sp.Symbol)
    assert str(d) == f"{rs.name}_dyn" == "RetileStreamify_8_dyn"
    assert is_ragged(d)
    assert rs.stream.dtype == Tile(FP32, 1, 64)


def test_reassemble_over_4_partitions_with_1x10_control_gives_1_10_dyn(dyn):
    ra = Reassemble(dyn.g, [dyn.part[i] for i in range(4)], dyn.sel, 0)
    shape = ra.stream.shape
    assert shape[:2] == (1, 10) and len(shape) == 3
    assert str(shape[2]) == f"{ra.name}_dyn"
    assert is_ragged(shape[2])
    assert ra.stream.dtype == Tile(FP32, 1, 64)
    assert ra.on_chip_bytes() == 0


def test_expert_addr_gen_12_of_merge_select_gives_x0_plus_x1_by_12_by_1_u64(dyn):
    e = ExpertAddrGen(dyn.g, dyn.merge[1], 12)
    shape = e.stream.shape
    assert len(shape) == 3 and shape[1:] == (12, 1)
    assert sym_equal(shape[0], dyn.X[0] + dyn.X[1])
    assert e.stream.dtype == Tile(UINT64, 1, 1)


def test_random_load_of_bf16_storage_64x64_tiles_off_98304_times_x0_plus_x1_on_8192(dyn):
    e = ExpertAddrGen(dyn.g, dyn.merge[1], 12)
    rl = RandomOffChipLoad(dyn.g, e, Tensor("experts", (12 * 64, 64), dtype=BF16), (64, 64), stream_dtype=FP32)
    assert rl.stream.dtype == Tile(FP32, 64, 64)
    assert shape_equal(rl.stream.shape, (dyn.X[0] + dyn.X[1], 12, 1))
    assert sym_equal(rl.off_chip_bytes(), 98_304 * (dyn.X[0] + dyn.X[1]))
    assert rl.on_chip_bytes() == 8_192
    assert rl.on_chip_bytes(convention("paper")) == 16_384


def test_dynamic_graph_total_off_chip_is_tokens_plus_weight_reloads(dyn):
    # tokens 10 * 256 B + weights 32768 * Piecewise * floor; evaluated for 3 tokens routed to target 0
    total = dyn.g.off_chip_bytes()
    assert sym_equal(total, 2_560 + 32_768 * dyn.piecewise * dyn.ceil4)
    assert total.subs({dyn.X[0]: 3}) == 2_560 + 32_768
    assert total.subs({dyn.X[0]: 0}) == 2_560
    assert total.subs({dyn.X[0]: 5}) == 2_560 + 2 * 32_768
