"""A Transpose of the last two dims that is not a MatMul's right operand (issue 44): ``x^T W`` (the left operand),
a swap stored as a graph output, a swap read by an elementwise op. No on-chip operator transposes a tile, so the
memory does: a graph input is read as 1x1 tiles in the swapped order, a computed value is spilled (its edge says
why) and read back so; the elements are packed into row tiles. Values equal onnxruntime's; both engines agree;
the engine's bytes equal the metric and the dims' bytes. A swap read only as a right operand (``q k^T``) is still
a view its MatMul reads transposed."""

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper

from stepsim.cli import main
from stepsim.frontend import from_onnx
from stepsim.frontend.fusion import SWAP_REASON

sys.path.insert(0, str(Path(__file__).parent))
from ort_check import check, model, rand  # noqa: E402
from test_spill import engines_agree  # noqa: E402

N = 16  # W's columns


def xtw(shape, computed: bool, name="xtw"):
    """y = Transpose(x)^T-of-the-last-two-dims @ W, W [S, N]; ``computed``: x goes through a Relu first."""
    *lead, s, d = shape
    nodes, x = [], "x"
    if computed:
        nodes.append(helper.make_node("Relu", ["x"], ["r"], name="pre"))
        x = "r"
    perm = list(range(len(shape) - 2)) + [len(shape) - 1, len(shape) - 2]
    nodes += [helper.make_node("Transpose", [x], ["t"], name="t", perm=perm),
              helper.make_node("MatMul", ["t", "w"], ["y"], name="mm")]
    return model(nodes, {"x": list(shape)}, {"y": [*lead, d, N]}, {"w": rand((s, N), 1, s ** -0.5)}, name=name)


CASES = [  # (shape of x, tile_m)
    ((8, 4), 2),
    ((8, 4), 4),
    ((2, 8, 4), 4),
    ((2, 16, 8), 2),
    ((2, 3, 8, 4), 1),
]


@pytest.mark.parametrize("computed", [False, True], ids=["graph input", "computed"])
@pytest.mark.parametrize("shape, tile_m", CASES)
def test_x_transposed_times_w_equals_onnxruntime(shape, tile_m, computed):
    m = xtw(shape, computed)
    w, r, errors = check(m, {"x": rand(shape, 3)}, shape[-2], tiling={"tile_m": tile_m})
    assert errors["y"] > 0  # a real comparison (fp32 sums in another order), within the tolerance check asserted
    *lead, s, d = shape
    g = int(np.prod(lead, dtype=np.int64))
    x_bytes, y_bytes = g * s * d * 4, g * d * N * 4
    weights = (g * d // tile_m) * s * N * 4  # W read once per row block of x^T
    spill = 2 * x_bytes if computed else 0  # the computed x written and read back once
    fast = engines_agree(w)
    assert (fast.bytes_read, fast.bytes_written) == (x_bytes + weights + spill // 2, y_bytes + spill // 2)
    assert w.metrics()["off_chip_bytes"] == x_bytes + weights + spill + y_bytes
    assert w.frontend.tile_m == tile_m and w.frontend.converters == {}
    edges = [(e.value, e.consumer, e.fused, e.reason) for e in w.frontend.edges]
    if computed:
        assert edges == [("r", "t", False, SWAP_REASON), ("t", "mm", True,
                                                           "fused: the consumer takes the producer's stream")]
    else:
        assert edges == [("t", "mm", True, "fused: the consumer takes the producer's stream")]


def test_a_swap_as_a_graph_output_and_into_an_elementwise_op():
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="pre"),
             helper.make_node("Transpose", ["r"], ["t"], name="t", perm=[0, 2, 1]),
             helper.make_node("Neg", ["t"], ["y"], name="neg")]
    m = model(nodes, {"x": [2, 8, 4]}, {"y": [2, 4, 8], "t": [2, 4, 8]}, name="swap_out")
    w, r, errors = check(m, {"x": rand((2, 8, 4), 2)}, 1, tiling={"tile_m": 2})
    assert errors == {"y": 0.0, "t": 0.0}  # data movement and a negation: exact
    engines_agree(w)


def test_no_fuse_and_a_named_spill_keep_the_swap_exact():
    m = xtw((2, 8, 4), computed=True)
    x = rand((2, 8, 4), 5)
    _, _, errors = check(m, {"x": x}, 8, fuse=False)
    assert errors["y"] < 1e-6
    w, _, _ = check(m, {"x": x}, 8, spill=("r",))
    # the swap's edge spills for the swap whether named or not
    assert [e.reason for e in w.frontend.edges] == [SWAP_REASON, "fused: the consumer takes the producer's stream"]


def test_a_right_operand_swap_is_still_a_view():
    # scores = q @ k^T: k^T is read transposed by the MatMul, no element reads
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], name="kt", perm=[0, 2, 1]),
             helper.make_node("MatMul", ["q", "kt"], ["s"], name="scores")]
    m = model(nodes, {"q": [2, 8, 16], "k": [2, 8, 16]}, {"s": [2, 8, 8]}, name="scores")
    w, _, _ = check(m, {"q": rand((2, 8, 16), 1), "k": rand((2, 8, 16), 2)}, 16)
    assert not [op for op in w.graph if op.kind == "LinearOffChipLoad" and op.tile_rows * op.tile_cols == 1]


def test_tile_m_must_divide_the_swapped_rows():
    from stepsim.base.errors import FrontendError

    with pytest.raises(FrontendError) as err:
        from_onnx(xtw((8, 6), computed=False), tiling={"tile_m": 4})
    assert str(err.value) == "tile_m 4 does not divide the 6 rows of 't'"


def test_stepsim_run_checks_an_xtw_model(tmp_path, capsys):
    import json

    path = tmp_path / "xtw.onnx"
    onnx.save(xtw((2, 8, 4), computed=True), path)
    assert main(["run", str(path), "--functional", "--check", "--json"]) == 0
    row = json.loads(capsys.readouterr().out)
    params = json.loads(row["params"])
    assert row["check_passed"] is True and params["spilled"] == ["r->t"]
    assert params["spill_reasons"] == {"r->t": SWAP_REASON.removeprefix("spilled: ")}


@pytest.mark.parametrize("tile_m", [1, 2, 4])
def test_x_transposed_times_an_activation(tile_m):
    # y = x^T b, both graph inputs: x read once in the swapped order, b packed per group as the right operand
    nodes = [helper.make_node("Transpose", ["x"], ["t"], name="t", perm=[0, 2, 1]),
             helper.make_node("MatMul", ["t", "b"], ["y"], name="mm")]
    m = model(nodes, {"x": [2, 8, 4], "b": [2, 8, N]}, {"y": [2, 4, N]}, name="xtb")
    w, _, errors = check(m, {"x": rand((2, 8, 4), 1), "b": rand((2, 8, N), 2)}, 8, tiling={"tile_m": tile_m})
    fast = engines_agree(w)
    x, b, y = 2 * 8 * 4 * 4, 2 * 8 * N * 4, 2 * 4 * N * 4
    assert (fast.bytes_read, fast.bytes_written) == (x + b, y) and w.metrics()["off_chip_bytes"] == x + b + y


@pytest.mark.parametrize("tile_m", [1, 2, 8])
def test_a_residual_around_the_swap_is_materialized_not_deadlocked(tile_m):
    # y = r^T W + r: r feeds the swap (spilled, read back whole) and the Add, which therefore reads it spilled too
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="pre"),
             helper.make_node("Transpose", ["r"], ["t"], name="t", perm=[0, 2, 1]),
             helper.make_node("MatMul", ["t", "w"], ["m"], name="mm"),
             helper.make_node("Add", ["m", "r"], ["y"], name="res")]
    m = model(nodes, {"x": [2, 8, 8]}, {"y": [2, 8, 8]}, {"w": rand((8, 8), 3)}, name="residual")
    w, _, _ = check(m, {"x": rand((2, 8, 8), 1)}, 9, tiling={"tile_m": tile_m})
    engines_agree(w)
    assert [(e.value, e.consumer, e.fused) for e in w.frontend.edges] == [
        ("r", "t", False), ("t", "mm", True), ("m", "res", True), ("r", "res", False)]


def test_a_transposed_2d_graph_input_as_the_graph_output():
    m = model([helper.make_node("Transpose", ["x"], ["y"], name="t", perm=[1, 0])], {"x": [4, 8]}, {"y": [8, 4]},
              name="transposed_output")
    w, _, errors = check(m, {"x": rand((4, 8), 7)}, 1, tiling={"tile_m": 2})
    assert errors == {"y": 0.0}
    fast = engines_agree(w)
    assert (fast.bytes_read, fast.bytes_written) == (4 * 8 * 4, 4 * 8 * 4)  # x read once, 4 bytes at a time
