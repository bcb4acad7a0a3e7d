"""Layouts and the converter's minimum buffer (issue 33): the closed form against a brute-force simulation."""

import itertools
import math

import numpy as np
import pytest

from stepsim.base.errors import LayoutError
from stepsim.graph.layout import Layout, Loop, compatible, converter_buffer


def brute_force_elements(p: Layout, c: Layout) -> int:
    """The least converter buffer (elements), by simulating both access orders element by element.

    The consumer takes its tiles in order; before taking one, the producer delivers tiles in its order until
    every element of that tile has arrived (delivering earlier never lowers the peak). The answer is the peak
    number of elements delivered but not yet taken, counted just before each take.
    """
    produced = np.zeros(p.shape, bool)
    held = 0
    peak = 0
    feed = p.origins()
    for origin in c.origins():
        want = tuple(slice(o, o + t) for o, t in zip(origin, c.tile))
        while not produced[want].all():
            got = tuple(slice(o, o + t) for o, t in zip(next(feed), p.tile))
            produced[got] = True
            held += math.prod(p.tile)
            peak = max(peak, held)
        held -= math.prod(c.tile)
    return peak


def random_layout(rng, shape, tile) -> Layout:
    """Tiles of ``tile`` over ``shape``; each dim's tile grid split into one or two loops, all loops shuffled."""
    loops = []
    for d, (n, t) in enumerate(zip(shape, tile)):
        grid = n // t
        splits = [k for k in range(2, grid) if grid % k == 0]
        if splits and rng.random() < 0.4:
            inner = int(rng.choice(splits))
            loops += [Loop(d, grid // inner, t * inner), Loop(d, inner, t)]
        else:
            loops.append(Loop(d, grid, t))
    order = list(rng.permutation(len(loops)))
    # keep each dim's outer part outside its inner part half of the time; else any order
    if rng.random() < 0.5:
        order.sort(key=lambda k: (loops[k].dim, -loops[k].step))
        order = list(rng.permutation(order)) if rng.random() < 0.5 else order
    return Layout(shape, tile, tuple(loops[k] for k in order))


def divisors(n):
    return [k for k in range(1, n + 1) if n % k == 0]


def random_pair(rng, sizes):
    rank = int(rng.choice([2, 3]))
    shape = tuple(int(rng.choice(sizes)) for _ in range(rank))
    tp = tuple(int(rng.choice(divisors(n))) for n in shape)
    tc = tuple(int(rng.choice(divisors(n))) for n in shape)
    return random_layout(rng, shape, tp), random_layout(rng, shape, tc)


def test_closed_form_equals_brute_force_on_1000_random_pairs():
    rng = np.random.default_rng(33)
    checked = 0
    while checked < 1000:
        p, c = random_pair(rng, [2, 4, 8, 16])
        got = converter_buffer(p, c)
        if got.method == "compatible":
            assert brute_force_elements(p, c) == p.tile_elements  # a tile in, a tile out
            continue
        assert got.method == "closed form", (p, c)
        assert got.elements == brute_force_elements(p, c), (str(p), str(c))
        assert got.bytes == 4 * got.elements
        checked += 1


def test_scan_equals_brute_force_on_pairs_without_a_common_digit_split():
    rng = np.random.default_rng(34)
    methods = {"closed form": 0, "scan": 0}
    while methods["scan"] < 200:
        p, c = random_pair(rng, [6, 12])
        got = converter_buffer(p, c)
        if got.method in methods:
            methods[got.method] += 1
            assert got.elements == brute_force_elements(p, c), (str(p), str(c))
    assert methods["closed form"] > 100  # both kinds came up


def test_design_note_examples():
    rm = Layout.ordered((128, 128), (32, 32))
    cm = Layout.ordered((128, 128), (32, 32), order=(1, 0))
    assert converter_buffer(rm, cm) == (10 * 1024, 40960, 10, (32, 32), "closed form")
    assert converter_buffer(rm, Layout.ordered((128, 128), (64, 64))).cells == 6
    assert converter_buffer(rm, Layout.ordered((128, 128), (32, 128))).cells == 4
    assert converter_buffer(rm, Layout.ordered((128, 128), (128, 32))).cells == 13
    # the transpose inside a shared outer head loop: 10 tiles per head, the heads one after another
    heads = Layout((4, 128, 128), (1, 32, 32), (Loop(0, 4, 1), Loop(1, 4, 32), Loop(2, 4, 32)))
    heads_t = Layout((4, 128, 128), (1, 32, 32), (Loop(0, 4, 1), Loop(2, 4, 32), Loop(1, 4, 32)))
    assert converter_buffer(heads, heads_t).cells == 10


def test_compatible_layouts_need_no_converter():
    a = Layout((64, 32), (16, 32), (Loop(0, 2, 32), Loop(0, 2, 16), Loop(1, 1, 32)))
    b = Layout.ordered((64, 32), (16, 32), order=(1, 0))
    assert compatible(a, b) and a.canonical() == (Loop(0, 4, 16),)
    assert converter_buffer(a, b).elements == 0


def test_affine_map_and_origins():
    cm = Layout.ordered((4, 6), (2, 3), order=(1, 0))
    assert cm.affine_map() == ((0, 2), (3, 0))
    assert list(cm.origins()) == [(0, 0), (2, 0), (0, 3), (2, 3)]
    assert cm.trips == (2, 2) and cm.num_tiles == 4 and cm.injective


def test_load_view_layouts():
    # the SwiGLU weight view: (d, tile_n) tiles of a (d, f) tensor, n outer, k (one tile) inner, re-read per m
    w = Layout.from_tile_view((256, 512), (256, 16), (4, 32, 1), (0, 1, 32))
    assert w.loops == (Loop(1, 4, 0), Loop(1, 32, 16)) and not w.injective
    x = Layout.from_tile_view((64, 256), (16, 256), (4, 1), (1, 0))
    assert x.loops == (Loop(0, 4, 16),) and x.injective
    t = Layout.from_tile_view((64, 64), (16, 16), (4, 4), (1, 4))  # column-major tiles
    assert t.canonical() == (Loop(1, 4, 16), Loop(0, 4, 16))


@pytest.mark.parametrize("p, c, message", [
    (Layout.ordered((8, 8), (4, 4)), Layout.ordered((8, 16), (4, 4)),
     "no converter from matmul_0 Layout(tensor 8x8, tile 4x4, loops [d0:2x4, d1:2x4]) to add_1 Layout(tensor "
     "8x16, tile 4x4, loops [d0:2x4, d1:4x4]): they describe tensors of different shapes"),
    (Layout.ordered((8, 8), (4, 4)), Layout((8, 8), (4, 4), (Loop(0, 2, 4), Loop(1, 2, 0), Loop(1, 2, 4))),
     "no converter from matmul_0 Layout(tensor 8x8, tile 4x4, loops [d0:2x4, d1:2x4]) to add_1 Layout(tensor "
     "8x8, tile 4x4, loops [d0:2x4, d1:2x0, d1:2x4]): the consumer re-reads tiles (that needs a reuse buffer, "
     "not a converter)"),
    (Layout.ordered((8, 8), (4, 4), elem_bytes=2), Layout.ordered((8, 8), (4, 4)),
     "no converter from matmul_0 Layout(tensor 8x8, tile 4x4, loops [d0:2x4, d1:2x4]) to add_1 Layout(tensor "
     "8x8, tile 4x4, loops [d0:2x4, d1:2x4]): their elements differ in size (2 B and 4 B)"),
])
def test_incompatible_pairs_are_one_line_errors(p, c, message):
    with pytest.raises(LayoutError) as err:
        converter_buffer(p, c, producer="matmul_0", consumer="add_1")
    assert str(err.value) == message


@pytest.mark.parametrize("args, message", [
    (((8, 8), (3, 4), ()), "layout of tensor [8, 8]: tile [3, 4] must have one positive divisor of each dimension"),
    (((8, 8), (4, 4), (Loop(0, 2, 4), Loop(1, 2, 2))),
     "Layout(tensor 8x8, tile 4x4, loops [d0:2x4, d1:2x2]): the loops on dim 1 do not tile it (a loop of step 2 "
     "where the tiles so far reach 4 elements)"),
    (((8, 8), (4, 4), (Loop(0, 2, 4),)), "Layout(tensor 8x8, tile 4x4, loops [d0:2x4]): the loops on dim 1 cover "
     "4 of its 8 elements"),
])
def test_malformed_layouts(args, message):
    with pytest.raises(LayoutError) as err:
        Layout(*args)
    assert str(err.value) == message


def test_brute_force_helper_on_a_hand_checked_case():
    # 2 x 2 tiles row-major -> column-major: t00 | t01 t10 (peak 2) | t11 -> peak 2 tiles
    rm, cm = Layout.ordered((4, 4), (2, 2)), Layout.ordered((4, 4), (2, 2), order=(1, 0))
    assert brute_force_elements(rm, cm) == 2 * 4
    assert list(itertools.islice(cm.origins(), 2)) == [(0, 0), (2, 0)]
