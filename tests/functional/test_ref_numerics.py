"""bf16 rounding on hand-picked bit patterns, the tolerance rule and max_rel_error's edge cases."""

import math

import numpy as np
import pytest

from stepsim.base.errors import ArgumentError, ShapeError
from stepsim.graph import BF16, FP32
from stepsim.workloads.reference import bf16_bits, max_rel_error, round_to_bf16, tolerance_for, unit_roundoff


def f32(bits: int) -> np.float32:
    return np.array([bits], np.uint32).view(np.float32)[0]


# float32 bit pattern -> expected bf16 bit pattern
ROUNDING = [
    (0x3F800000, 0x3F80, "1.0 is exact"),
    (0x3F807FFF, 0x3F80, "just below half an ulp: down"),
    (0x3F808000, 0x3F80, "tie, even neighbour below"),
    (0x3F808001, 0x3F81, "just above half an ulp: up"),
    (0x3F818000, 0x3F82, "tie, odd neighbour below: up to even"),
    (0xBF818000, 0xBF82, "negative tie rounds the magnitude the same way"),
    (0x3FFF8000, 0x4000, "tie carries into the exponent: 1.99609375 -> 2.0"),
    (0x7F7F7FFF, 0x7F7F, "just below the tie above the largest bf16: largest finite"),
    (0x7F7F8000, 0x7F80, "tie above the largest bf16 (odd): overflows to inf"),
    (0x7F7FFFFF, 0x7F80, "largest float32 overflows to inf"),
    (0x7F800000, 0x7F80, "+inf stays"),
    (0xFF800000, 0xFF80, "-inf stays"),
    (0x00000000, 0x0000, "+0"),
    (0x80000000, 0x8000, "-0 keeps its sign"),
    (0x00000001, 0x0000, "smallest float32 subnormal rounds to +0"),
    (0x80000001, 0x8000, "... and its negative to -0"),
    (0x00008000, 0x0000, "subnormal tie, even neighbour 0"),
    (0x00018000, 0x0002, "subnormal tie, odd neighbour: up"),
    (0x00010000, 0x0001, "smallest bf16 subnormal is exact"),
    (0x007F8000, 0x0080, "subnormal tie at an odd neighbour carries to the smallest normal"),
    (0x007FFFFF, 0x0080, "largest float32 subnormal rounds to the smallest normal 2**-126"),
]


@pytest.mark.parametrize("bits,expected,why", ROUNDING, ids=[r[2] for r in ROUNDING])
def test_round_to_bf16_on_hand_picked_bit_patterns(bits, expected, why):
    x = f32(bits)
    assert int(bf16_bits(x)) == expected
    got = round_to_bf16(x)
    assert got.dtype == np.float32
    assert int(np.asarray(got).view(np.uint32)) == expected << 16


@pytest.mark.parametrize("bits,expected", [
    (0x7FC00000, 0x7FC0),  # quiet NaN unchanged
    (0x7F800001, 0x7FC0),  # payload only in the dropped bits: would carry to inf without the NaN rule
    (0x7FFFFFFF, 0x7FFF),  # all-ones payload: the carry would wrap; kept as the high bits
    (0xFF812345, 0xFFC1),  # sign and high payload kept, quiet bit set
])
def test_round_to_bf16_keeps_nan_a_nan(bits, expected):
    x = f32(bits)
    assert int(bf16_bits(x)) == expected
    assert np.isnan(round_to_bf16(x))


def test_round_to_bf16_keeps_shape_and_is_idempotent():
    a = np.random.default_rng(1).standard_normal((3, 4, 5)).astype(np.float32)
    r = round_to_bf16(a)
    assert r.shape == a.shape and r.dtype == np.float32
    assert np.array_equal(round_to_bf16(r), r)
    assert (np.asarray(r).view(np.uint32) & 0xFFFF).max() == 0
    assert round_to_bf16(2.5).shape == ()


def test_round_to_bf16_rounds_float64_via_float32():
    assert round_to_bf16(np.float64(1 + 2 ** -8)) == 1.0
    assert round_to_bf16([1 + 3 * 2 ** -8]).tolist() == [1.015625]


def test_round_to_bf16_picks_the_nearest_neighbour_ties_to_even_on_random_bit_patterns():
    """Independent formulation: compare the two bf16 neighbours' distances in float64 (exact for these)."""
    rng = np.random.default_rng(7)
    bits = rng.integers(0, 2 ** 32, 200_000, dtype=np.uint64).astype(np.uint32)
    bits = np.concatenate([bits, (bits & 0xFFFF0000) | 0x8000])  # plus a tie for each
    x = bits.view(np.float32)
    keep = np.isfinite(x)
    bits, x = bits[keep], x[keep]
    lo = bits & np.uint32(0xFFFF0000)  # truncation toward zero
    hi = lo + np.uint32(0x10000)  # one bf16 ulp further from zero (may be the inf pattern)
    lo_v = lo.view(np.float32).astype(np.float64)
    hi_v = hi.view(np.float32).astype(np.float64)
    # IEEE overflow: inf counts as the value 2**128 when deciding the rounding direction
    hi_v = np.where(np.isinf(hi_v), np.copysign(2.0 ** 128, lo_v), hi_v)
    xv = x.astype(np.float64)
    d_lo, d_hi = np.abs(xv - lo_v), np.abs(hi_v - xv)
    lo_even = ((lo >> 16) & 1) == 0
    take_hi = (d_hi < d_lo) | ((d_hi == d_lo) & ~lo_even)
    expected = np.where(take_hi, hi, lo)
    got = round_to_bf16(x).view(np.uint32)
    assert np.array_equal(got, expected)


def test_unit_roundoff_per_dtype():
    assert unit_roundoff("fp32") == 2.0 ** -24
    assert unit_roundoff("bfloat16") == 2.0 ** -8
    assert unit_roundoff("half") == 2.0 ** -11
    assert unit_roundoff(BF16) == 2.0 ** -8


def test_tolerance_rule_exact_values():
    u32 = 2.0 ** -24
    assert tolerance_for("fp32", 0) == 2 * u32
    assert tolerance_for("bf16", 0) == 2 ** -7
    n = 256 + 512  # the SwiGLU validation layer's D + F
    assert tolerance_for("float32", n) == 2 * (u32 + n * u32 / (1 - n * u32))
    assert 9.1e-5 < tolerance_for(FP32, n) < 9.3e-5  # close to the artifact's rtol 1e-4
    assert tolerance_for("bf16", n) == 2 * (2 ** -8 + n * u32 / (1 - n * u32))
    assert tolerance_for("fp16", 10) < tolerance_for("bf16", 10)
    assert tolerance_for("fp32", 100) < tolerance_for("fp32", 1000)


@pytest.mark.parametrize("dtype,n,match", [
    ("int8", 4, "dtype_name"),
    (None, 4, "dtype_name"),
    ("fp32", -1, "reduction_length"),
    ("fp32", 2.5, "reduction_length"),
    ("fp32", True, "reduction_length"),
    ("fp32", 2 ** 23, "too long"),
])
def test_tolerance_for_rejects_bad_arguments(dtype, n, match):
    with pytest.raises(ArgumentError, match=match):
        tolerance_for(dtype, n)


def test_max_rel_error_normalises_by_the_largest_reference_magnitude():
    assert max_rel_error([1.5, -4.0], [1.0, -4.0]) == 0.125
    assert max_rel_error([[1.0, 2.0]], [[1.0, 2.0]]) == 0.0
    assert max_rel_error([0.0, -8.0], [1.0, -4.0]) == 1.0


def test_max_rel_error_with_an_all_zero_reference():
    assert max_rel_error([0.0, -0.0], [0.0, 0.0]) == 0.0
    assert max_rel_error([0.0, 1e-30], [0.0, 0.0]) == math.inf


def test_max_rel_error_on_empty_arrays_is_zero():
    assert max_rel_error(np.zeros((0, 3)), np.zeros((0, 3))) == 0.0


def test_max_rel_error_requires_matching_non_finite_entries():
    nan, inf = math.nan, math.inf
    assert max_rel_error([nan, 2.0, inf], [nan, 4.0, inf]) == 0.5  # matching NaN/inf are skipped
    assert max_rel_error([1.0, 2.0], [nan, 2.0]) == math.inf
    assert max_rel_error([nan, 2.0], [1.0, 2.0]) == math.inf
    assert max_rel_error([-inf], [inf]) == math.inf
    assert max_rel_error([inf, 1.0], [1.0, 1.0]) == math.inf


def test_max_rel_error_rejects_different_shapes():
    with pytest.raises(ShapeError, match=r"sim has shape \[2, 3\] but ref has shape \[3, 2\]"):
        max_rel_error(np.zeros((2, 3)), np.zeros((3, 2)))
