"""A Link's bytes (``stepsim.graph.ops_chips.Link.link_bytes``) sum its streams of one element type before
multiplying by that type's bytes: the same expression, term for term, as the sum over every stream of its elements
times its element bytes, which these tests build the slow way and compare on the all-to-all Links of a 16-chip
expert-parallel layer (every transfer its own symbol) and on a collective's chunked streams; the sum left for
substitution (``canonical=False``, what the sharding pass reports) is the same sum and gives the same integers."""

from __future__ import annotations

import pytest
import sympy
from small_routing import sixteen_chip_moe_config

from stepsim.base.system import System
from stepsim.graph.dims import dim_sum, product
from stepsim.graph.dtypes import FP32, DynTile, Tile
from stepsim.graph.lower import fp32_timing_bytes
from stepsim.workloads.collective.build import build_collective
from stepsim.workloads.config import workload_from_config


def _stream_by_stream(link, fp32_bytes: int):
    """The Link's bytes summed stream by stream (the definition)."""
    def element_bytes(dtype):
        if isinstance(dtype, (Tile, DynTile)) and dtype.dtype == FP32:
            return product((dtype.rows, dtype.cols, fp32_bytes))
        return dtype.size_in_bytes()

    return dim_sum(product(s.shape) * element_bytes(s.dtype) for s in link.outputs)


@pytest.mark.parametrize("fp32_bytes", [2, 4])
def test_sixteen_chip_all_to_all_links(tmp_path, fp32_bytes):
    w = workload_from_config(sixteen_chip_moe_config(tmp_path))
    links = [op for op in w.graph.ops if op.kind == "Link"]
    assert len(links) == 32
    for link in links:
        assert link.link_bytes(fp32_bytes) == _stream_by_stream(link, fp32_bytes), link.name
    busiest = max(links, key=lambda op: len(op.outputs))
    assert (len(busiest.outputs), len(busiest.link_bytes(fp32_bytes).free_symbols)) == (144, 144)


@pytest.mark.parametrize("fp32_bytes", [2, 4])
def test_the_sum_left_for_substitution_is_the_same_sum(tmp_path, fp32_bytes):
    """``canonical=False`` (what the sharding pass substitutes the trace's values into): the same sum, canonical
    once evaluated (``doit``), and the same integer under the layer's bindings as the canonical sum gives."""
    w = workload_from_config(sixteen_chip_moe_config(tmp_path))
    values = {sym: sympy.sympify(v) for sym, v in w.bindings.items()}
    for link in (op for op in w.graph.ops if op.kind == "Link"):
        canonical, left = link.link_bytes(fp32_bytes), link.link_bytes(fp32_bytes, canonical=False)
        assert left != canonical and left.doit() == canonical, link.name  # not canonical, the same sum
        assert int(left.xreplace(values)) == int(canonical.xreplace(values)) > 0, link.name


def test_the_layers_reported_link_bytes_are_the_canonical_sums(tmp_path):
    """The workload's ``link_bytes`` (the sharding pass substitutes into the sums left for it) are the canonical
    sums' values, link by link, at the width the engine times fp32 tiles."""
    w = workload_from_config(sixteen_chip_moe_config(tmp_path))
    values = {sym: sympy.sympify(v) for sym, v in w.bindings.items()}
    width = fp32_timing_bytes(w.graph)
    assert w.params["link_bytes"] == {op.name: int(op.link_bytes(width).xreplace(values))
                                      for op in w.graph.ops if op.kind == "Link"}


def test_collective_links():
    c = build_collective(System.preset("ring-4"), "all-reduce", 4096, tile_bytes=256)
    links = [op for op in c.graph.ops if op.kind == "Link"]
    assert links
    for link in links:
        assert link.link_bytes() == _stream_by_stream(link, 4) and isinstance(link.link_bytes(), int), link.name
        assert link.link_bytes(canonical=False) == link.link_bytes(), link.name  # static: the int either way
