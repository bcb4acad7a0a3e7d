"""Shape rules of every operator, stop-level propagation, dimension kinds, determinism, automatic Broadcast
insertion, placeholders / cycles, on-chip conventions and large selectors (STEP_SEMANTICS §1, §2, §3, §9).

Placeholders double as generic sources of a stream of any type: ``g.placeholder(Stream(dtype, shape))``.
"""

from __future__ import annotations

import itertools
import re
from types import SimpleNamespace

import numpy as np
import pytest
import sympy as sp
from hypothesis import given, settings
from hypothesis import strategies as st

from stepsim.base.errors import ArgumentError, DTypeError, GraphError
from stepsim.graph import (
    BF16,
    BOOL,
    FP32,
    PAPER,
    PUBLISHED,
    UINT64,
    Accum,
    AccumAdd,
    Add,
    BinaryMap,
    BinaryMapAccum,
    Broadcast,
    Bufferize,
    BufferRef,
    CacheReadAddrGen,
    DynStreamify,
    DynTile,
    EagerMerge,
    Empty,
    Expand,
    ExpandRef,
    FilterLastTile,
    FlatMap,
    Flatten,
    Graph,
    LinearOffChipLoad,
    LinearOffChipStore,
    Map,
    MapAccum,
    Matmul,
    MetadataSource,
    Mul,
    OutputRef,
    Parallelize,
    Partition,
    Placeholder,
    Promote,
    RaggedSymbol,
    RandomOffChipLoad,
    RandomOffChipStore,
    Reassemble,
    RepeatStatic,
    Reshape,
    RetileRow,
    RetileStreamify,
    RowStreamify,
    RowSum,
    Scan,
    Selector,
    SelectorSource,
    Silu,
    Sink,
    Stream,
    Streamify,
    Tensor,
    Tile,
    TupleType,
    UnaryMap,
    Zero,
    Zip,
    dim_kind,
    is_ragged,
    make_symbol,
    stop_level,
)
from stepsim.graph.graph import CONVENTIONS, OnChipConvention, convention

T16 = Tile(FP32, 16, 16)
ADDR = Tile(UINT64, 1, 1)


def src(g: Graph, shape, dtype=T16, name=None) -> Placeholder:
    return g.placeholder(Stream(dtype, tuple(shape)), name=name)


def sym_equal(a, b) -> bool:
    return sp.simplify(sp.sympify(a) - sp.sympify(b)) == 0


def base_load(g: Graph, out=(4, 8, 1), stride=(1, 0, 1)) -> LinearOffChipLoad:
    return LinearOffChipLoad(g, Tensor("x", (64, 256)), tile=(16, 256), out_shape_tiled=out, stride=stride)


# =========================================================================================================
# compute operators
# =========================================================================================================
def test_scan_keeps_the_input_shape_and_emits_the_accumulator_type():
    g = Graph()
    x = src(g, (1, 4, 32))
    s = Scan(g, x, AccumAdd(), Zero(16, 16), 1, compute_bw=256)
    assert s.stream.shape == (1, 4, 32)
    assert s.stream.dtype == T16
    assert s.on_chip_bytes() == 1_024
    assert s.flops() == 1 * 4 * 32 * 256


def test_scan_with_broadcasting_accumulator_widens_to_the_broadcast_tile():
    g = Graph()
    x = src(g, (1, 4), Tile(FP32, 16, 1))
    s = Scan(g, x, AccumAdd(), Zero(16, 8), 1, compute_bw=1)
    assert s.stream.dtype == Tile(FP32, 16, 8)
    assert s.stream.shape == (1, 4)


def test_flatmap_row_streamify_adds_an_inner_dim_of_the_tile_row_count():
    g = Graph()
    x = src(g, (1, 4), Tile(FP32, 4, 64))
    f = FlatMap(g, x, RowStreamify())
    assert f.stream.shape == (1, 4, 4)
    assert f.stream.dtype == Tile(FP32, 1, 64)
    assert f.stream.rank == x.stream.rank + 1


def test_flatmap_row_streamify_with_filter_padding_makes_a_ragged_name_dyn_dim():
    g = Graph()
    x = src(g, (1, 4), Tile(FP32, 4, 64))
    f = FlatMap(g, x, RowStreamify(filter_padding=True))
    d = f.stream.shape[-1]
    assert f.stream.shape[:2] == (1, 4)
    assert str(d) == "FlatMap_1_dyn" and is_ragged(d)


def test_flatmap_row_streamify_of_dynamic_rows_is_ragged():
    g = Graph()
    M = make_symbol("M")
    x = src(g, (1, 3), DynTile(FP32, M, 64))
    f = FlatMap(g, x, RowStreamify())
    assert f.stream.dtype == Tile(FP32, 1, 64)
    assert is_ragged(f.stream.shape[-1])


def test_zip_of_equal_shapes_gives_a_tuple_stream_of_both_types():
    g = Graph()
    a = src(g, (1, 4, 8), T16)
    b = src(g, (1, 4, 8), Tile(FP32, 16, 1))
    z = Zip(g, a, b)
    assert z.stream.shape == (1, 4, 8)
    assert z.stream.dtype == TupleType((T16, Tile(FP32, 16, 1)))
    assert z.stream.dtype.size_in_bytes() == 1_024 + 64


def test_map_over_a_zip_tuple_applies_the_binary_function_to_the_elements():
    g = Graph()
    a = src(g, (1, 4, 8), T16)
    b = src(g, (1, 4, 8), Tile(FP32, 16, 1))
    m = Map(g, Zip(g, a, b), Add(), compute_bw=64)
    assert m.stream.shape == (1, 4, 8)
    assert m.stream.dtype == T16
    assert m.operand_types == (T16, Tile(FP32, 16, 1))
    assert m.flops() == 32 * 256
    assert m.on_chip_bytes() == 0
    assert m.on_chip_bytes(convention("fifos")) == 1_024 + 64 + 1_024


def test_binary_map_output_takes_the_first_input_shape_and_broadcast_tile():
    g = Graph()
    a = src(g, (1, 2, 3), Tile(FP32, 16, 1))
    b = src(g, (1, 2, 3), Tile(FP32, 1, 32))
    m = BinaryMap(g, a, b, Mul(), compute_bw=1)
    assert m.stream.shape == (1, 2, 3)
    assert m.stream.dtype == Tile(FP32, 16, 32)


def test_matmul_chain_flops_are_2_b_d_f():
    g = Graph()
    x = base_load(g, out=(4, 32, 1))
    w = LinearOffChipLoad(g, Tensor("w", (256, 512)), tile=(256, 16), out_shape_tiled=(4, 32, 1), stride=(0, 1, 32))
    bma = BinaryMapAccum(g, x, w, Matmul(), Zero(16, 16), 1, compute_bw=1)
    silu = UnaryMap(g, bma, Silu(), compute_bw=1)
    assert bma.flops() == 2 * 64 * 256 * 512
    assert silu.flops() == 8 * 64 * 512
    assert g.flops() == 2 * 64 * 256 * 512 + 8 * 64 * 512


def test_row_sum_map_gives_r_by_1_tiles():
    g = Graph()
    m = UnaryMap(g, src(g, (1, 5), Tile(FP32, 8, 64)), RowSum(), compute_bw=1)
    assert m.stream.dtype == Tile(FP32, 8, 1)
    assert m.stream.shape == (1, 5)
    assert m.flops() == 5 * 8 * 64


def test_map_accum_with_dynamic_tile_gives_dynamic_tile_and_symbolic_bytes():
    g = Graph()
    M = make_symbol("M")
    a = src(g, (1, 3), DynTile(FP32, M, 64))
    b = src(g, (1, 3), Tile(FP32, 64, 32))
    m = MapAccum(g, a, b, Matmul(), Zero(1, 32), 1, compute_bw=1)
    assert m.stream.shape == (1,)
    assert m.stream.dtype == DynTile(FP32, M, 32)
    assert sym_equal(m.on_chip_bytes(), 128 * M)
    assert sym_equal(m.flops(), 3 * 2 * M * 64 * 32)


def test_matmul_weight_transposed_contracts_over_the_weight_columns():
    g = Graph()
    a = src(g, (1, 2), Tile(FP32, 16, 64))
    b = src(g, (1, 2), Tile(FP32, 32, 64))
    m = BinaryMap(g, a, b, Matmul(weight_transposed=True), compute_bw=1)
    assert m.stream.dtype == Tile(FP32, 16, 32)


def test_accum_output_defaults_to_the_init_tile_and_drops_the_reduced_dims():
    g = Graph()
    acc = Accum(g, src(g, (1, 4, 8, 2)), AccumAdd(), Zero(16, 16), 2, compute_bw=1)
    assert acc.stream.shape == (1, 4)
    assert acc.stream.dtype == T16


def test_accum_retile_row_with_zero_bandwidth_is_allowed_and_uses_the_given_out_dtype():
    g = Graph()
    acc = Accum(g, src(g, (1, 8), Tile(FP32, 1, 64)), RetileRow(), Empty(0, 64), 1, compute_bw=0,
                out_dtype=Tile(FP32, 8, 64))
    assert acc.stream.shape == (1,)
    assert acc.stream.dtype == Tile(FP32, 8, 64)
    assert acc.on_chip_bytes() == 8 * 64 * 4


def test_retile_streamify_without_split_row_makes_column_tiles():
    g = Graph()
    r = RetileStreamify(g, src(g, (1, 3, 2), Tile(FP32, 4, 8)), split_row=False)
    assert r.stream.shape == (1, 3, 16)
    assert r.stream.dtype == Tile(FP32, 4, 1)


# =========================================================================================================
# buffer operators
# =========================================================================================================
def test_bufferize_keeps_outer_dims_and_emits_buffer_refs_over_the_inner_dims():
    g = Graph()
    b = Bufferize(g, src(g, (1, 2, 3, 4, 5)), 3)
    assert b.stream.shape == (1, 2)
    assert b.stream.dtype == BufferRef(T16, (3, 4, 5))
    assert b.stream.dtype.size_in_bytes() == 60 * 1_024


def test_bufferize_accepts_a_dynamic_outermost_buffered_dim():
    g = Graph()
    X = make_symbol("X")
    b = Bufferize(g, src(g, (1, X, 4)), 2)
    assert b.stream.shape == (1,)
    assert b.stream.dtype.shape == (X, 4)
    assert sym_equal(b.on_chip_bytes(), 2 * X * 4 * 1_024 + 1_024)


def test_streamify_appends_repeat_factors_then_the_buffer_shape():
    g = Graph()
    b = Bufferize(g, src(g, (1, 2, 3, 4)), 2)
    s = Streamify(g, b, [5, 6], 2)
    assert s.stream.shape == (1, 2, 5, 6, 3, 4)
    assert s.stream.dtype == T16


def test_dyn_streamify_rereads_the_buffer_once_per_reference_element():
    g = Graph()
    x = LinearOffChipLoad(g, Tensor("x", (64, 256)), tile=(16, 256), out_shape_tiled=(4, 1, 8, 1),
                          stride=(1, 0, 0, 0))
    buf = Bufferize(g, x, 2)
    assert buf.stream.shape == (1, 4, 1)
    ref = LinearOffChipLoad(g, Tensor("r", (64, 256)), tile=(16, 256), out_shape_tiled=(4, 3), stride=(1, 0))
    d = DynStreamify(g, buf, ref, 0, 2)
    assert d.stream.shape == (1, 4, 3, 8, 1)
    assert d.stream.dtype == Tile(FP32, 16, 256)
    assert d.on_chip_bytes() == 8 * 16_384 + 16_384
    assert d.on_chip_bytes(PAPER) == 0


def test_dyn_streamify_off_chip_quirk_counts_only_reference_elements():
    g = Graph()
    x = LinearOffChipLoad(g, Tensor("x", (64, 256)), tile=(16, 256), out_shape_tiled=(4, 1, 8, 1),
                          stride=(1, 0, 0, 0))
    buf = Bufferize(g, x, 2, off_chip=True)
    ref = LinearOffChipLoad(g, Tensor("r", (64, 256)), tile=(16, 256), out_shape_tiled=(4, 3), stride=(1, 0))
    d = DynStreamify(g, buf, ref, 0, 2, off_chip=True)
    assert d.off_chip_bytes() == 12 * 16_384
    assert d.on_chip_bytes() == 16_384


def test_dyn_streamify_with_dynamic_reference_dim():
    g = Graph()
    X = make_symbol("X")
    buf = src(g, (1, 4, 1), BufferRef(T16, (2, 3)))
    ref = src(g, (1, 4, X), ADDR)
    d = DynStreamify(g, buf, ref, 0, 2)
    assert d.stream.shape == (1, 4, X, 2, 3)


# =========================================================================================================
# memory operators
# =========================================================================================================
def test_linear_load_output_is_leading_one_plus_out_shape_tiled():
    g = Graph()
    w = LinearOffChipLoad(g, Tensor("w", (256, 512)), tile=(256, 16), out_shape_tiled=(2, 32, 1), stride=(0, 1, 32))
    assert w.stream.shape == (1, 2, 32, 1)
    assert w.tensor_shape_tiled == (1, 32)


def test_linear_load_stream_dtype_can_differ_from_bf16_storage_and_bytes_follow_storage():
    g = Graph()
    x = LinearOffChipLoad(g, Tensor("x", (64, 256), dtype=BF16), tile=(16, 256), out_shape_tiled=(4,),
                          stride=(1,), stream_dtype=FP32)
    assert x.stream.dtype == Tile(FP32, 16, 256)
    assert x.off_chip_bytes() == 4 * 16 * 256 * 2
    assert x.on_chip_bytes() == 16 * 256 * 2
    st_ = LinearOffChipStore(g, x)
    assert st_.off_chip_bytes() == 4 * 16 * 256 * 4  # the store uses the fp32 stream dtype (quirk 3)


@pytest.mark.parametrize("based_on_waddr", [True, False])
def test_random_store_ack_has_waddr_or_wdata_shape(based_on_waddr):
    g = Graph()
    wdata = src(g, (1, 4, 2), T16)
    waddr = src(g, (1, 8), ADDR)
    s = RandomOffChipStore(g, wdata, waddr, Tensor("kv", (64, 64)), (16, 16), ack_based_on_waddr=based_on_waddr)
    want = (1, 8) if based_on_waddr else (1, 4, 2)
    assert s.stream.shape == want
    assert s.stream.dtype == BOOL
    assert s.off_chip_bytes() == int(np.prod(want)) * 1_024


def test_random_store_on_chip_is_buffer_depth_tiles_doubled_in_paper_mode():
    g = Graph()
    s = RandomOffChipStore(g, src(g, (1, 8)), src(g, (1, 8), ADDR), Tensor("kv", (64, 64), dtype=BF16), (16, 16),
                           buffer_depth=3)
    assert s.on_chip_bytes() == 3 * 16 * 16 * 2
    assert s.on_chip_bytes(PAPER) == 6 * 16 * 16 * 2


def test_random_load_output_has_address_shape():
    g = Graph()
    X = make_symbol("X")
    r = RandomOffChipLoad(g, src(g, (1, X, 3), ADDR), Tensor("w", (64, 64)), (16, 16))
    assert r.stream.shape == (1, X, 3)
    assert r.stream.dtype == T16
    assert sym_equal(r.off_chip_bytes(), 3 * X * 1_024)


@pytest.mark.parametrize("shape,tile,want", [
    ((1, 4, 32), (16, 16), (64, 512)),
    ((1, 7), (16, 32), (112, 32)),
    ((1, 2, 4, 32), (16, 16), (2, 64, 512)),
])
def test_linear_store_tensor_shape_multiplies_the_last_two_tiled_dims(shape, tile, want):
    g = Graph()
    s = LinearOffChipStore(g, src(g, shape, Tile(FP32, *tile)))
    assert s.tensor_shape == want


def test_linear_store_tensor_shape_with_a_dynamic_tiled_dim():
    g = Graph()
    X = make_symbol("X")
    s = LinearOffChipStore(g, src(g, (1, X), Tile(FP32, 4, 64)))
    assert sym_equal(s.tensor_shape[0], 4 * X) and s.tensor_shape[1] == 64


def test_linear_store_of_a_rank0_stream_covers_all_n_tiles():
    g = Graph()
    s = LinearOffChipStore(g, src(g, (5,), Tile(FP32, 4, 64)))
    assert s.off_chip_bytes() == 5 * 4 * 64 * 4
    assert s.tensor_shape == (20, 64)


# =========================================================================================================
# routing operators
# =========================================================================================================
def test_explicit_broadcast_makes_n_identical_copies_with_zero_metrics():
    g = Graph()
    x = base_load(g)
    b = Broadcast(g, x, 3)
    assert b.num_outputs == 3
    assert all(s == x.stream for s in b.outputs)
    assert b.on_chip_bytes() == 0 and b.off_chip_bytes() == 0 and b.on_chip_bytes(PAPER) == 0


def test_partition_at_rank_1_keeps_the_inner_dim():
    g = Graph()
    x = src(g, (1, 6, 4))
    sel = SelectorSource(g, np.eye(3, dtype=np.int64)[[0, 1, 2, 0, 1, 2]], 3)
    p = Partition(g, x, sel, 1, 3)
    assert [s.shape for s in p.outputs] == [(make_symbol(f"{sel.name}_{i:03d}"), 4) for i in range(3)]
    assert p.on_chip_bytes(convention("fifos")) == 1_024 * 4


def test_parallelize_of_a_dynamic_outer_dim_divides_exactly():
    g = Graph()
    X = make_symbol("X")
    p = Parallelize(g, src(g, (X, 4)), 1, 4)
    assert p.num_outputs == 4
    for s in p.outputs:
        assert s.shape[1] == 4 and sym_equal(s.shape[0], X / 4)


def test_reassemble_keeps_inner_rank_dims_and_adds_a_ragged_dim_after_the_control_shape():
    g = Graph()
    ins = [src(g, (make_symbol(f"S{i}"), 4, 2)) for i in range(3)]
    ctrl = src(g, (1, 5), Selector(3))
    r = Reassemble(g, ins, ctrl, 2)
    assert r.stream.shape[:2] == (1, 5) and r.stream.shape[3:] == (4, 2)
    assert str(r.stream.shape[2]) == f"{r.name}_dyn" and is_ragged(r.stream.shape[2])


def test_reassemble_on_chip_with_write_back_is_the_product_from_control_rank_minus_1_and_fifos_add_inputs():
    g = Graph()
    ins = [src(g, (make_symbol(f"S{i}"),), Tile(FP32, 1, 64)) for i in range(4)]
    ctrl = src(g, (1, 10), Selector(4))
    r = Reassemble(g, ins, ctrl, 0, write_back_mu=True)
    dyn = r.stream.shape[2]
    assert sym_equal(r.on_chip_bytes(), 1 * 10 * dyn * 256)
    assert sym_equal(r.on_chip_bytes(convention("fifos")), 10 * dyn * 256 + 256 * 5)
    plain = Reassemble(g, ins, ctrl, 0)
    assert plain.on_chip_bytes() == 0 and plain.on_chip_bytes(convention("fifos")) == 256 * 5


def test_reassemble_of_dynamic_tiles_with_different_rows_carries_a_ragged_row_dim():
    """An expert's dynamic tiles of several micro-batches (rows: each micro-batch's count) in one stream; the same
    rows stay the input's type, and a static tile among symbolic ones is refused (nothing re-tiles it)."""
    g = Graph()
    ctrl = src(g, (2,), Selector(2))
    a = src(g, (1,), DynTile(FP32, make_symbol("C0"), 64))
    b = src(g, (1,), DynTile(FP32, make_symbol("C1"), 64))
    r = Reassemble(g, [a, b], ctrl, 0)
    t = r.stream.dtype
    assert isinstance(t, DynTile) and t.cols == 64 and is_ragged(t.rows) and str(t.rows) == f"{r.name}_rows"
    same = Reassemble(g, [a, a], ctrl, 0)
    assert same.stream.dtype == DynTile(FP32, make_symbol("C0"), 64)
    c = src(g, (1,), DynTile(FP32, 16, 64))
    with pytest.raises(DTypeError, match=re.escape(f"input 1 carries {c.stream.dtype} but input 0 carries "
                                                   f"{a.stream.dtype}")):
        Reassemble(g, [a, c], ctrl, 0)


def test_eager_merge_of_dynamic_tiles_with_different_rows_merges_into_a_ragged_row_dim():
    g = Graph()
    a = src(g, (make_symbol("A"),), DynTile(FP32, make_symbol("M0"), 64))
    b = src(g, (make_symbol("B"),), DynTile(FP32, make_symbol("M1"), 64))
    m = EagerMerge(g, [a, b], 0)
    t = m.outputs[0].dtype
    assert isinstance(t, DynTile) and t.cols == 64 and is_ragged(t.rows)
    assert str(t.rows) == f"{m.name}_rows"


# =========================================================================================================
# shape operators
# =========================================================================================================
@pytest.mark.parametrize("lo,hi", [(lo, hi) for lo in range(4) for hi in range(lo + 1, 5)])
def test_flatten_merges_ranks_lo_to_hi_into_their_product(lo, hi):
    g = Graph()
    shape = (2, 3, 5, 7, 11)
    f = Flatten(g, src(g, shape), lo, hi)
    i, j = 4 - hi, 4 - lo
    assert f.stream.shape == shape[:i] + (int(np.prod(shape[i:j + 1])),) + shape[j + 1:]
    assert f.stream.rank == 4 - (hi - lo)


@pytest.mark.parametrize("p", range(5))
def test_promote_inserts_a_static_1_that_has_rank_p_in_the_output(p):
    g = Graph()
    shape = (2, 3, 5, 7)
    pr = Promote(g, src(g, shape), p)
    out = pr.stream.shape
    assert len(out) == 5
    assert out[len(out) - 1 - p] == 1
    assert out[:len(out) - 1 - p] + out[len(out) - p:] == shape
    assert pr.stream.dim(p) == 1


def test_promote_of_a_dynamic_stream_still_inserts_int_1_not_piecewise():
    g = Graph()
    X = make_symbol("X")
    pr = Promote(g, src(g, (X,)), 1)
    assert pr.stream.shape == (1, X) and isinstance(pr.stream.shape[0], int)


def test_reshape_rank0_with_pad_rounds_up_a_static_dim():
    g = Graph()
    r = Reshape(g, src(g, (1, 10), Tile(FP32, 1, 64)), 4, 0, pad=Zero(1, 64))
    assert r.stream.shape == (1, 3, 4)
    assert r.num_outputs == 2
    assert r.outputs[1] == Stream(BOOL, (1, 3, 4))  # padding flags
    assert r.stream is r.outputs[0]


def test_reshape_add_outer_dim_of_a_static_rank0_stream_prepends_1():
    g = Graph()
    r = Reshape(g, src(g, (8,), Tile(FP32, 1, 64)), 4, 0, add_outer_dim=True)
    assert r.stream.shape == (1, 2, 4)


def test_reshape_chunk_1_at_rank_0_splits_a_dynamic_dim_without_pad():
    g = Graph()
    X = make_symbol("X")
    r = Reshape(g, src(g, (1, X)), 1, 0)
    assert r.stream.shape == (1, X, 1)


def test_reshape_of_a_higher_rank_splits_that_dim():
    g = Graph()
    r = Reshape(g, src(g, (1, 6, 4, 5)), 3, 2)
    assert r.stream.shape == (1, 2, 3, 4, 5)


def test_expand_repeats_over_the_reference_inner_dims_with_the_input_dtype():
    g = Graph()
    x = src(g, (1, 4, 1, 1), Tile(FP32, 16, 1))
    ref = src(g, (1, 4, 3, 7), ADDR)
    e = Expand(g, x, ref, 2)
    assert e.stream.shape == (1, 4, 3, 7)
    assert e.stream.dtype == Tile(FP32, 16, 1)
    assert e.on_chip_bytes() == 64 and e.on_chip_bytes(convention("fifos")) == 128
    assert ExpandRef is Expand


def test_expand_with_a_dynamic_reference_dim():
    g = Graph()
    R = make_symbol("R", ragged=True)
    e = Expand(g, src(g, (1, 4, 1)), src(g, (1, 4, R), ADDR), 1)
    assert e.stream.shape == (1, 4, R)


def test_repeat_static_appends_the_count():
    g = Graph()
    r = RepeatStatic(g, src(g, (1, 2)), 7)
    assert r.stream.shape == (1, 2, 7)


# =========================================================================================================
# sources, address generators, sinks
# =========================================================================================================
def test_metadata_source_is_leading_1_plus_values_shape_of_u64_scalars():
    g = Graph()
    m = MetadataSource(g, np.arange(12).reshape(3, 4))
    assert m.stream == Stream(ADDR, (1, 3, 4))
    assert m.values.dtype == np.int64


def test_cache_read_addr_gen_and_filter_last_tile_add_a_ragged_dim_named_after_the_op():
    g = Graph()
    idx = MetadataSource(g, np.arange(4))
    lens = MetadataSource(g, np.array([3, 1, 4, 1]))
    c = CacheReadAddrGen(g, idx, lens, 128)
    f = FilterLastTile(g, lens)
    assert c.stream.shape[:2] == (1, 4) and str(c.stream.shape[2]) == c.name == "CacheReadAddrGen_2"
    assert f.stream.shape[:2] == (1, 4) and str(f.stream.shape[2]) == f.name == "FilterLastTile_3"
    assert f.stream.dtype == Selector(2)
    assert is_ragged(c.stream.shape[2]) and is_ragged(f.stream.shape[2])


def test_sink_has_no_outputs_and_consumes_its_input():
    g = Graph()
    x = base_load(g)
    s = Sink(g, x)
    assert s.outputs == [] and s.inputs[0] == x.out(0)


# =========================================================================================================
# stop levels
# =========================================================================================================
def static_levels(shape):
    return [stop_level(i, shape) for i in itertools.product(*(range(d) for d in shape))]


def test_stop_level_of_a_1x2x3_stream():
    assert static_levels((1, 2, 3)) == [0, 0, 1, 0, 0, 2]


def test_stop_level_is_capped_at_the_stream_rank():
    # rank 1 stream of 2 vectors: the outermost dim never contributes a level
    assert static_levels((2, 3)) == [0, 0, 1, 0, 0, 1]
    assert static_levels((5,)) == [0] * 5


def test_stop_level_reproduces_the_paper_rank2_example():
    rows = [[1, 3, 1, 2, 4, 5, 3], [1, 1, 1, 2], [4, 5]]
    tokens = []
    for r, row in enumerate(rows):
        for j, v in enumerate(row):
            tokens.append(str(v))
            level = stop_level((0, r, j), (1, len(rows), len(row)))
            if level:
                tokens.append(f"S{level}")
    tokens.append("D")
    assert " ".join(tokens) == "1 3 1 2 4 5 3 S1 1 1 1 2 S1 4 5 S2 D"


small_shapes = st.lists(st.integers(1, 3), min_size=2, max_size=4).map(tuple)


@settings(max_examples=60, deadline=None)
@given(shape=small_shapes, data=st.data())
def test_flatten_stop_level_out_matches_the_levels_of_the_flattened_shape(shape, data):
    rank = len(shape) - 1
    lo = data.draw(st.integers(0, rank - 1))
    hi = data.draw(st.integers(lo + 1, rank))
    g = Graph()
    f = Flatten(g, src(g, shape), lo, hi)
    assert [f.stop_level_out(level) for level in static_levels(shape)] == static_levels(f.stream.shape)


@settings(max_examples=60, deadline=None)
@given(shape=small_shapes, data=st.data())
def test_promote_stop_level_out_matches_the_levels_of_the_promoted_shape_for_ranks_0_to_input_rank(shape, data):
    p = data.draw(st.integers(0, len(shape) - 1))
    g = Graph()
    pr = Promote(g, src(g, shape), p)
    assert [pr.stop_level_out(level) for level in static_levels(shape)] == static_levels(pr.stream.shape)


def test_promote_stop_level_out_paper_rule_levels_at_least_p_gain_one():
    g = Graph()
    pr = Promote(g, src(g, (1, 2, 3, 4)), 2)
    assert [pr.stop_level_out(level) for level in range(4)] == [0, 1, 3, 4]


def test_promote_rank0_stop_level_out_gives_every_element_a_stop_token():
    g = Graph()
    shape = (1, 2, 3)
    pr = Promote(g, src(g, shape), 0)
    assert pr.stream.shape == (1, 2, 3, 1)
    assert [pr.stop_level_out(level) for level in static_levels(shape)] == static_levels(pr.stream.shape)


# =========================================================================================================
# dimension kinds
# =========================================================================================================
def test_dimension_kinds_static_dynamic_ragged():
    X = make_symbol("X")
    R = make_symbol("R", ragged=True)
    assert dim_kind(4) == "static"
    assert dim_kind(sp.Integer(4)) == "static"
    assert dim_kind(X) == "dynamic"
    assert dim_kind(X + 3) == "dynamic"
    assert dim_kind(sp.floor(X / 4)) == "dynamic"
    assert dim_kind(R) == "ragged"
    assert isinstance(R, RaggedSymbol) and isinstance(R, sp.Symbol)


def test_ragged_symbols_pickle_as_ragged_symbols():
    """RaggedSymbol is defined on first use (sympy is imported lazily); pickle still finds it by name, so sweeps
    can send ragged expressions to worker processes."""
    import pickle

    from stepsim.graph import dims

    R = make_symbol("R", ragged=True)
    assert RaggedSymbol is dims.RaggedSymbol
    assert RaggedSymbol.__module__ + "." + RaggedSymbol.__qualname__ == "stepsim.graph.dims.RaggedSymbol"
    copy = pickle.loads(pickle.dumps(R * 3 + 1))
    assert copy == R * 3 + 1 and dim_kind(copy) == "ragged"


def test_ragged_symbols_absorb_every_expression_they_appear_in():
    X, Y = make_symbol("X"), make_symbol("Y")
    R = make_symbol("R", ragged=True)
    assert is_ragged(X * R)
    assert is_ragged(R + 1)
    assert is_ragged(sp.floor((X + R) / 4))
    assert is_ragged(sp.Piecewise((1, R >= 1), (0, True)) * X)
    assert not is_ragged(X * Y)
    assert not is_ragged(7)


def test_dimension_symbols_are_integer_and_nonnegative():
    for s in (make_symbol("X"), make_symbol("R", ragged=True)):
        assert s.is_integer is True and s.is_nonnegative is True


# =========================================================================================================
# determinism
# =========================================================================================================
def build_dynamic(g: Graph):
    data = LinearOffChipLoad(g, Tensor("tok", (10, 64)), tile=(1, 64), out_shape_tiled=(10,), stride=(1,))
    sel = SelectorSource(g, np.eye(4, dtype=np.int64)[[0, 1, 2, 3, 0, 1, 2, 3, 0, 1]], 4)
    part = Partition(g, data, sel, 0, 4)
    outs = []
    for i in range(4):
        r = Reshape(g, part[i], 4, 0, pad=Zero(1, 64), add_outer_dim=True)
        acc = Accum(g, Flatten(g, r, 1, 2), RetileRow(), Empty(0, 64), 1, compute_bw=0,
                    out_dtype=Tile(FP32, 4, 64))
        w = LinearOffChipLoad(g, Tensor(f"w{i}", (64, 128)), tile=(64, 32), out_shape_tiled=(4,), stride=(1,),
                              ref=acc)
        y = BinaryMapAccum(g, RepeatStatic(g, acc, 4), w, Matmul(), Zero(4, 32), 1, compute_bw=64)
        outs.append(RetileStreamify(g, y, filter_mask=True))
    re_ = Reassemble(g, outs, sel, 0)
    LinearOffChipStore(g, re_)
    return g


def test_building_the_same_graph_twice_gives_identical_names_symbols_and_metrics():
    g1 = build_dynamic(Graph("a"))
    Graph("unrelated")  # other graphs in between must not shift names
    build_dynamic(Graph("b"))
    g2 = build_dynamic(Graph("c"))
    assert [op.name for op in g1] == [op.name for op in g2]
    off1, off2 = g1.off_chip_bytes(), g2.off_chip_bytes()
    assert off1 == off2 and str(off1) == str(off2)
    assert g1.on_chip_bytes() == g2.on_chip_bytes()
    assert [str(s.shape) for op in g1 for s in op.outputs] == [str(s.shape) for op in g2 for s in op.outputs]
    assert [op.name for op in g1] == [op.name for op in g2]  # after finalize: Broadcasts named alike
    assert g1.count_by_kind() == g2.count_by_kind() and g1.count_by_kind()["Broadcast"] >= 1
    names = sorted(str(s) for s in off1.free_symbols)
    assert names == ["Reassemble_31_dyn"] + [f"SelectorSource_1_{i:03d}" for i in range(4)]


def test_every_free_symbol_of_a_graph_is_integer_and_nonnegative():
    g = build_dynamic(Graph())
    syms = set()
    for op in g:
        for s in op.outputs:
            for d in s.shape:
                syms |= sp.sympify(d).free_symbols
    syms |= g.off_chip_bytes().free_symbols | g.on_chip_bytes().free_symbols
    assert len(syms) >= 8
    assert all(s.is_integer is True and s.is_nonnegative is True for s in syms)


# =========================================================================================================
# automatic Broadcast insertion
# =========================================================================================================
def test_a_stream_consumed_by_three_ops_gets_one_broadcast_with_three_outputs():
    g = Graph()
    x = base_load(g)
    a = UnaryMap(g, x, Silu(), compute_bw=1)
    b = Flatten(g, x, 0, 1)
    c = RepeatStatic(g, x, 2)
    g.insert_broadcasts()
    bcs = [op for op in g if isinstance(op, Broadcast)]
    assert len(bcs) == 1
    bc = bcs[0]
    assert bc.num_outputs == 3 and bc.inputs == [x.out(0)]
    assert g.ops[-1] is bc  # appended after the existing ops
    assert [a.inputs[0], b.inputs[0], c.inputs[0]] == [bc.out(0), bc.out(1), bc.out(2)]
    assert all(s == x.stream for s in bc.outputs)


def test_multi_edges_count_an_op_reading_the_same_stream_twice_gets_two_broadcast_outputs():
    g = Graph()
    x = base_load(g)
    m = BinaryMap(g, x, x, Add(), compute_bw=1)
    g.finalize()
    (bc,) = [op for op in g if isinstance(op, Broadcast)]
    assert bc.num_outputs == 2
    assert m.inputs == [bc.out(0), bc.out(1)]


def test_broadcast_insertion_is_idempotent_even_after_more_ops_are_added():
    g = Graph()
    x = base_load(g)
    y = base_load(g)
    UnaryMap(g, x, Silu(), compute_bw=1)
    UnaryMap(g, x, Silu(), compute_bw=1)
    g.finalize()
    n = len(g)
    g.finalize()
    g.insert_broadcasts()
    assert len(g) == n
    Sink(g, y)  # an unrelated addition invalidates the cache; re-running must not re-broadcast x
    g.finalize()
    assert len(g) == n + 1
    assert g.count_by_kind()["Broadcast"] == 1


def test_single_consumer_streams_get_no_broadcast():
    g = Graph()
    x = base_load(g)
    LinearOffChipStore(g, UnaryMap(g, x, Silu(), compute_bw=1))
    g.finalize()
    assert "Broadcast" not in g.count_by_kind()


def test_multi_output_producers_get_a_broadcast_only_on_the_output_with_several_consumers():
    g = Graph()
    x = LinearOffChipLoad(g, Tensor("tok", (10, 64)), tile=(1, 64), out_shape_tiled=(10,), stride=(1,))
    sel = SelectorSource(g, np.eye(3, dtype=np.int64)[[0, 1, 2, 0, 1, 2, 0, 1, 2, 0]], 3)
    p = Partition(g, x, sel, 0, 3)
    Sink(g, p[0])
    Sink(g, p[0])
    Sink(g, p[1])
    Sink(g, p[2])
    g.finalize()
    bcs = [op for op in g if isinstance(op, Broadcast)]
    assert len(bcs) == 1
    assert bcs[0].inputs == [p.out(0)] and bcs[0].num_outputs == 2


def test_existing_broadcasts_are_left_alone():
    g = Graph()
    x = base_load(g)
    bc = Broadcast(g, x, 2)
    Sink(g, bc[0])
    Sink(g, bc[1])
    g.finalize()
    assert g.count_by_kind()["Broadcast"] == 1


def test_inserted_broadcast_takes_the_producer_fanout_depth_and_group_and_adds_no_bytes():
    g = Graph()
    x = base_load(g)
    x.fanout_depth = 7
    x.group = ("expert", 3)
    UnaryMap(g, x, Silu(), compute_bw=1)
    UnaryMap(g, x, Silu(), compute_bw=1)
    before_on = sum(op.on_chip_bytes() for op in g)
    assert g.on_chip_bytes() == before_on == 16_384
    (bc,) = [op for op in g if isinstance(op, Broadcast)]
    assert bc.channel_depth == 7 and bc.group == ("expert", 3)


def test_the_selector_shared_by_partition_and_reassemble_is_broadcast():
    g = build_dynamic(Graph())
    g.finalize()
    sel = g.op("SelectorSource_1")
    consumers = g.consumers()[(sel.id, 0)]
    assert len(consumers) == 1 and isinstance(consumers[0][0], Broadcast)
    assert consumers[0][0].num_outputs == 2


# =========================================================================================================
# placeholders and cycles
# =========================================================================================================
def build_cycle(g: Graph):
    """tokens -> EagerMerge([tokens, feedback]) -> Partition by the merge's own select -> output 1 goes through
    a Map and feeds back into the merge; output 0 is stored."""
    R = make_symbol("R")
    tok = Flatten(g, LinearOffChipLoad(g, Tensor("tok", (10, 64)), tile=(1, 64), out_shape_tiled=(10,),
                                       stride=(1,)), 0, 1)
    ph = g.placeholder(Stream(Tile(FP32, 1, 64), (R,)))
    merge = EagerMerge(g, [tok, ph], 0)
    part = Partition(g, merge[0], merge[1], 0, 2)
    back = UnaryMap(g, part[1], Silu(), compute_bw=64)
    back.assume_shape(0, (R,))
    store = LinearOffChipStore(g, part[0])
    return SimpleNamespace(R=R, tok=tok, ph=ph, merge=merge, part=part, back=back, store=store)


def test_a_placeholder_closes_a_feedback_cycle_through_eager_merge():
    g = Graph()
    c = build_cycle(g)
    R, ph, merge, part, back = c.R, c.ph, c.merge, c.part, c.back
    assert ph.name == "Placeholder_2"
    assert sym_equal(merge.outputs[0].shape[0], 10 + R)
    g.connect(ph, back)
    assert merge.inputs[1] == back.out(0)
    assert not any(isinstance(op, Placeholder) for op in g)
    g.finalize()
    # the cycle: merge -> partition -> map -> merge
    assert part.inputs[0].op is merge and back.inputs[0].op is part and merge.inputs[1].op is back
    assert sym_equal(g.off_chip_bytes(), 10 * 256 + 256 * make_symbol("EagerMerge_3_000"))


def test_ops_built_from_a_connected_placeholder_read_the_real_producer():
    g = Graph()
    c = build_cycle(g)
    g.connect(c.ph, c.back)
    late = Sink(g, c.ph)
    assert late.inputs[0] == c.back.out(0)


def test_an_unconnected_placeholder_makes_finalize_raise_graph_error_naming_it():
    g = Graph()
    build_cycle(g)
    with pytest.raises(GraphError, match=r"placeholder Placeholder_2 .*never connected"):
        g.finalize()
    with pytest.raises(GraphError, match="Placeholder_2"):
        g.off_chip_bytes()


def test_connecting_a_placeholder_to_a_stream_of_another_type_raises_graph_error():
    g = Graph()
    c = build_cycle(g)
    with pytest.raises(GraphError, match=r"Placeholder_2: placeholder expects .*\[R\].* produces .*\[10\]"):
        g.connect(c.ph, c.tok)
    with pytest.raises(GraphError, match="Placeholder_2"):
        g.connect(c.ph, UnaryMap(g, c.back, RowSum(), compute_bw=1))  # same shape, other dtype


def test_connecting_twice_or_to_another_placeholder_raises_graph_error():
    g = Graph()
    c = build_cycle(g)
    other = g.placeholder(Stream(Tile(FP32, 1, 64), (c.R,)))
    with pytest.raises(GraphError, match="another placeholder"):
        g.connect(c.ph, other)
    g.connect(c.ph, c.back)
    with pytest.raises(GraphError, match="already connected"):
        g.connect(c.ph, c.back)


# =========================================================================================================
# on-chip conventions
# =========================================================================================================
def test_published_is_mode1_without_fifos_and_paper_is_mode2_with_fifos():
    assert PUBLISHED == OnChipConvention(1, False)
    assert PAPER == OnChipConvention(2, True)
    assert convention("published") == PUBLISHED
    assert convention("paper") == PAPER
    assert convention("fifos") == OnChipConvention(1, True)
    assert convention((2, False)) == OnChipConvention(2, False)
    assert convention(PAPER) is PAPER
    assert set(CONVENTIONS) == {"published", "paper", "fifos"}


def test_unknown_convention_names_and_modes_raise_argument_error():
    with pytest.raises(ArgumentError, match=r"unknown on-chip convention 'bogus'.*fifos.*paper.*published"):
        convention("bogus")
    with pytest.raises(ArgumentError, match="mode must be 1 or 2, got 3"):
        convention((3, True))


def test_loads_and_stores_are_double_buffered_only_in_paper_mode():
    g = Graph()
    x = base_load(g)
    s = LinearOffChipStore(g, x)
    assert x.on_chip_bytes(PUBLISHED) == 16_384
    assert x.on_chip_bytes(PAPER) == 32_768
    assert x.on_chip_bytes(OnChipConvention(2, False)) == 32_768
    assert s.on_chip_bytes(PUBLISHED) == 16_384 and s.on_chip_bytes(PAPER) == 32_768
    assert g.on_chip_bytes() == 32_768
    assert g.on_chip_bytes("paper") == g.on_chip_bytes(PAPER) == 65_536


def test_matmul_map_in_paper_mode_is_16_in1_cols_plus_weight_plus_out():
    g = Graph()
    x = base_load(g, out=(4, 32, 1))
    w = LinearOffChipLoad(g, Tensor("w", (256, 512)), tile=(256, 16), out_shape_tiled=(4, 32, 1), stride=(0, 1, 32))
    m = BinaryMap(g, x, w, Matmul(), compute_bw=1)
    assert m.on_chip_bytes(PUBLISHED) == 0
    assert m.on_chip_bytes(PAPER) == 16 * 256 + 16_384 + 1_024 == 21_504
    assert m.on_chip_bytes(OnChipConvention(2, False)) == 0
    bma = BinaryMapAccum(g, x, w, Matmul(), Zero(16, 16), 1, compute_bw=1)
    assert bma.on_chip_bytes(PAPER) == 21_504
    assert bma.on_chip_bytes(PUBLISHED) == 1_024


def test_non_matmul_maps_count_nothing_in_paper_mode():
    g = Graph()
    x = base_load(g)
    assert UnaryMap(g, x, Silu(), compute_bw=1).on_chip_bytes(PAPER) == 0
    assert BinaryMap(g, x, x, Add(), compute_bw=1).on_chip_bytes(PAPER) == 0


def test_streamify_counts_zero_in_mode_2():
    g = Graph()
    s = Streamify(g, Bufferize(g, base_load(g), 2), [3], 2)
    assert s.on_chip_bytes(PUBLISHED) == 147_456
    assert s.on_chip_bytes(PAPER) == 0
    assert s.on_chip_bytes(OnChipConvention(2, False)) == 0


# =========================================================================================================
# selectors over 1024 targets
# =========================================================================================================
def test_multihot_selector_source_over_1024_targets_builds_csr_and_counts():
    rng = np.random.default_rng(0)
    hot = (rng.random((2, 16, 1024)) < 0.01).astype(np.int64)
    hot[0, 0, :] = 0  # an empty selector
    hot[1, 3, 1023] = 1
    g = Graph()
    s = SelectorSource(g, hot, 1024)
    assert s.stream == Stream(Selector(1024), (1, 2, 16))
    assert s.stream.dtype.size_in_bytes() == 1024
    flat = hot.reshape(-1, 1024)
    assert s.ptr.dtype == np.int64 and s.targets.dtype == np.int64
    assert s.ptr.tolist() == [0] + np.cumsum(flat.sum(axis=1)).tolist()
    for i in range(len(flat)):
        assert s.selected(i).tolist() == np.nonzero(flat[i])[0].tolist()
    assert s.selected(0).size == 0
    counts = s.target_counts()
    assert counts.shape == (1024,) and counts.dtype == np.int64
    assert counts.tolist() == flat.sum(axis=0).tolist()


def test_index_selector_source_over_1024_targets_sorts_each_selection():
    g = Graph()
    s = SelectorSource(g, [[1023, 0], [512, 3], [7, 8]], 1024, multihot=False)
    assert s.stream == Stream(Selector(1024, multihot=False), (1, 3))
    assert s.ptr.tolist() == [0, 2, 4, 6]
    assert s.targets.tolist() == [0, 1023, 3, 512, 7, 8]
    counts = s.target_counts()
    assert counts[0] == counts[1023] == counts[512] == 1 and counts.sum() == 6


def test_index_selector_source_accepts_ragged_and_empty_selections():
    g = Graph()
    s = SelectorSource(g, [[0], [1023, 2], []], 1024)
    assert s.stream.shape == (1, 3)
    assert s.ptr.tolist() == [0, 1, 3, 3]
    assert s.targets.tolist() == [0, 2, 1023]


def test_partition_by_a_1024_target_selector_has_1024_outputs_with_symbols_in_target_order():
    g = Graph()
    x = src(g, (1, 4), Tile(FP32, 1, 64))
    hot = np.zeros((4, 1024), np.int64)
    hot[[0, 1, 2, 3], [0, 999, 1000, 1023]] = 1
    sel = SelectorSource(g, hot, 1024)
    p = Partition(g, x, sel, 0, 1024)
    assert p.num_outputs == 1024
    names = [str(s) for s in p.count_symbols]
    assert names[:2] == ["SelectorSource_1_000", "SelectorSource_1_001"]
    assert names[999] == "SelectorSource_1_999" and names[1000] == "SelectorSource_1_1000"
    assert len(set(names)) == 1024
    assert [s.shape[0] for s in p.outputs] == list(p.count_symbols)
    assert sel.target_counts()[[0, 999, 1000, 1023]].tolist() == [1, 1, 1, 1]
    assert p.on_chip_bytes(convention("fifos")) == 256 * 1025


def test_output_refs_name_multi_output_ops_with_an_index():
    g = Graph()
    m = EagerMerge(g, [src(g, (3,)), src(g, (4,))], 0)
    assert str(m[1]) == "EagerMerge_2[1]" and isinstance(m[1], OutputRef)
    assert m.outputs[0].shape == (7,)
    assert re.fullmatch(r"Placeholder_0", str(m.inputs[0]))


def test_ceil_div_and_indicator_fast_paths_build_the_evaluated_expressions():
    """dims.ceil_div / nonzero_indicator skip sympy's evaluation for plain count symbols: the result must be the
    very expression (same tree) the evaluation gives."""
    import sympy as sp

    from stepsim.graph import dims

    # one symbol of each class the fast path takes (a count symbol, a ragged one) and the divisors a tile size takes:
    # every one to 130, the powers of two to 1,024 and every eighth prime to 1,100 (each sympy evaluation is
    # milliseconds: every divisor to 1,100 for three symbols was 28 s of the suite)
    divisors = sorted({*range(1, 131), *(2 ** k for k in range(8, 11)), *list(sp.primerange(131, 1100))[::8]})
    for x in (dims.make_symbol("Partition_4_000"), dims.RaggedSymbol("Ragged_1", integer=True, nonnegative=True)):
        for s in divisors:
            evaluated = dims.normalize(sp.floor((x + s - 1) / sp.Integer(s)))
            fast = dims.ceil_div(x, s)
            assert fast == evaluated and sp.srepr(fast) == sp.srepr(evaluated), (x, s)
        evaluated = sp.Piecewise((1, x >= 1), (0, True))
        assert sp.srepr(dims.nonzero_indicator(x)) == sp.srepr(evaluated)
    plain = sp.Symbol("y")  # no assumptions: the slow path
    assert dims.ceil_div(plain, 4) == sp.floor((plain + 3) / 4)
