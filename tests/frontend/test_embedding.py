"""An embedding Gather on token ids given at lowering (issue 33): one random read of a table row per id, packed
into row tiles by a retile holding exactly the minimum buffer; values equal onnxruntime's."""

import sys
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper

from stepsim.base.errors import FrontendError
from stepsim.frontend import from_onnx
from stepsim.frontend.check import check_outputs
from stepsim.graph.layout import Layout, converter_buffer
from stepsim.simulation.simulate import simulate

sys.path.insert(0, str(Path(__file__).parent))
from ort_check import model, ort_run, rand  # noqa: E402

B, S, V, D = 2, 4, 10, 16


def embed_model():
    """``y = LayerNorm(table[ids] + x)``: ids [B, S] int64, x [B, S, D]."""
    nodes = [helper.make_node("Gather", ["table", "ids"], ["e"], name="embed", axis=0),
             helper.make_node("Add", ["e", "x"], ["h"], name="add"),
             helper.make_node("LayerNormalization", ["h", "g", "b"], ["y"], name="ln", axis=-1)]
    m = model(nodes, {"ids": [B, S], "x": [B, S, D]}, {"y": [B, S, D]},
              {"table": rand((V, D), 1), "g": rand((D,), 2), "b": rand((D,), 3)}, name="embed")
    m.graph.input[0].type.tensor_type.elem_type = TensorProto.INT64
    return m


IDS = np.array([[3, 1, 4, 1], [5, 9, 2, 6]], np.int64)


@pytest.mark.parametrize("tile_m", [1, 2, 4])
def test_embedding_values_bytes_and_retile(tile_m):
    w = from_onnx(embed_model(), values={"ids": IDS}, tiling={"tile_m": tile_m})
    x = rand((B, S, D), 4)
    r = simulate(w, functional=True, inputs={"x": x})
    want = ort_run(embed_model(), {"ids": IDS, "x": x})["y"]
    (c,) = check_outputs(w, r.inputs, r.outputs).values()
    print(f"embed tile_m {tile_m}: max rel error {c.error:.2e} (tolerance {c.tolerance:.2e})")
    assert c.passed and np.allclose(r.outputs["y"], want, rtol=0, atol=c.tolerance * np.abs(want).max())
    # one table row per id, x, the norm's two vectors, y
    assert w.metrics()["off_chip_bytes"] == 4 * (IDS.size * D + B * S * D + 2 * D + B * S * D)
    rows = B * S
    need = converter_buffer(Layout.ordered((rows, D), (1, D)), Layout.ordered((rows, D), (tile_m, D))).bytes
    if tile_m == 1:  # the reads are row tiles already: no packing
        assert need == 0 and "e" not in w.frontend.converter_ops
    else:
        assert w.frontend.converter_ops["e"].on_chip_bytes() == need == tile_m * D * 4


def test_bad_values():
    with pytest.raises(FrontendError) as err:
        from_onnx(embed_model(), values={"ids": IDS[:, :2]})
    assert str(err.value) == "values: 'ids' must be integers of shape [2, 4], got int64 [2, 2]"
    with pytest.raises(FrontendError) as err:
        from_onnx(embed_model(), values={"ids": IDS, "x": IDS})
    assert str(err.value) == "values: 'x' is not an integer graph input of model 'embed' (those: ['ids'])"
    with pytest.raises(FrontendError) as err:
        from_onnx(embed_model(), values={"ids": IDS + 5})
    assert str(err.value) == "node 'embed' (Gather): token id 14 is outside the table's 10 rows"
