"""The sharding pass (stepsim/workloads/sharding.py): a layer that has no parallel builder of its own runs
tensor-parallel in pipeline stages through the pass alone (values, the stores' chips, bytes over every link by
formula, cycles pinned); its helpers' selectors and labels; the per-combination builders it replaced are gone."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from stepsim.graph import BF16, FP32, Flatten, Graph, LinearOffChipLoad, Tensor
from stepsim.simulation.simulate import simulate
from stepsim.workloads.chips import chips_system
from stepsim.workloads.sharding import Sharding, chunk_selector, relabel, tp_layers

B, D = 8, 16


def _rows(g, name):
    """Tensor ``name`` ([B, D], bf16) as B rows (1, D): stream (1, B)."""
    return Flatten(g, LinearOffChipLoad(g, Tensor(name, (B, D), BF16), (1, D), (B, 1), (1, 1), stream_dtype=FP32), 0, 1)


def _toy(tp: int, pp: int, layers: int, algorithm: str):
    """``layers`` layers of a toy kind, each one block whose partial sum on chip t is tensor ``p<i>.<t>``, with a
    residual: y = x + sum over layers and chips of p<i>.<t>, on ``tp`` chips per stage of ``pp``."""
    g = Graph("toy")
    sh = Sharding(g, chips_system(tp * pp, None, "--tp"))
    rows_in = {}
    for t in range(tp):
        before = len(g.ops)
        rows_in[t] = _rows(g, "x")
        sh.place(before, t)
    bindings: dict = {}
    tp_layers(sh, layers, tp=tp, pp=pp, algorithm=algorithm, batch=B, compute_bw=1024, bindings=bindings,
              rows_in=rows_in, blocks=lambda i: [("allreduce", lambda t, rows: _rows(g, f"p{i}.{t}"), True)])
    return g, sh.finish(bindings)


def test_a_kind_without_a_parallel_builder_runs_tensor_parallel_in_stages():
    """Two layers, two stages of two chips: every chip of the last stage ends with all of y, equal to the sum
    (integer values: float32 sums in any order are exact); each ring link carries its two chunks (reduce-scatter
    and all-gather, B / 2 rows of D values timed at 2 bytes each way), each stage boundary B rows once."""
    g, report = _toy(2, 2, 2, "ring")
    rng = np.random.default_rng(0)
    inputs = {name: rng.integers(-8, 8, (B, D)).astype(np.float32)
              for name in ["x"] + [f"p{i}.{t}" for i in range(2) for t in range(2)]}
    r = simulate(g, "sn40l", functional=True, inputs=inputs)
    y = sum(inputs.values())
    for t in range(2):
        np.testing.assert_array_equal(np.concatenate([r.outputs[f"y{t}.{k}"] for k in range(2)]), y)
    assert sorted(r.outputs) == ["y0.0", "y0.1", "y1.0", "y1.1"]
    assert {op.chip for op in g.ops if op.kind == "LinearOffChipStore"} == {2, 3}
    chunk, rows = (B // 2) * D * 2, B * D * 2
    assert report == {"system": "fully-connected-4", "links_used": 6, "link_bytes": {
        "chip0->chip1": 2 * chunk, "chip1->chip0": 2 * chunk, "chip2->chip3": 2 * chunk, "chip3->chip2": 2 * chunk,
        "chip0->chip2": rows, "chip1->chip3": rows}}
    assert r.cycles == 2178


def test_the_operators_of_each_layer_are_named_and_labelled_by_layer():
    g, _ = _toy(2, 1, 2, "direct")
    names = {op.name.split(".")[0] for op in g.ops if op.name.startswith("layer")}
    assert names == {"layer0", "layer1"}
    ops = [type("Op", (), {"group": group})() for group in (("expert", 3), ("region", 1), None)]
    relabel(ops, 2, ("expert",))
    assert [op.group for op in ops] == [("layer2.expert", 3), ("region", 1), None]


def test_chunk_selector_cuts_rows_into_consecutive_chunks():
    np.testing.assert_array_equal(chunk_selector(6, 3), np.array([[1, 0, 0], [1, 0, 0], [0, 1, 0], [0, 1, 0],
                                                                  [0, 0, 1], [0, 0, 1]], np.int8))


@pytest.mark.parametrize("module", ["moe.pipeline_tp", "moe.pipeline_ep", "decoder.pipeline_tp",
                                    "decoder.pipeline_ep", "decoder.parallel", "decoder.expert_parallel"])
def test_the_per_combination_builders_are_gone(module):
    assert importlib.util.find_spec(f"stepsim.workloads.{module}") is None
