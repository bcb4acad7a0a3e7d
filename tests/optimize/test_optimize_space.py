"""The default search spaces, the space file, and the Pareto / bound helpers (exact values)."""

from __future__ import annotations

import pytest

from stepsim.base.errors import ConfigError
from stepsim.optimize.pareto import dominates, pareto_front, roofline_lower_bound
from stepsim.optimize.space import (
    default_attention_grids,
    default_moe_grids,
    divisors,
    grid_size,
    load_space,
    powers_of_two,
)


def test_default_moe_space_qwen_b64():
    grids = default_moe_grids(experts=128, intermediate=768, batch=64)
    tile_f = (32, 48, 64, 96, 128, 192, 256)
    shared = (1, 2, 4, 8, 16, 32, 64)
    tile_n = (1, 2, 4, 8, 16, 32, 64)
    assert grids == [{"tiling": ("dynamic",), "tile_f": tile_f},
                     {"tiling": ("dynamic",), "tile_f": tile_f, "regions": shared},
                     {"tiling": ("static",), "tile_n": tile_n, "tile_f": tile_f},
                     {"tiling": ("static",), "tile_n": tile_n, "tile_f": tile_f, "regions": shared}]
    assert grid_size(grids) == 7 + 49 + 49 + 343 == 448


def test_default_moe_space_mixtral_b64():
    grids = default_moe_grids(experts=8, intermediate=14336, batch=64)
    assert grids[0]["tile_f"] == (32, 56, 64, 112, 128, 224, 256)
    assert grids[1]["regions"] == (1, 2, 4)
    assert grid_size(grids) == 7 + 21 + 49 + 147 == 224


def test_default_moe_space_one_expert_has_no_time_multiplexing():
    grids = default_moe_grids(experts=1, intermediate=20, batch=3)
    assert grids == [{"tiling": ("dynamic",), "tile_f": (20,)}, {"tiling": ("static",), "tile_n": (1, 2), "tile_f": (20,)}]


def test_default_attention_space():
    # coarse uses min(ceil(B/16), regions) regions: larger counts would repeat the same graph
    assert default_attention_grids(16) == [{"strategy": ("coarse",), "regions": (1,)},
                                           {"strategy": ("interleave", "dynamic"), "regions": (1, 2, 4, 8, 16)}]
    assert default_attention_grids(12) == [{"strategy": ("coarse",), "regions": (1,)},
                                           {"strategy": ("interleave", "dynamic"), "regions": (1, 2, 4)}]
    assert default_attention_grids(64) == [{"strategy": ("coarse",), "regions": (1, 2, 4)},
                                           {"strategy": ("interleave", "dynamic"), "regions": (1, 2, 4, 8, 16)}]


def test_divisors_and_powers():
    assert divisors(12) == [1, 2, 3, 4, 6, 12]
    assert powers_of_two(64) == [1, 2, 4, 8, 16, 32, 64]
    assert powers_of_two(63) == [1, 2, 4, 8, 16, 32]


def test_space_file(tmp_path):
    path = tmp_path / "space.toml"
    path.write_text('[[axes]]\ntiling = ["dynamic"]\ntile_f = [48, 96]\n\n'
                    '[[axes]]\ntiling = ["static"]\ntile_n = {start = 8, stop = 65, factor = 2}\n'
                    'channel_depth = [2, 8]\n')
    assert load_space(path, "moe") == [{"tiling": ("dynamic",), "tile_f": (48, 96)},
                                       {"tiling": ("static",), "tile_n": (8, 16, 32, 64), "channel_depth": (2, 8)}]


@pytest.mark.parametrize("text, message", [
    ("[fixed]\ntile_f = 48\n", "{path}: unknown key 'fixed'; a space file holds [axes] or [[axes]] tables only"),
    ("x = 1\n", "{path}: unknown key 'x'; a space file holds [axes] or [[axes]] tables only"),
    ("", "{path}: no [axes] or [[axes]] table; a space file lists the axes to search"),
    ("[axes]\ntile_ff = [1]\n", "{path}: unknown key 'tile_ff' in [axes] (did you mean 'tile_f'?); known keys: "),
    ("[axes]\ntile_f = []\n", "{path}: [axes] tile_f has no values"),
])
def test_space_file_errors(tmp_path, text, message):
    path = tmp_path / "space.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_space(path, "moe")
    assert str(err.value).startswith(message.format(path=path))


def test_space_file_missing(tmp_path):
    with pytest.raises(ConfigError, match=r"^--space: space file not found: .*nope\.toml$"):
        load_space(tmp_path / "nope.toml", "moe")


def test_dominance_and_front():
    assert dominates((1, 2, 3), (1, 2, 4))
    assert not dominates((1, 2, 3), (1, 2, 3))  # equal vectors: both stay on the front
    assert not dominates((1, 5, 3), (2, 2, 3))
    points = [(10, 5, 5), (10, 5, 5), (9, 6, 5), (11, 6, 6), (20, 1, 1), (9, 6, 6)]
    assert pareto_front(points) == [0, 1, 2, 4]


def test_roofline_lower_bound():
    # memory bound: ceil(1025 / 1024) = 2 > ceil(100 / 100) = 1
    assert roofline_lower_bound(1025, 1024, 100, 100) == 2
    # compute bound: ceil(1001 / 10) = 101
    assert roofline_lower_bound(1024, 1024, 1001, 10) == 101
    assert roofline_lower_bound(0, 1024, 5, 0) == 0  # no compute allocated: the memory bound alone
