"""Malformed graphs raise the precise typed error (stepsim.base.errors) with a message naming the operator
(graph-local names such as ``Map_2``, deterministic from the build order) and the offending shapes / values.

Each case builds a small graph and triggers one mistake. ``expect`` checks the *exact* error class (a
ShapeError is a GraphError, so ``pytest.raises(GraphError)`` alone would be too weak) and that every message
fragment appears, in order.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import sympy as sp

from stepsim.base.errors import ArgumentError, DTypeError, GraphError, MetricError, ShapeError, StepsimError
from stepsim.graph import (
    BF16,
    FP32,
    UINT32,
    UINT64,
    Accum,
    AccumAdd,
    Add,
    BinaryMap,
    BinaryMapAccum,
    Bufferize,
    CacheReadAddrGen,
    CacheWriteAddr,
    DynStreamify,
    DynTile,
    EagerMerge,
    Expand,
    ExpertAddrGen,
    Flatten,
    Graph,
    LinearOffChipLoad,
    LinearOffChipStore,
    Map,
    Matmul,
    MetadataSource,
    OnlineSoftmax,
    Parallelize,
    Partition,
    Promote,
    RandomOffChipLoad,
    RandomOffChipStore,
    Reassemble,
    RepeatStatic,
    Reshape,
    RowAppend,
    Scan,
    Selector,
    SelectorSource,
    SetOffset,
    Silu,
    Sink,
    Stream,
    Streamify,
    Tensor,
    Tile,
    UnaryMap,
    Zero,
    Zip,
    as_int,
    make_symbol,
)

T16 = Tile(FP32, 16, 16)
ADDR = Tile(UINT64, 1, 1)


def src(g: Graph, shape, dtype=T16):
    return g.placeholder(Stream(dtype, tuple(shape)))


def base(g: Graph) -> LinearOffChipLoad:
    """LinearOffChipLoad_0: [1, 4, 8, 1] of Tile[fp32](16, 256)."""
    return LinearOffChipLoad(g, Tensor("x", (64, 256)), tile=(16, 256), out_shape_tiled=(4, 8, 1), stride=(1, 0, 1))


def expect(cls, *fragments):
    """pytest.raises(cls, match=<fragments in order>) plus an exact-class check."""
    pattern = ".*".join(re.escape(f) for f in fragments)
    ctx = pytest.raises(cls, match=pattern)

    class _Exact:
        def __enter__(self):
            self.info = ctx.__enter__()
            return self.info

        def __exit__(self, *exc):
            handled = ctx.__exit__(*exc)
            assert type(self.info.value) is cls, f"expected exactly {cls.__name__}, got {type(self.info.value)}"
            return handled

    return _Exact()


# =========================================================================================================
# compute operators
# =========================================================================================================
def test_map_with_two_inputs_of_different_shapes_is_a_shape_error():
    g = Graph()
    a, b = src(g, (1, 4)), src(g, (1, 5))
    with expect(ShapeError, "Map_2: both inputs must have the same shape", "[1, 4] and [1, 5]"):
        Map(g, [a, b], Add(), compute_bw=1)


def test_matmul_with_mismatched_inner_dims_is_a_dtype_error_naming_both_tiles():
    g = Graph()
    a, b = src(g, (1, 4), Tile(FP32, 16, 64)), src(g, (1, 4), Tile(FP32, 32, 16))
    with expect(DTypeError, "Map_2", "Matmul inner dimensions differ: [16, 64] x [32, 16]"):
        BinaryMap(g, a, b, Matmul(), compute_bw=1)


def test_map_accum_matmul_with_mismatched_inner_dims_is_a_dtype_error():
    g = Graph()
    a, b = src(g, (1, 4, 2), Tile(FP32, 16, 64)), src(g, (1, 4, 2), Tile(FP32, 16, 16))
    with expect(DTypeError, "MapAccum_2", "[16, 64] x [16, 16]"):
        BinaryMapAccum(g, a, b, Matmul(), Zero(16, 16), 1, compute_bw=1)


def test_map_accum_with_inputs_of_different_shapes_is_a_shape_error():
    g = Graph()
    a, b = src(g, (1, 4, 2)), src(g, (1, 4, 3))
    with expect(ShapeError, "MapAccum_2: inputs must have identical shapes", "[1, 4, 2] and [1, 4, 3]"):
        BinaryMapAccum(g, a, b, Matmul(), Zero(16, 16), 1, compute_bw=1)


def test_online_softmax_outside_a_map_accum_is_an_argument_error():
    g = Graph()
    s, v = src(g, (1, 4), Tile(FP32, 8, 32)), src(g, (1, 4), Tile(FP32, 32, 64))
    with expect(ArgumentError, "Map_2: OnlineSoftmax(head_dim=64) folds its operands into an accumulator state; "
                               "use it in a MapAccum"):
        BinaryMap(g, s, v, OnlineSoftmax(64), compute_bw=1)


def test_online_softmax_needs_the_zero_state_init_and_matching_tiles():
    g = Graph()
    s, v = src(g, (1, 4), Tile(FP32, 8, 32)), src(g, (1, 4), Tile(FP32, 32, 64))
    with expect(DTypeError, "MapAccum_2: OnlineSoftmax(head_dim=64) needs the zero state Zero(8, 66) as init, got "
                            "Zero(rows=8, cols=64"):
        BinaryMapAccum(g, s, v, OnlineSoftmax(64), Zero(8, 64), 1, compute_bw=1)
    w = src(g, (1, 4), Tile(FP32, 16, 64))
    with expect(DTypeError, "MapAccum_4: OnlineSoftmax(head_dim=64) cannot be applied: OnlineSoftmax needs score "
                            "columns == value rows"):
        BinaryMapAccum(g, s, w, OnlineSoftmax(64), Zero(8, 66), 1, compute_bw=1)


def test_compute_bw_0_with_a_flop_based_function_is_an_argument_error():
    g = Graph()
    with expect(ArgumentError, "Map_1: compute_bw is 0 but Silu() is FLOP-based"):
        UnaryMap(g, base(g), Silu(), compute_bw=0)


def test_negative_compute_bw_is_an_argument_error():
    g = Graph()
    with expect(ArgumentError, "Map_1: compute_bw must be a non-negative int", "got -1"):
        UnaryMap(g, base(g), Silu(), compute_bw=-1)


def test_map_given_a_binary_function_and_one_stream_is_an_argument_error():
    g = Graph()
    with expect(ArgumentError, "Map_1: Add() takes 2 operand(s), but 1 were given"):
        UnaryMap(g, base(g), Add(), compute_bw=1)


def test_map_given_three_streams_is_an_argument_error():
    g = Graph()
    x = base(g)
    with expect(ArgumentError, "Map_1", "takes 2 operand(s), but 3 were given"):
        Map(g, [x, x, x], Add(), compute_bw=1)


def test_map_given_a_non_function_is_an_argument_error():
    g = Graph()
    with expect(ArgumentError, "Map_1: fn must be a stepsim function", "'silu'"):
        UnaryMap(g, base(g), "silu", compute_bw=1)


def test_accum_rank_0_is_an_argument_error():
    g = Graph()
    with expect(ArgumentError, "Accum_1: rank must be between 1 and the input rank 3, got 0"):
        Accum(g, base(g), AccumAdd(), Zero(16, 256), 0, compute_bw=1)


def test_scan_rank_above_the_input_rank_is_an_argument_error():
    g = Graph()
    with expect(ArgumentError, "Scan_1: rank must be between 1 and the input rank 3, got 9"):
        Scan(g, base(g), AccumAdd(), Zero(16, 256), 9, compute_bw=1)


def test_accum_with_a_tile_instead_of_an_initialiser_is_an_argument_error():
    g = Graph()
    with expect(ArgumentError, "Accum_1: init must be Zero(...) or Empty(...)"):
        Accum(g, base(g), AccumAdd(), Tile(FP32, 16, 256), 1, compute_bw=1)


def test_accum_whose_accumulator_does_not_broadcast_with_the_input_is_a_dtype_error():
    g = Graph()
    with expect(DTypeError, "Accum_1: AccumAdd() cannot be applied", "dimensions 16 and 256 do not broadcast"):
        Accum(g, base(g), AccumAdd(), Zero(16, 16), 1, compute_bw=1)


def test_set_offset_with_a_non_u64_offset_is_a_dtype_error():
    g = Graph()
    a, off = src(g, (1, 4)), src(g, (1, 4), Tile(UINT32, 1, 1))
    with expect(DTypeError, "Map_2: SetOffset() cannot be applied",
                "offset must be a Tile[uint64](1, 1), got Tile[uint32](1, 1)"):
        BinaryMap(g, a, off, SetOffset(), compute_bw=0)


def test_row_append_with_a_row_of_the_wrong_width_is_a_dtype_error():
    g = Graph()
    a, row = src(g, (1, 4), Tile(FP32, 16, 64)), src(g, (1, 4), Tile(FP32, 1, 32))
    with expect(DTypeError, "Map_2: RowAppend() cannot be applied", "row must be [1, 64], got Tile[fp32](1, 32)"):
        BinaryMap(g, a, row, RowAppend(), compute_bw=0)


def test_cache_write_addr_with_a_float_operand_is_a_dtype_error():
    g = Graph()
    idx = MetadataSource(g, np.arange(4))
    bad = src(g, (1, 4), Tile(FP32, 1, 1))
    with expect(DTypeError, "Map_2: CacheWriteAddr() cannot be applied", "got Tile[fp32](1, 1)"):
        BinaryMap(g, idx, bad, CacheWriteAddr(8), compute_bw=0)


# =========================================================================================================
# routing operators
# =========================================================================================================
def test_partition_control_shape_not_matching_the_input_outer_dims_is_a_shape_error():
    g = Graph()
    x, c = src(g, (1, 10)), src(g, (1, 9), Selector(4))
    with expect(ShapeError, "Partition_2: control shape [1, 9] must equal the input's outer dims [1, 10]"):
        Partition(g, x, c, 0, 4)


def test_partition_at_rank_1_checks_the_control_against_the_dims_above_rank_1():
    g = Graph()
    x, c = src(g, (1, 10, 4)), src(g, (1, 10, 4), Selector(2))
    with expect(ShapeError, "Partition_2: control shape [1, 10, 4]", "outer dims [1, 10]", "at rank 1"):
        Partition(g, x, c, 1, 2)


def test_partition_selector_target_count_mismatch_is_an_argument_error():
    g = Graph()
    x, c = src(g, (1, 10)), src(g, (1, 10), Selector(3))
    with expect(ArgumentError, "Partition_2: control selects among 3 targets but there are 4"):
        Partition(g, x, c, 0, 4)


def test_partition_controlled_by_a_tile_stream_is_a_dtype_error():
    g = Graph()
    x, c = src(g, (1, 10)), src(g, (1, 10), ADDR)
    with expect(DTypeError, "Partition_2: control must be a selector stream", "Tile[uint64](1, 1)"):
        Partition(g, x, c, 0, 2)


def test_partition_rank_above_the_input_rank_is_an_argument_error():
    g = Graph()
    x, c = src(g, (1, 10)), src(g, (1,), Selector(2))
    with expect(ArgumentError, "Partition_2: rank must be between 0 and the input rank 1, got 2"):
        Partition(g, x, c, 2, 2)


def test_partition_with_zero_consumers_is_an_argument_error():
    g = Graph()
    x, c = src(g, (1, 10)), src(g, (1, 10), Selector(2))
    with expect(ArgumentError, "Partition_2: num_consumers must be a positive int, got 0"):
        Partition(g, x, c, 0, 0)


def test_partition_with_the_wrong_number_of_switch_cycles_is_an_argument_error():
    g = Graph()
    x, c = src(g, (1, 10)), src(g, (1, 10), Selector(2))
    with expect(ArgumentError, "Partition_2: switch_cycles must be a non-negative int or 2 of them", "[1, 2, 3]"):
        Partition(g, x, c, 0, 2, switch_cycles=[1, 2, 3])


def test_reassemble_inputs_with_different_inner_dims_is_a_shape_error():
    g = Graph()
    a, b, c = src(g, (3, 4)), src(g, (3, 5)), src(g, (1, 2), Selector(2))
    with expect(ShapeError, "Reassemble_3: input 1 [3, 5] must share the inner 1 dims [4]"):
        Reassemble(g, [a, b], c, 1)


def test_reassemble_inputs_with_different_dtypes_is_a_dtype_error():
    g = Graph()
    a, b, c = src(g, (3, 4)), src(g, (3, 4), Tile(FP32, 16, 8)), src(g, (1, 2), Selector(2))
    with expect(DTypeError, "Reassemble_3: input 1 carries Tile[fp32](16, 8) but input 0 carries Tile[fp32](16, 16)"):
        Reassemble(g, [a, b], c, 1)


def test_reassemble_with_a_selector_over_the_wrong_number_of_inputs_is_an_argument_error():
    g = Graph()
    a, b, c = src(g, (3, 4)), src(g, (3, 4)), src(g, (1, 2), Selector(3))
    with expect(ArgumentError, "Reassemble_3: control selects among 3 targets but there are 2"):
        Reassemble(g, [a, b], c, 1)


def test_eager_merge_of_different_element_types_is_a_dtype_error():
    g = Graph()
    a, b = src(g, (3,)), src(g, (4,), Tile(BF16, 16, 16))
    with expect(DTypeError, "EagerMerge_2: input 1 carries Tile[bf16](16, 16) but input 0 carries Tile[fp32](16, 16)"):
        EagerMerge(g, [a, b], 0)


def test_eager_merge_of_different_inner_dims_is_a_shape_error():
    g = Graph()
    a, b = src(g, (3, 2)), src(g, (4, 3))
    with expect(ShapeError, "EagerMerge_2: input 1 [4, 3] must share the inner 1 dims [2]"):
        EagerMerge(g, [a, b], 1)


def test_parallelize_rank_different_from_the_input_rank_is_an_argument_error():
    g = Graph()
    with expect(ArgumentError, "Parallelize_1: Parallelize rank must equal the input rank 1, got 0"):
        Parallelize(g, src(g, (10, 4)), 0, 2)


def test_parallelize_of_a_non_divisible_outer_dim_is_a_shape_error():
    g = Graph()
    with expect(ShapeError, "Parallelize_1: outer dim 10 is not divisible by 3 consumers"):
        Parallelize(g, src(g, (10,)), 0, 3)


# =========================================================================================================
# shape operators
# =========================================================================================================
def test_reshape_of_a_non_divisible_static_dim_without_pad_is_a_shape_error():
    g = Graph()
    with expect(ShapeError, "Reshape_1: dim 4 at rank 2 is not divisible by chunk_size 3"):
        Reshape(g, base(g), 3, 2)


def test_reshape_of_a_non_divisible_rank0_dim_without_pad_is_a_shape_error():
    g = Graph()
    with expect(ShapeError, "Reshape_1: dim 10 at rank 0 is not divisible by chunk_size 4", "give pad="):
        Reshape(g, src(g, (1, 10), Tile(FP32, 1, 64)), 4, 0)


def test_reshape_of_a_dynamic_dim_above_rank_0_is_a_shape_error():
    g = Graph()
    with expect(ShapeError, "Reshape_1: dim X at rank 1 is dynamic"):
        Reshape(g, src(g, (1, make_symbol("X"), 4)), 2, 1)


def test_reshape_add_outer_dim_on_a_rank_above_0_is_an_argument_error():
    g = Graph()
    with expect(ArgumentError, "Reshape_1: add_outer_dim is only allowed for rank-0 inputs (this one has rank 3)"):
        Reshape(g, base(g), 2, 2, add_outer_dim=True)


def test_reshape_with_a_pad_tile_of_another_shape_is_a_dtype_error():
    g = Graph()
    with expect(DTypeError, "Reshape_1: pad tile Tile[fp32](1, 32) must equal the stream's element type "
                            "Tile[fp32](1, 64)"):
        Reshape(g, src(g, (1, 10), Tile(FP32, 1, 64)), 4, 0, pad=Zero(1, 32))


def test_reshape_with_a_negative_chunk_is_an_argument_error():
    g = Graph()
    with expect(ArgumentError, "Reshape_1: chunk_size must be a positive int, got -2"):
        Reshape(g, base(g), -2, 2)


def test_flatten_with_min_rank_not_below_max_rank_is_an_argument_error():
    g = Graph()
    with expect(ArgumentError, "Flatten_1: need 0 <= min_rank < max_rank <= 3 (input rank), got 2, 2"):
        Flatten(g, base(g), 2, 2)


def test_flatten_with_max_rank_above_the_input_rank_is_an_argument_error():
    g = Graph()
    with expect(ArgumentError, "Flatten_1: need 0 <= min_rank < max_rank <= 3 (input rank), got 1, 4"):
        Flatten(g, base(g), 1, 4)


def test_promote_beyond_the_new_outermost_rank_is_an_argument_error():
    g = Graph()
    with expect(ArgumentError, "Promote_1: rank must be between 0 and 2, got 3"):
        Promote(g, src(g, (1, 4)), 3)


def test_expand_with_non_1_inner_dims_is_a_shape_error():
    g = Graph()
    with expect(ShapeError, "Expand_2: the input's innermost 1 dims must be 1, got [1, 4, 2]"):
        Expand(g, src(g, (1, 4, 2)), src(g, (1, 4, 3)), 1)


def test_expand_against_a_reference_of_another_rank_is_a_shape_error():
    g = Graph()
    with expect(ShapeError, "Expand_2: input [1, 4, 1] and reference [1, 4] differ in rank"):
        Expand(g, src(g, (1, 4, 1)), src(g, (1, 4)), 1)


def test_expand_with_different_outer_dims_is_a_shape_error():
    g = Graph()
    with expect(ShapeError, "Expand_2: outer dims differ: input [1, 4, 1] vs reference [1, 5, 3]"):
        Expand(g, src(g, (1, 4, 1)), src(g, (1, 5, 3)), 1)


def test_repeat_static_zero_times_is_an_argument_error():
    g = Graph()
    with expect(ArgumentError, "RepeatStatic_1: count must be a positive int, got 0"):
        RepeatStatic(g, base(g), 0)


def test_zip_of_different_shapes_is_a_shape_error():
    g = Graph()
    with expect(ShapeError, "Zip_2: Zip needs identical shapes, got [1, 4] and [1, 4, 1]"):
        Zip(g, src(g, (1, 4)), src(g, (1, 4, 1)))


# =========================================================================================================
# buffer operators
# =========================================================================================================
def test_bufferize_of_a_selector_stream_is_a_dtype_error():
    g = Graph()
    with expect(DTypeError, "Bufferize_1: Bufferize needs static tiles, got MultiHot(4)"):
        Bufferize(g, src(g, (1, 4, 2), Selector(4)), 1)


def test_bufferize_of_dynamic_tiles_is_a_dtype_error():
    g = Graph()
    with expect(DTypeError, "Bufferize_1: Bufferize needs static tiles, got DynTile[fp32](M, 64)"):
        Bufferize(g, src(g, (1, 4, 2), DynTile(FP32, make_symbol("M"), 64)), 1)


def test_bufferize_with_a_dynamic_inner_buffered_dim_is_a_shape_error():
    g = Graph()
    with expect(ShapeError, "Bufferize_1: only the outermost buffered dim may be dynamic, got [4, X]"):
        Bufferize(g, src(g, (1, 4, make_symbol("X"))), 2)


def test_bufferize_rank_above_the_input_rank_is_an_argument_error():
    g = Graph()
    with expect(ArgumentError, "Bufferize_1: rank must be between 1 and the input rank 3, got 4"):
        Bufferize(g, base(g), 4)


def test_streamify_of_a_non_buffer_stream_is_a_dtype_error():
    g = Graph()
    with expect(DTypeError, "Streamify_1: input must be a stream of buffer references",
                "got Stream<Tile[fp32](16, 256)>[1, 4, 8, 1]"):
        Streamify(g, base(g), [2], 1)


def test_streamify_rank_different_from_the_buffer_rank_is_an_argument_error():
    g = Graph()
    b = Bufferize(g, base(g), 2)
    with expect(ArgumentError, "Streamify_2: rank 1 must equal the buffer rank 2"):
        Streamify(g, b, [3], 1)


def test_dyn_streamify_whose_inner_dims_are_not_1_is_a_shape_error():
    g = Graph()
    b = Bufferize(g, base(g), 2)
    ref = src(g, (1, 4))
    with expect(ShapeError, "DynStreamify_3: input [1, 4] must equal the reference [1, 4]",
                "innermost 1 dims, which must be 1"):
        DynStreamify(g, b, ref, 0, 2)


# =========================================================================================================
# memory operators
# =========================================================================================================
def test_load_tile_not_dividing_the_tensor_is_a_shape_error():
    g = Graph()
    with expect(ShapeError, "LinearOffChipLoad_0: tile (24, 256) does not divide tensor 'x' of shape [64, 256]"):
        LinearOffChipLoad(g, Tensor("x", (64, 256)), tile=(24, 256), out_shape_tiled=(2,), stride=(1,))


def test_random_load_tile_not_dividing_the_tensor_is_a_shape_error():
    g = Graph()
    a = src(g, (1, 4), ADDR)
    with expect(ShapeError, "RandomOffChipLoad_1: tile (48, 64) does not divide tensor 'w' of shape [64, 64]"):
        RandomOffChipLoad(g, a, Tensor("w", (64, 64)), (48, 64))


def test_load_stride_length_mismatch_is_an_argument_error():
    g = Graph()
    with expect(ArgumentError, "LinearOffChipLoad_0: stride (1, 0) must have one non-negative int per "
                               "out_shape_tiled dim (4, 8, 1)"):
        LinearOffChipLoad(g, Tensor("x", (64, 256)), tile=(16, 256), out_shape_tiled=(4, 8, 1), stride=(1, 0))


def test_strided_view_out_of_range_is_a_shape_error():
    g = Graph()
    with expect(ShapeError, "LinearOffChipLoad_0: strided view out_shape_tiled=(4, 8, 1) stride=(1, 1, 1) "
                            "reaches tile 10, but tensor 'x' has only 4 tiles (tiled shape [4, 1])"):
        LinearOffChipLoad(g, Tensor("x", (64, 256)), tile=(16, 256), out_shape_tiled=(4, 8, 1), stride=(1, 1, 1))


def test_load_par_dispatch_0_is_an_argument_error():
    g = Graph()
    with expect(ArgumentError, "LinearOffChipLoad_0: par_dispatch must be a positive int, got 0"):
        LinearOffChipLoad(g, Tensor("x", (64, 256)), tile=(16, 256), out_shape_tiled=(4,), stride=(1,),
                          par_dispatch=0)


def test_one_dimensional_tensor_is_an_argument_error_naming_the_tensor():
    with expect(ArgumentError, "tensor 'v': shape must be at least 2-D with positive dims, got (64,)"):
        Tensor("v", (64,))


def test_random_load_with_non_u64_addresses_is_a_dtype_error():
    g = Graph()
    with expect(DTypeError, "RandomOffChipLoad_1: raddr must carry Tile[uint64](1, 1) addresses",
                "Stream<Tile[uint32](1, 1)>[1, 4]"):
        RandomOffChipLoad(g, src(g, (1, 4), Tile(UINT32, 1, 1)), Tensor("w", (64, 64)), (16, 16))


def test_random_store_with_non_u64_write_addresses_is_a_dtype_error():
    g = Graph()
    with expect(DTypeError, "RandomOffChipStore_2: waddr must carry Tile[uint64](1, 1) addresses"):
        RandomOffChipStore(g, src(g, (1, 4)), src(g, (1, 4), Tile(UINT32, 1, 1)), Tensor("kv", (64, 64)), (16, 16))


def test_random_store_whose_data_tiles_differ_from_the_store_tile_is_a_shape_error():
    g = Graph()
    with expect(ShapeError, "RandomOffChipStore_2: wdata tiles Tile[fp32](16, 16) do not match the store tile (32, 32)"):
        RandomOffChipStore(g, src(g, (1, 4)), src(g, (1, 4), ADDR), Tensor("kv", (64, 64)), (32, 32))


def test_linear_store_of_a_selector_stream_is_a_dtype_error():
    g = Graph()
    with expect(DTypeError, "LinearOffChipStore_1: input must be a tile stream, got Stream<MultiHot(2)>[1, 4]"):
        LinearOffChipStore(g, src(g, (1, 4), Selector(2)))


# =========================================================================================================
# sources and address generators
# =========================================================================================================
def test_selector_source_with_an_out_of_range_index_is_an_argument_error():
    g = Graph()
    with expect(ArgumentError, "SelectorSource_0: selection 0 holds target 5, outside 0..3"):
        SelectorSource(g, [[0, 5], [1, 2]], 4)


def test_selector_source_with_a_negative_index_is_an_argument_error():
    g = Graph()
    with expect(ArgumentError, "SelectorSource_0: selection 1 holds target -1, outside 0..3"):
        SelectorSource(g, [[0, 1], [-1, 2]], 4)


def test_selector_source_with_a_duplicated_index_is_an_argument_error():
    g = Graph()
    with expect(ArgumentError, "SelectorSource_0: selection 0 names a target twice: [2, 2]"):
        SelectorSource(g, [[2, 2], [1, 3]], 4)


def test_selector_source_with_a_non_01_multi_hot_value_is_an_argument_error():
    g = Graph()
    with expect(ArgumentError, "SelectorSource_0: multi-hot selections must be 0/1; found 2"):
        SelectorSource(g, np.array([[0, 2, 0, 0]]), 4)


def test_selector_source_non_01_multi_hot_error_names_the_position_as_plain_ints():
    g = Graph()
    with expect(ArgumentError, "SelectorSource_0: multi-hot selections must be 0/1; found 2 at (0, 1)"):
        SelectorSource(g, np.array([[0, 2, 0, 0]]), 4)


def test_selector_source_multi_hot_of_the_wrong_width_is_a_shape_error():
    g = Graph()
    with expect(ShapeError, "SelectorSource_0: multi-hot selections end in 5 targets, expected 4"):
        SelectorSource(g, np.zeros((3, 5), np.int64), 4)


def test_metadata_source_with_negative_values_is_an_argument_error():
    g = Graph()
    with expect(ArgumentError, "MetadataSource_0: values must be non-negative; element 1 is -1"):
        MetadataSource(g, np.array([3, -1, 2]))


def test_metadata_source_with_float_values_is_a_dtype_error():
    g = Graph()
    with expect(DTypeError, "MetadataSource_0: values must be integers, got dtype float64"):
        MetadataSource(g, np.array([1.5, 2.0]))


def test_metadata_source_with_no_values_is_an_argument_error():
    g = Graph()
    with expect(ArgumentError, "MetadataSource_0: values must be a non-empty array, got shape (0,)"):
        MetadataSource(g, np.array([], dtype=np.int64))


def test_metadata_source_rejects_uint64_values_that_do_not_fit_int64():
    g = Graph()
    with expect(ArgumentError, "MetadataSource_0: values must fit in int64; element 0 is 9223372036854775808"):
        MetadataSource(g, np.array([2**63, 5], dtype=np.uint64))


def test_selector_source_rejects_non_integer_indices():
    g = Graph()
    with expect(DTypeError, "SelectorSource_0: selection 0 must hold integer target indices, got [0.5, 2.7]"):
        SelectorSource(g, [[0.5, 2.7]], 4)


def test_expert_addr_gen_of_a_tile_stream_is_a_dtype_error():
    g = Graph()
    with expect(DTypeError, "ExpertAddrGen_1: sel must be a selector stream, got Stream<Tile[fp32](16, 256)>"):
        ExpertAddrGen(g, base(g), 12)


def test_cache_read_addr_gen_with_index_and_length_of_different_shapes_is_a_shape_error():
    g = Graph()
    idx, lens = MetadataSource(g, np.arange(4)), MetadataSource(g, np.arange(3))
    with expect(ShapeError, "CacheReadAddrGen_2: idx Stream<Tile[uint64](1, 1)>[1, 4] and seq_len "
                            "Stream<Tile[uint64](1, 1)>[1, 3] must have the same shape"):
        CacheReadAddrGen(g, idx, lens, 8)


# =========================================================================================================
# wiring
# =========================================================================================================
def test_input_from_another_graph_is_a_graph_error():
    g, h = Graph("a"), Graph("b")
    x = base(g)
    with expect(GraphError, "Flatten_0: input LinearOffChipLoad_0 belongs to graph 'a', not 'b'"):
        Flatten(h, x, 0, 1)


def test_multi_output_op_used_as_input_without_choosing_an_output_is_an_argument_error():
    g = Graph()
    m = EagerMerge(g, [src(g, (3,)), src(g, (4,))], 0)
    with expect(ArgumentError, "Flatten_3: input EagerMerge_2 has 2 outputs; pass EagerMerge_2[i] to choose one"):
        Flatten(g, m, 0, 0)


def test_multi_output_partition_used_as_input_is_an_argument_error():
    g = Graph()
    p = Partition(g, src(g, (1, 4)), src(g, (1, 4), Selector(2)), 0, 2)
    with expect(ArgumentError, "Sink_3: input Partition_2 has 2 outputs"):
        Sink(g, p)


def test_choosing_an_output_index_that_does_not_exist_is_an_argument_error():
    g = Graph()
    p = Parallelize(g, src(g, (10,)), 0, 2)
    with expect(ArgumentError, "Parallelize_1 has 2 output(s); output 2 does not exist"):
        Sink(g, (p, 2))


def test_an_input_that_is_not_an_operator_is_an_argument_error():
    g = Graph()
    with expect(ArgumentError, "Sink_0: an input must be an operator or an operator output, got str"):
        Sink(g, "x")


def test_an_unconnected_placeholder_makes_finalize_a_graph_error():
    g = Graph("loop")
    p = src(g, (3,))
    Sink(g, p)
    with expect(GraphError, "graph 'loop': placeholder Placeholder_0", "[3]", "was never connected"):
        g.finalize()


def test_connecting_a_placeholder_to_a_mismatched_stream_is_a_graph_error():
    g = Graph()
    p = src(g, (3,))
    x = base(g)
    with expect(GraphError, "Placeholder_0: placeholder expects Stream<Tile[fp32](16, 16)>[3]",
                "LinearOffChipLoad_1 produces Stream<Tile[fp32](16, 256)>[1, 4, 8, 1]"):
        g.connect(p, x)


def test_connecting_a_placeholder_of_another_graph_is_a_graph_error():
    g, h = Graph("a"), Graph("b")
    p = src(g, (3,))
    with expect(GraphError, "connect:", "is not a placeholder of graph 'b'"):
        h.connect(p, src(h, (3,)))


def test_assume_shape_changing_the_rank_is_an_argument_error():
    g = Graph()
    x = base(g)
    with expect(ArgumentError, "LinearOffChipLoad_0: assume_shape cannot change rank", "[1, 4, 8, 1]", "[1, 32]"):
        x.assume_shape(0, (1, 32))


def test_looking_up_an_unknown_operator_is_a_graph_error():
    g = Graph("g1")
    base(g)
    with expect(GraphError, "graph 'g1' has no operator named 'Map_7'"):
        g.op("Map_7")


def test_as_int_of_a_metric_with_unbound_symbols_is_a_metric_error_naming_them():
    X = make_symbol("SelectorSource_1_000")
    with expect(MetricError, "off-chip bytes still depends on ['SelectorSource_1_000']"):
        as_int(32768 * X + 5, "off-chip bytes")
    assert as_int(sp.Integer(7) + X - X) == 7


# =========================================================================================================
# element types and streams: documented contract "every error raised on purpose derives from StepsimError"
# =========================================================================================================
def test_a_stream_with_a_negative_dimension_is_rejected_with_a_typed_error():
    with pytest.raises(GraphError, match=re.escape("-4")):
        Stream(T16, (1, -4))


@pytest.mark.parametrize("make", [
    pytest.param(lambda: Stream(T16, ()), id="Stream-empty-shape"),
    pytest.param(lambda: Tile(FP32, -1, 4), id="Tile-negative-rows"),
    pytest.param(lambda: Selector(0), id="Selector-zero-targets"),
    pytest.param(lambda: CacheWriteAddr(0), id="CacheWriteAddr-zero-row-offset"),
    pytest.param(lambda: Stream(T16, (1, 2.5)), id="Stream-float-dim"),
])
def test_invalid_types_and_streams_raise_a_stepsim_error(make):
    with pytest.raises(StepsimError):
        make()


_X = make_symbol("X")


@pytest.mark.parametrize("shape,fragments", [
    pytest.param((1, -4), ("Stream<Tile[fp32](16, 16)>[1, -4]: entry 1 (rank 0) is -4", ">= 0"), id="negative"),
    pytest.param((1, 2.5), ("[1, 2.5]: entry 1 (rank 0) is invalid", "got float: 2.5"), id="float"),
    pytest.param((1, sp.Rational(5, 2), 3), ("entry 1 (rank 1) is 5/2", "integer-valued"), id="rational"),
    pytest.param((1, -_X - 1), ("entry 1 (rank 0) is -X - 1, negative for every value"), id="negative-symbolic"),
    pytest.param((True, 4), ("entry 0 (rank 1) is invalid: a dimension cannot be a bool"), id="bool"),
    pytest.param((), ("a stream shape needs at least one dimension",), id="empty"),
])
def test_an_invalid_stream_shape_is_an_argument_error_naming_the_entry_and_its_rank(shape, fragments):
    fragments = (fragments,) if isinstance(fragments, str) else fragments
    with expect(ArgumentError, *fragments):
        Stream(T16, shape)


def test_stream_shapes_that_may_be_valid_are_kept():
    assert Stream(T16, [1, 4]) == Stream(T16, (1, 4))  # any sequence, stored as a tuple
    assert Stream(T16, (1, 0)).shape == (1, 0)  # an empty stream (e.g. an expert that got no token)
    assert Stream(T16, (1, _X / 4)).shape == (1, _X / 4)  # an integer for some X: not decidable here
    assert Stream(T16, (1, _X - 5)).shape == (1, _X - 5)


def test_stream_dim_of_a_negative_rank_is_an_argument_error():
    with expect(ArgumentError, "Stream<Tile[fp32](16, 16)>[1, 4]: rank -1 is out of range", "ranks 0..1"):
        Stream(T16, (1, 4)).dim(-1)


def test_stream_dim_of_a_rank_above_the_stream_rank_is_an_argument_error():
    s = Stream(T16, (1, 4, 8, 2))
    assert [s.dim(r) for r in range(4)] == [2, 8, 4, 1]
    with pytest.raises(ArgumentError, match="4"):
        s.dim(4)


def test_tensor_with_a_non_integer_dim_is_an_argument_error():
    with expect(ArgumentError, "tensor 'x'", "64.7"):
        Tensor("x", (64.7, 256))


@pytest.mark.parametrize("dim", [True, "64", float("inf")])
def test_tensor_with_a_non_numeric_dim_is_an_argument_error_naming_it(dim):
    with expect(ArgumentError, "tensor 'x': dim 1 of shape", f"is {dim!r}, not an integer"):
        Tensor("x", (64, dim))


def test_tensor_accepts_integer_valued_floats_and_numpy_ints():
    assert Tensor("x", (64.0, np.int64(256))).shape == (64, 256)
    assert all(type(d) is int for d in Tensor("x", (sp.Float(64.0), 256)).shape)


def test_as_int_of_a_non_integer_value_says_it_is_not_an_integer():
    g = Graph()
    X = make_symbol("X")
    p = Parallelize(g, src(g, (X,)), 0, 4)
    value = p.outputs[0].shape[0].subs(X, 10)
    with pytest.raises(MetricError, match="5/2") as info:
        as_int(value, "tiles")
    assert "depends on []" not in str(info.value)


def test_as_int_of_an_integral_float_returns_the_int():
    assert as_int(sp.Float(3.0)) == 3
