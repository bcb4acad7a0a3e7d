"""Functional mode across chips: the collectives move and reduce real values (fp32) as NumPy says, and the
timing of a functional run is the timing run's."""

from __future__ import annotations

import numpy as np
import pytest

from stepsim.base.system import from_dict
from stepsim.graph.lower import lower
from stepsim.kernels.api import run as fast_run
from stepsim.workloads.collective.build import build_collective


def _expected(c, inputs):
    n = c.chips
    if c.op == "all-reduce":
        return {f"y{i}.{k}": sum(inputs[f"x{j}.{k}"] for j in range(n)) for i in range(n) for k in range(n)}
    if c.op == "reduce-scatter":
        return {f"y{i}": sum(inputs[f"x{j}.{i}"] for j in range(n)) for i in range(n)}
    if c.op == "all-gather":
        return {f"y{i}.{k}": inputs[f"x{k}"] for i in range(n) for k in range(n)}
    return {f"y{i}.{j}": inputs[f"x{j}.{i}"] for i in range(n) for j in range(n)}


@pytest.mark.parametrize("topology, n, op, algorithm, tile_bytes, tiles", [
    ("ring", 4, "all-reduce", "ring-chunked", None, 1), ("ring", 3, "reduce-scatter", "ring-chunked", None, 1),
    ("ring", 5, "all-gather", "ring-chunked", None, 1),
    ("ring", 4, "all-reduce", "ring", None, 1), ("ring", 4, "all-reduce", "ring", 64, 3),
    ("ring", 3, "reduce-scatter", "ring", 40, 6), ("ring", 5, "all-gather", "ring", 100, 2),
    ("switch", 3, "all-reduce", "ring", 4, 48),
    ("fully-connected", 4, "all-reduce", "direct", None, 1), ("switch", 3, "reduce-scatter", "direct", None, 1),
    ("ring", 4, "all-to-all", "direct", None, 1), ("switch", 4, "all-gather", "direct", None, 1)])
def test_collective_values_match_numpy(topology, n, op, algorithm, tile_bytes, tiles):
    """Streamed rings too (``tiles`` tiles a chunk of 48 fp32 values: the send stage's x * 1 keeps every bit)."""
    system = from_dict({"chips": n, "topology": topology, "link_bandwidth": 64, "link_latency": 10}, source="t")
    c = build_collective(system, op, 4 * n * 48, algorithm, tile_bytes=tile_bytes)
    assert c.tiles == tiles
    program = lower(c.graph, system.hardware)
    rng = np.random.default_rng(n)
    inputs = {name: rng.standard_normal((1, c.chunk_elems)).astype(np.float32) for name in c.inputs}
    functional = fast_run(program, inputs=inputs)
    assert functional.cycles == fast_run(program).cycles
    expected = _expected(c, inputs)
    assert sorted(functional.outputs) == sorted(expected) == sorted(c.outputs)
    for name, want in expected.items():
        # fp32 sums of n terms in ring order: within n ulps of the largest partial sum
        np.testing.assert_allclose(functional.outputs[name], want, rtol=0, atol=n * 4e-7 * np.abs(want).max() + 1e-6)
    if op == "all-reduce":  # every chip holds bit-identical sums: each chunk is reduced once, then copied
        for k in range(n):
            assert all(np.array_equal(functional.outputs[f"y{i}.{k}"], functional.outputs[f"y0.{k}"])
                       for i in range(n))
