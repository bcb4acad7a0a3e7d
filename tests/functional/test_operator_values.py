"""Functional mode, one shape or routing operator at a time: whole stored tensors, exact equality.

Each test loads tensors whose tiles hold distinct integers (exact in float32), runs one operator (with the
plumbing it needs) and stores every output stream; the expected tensors are written out tile by tile. Every run
also checks that functional mode's timing equals timing mode's and the reference engine's, that no tile is
leaked (``live_at_end == 0``), and, where it says so, the tile identities the reference engine records.
"""

from __future__ import annotations

import numpy as np
import pytest

from stepsim.base.errors import LoweringError
from stepsim.base.hardware import Hardware
from stepsim.kernels import run
from stepsim.kernels.program import ProgramBuilder, TensorRef
from stepsim.kernels.reference import run as ref_run


# ------------------------------------------------------------------------------------------------ helpers
def builder() -> ProgramBuilder:
    return ProgramBuilder(Hardware.preset("step-eval"))


def tensor(name: str, n_tiles: int, rows: int, cols: int, grid: int = 1, strides: tuple = ()) -> TensorRef:
    """``n_tiles`` tiles of ``rows x cols``, ``grid`` tiles per tensor row."""
    return TensorRef(name, rows * -(-n_tiles // grid), cols * grid, rows, cols, strides=strides)


def tile(a: np.ndarray, t: TensorRef, k: int) -> np.ndarray:
    """Tile k of tensor t's matrix a (row-major tile grid)."""
    grid = t.cols // t.tile_cols
    r, c = (k // grid) * t.tile_rows, (k % grid) * t.tile_cols
    return a[r:r + t.tile_rows, c:c + t.tile_cols]


def filled(t: TensorRef, base: int = 0) -> tuple[np.ndarray, list[np.ndarray]]:
    """Tensor t's matrix with tile k holding ``base + 100 * (k + 1) + position``, and its tiles."""
    a = np.zeros((t.rows, t.cols), np.float32)
    for k in range(t.n_tiles):
        tile(a, t, k)[:] = (base + 100 * (k + 1) + np.arange(t.tile_rows * t.tile_cols)).reshape(t.tile_rows,
                                                                                                  t.tile_cols)
    return a, [tile(a, t, k).copy() for k in range(t.n_tiles)]


def assembled(t: TensorRef, tiles: list) -> np.ndarray:
    """Tensor t's matrix with tile k = ``tiles[k]`` (None: zeros); tiles past the list stay zero."""
    a = np.zeros((t.rows, t.cols), np.float32)
    for k, v in enumerate(tiles):
        if v is not None:
            tile(a, t, k)[:] = v
    return a


def run_checked(program, inputs: dict, expected: dict):
    """Functional run; timing identical to timing mode and the reference engine; no leak; exact outputs.

    Returns the reference result (for identity checks).
    """
    functional = run(program, inputs=inputs)
    timing = run(program)
    ref = ref_run(program)
    for other in (timing, functional):
        assert other.cycles == ref.cycles
        np.testing.assert_array_equal(other.unit_counters, ref.unit_counters)
        np.testing.assert_array_equal(other.channel_counters, ref.channel_counters)
        assert (other.bytes_read, other.bytes_written) == (ref.off_chip_bytes_read, ref.off_chip_bytes_written)
    assert functional.functional.live_at_end == 0
    assert set(functional.outputs) == set(expected)
    for name, want in expected.items():
        np.testing.assert_array_equal(functional.outputs[name], want, err_msg=f"tensor {name!r}")
    return ref


def idents(ref, unit: int) -> list:
    """Identities of the tiles a store received, in order (reference engine)."""
    return [tok.ident for tok in ref.stored[unit]]


# ------------------------------------------------------------------------------------------------ routing
def test_broadcast_gives_every_output_the_same_tiles():
    b = builder()
    x, *outs = (b.add_channel() for _ in range(4))
    t_in = tensor("x", 3, 2, 4, grid=3)
    a, T = filled(t_in)
    load = b.offchip_load(out=x, tile_rows=2, tile_cols=4, elem_bytes=2, view_shape=(3,), tensor=t_in)
    b.broadcast(inp=x, outs=outs)
    t_out = [tensor(f"y{k}", 3, 2, 4) for k in range(3)]
    stores = [b.offchip_store(inp=o, tensor=t) for o, t in zip(outs, t_out)]
    ref = run_checked(b.build(), {"x": a}, {t.name: np.vstack(T) for t in t_out})
    for s in stores:
        assert idents(ref, s) == [(load, 0), (load, 1), (load, 2)]


def test_partition_with_a_multi_target_selector_copies_and_drops_groups():
    """Rank-1 groups g0..g2 of a (3, 2) view; selectors [1], [], [0, 1]: g1 is dropped, g2 goes to both."""
    b = builder()
    x, sel, o0, o1 = (b.add_channel() for _ in range(4))
    t_in = tensor("x", 6, 1, 8, grid=2)
    a, T = filled(t_in)
    load = b.offchip_load(out=x, tile_rows=1, tile_cols=8, elem_bytes=2, view_shape=(3, 2), tensor=t_in)
    b.select_gen(out=sel, targets_ptr=[0, 1, 1, 3], targets_idx=[1, 0, 1], n_targets=2)
    b.partition(data=x, sel=sel, outs=[o0, o1], rank=1, switch_cycles=[1, 2])
    t0, t1 = tensor("y0", 2, 1, 8), tensor("y1", 4, 1, 8, grid=2)
    s0, s1 = b.offchip_store(inp=o0, tensor=t0), b.offchip_store(inp=o1, tensor=t1)
    ref = run_checked(b.build(), {"x": a}, {"y0": np.vstack([T[4], T[5]]),
                                             "y1": assembled(t1, [T[0], T[1], T[4], T[5]])})
    assert idents(ref, s0) == [(load, 4), (load, 5)]
    assert idents(ref, s1) == [(load, 0), (load, 1), (load, 4), (load, 5)]


def test_partition_at_rank_0_routes_single_tiles():
    b = builder()
    x, sel, o0, o1, o2 = (b.add_channel() for _ in range(5))
    t_in = tensor("x", 4, 2, 4)
    a, T = filled(t_in)
    b.offchip_load(out=x, tile_rows=2, tile_cols=4, elem_bytes=2, view_shape=(4,), tensor=t_in)
    b.select_gen(out=sel, targets_ptr=[0, 1, 3, 6, 7], targets_idx=[0, 2, 0, 0, 1, 2, 2], n_targets=3)
    b.partition(data=x, sel=sel, outs=[o0, o1, o2], rank=0)
    outs = {"y0": [T[0], T[1], T[2]], "y1": [T[2]], "y2": [T[1], T[2], T[3]]}
    for o, name in zip((o0, o1, o2), outs):
        b.offchip_store(inp=o, tensor=tensor(name, len(outs[name]), 2, 4))
    run_checked(b.build(), {"x": a}, {name: np.vstack(v) for name, v in outs.items()})


@pytest.mark.parametrize("slow", ["a", "b"])
def test_reassemble_drains_the_selected_inputs_by_head_stamp(slow):
    """Selectors [0], [1], [0, 1] over rank-1 groups; for the last one both heads wait and the input whose head
    arrived first is drained first (a 60-cycle channel latency makes one input clearly later)."""
    b = builder()
    xa = b.add_channel(latency=60 if slow == "a" else 1)
    xb = b.add_channel(latency=60 if slow == "b" else 1)
    sel, out = b.add_channel(), b.add_channel()
    ta, tb = tensor("a", 4, 2, 8, grid=2), tensor("b", 4, 2, 8)
    a, A = filled(ta)
    bb, B = filled(tb, base=1000)
    b.offchip_load(out=xa, tile_rows=2, tile_cols=8, elem_bytes=2, view_shape=(2, 2), tensor=ta)
    b.offchip_load(out=xb, tile_rows=2, tile_cols=8, elem_bytes=2, view_shape=(2, 2), tensor=tb)
    b.select_gen(out=sel, targets_ptr=[0, 1, 2, 4], targets_idx=[0, 1, 0, 1], n_targets=2)
    b.reassemble(ins=[xa, xb], sel=sel, out=out, rank=1)
    t_out = tensor("y", 8, 2, 8, grid=3)
    b.offchip_store(inp=out, tensor=t_out)
    last = [B[2], B[3], A[2], A[3]] if slow == "a" else [A[2], A[3], B[2], B[3]]
    run_checked(b.build(), {"a": a, "b": bb}, {"y": assembled(t_out, [A[0], A[1], B[0], B[1]] + last)})


def test_partition_then_reassemble_restores_the_stream():
    b = builder()
    x, sel, sp, sr, o0, o1, out = (b.add_channel() for _ in range(7))
    t_in = tensor("x", 6, 1, 4)
    a, T = filled(t_in)
    b.offchip_load(out=x, tile_rows=1, tile_cols=4, elem_bytes=2, view_shape=(3, 2), tensor=t_in)
    b.select_gen(out=sel, targets_ptr=[0, 1, 2, 3], targets_idx=[1, 0, 1], n_targets=2)
    b.broadcast(inp=sel, outs=[sp, sr])
    b.partition(data=x, sel=sp, outs=[o0, o1], rank=1)
    b.reassemble(ins=[o0, o1], sel=sr, out=out, rank=1)
    b.offchip_store(inp=out, tensor=tensor("y", 6, 1, 4))
    run_checked(b.build(), {"x": a}, {"y": np.vstack(T)})


@pytest.mark.parametrize("slow", ["a", "b"])
def test_eager_merge_forwards_whole_groups_in_arrival_order(slow):
    b = builder()
    xa = b.add_channel(latency=100 if slow == "a" else 1)
    xb = b.add_channel(latency=100 if slow == "b" else 1)
    out, sel = b.add_channel(), b.add_channel()
    ta, tb = tensor("a", 2, 1, 4), tensor("b", 2, 1, 4)
    a, A = filled(ta)
    bb, B = filled(tb, base=1000)
    b.offchip_load(out=xa, tile_rows=1, tile_cols=4, elem_bytes=2, view_shape=(2,), tensor=ta)
    b.offchip_load(out=xb, tile_rows=1, tile_cols=4, elem_bytes=2, view_shape=(2,), tensor=tb)
    b.eager_merge(ins=[xa, xb], data_out=out, sel_out=sel, rank=1)
    b.sink(inp=sel)
    b.offchip_store(inp=out, tensor=tensor("y", 4, 1, 4))
    order = B + A if slow == "a" else A + B
    run_checked(b.build(), {"a": a, "b": bb}, {"y": np.vstack(order)})


def test_parallelize_deals_groups_round_robin():
    b = builder()
    addr, x, l0, l1 = (b.add_channel() for _ in range(4))
    t_in = tensor("x", 8, 2, 4, grid=4)
    a, T = filled(t_in)
    b.metadata_gen(out=addr, values=range(8), shape=(4, 2))  # four rank-1 groups of two addresses
    b.random_offchip_load(raddr=addr, out=x, tile_rows=2, tile_cols=4, elem_bytes=2, tensor=t_in)
    b.parallelize(inp=x, outs=[l0, l1], rank=1, switch_cycles=[0, 3])
    t1 = tensor("y1", 4, 2, 4, grid=2)
    b.offchip_store(inp=l0, tensor=tensor("y0", 4, 2, 4))
    b.offchip_store(inp=l1, tensor=t1)
    run_checked(b.build(), {"x": a}, {"y0": np.vstack([T[0], T[1], T[4], T[5]]),
                                      "y1": assembled(t1, [T[2], T[3], T[6], T[7]])})


# ------------------------------------------------------------------------------------------------ shape
def test_flatten_keeps_the_order_of_a_strided_view():
    """A (2, 3) view with tile strides (1, 2) reads a 3 x 2 tile grid column by column: tiles 0 2 4 1 3 5."""
    b = builder()
    x, y = b.add_channel(), b.add_channel()
    t_in = tensor("x", 6, 2, 4, grid=2, strides=(1, 2))
    a, T = filled(t_in)
    load = b.offchip_load(out=x, tile_rows=2, tile_cols=4, elem_bytes=2, view_shape=(2, 3), tensor=t_in)
    b.flatten(inp=x, out=y, min_rank=0, max_rank=1)
    s = b.offchip_store(inp=y, tensor=tensor("y", 6, 2, 4))
    ref = run_checked(b.build(), {"x": a}, {"y": np.vstack([T[0], T[2], T[4], T[1], T[3], T[5]])})
    assert idents(ref, s) == [(load, k) for k in (0, 2, 4, 1, 3, 5)]


def test_promote_inner_and_outer_keep_the_tiles():
    b = builder()
    x, p, q = (b.add_channel() for _ in range(3))
    t_in = tensor("x", 4, 1, 8)
    a, T = filled(t_in)
    b.offchip_load(out=x, tile_rows=1, tile_cols=8, elem_bytes=2, view_shape=(2, 2), tensor=t_in)
    b.promote(inp=x, out=p, rank=0)
    b.promote(inp=p, out=q, rank=4, input_rank=3)
    b.offchip_store(inp=q, tensor=tensor("y", 4, 1, 8, grid=4))
    run_checked(b.build(), {"x": a}, {"y": np.hstack(T)})


def test_reshape_pads_each_partial_chunk_with_a_zero_tile():
    """(2, 3) -> chunks of 2: [T0 T1] [T2 pad] [T3 T4] [T5 pad]."""
    b = builder()
    x, y = b.add_channel(), b.add_channel()
    t_in = tensor("x", 6, 2, 4)
    a, T = filled(t_in)
    load = b.offchip_load(out=x, tile_rows=2, tile_cols=4, elem_bytes=2, view_shape=(2, 3), tensor=t_in)
    b.reshape(inp=x, out=y, chunk=2, rank=0, pad_rows=2, pad_cols=4, pad_elem_bytes=2)
    t_out = tensor("y", 8, 2, 4, grid=2)
    s = b.offchip_store(inp=y, tensor=t_out)
    ref = run_checked(b.build(), {"x": a}, {"y": assembled(t_out, [T[0], T[1], T[2], None, T[3], T[4], T[5],
                                                                      None])})
    assert idents(ref, s) == [(load, 0), (load, 1), (load, 2), None, (load, 3), (load, 4), (load, 5), None]


def test_reshape_with_an_outer_dim_pads_at_the_close_of_a_random_load():
    """Random addresses 3, 0, 2 (a rank-0 stream) in chunks of 2 with add_outer_dim: T3 T0 T2 pad."""
    b = builder()
    addr, x, y = (b.add_channel() for _ in range(3))
    t_in = tensor("x", 4, 2, 4, grid=2)
    a, T = filled(t_in)
    b.metadata_gen(out=addr, values=[3, 0, 2], shape=(3,))
    load = b.random_offchip_load(raddr=addr, out=x, tile_rows=2, tile_cols=4, elem_bytes=2, tensor=t_in)
    b.reshape(inp=x, out=y, chunk=2, rank=0, pad_rows=2, pad_cols=4, pad_elem_bytes=2, add_outer_dim=True,
              write_back_mu=True)
    t_out = tensor("y", 4, 2, 4, grid=4)
    s = b.offchip_store(inp=y, tensor=t_out)
    ref = run_checked(b.build(), {"x": a}, {"y": np.hstack([T[3], T[0], T[2], np.zeros((2, 4), np.float32)])})
    assert idents(ref, s) == [(load, 3), (load, 0), (load, 2), None]


def test_reshape_padding_flags_mark_each_pad_and_carry_its_stop():
    """(2, 3) -> chunks of 2 with the flag output read: the flags, used as tile addresses into a two-tile table
    (tile 0 = "real", tile 1 = "pad"), fetch real real real pad real real real pad."""
    b = builder()
    x, y, flags, marks = (b.add_channel() for _ in range(4))
    t_in = tensor("x", 6, 2, 4)
    a, T = filled(t_in)
    b.offchip_load(out=x, tile_rows=2, tile_cols=4, elem_bytes=2, view_shape=(2, 3), tensor=t_in)
    b.reshape(inp=x, out=y, chunk=2, rank=0, pad_rows=2, pad_cols=4, pad_elem_bytes=2, flags_out=flags)
    t_table = tensor("table", 2, 2, 4)
    table, (real, pad) = filled(t_table, base=1000)
    b.random_offchip_load(raddr=flags, out=marks, tile_rows=2, tile_cols=4, elem_bytes=2, tensor=t_table)
    t_y, t_marks = tensor("y", 8, 2, 4, grid=2), tensor("marks", 8, 2, 4)
    b.offchip_store(inp=y, tensor=t_y)
    b.offchip_store(inp=marks, tensor=t_marks)
    program = b.build()
    run_checked(program, {"x": a, "table": table},
                {"y": assembled(t_y, [T[0], T[1], T[2], None, T[3], T[4], T[5], None]),
                 "marks": np.vstack([real, real, real, pad, real, real, real, pad])})
    sent = ref_run(program, record_tokens=True).tokens[flags]
    # stops: a completed chunk closes rank 1; the pad after a row's odd last tile closes the row (2) / tensor (3)
    assert [(tok.kind, tok.stop, tok.value, tok.nbytes) for tok in sent] == [
        ("scalar", 0, 0, 1), ("scalar", 1, 0, 1), ("scalar", 0, 0, 1), ("scalar", 2, 1, 1),
        ("scalar", 0, 0, 1), ("scalar", 1, 0, 1), ("scalar", 0, 0, 1), ("scalar", 3, 1, 1)]


@pytest.mark.parametrize("ref_kind", ["metadata", "tiles"])
def test_expand_ref_repeats_each_tile_once_per_reference_element(ref_kind):
    """Tiles as the reference stream are consumed and released (no leak)."""
    b = builder()
    x, r, y = (b.add_channel() for _ in range(3))
    t_in = tensor("x", 3, 2, 4)
    a, T = filled(t_in)
    inputs = {"x": a}
    b.offchip_load(out=x, tile_rows=2, tile_cols=4, elem_bytes=2, view_shape=(3,), tensor=t_in)
    if ref_kind == "metadata":
        b.metadata_gen(out=r, values=[0] * 6, shape=(3, 2))
    else:
        t_ref = tensor("r", 6, 1, 4)
        inputs["r"] = filled(t_ref, base=1000)[0]
        b.offchip_load(out=r, tile_rows=1, tile_cols=4, elem_bytes=2, view_shape=(3, 2), tensor=t_ref)
    b.expand_ref(inp=x, ref=r, out=y, rank=1)
    b.offchip_store(inp=y, tensor=tensor("y", 6, 2, 4))
    run_checked(b.build(), inputs, {"y": np.vstack([T[0], T[0], T[1], T[1], T[2], T[2]])})


def test_repeat_static_emits_each_tile_count_times():
    b = builder()
    x, y = b.add_channel(), b.add_channel(capacity=1)
    t_in = tensor("x", 2, 1, 8)
    a, T = filled(t_in)
    b.offchip_load(out=x, tile_rows=1, tile_cols=8, elem_bytes=2, view_shape=(2,), tensor=t_in)
    b.repeat_static(inp=x, out=y, count=3)
    b.offchip_store(inp=y, tensor=tensor("y", 6, 1, 8))
    run_checked(b.build(), {"x": a}, {"y": np.vstack([T[0]] * 3 + [T[1]] * 3)})


@pytest.mark.parametrize("new_dim", [False, True])
def test_row_streamify_splits_tiles_into_their_rows(new_dim):
    b = builder()
    x, y = b.add_channel(), b.add_channel()
    t_in = tensor("x", 2, 4, 4, grid=2)
    a, T = filled(t_in)
    load = b.offchip_load(out=x, tile_rows=4, tile_cols=4, elem_bytes=2, view_shape=(2,), tensor=t_in)
    b.row_streamify(inp=x, out=y, split_rows=True, new_dim=new_dim)
    t_out = tensor("y", 8, 1, 4, grid=3)
    s = b.offchip_store(inp=y, tensor=t_out)
    ref = run_checked(b.build(), {"x": a}, {"y": assembled(t_out, [T[k][i:i + 1] for k in range(2)
                                                                      for i in range(4)])})
    assert idents(ref, s) == [((load, k), "row", i) for k in range(2) for i in range(4)]


def test_row_streamify_splits_tiles_into_their_columns():
    b = builder()
    x, y = b.add_channel(), b.add_channel()
    t_in = tensor("x", 2, 2, 4)
    a, T = filled(t_in)
    b.offchip_load(out=x, tile_rows=2, tile_cols=4, elem_bytes=2, view_shape=(2,), tensor=t_in)
    b.row_streamify(inp=x, out=y, split_rows=False)
    t_out = tensor("y", 8, 2, 1, grid=3)
    b.offchip_store(inp=y, tensor=t_out)
    run_checked(b.build(), {"x": a}, {"y": assembled(t_out, [T[k][:, j:j + 1] for k in range(2)
                                                             for j in range(4)])})


@pytest.mark.parametrize("split_rows", [True, False])
@pytest.mark.parametrize("filt", [False, True])
def test_row_streamify_of_padded_chunks_drops_pad_pieces_only_when_filtering(split_rows, filt):
    """(3,) -> Reshape chunks of 2 -> [T0 T1] [T2 pad] -> rows (or columns); the pad's pieces are zeros, or
    vanish with filter_padding."""
    b = builder()
    x, r, y = (b.add_channel() for _ in range(3))
    t_in = tensor("x", 3, 2, 4)
    a, T = filled(t_in)
    b.offchip_load(out=x, tile_rows=2, tile_cols=4, elem_bytes=2, view_shape=(3,), tensor=t_in)
    b.reshape(inp=x, out=r, chunk=2, rank=0, pad_rows=2, pad_cols=4, pad_elem_bytes=2)
    b.row_streamify(inp=r, out=y, split_rows=split_rows, filter_padding=filt)
    if split_rows:
        pieces = [T[k][i:i + 1] for k in range(3) for i in range(2)] + ([] if filt else [None, None])
        t_out = tensor("y", 8, 1, 4)
    else:
        pieces = [T[k][:, j:j + 1] for k in range(3) for j in range(4)] + ([] if filt else [None] * 4)
        t_out = tensor("y", 16, 2, 1, grid=4)
    b.offchip_store(inp=y, tensor=t_out)
    run_checked(b.build(), {"x": a}, {"y": assembled(t_out, pieces)})


@pytest.mark.parametrize("rank,repeats,order", [
    (1, (2,), [0, 1, 0, 1, 2, 3, 2, 3]),
    (2, (3,), [0, 1, 2, 3] * 3),
    (1, (2, 2), [0, 1] * 4 + [2, 3] * 4),
    (1, (), [0, 1, 2, 3]),
])
def test_bufferize_then_streamify_replays_each_buffer(rank, repeats, order):
    b = builder()
    x, buf, y = (b.add_channel() for _ in range(3))
    t_in = tensor("x", 4, 2, 4, grid=2)
    a, T = filled(t_in)
    b.offchip_load(out=x, tile_rows=2, tile_cols=4, elem_bytes=2, view_shape=(2, 2), tensor=t_in)
    b.bufferize(inp=x, out=buf, rank=rank, max_buffer_elems=2)  # small region: the engine grows it
    b.streamify(inp=buf, out=y, rank=rank, repeat_factors=repeats)
    b.offchip_store(inp=y, tensor=tensor("y", len(order), 2, 4))
    run_checked(b.build(), {"x": a}, {"y": np.vstack([T[k] for k in order])})


@pytest.mark.parametrize("ref_kind", ["metadata", "tiles"])
def test_dyn_streamify_replays_each_buffer_once_per_reference_element(ref_kind):
    """Buffers [T0 T1] and [T2 T3]; the reference (2, 3) replays each three times."""
    b = builder()
    x, buf, r, y = (b.add_channel() for _ in range(4))
    t_in = tensor("x", 4, 1, 4)
    a, T = filled(t_in)
    inputs = {"x": a}
    b.offchip_load(out=x, tile_rows=1, tile_cols=4, elem_bytes=2, view_shape=(2, 2), tensor=t_in)
    b.bufferize(inp=x, out=buf, rank=1)
    if ref_kind == "metadata":
        b.metadata_gen(out=r, values=[0] * 6, shape=(2, 3))
    else:
        t_ref = tensor("r", 6, 1, 4)
        inputs["r"] = filled(t_ref, base=1000)[0]
        b.offchip_load(out=r, tile_rows=1, tile_cols=4, elem_bytes=2, view_shape=(2, 3), tensor=t_ref)
    b.dyn_streamify(inp=buf, ref=r, out=y, repeat_rank=0, bufferized_rank=1)
    t_out = tensor("y", 12, 1, 4, grid=2)
    b.offchip_store(inp=y, tensor=t_out)
    run_checked(b.build(), inputs, {"y": assembled(t_out, [T[0], T[1]] * 3 + [T[2], T[3]] * 3)})


def test_dyn_offchip_load_reads_its_strided_view_once_per_reference_element():
    b = builder()
    r, x = b.add_channel(), b.add_channel()
    t_in = tensor("x", 4, 2, 4, grid=2, strides=(1, 2))
    a, T = filled(t_in)
    b.metadata_gen(out=r, values=[0, 0], shape=(2,))
    b.dyn_offchip_load(ref=r, out=x, tile_rows=2, tile_cols=4, elem_bytes=2, view_shape=(2, 2), tensor=t_in)
    b.offchip_store(inp=x, tensor=tensor("y", 8, 2, 4))
    run_checked(b.build(), {"x": a}, {"y": np.vstack([T[k] for k in (0, 2, 1, 3) * 2])})


# ------------------------------------------------------------------------------------------------ limits
def test_a_load_with_more_view_dims_than_the_stride_table_is_rejected_when_built():
    """Functional mode keeps one stride per view dim in a table of values.N_STRIDES = 8 slots."""
    b = builder()
    x = b.add_channel()
    with pytest.raises(LoweringError, match=r"supports views of at most 8 dims, got 9"):
        b.offchip_load(out=x, tile_rows=1, tile_cols=4, elem_bytes=2, view_shape=(1, 1, 1, 1, 1, 1, 1, 2, 2),
                       tensor=tensor("x", 4, 1, 4))
