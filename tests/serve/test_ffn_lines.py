"""The mapped FFN's per-bucket lines (stepsim.serve.fast_mapped.fit_ffn_lines, ffn_cycles): each bucket's engine
cycles against its expert tiles, fitted on the relative error; through the origin where a line cannot be trusted;
the pooled coefficients for a bucket without a line."""

from __future__ import annotations

import numpy as np

from stepsim.serve.fast_mapped import FFN_COLUMNS, FFN_LINES, ffn_bucket, ffn_cycles, fit_ffn_lines


def _row(tokens: int, tiles: int) -> np.ndarray:
    x = np.zeros(FFN_COLUMNS)
    x[0], x[1], x[2] = 1.0, tokens, tiles
    return x


def test_buckets_are_the_mappers():
    assert [ffn_bucket(t) for t in (1, 2, 3, 4, 5, 8, 9, 33, 64, 65)] == [0, 1, 2, 2, 3, 3, 4, 6, 6, 7]


def test_a_bucket_whose_cycles_are_a_line_in_its_tiles_gets_that_line():
    """Bucket 64 (33-64 tokens): cycles exactly 100,000 + 7,000 a tile; bucket 32: 5,000 + 6,000 a tile."""
    samples = [(40, 50), (64, 67), (50, 58), (33, 52)]
    rows = [_row(t, n) for t, n in samples] + [_row(20, 45), _row(32, 60), _row(17, 42)]
    cycles = [100_000 + 7_000 * n for _, n in samples] + [5_000 + 6_000 * n for n in (45, 60, 42)]
    lines = fit_ffn_lines(rows, cycles)[FFN_LINES]
    assert sorted(lines) == ["5", "6"]
    assert [round(v, 6) for v in lines["6"]] == [100_000.0, 7_000.0]
    assert [round(v, 6) for v in lines["5"]] == [5_000.0, 6_000.0]


def test_a_line_that_cannot_be_trusted_goes_through_the_origin():
    """Two samples (bucket 8); one tile count (bucket 16); cycles falling with the tiles (bucket 4): the slope of
    least squares on the relative error through the origin, sum(t / y) / sum(t^2 / y^2)."""
    rows = [_row(6, 30), _row(8, 40), _row(12, 50), _row(16, 50), _row(10, 50), _row(3, 20), _row(4, 22),
            _row(3, 24)]
    cycles = [150_000, 210_000, 300_000, 310_000, 290_000, 90_000, 80_000, 70_000]
    lines = fit_ffn_lines(rows, cycles)[FFN_LINES]

    def through_origin(tiles, y):
        t, y = np.array(tiles, dtype=float), np.array(y, dtype=float)
        return (t / y).sum() / ((t / y) ** 2).sum()

    assert lines["3"] == [0.0, lines["3"][1]] and np.isclose(lines["3"][1], through_origin([30, 40], cycles[:2]),
                                                             rtol=1e-14)
    assert lines["4"][0] == 0.0 and np.isclose(lines["4"][1], through_origin([50, 50, 50], cycles[2:5]), rtol=1e-14)
    assert lines["2"][0] == 0.0 and np.isclose(lines["2"][1], through_origin([20, 22, 24], cycles[5:]), rtol=1e-14)


def test_a_step_is_priced_on_its_buckets_line_else_by_the_pooled_coefficients():
    theta = {"ffn": [1.0] + [0.0] * (FFN_COLUMNS - 1), "ffn_prefill": [2.0] + [0.0] * (FFN_COLUMNS - 1),
             FFN_LINES: {"6": [100.4, 7.5]}}
    x = np.array([_row(40, 50), _row(40, 53)])
    assert ffn_cycles(x, theta, False).tolist() == [475, 498]  # rint(100.4 + 375) = 475, rint(497.9) = 498
    y = np.array([_row(20, 50)])
    assert ffn_cycles(y, theta, False).tolist() == [1] and ffn_cycles(y, theta, True).tolist() == [2]
    assert ffn_cycles(np.array([_row(40, 0)]), {FFN_LINES: {"6": [0.0, 7.5]}}, False).tolist() == [1]
