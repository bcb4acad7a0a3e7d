"""Functional mode, one compute or memory operator at a time: the values each function produces.

Every program loads tensors, applies one operator and stores the result; the expected tensors are computed
here with NumPy in float32. Elementwise functions, copies and concatenations must be bit-exact; matmul sums
in ascending k in float32 (compared with a float32 loop in the same order, bit-exact); exp / SiLU use
numba's float32 libm (within 2 ulp of NumPy's).
"""

from __future__ import annotations

import numpy as np
import pytest

from stepsim.base.errors import SimulationError
from stepsim.kernels import run
from stepsim.kernels.program import ProgramBuilder, TensorRef
from stepsim.kernels.values import bf16_round_into
from stepsim.workloads.reference import round_to_bf16

RNG = np.random.default_rng(7)


def _mat(rows, cols):
    return RNG.standard_normal((rows, cols)).astype(np.float32)


def _load(b, name, value, tile, view=None, strides=()):
    """Load ``value`` (a matrix) tile by tile in row-major tile order (or ``view`` / ``strides``)."""
    rows, cols = value.shape
    tr, tc = tile
    view = view or ((rows // tr) * (cols // tc),)
    ch = b.add_channel()
    b.offchip_load(out=ch, tile_rows=tr, tile_cols=tc, elem_bytes=4, view_shape=view,
                   tensor=TensorRef(name, rows, cols, tr, tc, strides=strides))
    return ch


def _store(b, inp, rows, cols, tile, name="y"):
    b.offchip_store(inp=inp, tensor=TensorRef(name, rows, cols, *tile))


def _run(b, inputs):
    res = run(b.build(), inputs=inputs)
    assert res.functional.live_at_end == 0
    return res.outputs


def _matmul_f32(a, w):
    """float32 products summed in ascending k, as the engine does."""
    out = np.zeros((a.shape[0], w.shape[1]), np.float32)
    for k in range(a.shape[1]):
        out += np.outer(a[:, k], w[k, :]).astype(np.float32)
    return out


# ------------------------------------------------------------------------------------------------- Map
@pytest.mark.parametrize("transposed", [False, True])
def test_map_matmul(transposed):
    x, w = _mat(8, 16), _mat(16, 8)
    b = ProgramBuilder()
    cx = _load(b, "x", x, (4, 16))
    cw = _load(b, "w", w.T.copy() if transposed else w, (8, 16) if transposed else (16, 8), view=(2,),
               strides=(0,))
    out = b.add_channel()
    b.map(ins=[cx, cw], out=out, fn="matmul", fn_param=int(transposed), compute_bw=64)
    _store(b, out, 8, 8, (4, 8))
    got = _run(b, {"x": x, "w": w.T.copy() if transposed else w})["y"]
    np.testing.assert_array_equal(got, _matmul_f32(x, w))


@pytest.mark.parametrize("fn,op", [("add", np.add), ("sub", np.subtract), ("mul", np.multiply),
                                   ("div", np.divide), ("max", np.maximum)])
@pytest.mark.parametrize("b_shape", [(4, 8), (1, 8), (4, 1)], ids=["same", "row", "col"])
def test_map_elementwise_broadcasts(fn, op, b_shape):
    x = _mat(8, 8)
    y = _mat(2 * b_shape[0], b_shape[1])
    b = ProgramBuilder()
    cx = _load(b, "x", x, (4, 8))
    cy = _load(b, "z", y, b_shape)
    out = b.add_channel()
    b.map(ins=[cx, cy], out=out, fn=fn, compute_bw=64)
    _store(b, out, 8, 8, (4, 8))
    got = _run(b, {"x": x, "z": y})["y"]
    expected = np.concatenate([op(x[:4], y[:b_shape[0]]), op(x[4:], y[b_shape[0]:])]).astype(np.float32)
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("fn", ["silu", "exp"])
def test_map_unary_transcendental(fn):
    x = _mat(8, 8)
    b = ProgramBuilder()
    out = b.add_channel()
    b.map(ins=[_load(b, "x", x, (4, 8))], out=out, fn=fn, compute_bw=64)
    _store(b, out, 8, 8, (4, 8))
    got = _run(b, {"x": x})["y"]
    expected = np.exp(x) if fn == "exp" else x / (np.float32(1) + np.exp(-x))
    np.testing.assert_array_max_ulp(got, expected.astype(np.float32), maxulp=2)


@pytest.mark.parametrize("fn,op", [("rowsum", np.add), ("rowmax", np.maximum)])
def test_map_row_reductions(fn, op):
    x = _mat(8, 8)
    b = ProgramBuilder()
    out = b.add_channel()
    b.map(ins=[_load(b, "x", x, (4, 8))], out=out, fn=fn, compute_bw=64)
    _store(b, out, 8, 1, (4, 1))
    expected = x[:, 0].copy()
    for j in range(1, 8):  # left to right, in float32
        expected = op(expected, x[:, j]).astype(np.float32)
    np.testing.assert_array_equal(_run(b, {"x": x})["y"], expected[:, None])


def test_set_offset_then_row_append_writes_the_row_at_the_offset():
    """The KV append: tile.offset = 2 (a u64), then row_append(tile, new_row) replaces row 2."""
    tile, row = _mat(4, 8), _mat(1, 8)
    b = ProgramBuilder()
    off, with_off, out = b.add_channel(), b.add_channel(), b.add_channel()
    b.metadata_gen(out=off, values=[2])
    b.map(ins=[_load(b, "k", tile, (4, 8)), off], out=with_off, fn="set_offset", compute_bw=0)
    b.map(ins=[with_off, _load(b, "r", row, (1, 8))], out=out, fn="row_append", compute_bw=0)
    _store(b, out, 4, 8, (4, 8))
    expected = tile.copy()
    expected[2] = row[0]
    np.testing.assert_array_equal(_run(b, {"k": tile, "r": row})["y"], expected)


# ----------------------------------------------------------------------------------------- Accum / Scan
def _accum_program(fn, x, tile, init, rank=1, scan=False, store_shape=None):
    b = ProgramBuilder()
    out = b.add_channel()
    n = (x.shape[0] // tile[0]) * (x.shape[1] // tile[1])
    cx = _load(b, "x", x, tile, view=(n // 2, 2) if rank == 1 else (n,))
    kw = dict(inp=cx, out=out, fn=fn, init_rows=init[0], init_cols=init[1], init_elem_bytes=4, rank=rank)
    (b.scan if scan else b.accum)(**kw)
    _store(b, out, *store_shape)
    return _run(b, {"x": x})["y"]


@pytest.mark.parametrize("fn,op", [("add", np.add), ("mul", np.multiply), ("max", np.maximum)])
def test_accum_folds_pairs_of_tiles(fn, op):
    x = _mat(16, 4)  # 4 tiles of 4x4, folded in pairs (rank 1)
    init_value = {"add": 0.0, "mul": 0.0, "max": 0.0}[fn]  # init tiles are zeros
    got = _accum_program(fn, x, (4, 4), (4, 4), store_shape=(8, 4, (4, 4)))
    t = x.reshape(4, 4, 4)
    init = np.full((4, 4), init_value, np.float32)
    expected = np.concatenate([op(op(init, t[0]), t[1]), op(op(init, t[2]), t[3])]).astype(np.float32)
    np.testing.assert_array_equal(got, expected)


def test_accum_retile_row_and_col_concatenate():
    x = _mat(8, 4)  # 4 tiles of 2x4
    rows = _accum_program("retile_row", x, (2, 4), (0, 4), store_shape=(8, 4, (4, 4)))
    np.testing.assert_array_equal(rows, x)  # pairs of 2-row tiles stacked into 4-row tiles
    cols = _accum_program("retile_col", x, (2, 4), (2, 0), store_shape=(4, 8, (2, 8)))
    t = x.reshape(4, 2, 4)
    np.testing.assert_array_equal(cols, np.concatenate([np.hstack([t[0], t[1]]), np.hstack([t[2], t[3]])]))


def test_scan_emits_every_running_sum():
    x = _mat(16, 4)
    got = _accum_program("add", x, (4, 4), (4, 4), scan=True, store_shape=(16, 4, (4, 4)))
    t = x.reshape(4, 4, 4)
    expected = np.concatenate([t[0], t[0] + t[1], t[2], t[2] + t[3]])
    np.testing.assert_array_equal(got, expected)


def test_map_accum_sums_matmuls():
    x, w = _mat(4, 16), _mat(16, 8)
    b = ProgramBuilder()
    out = b.add_channel()
    cx = _load(b, "x", x, (4, 8))  # two K tiles of x
    cw = _load(b, "w", w, (8, 8))  # the matching K tiles of w
    b.map_accum(in1=cx, in2=cw, out=out, fn="matmul", init_rows=4, init_cols=8, init_elem_bytes=4, rank=1)
    _store(b, out, 4, 8, (4, 8))
    got = _run(b, {"x": x, "w": w})["y"]
    expected = (_matmul_f32(x[:, :8], w[:8]) + _matmul_f32(x[:, 8:], w[8:])).astype(np.float32)
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("normalize", [False, True])
def test_map_accum_online_softmax_rescales_when_the_max_grows(normalize):
    """Three KV tiles of 8 scores for 4 query rows; tile 2 raises every row's max (up to 200 / sqrt(16) = 50,
    and one row's scores reach 400, past exp's fp32 range unscaled). State = [acc | l | m]; normalized =
    softmax(S / 4) V, compared with float64."""
    q, n, d, head_dim = 4, 8, 6, 16
    scores = _mat(q, 3 * n)
    scores[:, n:2 * n] += np.float32(200.0)
    scores[0, 2 * n:] += np.float32(400.0)
    values = _mat(3 * n, d)
    b = ProgramBuilder()
    state = b.add_channel()
    cs = _load(b, "s", scores, (q, n))
    cv = _load(b, "v", values, (n, d))
    b.map_accum(in1=cs, in2=cv, out=state, fn="online_softmax", fn_param=head_dim, init_rows=q, init_cols=d + 2,
                init_elem_bytes=4, rank=1)
    x = scores.astype(np.float64) * 0.25
    p = np.exp(x - x.max(axis=1, keepdims=True))
    if normalize:
        out = b.add_channel()
        b.map(ins=[state], out=out, fn="softmax_normalize")
        _store(b, out, q, d, (q, d))
        got = _run(b, {"s": scores, "v": values})["y"]
        np.testing.assert_allclose(got, (p @ values) / p.sum(axis=1, keepdims=True), rtol=2e-6, atol=2e-6)
        return
    _store(b, state, q, d + 2, (q, d + 2))
    got = _run(b, {"s": scores, "v": values})["y"]
    assert np.isfinite(got).all()
    np.testing.assert_array_equal(got[:, d + 1], (scores * np.float32(0.25)).max(axis=1))  # m: exact in fp32
    np.testing.assert_allclose(got[:, d], p.sum(axis=1), rtol=2e-6)  # l, relative to the final max
    np.testing.assert_allclose(got[:, :d], p @ values, rtol=2e-6, atol=2e-6)


# ------------------------------------------------------------------------------------------------ memory
def test_strided_and_broadcast_loads_read_the_right_tiles():
    x = _mat(8, 8)  # 2x2 tiles of 4x4: t0 t1 / t2 t3
    b = ProgramBuilder()
    # view (2, 2) with strides (1, 2): t0, t2, t1, t3 (column-major tile order)
    _store(b, _load(b, "x", x, (4, 4), view=(2, 2), strides=(1, 2)), 16, 4, (4, 4))
    got = _run(b, {"x": x})["y"]
    t = [x[:4, :4], x[:4, 4:], x[4:, :4], x[4:, 4:]]
    np.testing.assert_array_equal(got, np.concatenate([t[0], t[2], t[1], t[3]]))


def test_random_load_and_store_follow_the_addresses_and_round_bf16():
    src = _mat(8, 4)  # 4 tiles of 2x4
    b = ProgramBuilder()
    addr, data, waddr, ack = b.add_channel(), b.add_channel(), b.add_channel(), b.add_channel()
    b.metadata_gen(out=addr, values=[3, 0, 2], shape=(3,))
    b.random_offchip_load(raddr=addr, out=data, tile_rows=2, tile_cols=4, elem_bytes=4,
                          tensor=TensorRef("src", 8, 4, 2, 4))
    b.metadata_gen(out=waddr, values=[1, 2, 0], shape=(3,))
    b.random_offchip_store(waddr=waddr, wdata=data, ack=ack, tile_rows=2, tile_cols=4, elem_bytes=2,
                           tensor=TensorRef("dst", 6, 4, 2, 4, bf16=True))
    b.sink(inp=ack)
    got = _run(b, {"src": src})["dst"]
    t = src.reshape(4, 2, 4)
    # loads read src tiles 3, 0, 2; they are written to dst tiles 1, 2, 0
    expected = np.concatenate([t[2], t[3], t[0]])
    np.testing.assert_array_equal(got, round_to_bf16(expected))


def test_random_address_outside_the_tensor_is_a_clear_error():
    b = ProgramBuilder()
    addr, data = b.add_channel(), b.add_channel()
    b.metadata_gen(out=addr, values=[4], shape=(1,))
    b.random_offchip_load(raddr=addr, out=data, tile_rows=2, tile_cols=4, elem_bytes=4,
                          tensor=TensorRef("src", 8, 4, 2, 4), name="gather")
    b.sink(inp=data)
    with pytest.raises(SimulationError, match=r"gather \(RandomOffChipLoad\): tile address 4 is outside tensor "
                                              r"'src' \(4 tiles of 2x4\)"):
        run(b.build(), inputs={"src": _mat(8, 4)})


def test_bf16_round_matches_the_reference_rounding():
    bits = np.concatenate([
        RNG.integers(0, 2 ** 32, 20000, dtype=np.uint64).astype(np.uint32),
        np.array([0x3F808000, 0x3F818000, 0x7F7F8000, 0x7F7FFFFF, 0x00008000, 0x00018000, 0x007FFFFF,
                  0x80000001, 0x7F800000, 0xFF800000, 0x00000000, 0x80000000], np.uint32)])
    values = bits.view(np.float32)  # NaN patterns included: their rounded bits must match too
    got = np.empty_like(values)
    bf16_round_into(values, got)
    np.testing.assert_array_equal(got.view(np.uint32), round_to_bf16(values).view(np.uint32))
    in_place = values.copy()
    bf16_round_into(in_place, in_place)
    np.testing.assert_array_equal(in_place.view(np.uint32), got.view(np.uint32))
