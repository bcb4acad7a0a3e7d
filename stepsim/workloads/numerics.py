"""Numerics shared by the workload kinds' NumPy references and functional inputs: bf16 storage, tolerances,
errors, seeded inputs, and small helpers every reference uses.

The rules the references follow (which values are rounded where, what the tolerance budgets for) are in
:mod:`stepsim.workloads.reference`.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass

import numpy as np

from stepsim.base.errors import ArgumentError, GraphError, ShapeError
from stepsim.workloads.base import Workload

# =========================================================================================================
# bf16 storage emulation
# =========================================================================================================
_LOW16 = np.uint32(0xFFFF)
_HIGH16 = np.uint32(0xFFFF0000)
_QUIET_NAN = np.uint32(0x00400000)  # the float32 quiet bit; bit 6 of the bf16 mantissa


def _bf16_rounded_bits(a) -> np.ndarray:
    """float32 bit patterns (uint32) of ``a`` rounded to bf16; the low 16 bits are zero."""
    x = np.array(a, dtype=np.float32, order="C")  # a C-contiguous copy (keeps 0-d shape) to view as bits
    bits = x.view(np.uint32)
    # Round half to even on the 16 bits that bf16 drops: adding 0x7FFF plus the lowest kept bit carries into
    # the kept bits exactly when the dropped part is above half, or equal to half with an odd kept part.
    # The carry propagates through the exponent, so finite values past the largest bf16 become inf, the
    # largest subnormals become the smallest normal, and infinities stay infinite. Non-NaN patterns never
    # wrap (the largest is -inf's 0xFF800000).
    lsb = (bits >> np.uint32(16)) & np.uint32(1)
    rounded = (bits + np.uint32(0x7FFF) + lsb) & _HIGH16
    # NaN: the rule above could carry a NaN whose payload sits in the low bits into inf (0x7F800001 ->
    # 0x7F80...), so NaNs keep their sign and high payload and get the quiet bit, which keeps them NaN.
    nan_bits = (bits & _HIGH16) | _QUIET_NAN
    return np.where(np.isnan(x), nan_bits, rounded).astype(np.uint32)


def round_to_bf16(a) -> np.ndarray:
    """Round to the nearest bf16 value, ties to even; return float32 holding bf16-representable values.

    Rule: ``a`` is converted to float32 first (the engine's tile type), then the float32 bit pattern is rounded
    to its upper 16 bits (sign, 8 exponent bits, 7 mantissa bits) with round-half-to-even on the 16 dropped
    bits. Consequences: values beyond the largest bf16 (``0x7F7F`` = 3.3895e38) by half an ulp or more become
    ``±inf``; ``±inf`` and ``±0`` are kept; subnormals round like normal numbers (bf16 has float32's exponent
    range, so its subnormals are float32's with 16 fewer mantissa bits); NaN stays NaN (sign and the high
    payload bits kept, quiet bit set). Float64 input is rounded twice (to float32, then to bf16), which in rare
    ties differs from a direct float64-to-bf16 rounding.

    Parameters
    ----------
    a : array-like of float
        Values of any shape.

    Returns
    -------
    numpy.ndarray
        float32 array of ``a``'s shape.

    Examples
    --------
    >>> round_to_bf16([1.0 + 2**-8, 1.0 + 3 * 2**-8]).tolist()  # both ties: to the even neighbour
    [1.0, 1.015625]
    """
    return _bf16_rounded_bits(a).view(np.float32)


def bf16_bits(a) -> np.ndarray:
    """The bf16 bit patterns (uint16, same shape) of ``a`` rounded with :func:`round_to_bf16`.

    >>> hex(int(bf16_bits(1.0)))
    '0x3f80'
    """
    return (_bf16_rounded_bits(a) >> np.uint32(16)).astype(np.uint16)


# =========================================================================================================
# tolerances and errors
# =========================================================================================================
#: unit roundoff (half an ulp of 1, relative error bound of round-to-nearest) per storage dtype
_UNIT_ROUNDOFF = {"fp32": 2.0 ** -24, "bf16": 2.0 ** -8, "fp16": 2.0 ** -11}
_DTYPE_ALIASES = {"fp32": "fp32", "float32": "fp32", "f32": "fp32", "bf16": "bf16", "bfloat16": "bf16",
                  "fp16": "fp16", "float16": "fp16", "f16": "fp16", "half": "fp16"}


def _dtype_key(dtype_name) -> str:
    name = getattr(dtype_name, "name", dtype_name)  # accept stepsim ScalarType (FP32, BF16, ...) too
    key = _DTYPE_ALIASES.get(str(name).lower()) if isinstance(name, str) else None
    if key is None:
        raise ArgumentError(f"dtype_name must be one of {sorted(_DTYPE_ALIASES)} (or a stepsim float ScalarType), "
                            f"got {dtype_name!r}")
    return key


def unit_roundoff(dtype_name) -> float:
    """Unit roundoff ``u`` of a float storage dtype: 2**-24 (fp32), 2**-11 (fp16), 2**-8 (bf16)."""
    return _UNIT_ROUNDOFF[_dtype_key(dtype_name)]


def tolerance_for(dtype_name, reduction_length: int) -> float:
    """Tolerance on :func:`max_rel_error` for a result stored as ``dtype_name`` after fp32 compute.

    Rule::

        tolerance = 2 * (u(dtype) + gamma_n),   gamma_n = n * u32 / (1 - n * u32),   u32 = 2**-24

    * ``u(dtype)`` (:func:`unit_roundoff`) bounds the one rounding of the result to its storage dtype
      (round-to-nearest errs by at most half an ulp, i.e. ``u`` relative). For fp32 results it is the final
      fp32 rounding.
    * ``gamma_n`` is Higham's bound on the relative error of ``n`` chained fp32 operations (a length-``n``
      dot product in any summation order). Pass as ``n`` the reduction lengths summed along the longest path
      to an output: ``D + F`` for a SwiGLU FFN, ``D + F + top_k`` for MoE, ``head_dim + rows read`` for
      attention; 0 for pure data movement (a KV-cache append).
    * The factor 2 covers the reference's own float32 roundings of materialised tiles and the
      normalisation by ``max|ref|`` (an element slightly larger than ``max|ref|`` in the engine's result).
      ``gamma_n`` bounds error relative to the sum of ``|terms|``, not to the result; for the zero-mean
      inputs of :func:`make_inputs` rounding errors grow like ``sqrt(n) * u32`` (random walk), so the
      ``n * u32`` of ``gamma_n`` leaves a ``sqrt(n)`` margin for that cancellation.

    For example fp32, ``n = 256 + 512`` gives 9.2e-5 (the artifact's gold check uses rtol 1e-4); bf16 outputs
    get at least 2**-7 = 7.8e-3.

    Parameters
    ----------
    dtype_name : str or ScalarType
        Storage dtype of the compared result: ``"fp32"``/``"float32"``, ``"bf16"``/``"bfloat16"``,
        ``"fp16"``/``"float16"``, or a stepsim ``ScalarType``.
    reduction_length : int
        ``n`` above (>= 0, and ``n * 2**-24 < 1/2`` for the bound to mean anything).

    Returns
    -------
    float
        The tolerance (dimensionless, relative to ``max|ref|``).
    """
    u = unit_roundoff(dtype_name)
    if isinstance(reduction_length, bool) or not isinstance(reduction_length, (int, np.integer)) \
            or reduction_length < 0:
        raise ArgumentError(f"reduction_length must be a non-negative int, got {reduction_length!r}")
    nu = int(reduction_length) * _UNIT_ROUNDOFF["fp32"]
    if nu >= 0.5:
        raise ArgumentError(f"reduction_length {reduction_length} is too long for an fp32 error bound "
                            f"(n * 2**-24 must stay below 1/2)")
    return 2.0 * (u + nu / (1.0 - nu))


def max_rel_error(sim, ref) -> float:
    """``max|sim - ref| / max|ref|`` over the finite entries, in float64.

    Defined results for the edge cases:

    * ``ref`` all zero (or empty of finite values): 0.0 if ``sim`` equals it exactly, ``inf`` otherwise
      (any difference is infinitely large relative to zero);
    * empty arrays: 0.0;
    * non-finite entries must match exactly: NaN where ``ref`` is NaN, the same signed infinity where ``ref``
      is infinite (the plain softmax overflows in both the graph and the reference); a mismatch gives ``inf``.

    Parameters
    ----------
    sim, ref : array-like of float, same shape
        Simulated and reference values.

    Returns
    -------
    float
        The relative error (dimensionless).

    Raises
    ------
    ShapeError
        When the shapes differ.
    """
    s = np.asarray(sim, dtype=np.float64)
    r = np.asarray(ref, dtype=np.float64)
    if s.shape != r.shape:
        raise ShapeError(f"max_rel_error: sim has shape {list(s.shape)} but ref has shape {list(r.shape)}")
    if s.size == 0:
        return 0.0
    finite_r, finite_s = np.isfinite(r), np.isfinite(s)
    nan_ok = np.isnan(r) == np.isnan(s)
    inf_ok = np.where(np.isinf(r) | np.isinf(s), r == s, True)
    if not (nan_ok.all() and inf_ok.all()):
        return math.inf
    both = finite_r & finite_s
    diff = float(np.max(np.abs(s[both] - r[both]), initial=0.0))
    scale = float(np.max(np.abs(r[both]), initial=0.0))
    if scale == 0.0:
        return 0.0 if diff == 0.0 else math.inf
    return diff / scale


# =========================================================================================================
# helpers
# =========================================================================================================
def as_f32(a) -> np.ndarray:
    """Round to float32 (a value the graph materialises as an fp32 tile) and widen back to float64."""
    return np.asarray(a, dtype=np.float32).astype(np.float64)


def checked_array(a, who: str, name: str, ndim: int | tuple[int, ...]) -> np.ndarray:
    """``a`` as float64 holding float32 values, checked to have ``ndim`` dims (an int or allowed ints)."""
    try:
        arr = np.asarray(a, dtype=np.float32)
    except (TypeError, ValueError) as exc:
        raise ArgumentError(f"{who}: {name} must be a numeric array: {exc}") from None
    allowed = (ndim,) if isinstance(ndim, int) else ndim
    if arr.ndim not in allowed:
        want = " or ".join(f"{n}-D" for n in allowed)
        raise ShapeError(f"{who}: {name} must be {want}, got shape {list(arr.shape)}")
    return arr.astype(np.float64)


def expect_shape(who: str, name: str, arr: np.ndarray, shape: tuple, meaning: str) -> None:
    if arr.shape != tuple(shape):
        raise ShapeError(f"{who}: {name} has shape {list(arr.shape)}, expected {meaning} = {list(shape)}")


def silu(x) -> np.ndarray:
    """``x * sigmoid(x)`` in float64.

    The sigmoid is evaluated from ``e = exp(-|x|)`` as ``1 / (1 + e)`` for ``x >= 0`` and ``e / (1 + e)``
    otherwise: ``exp`` never overflows (``exp(-x)`` would for ``x < -709``) and neither branch cancels, so the
    result keeps full relative accuracy even where it is tiny.
    """
    x = np.asarray(x, dtype=np.float64)
    e = np.exp(-np.abs(x))
    return x * np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def ffn_rows(x: np.ndarray, w_gate: np.ndarray, w_up: np.ndarray, w_down: np.ndarray) -> np.ndarray:
    """SwiGLU rows ``(silu(x @ w_gate) * (x @ w_up)) @ w_down`` (float64 arrays of float32 values), with a
    float32 rounding wherever the graph materialises a tile: the gate and up matmuls, SiLU, the product
    and the down projection (accumulated over all F tiles in float64, rounded once)."""
    gate = as_f32(x @ w_gate)
    up = as_f32(x @ w_up)
    hidden = as_f32(up * as_f32(silu(gate)))
    return as_f32(hidden @ w_down)


# =========================================================================================================
# graph tensors, seeded inputs, whole-workload references
# =========================================================================================================
@dataclass(frozen=True)
class TensorSpec:
    """An off-chip tensor of a workload graph.

    ``dtype`` is the storage dtype name (``"bf16"``, ``"fp32"``): the tensor's own dtype for loads and random
    stores, the input stream's element dtype for a linear store (which writes what it receives).
    ``loaded``/``stored`` say whether the graph reads / writes it (a KV cache does both).
    """

    name: str
    shape: tuple
    dtype: str
    loaded: bool
    stored: bool


def graph_tensors(workload: Workload) -> dict[str, TensorSpec]:
    """Every off-chip tensor the workload's graph loads or stores, by name, in first-use order.

    Raises
    ------
    GraphError
        When two operators name the same tensor with different shapes or dtypes.
    """
    found: dict[str, TensorSpec] = {}
    for op in workload.graph.ops:
        # resident tensors (a collective's on-chip inputs and outputs) hold values like off-chip ones
        if op.kind in ("LinearOffChipLoad", "ResidentLoad", "RandomOffChipLoad", "RandomOffChipStore"):
            spec = TensorSpec(op.tensor.name, tuple(op.tensor.shape), op.tensor.dtype.name,
                              op.kind != "RandomOffChipStore", op.kind == "RandomOffChipStore")
        elif op.kind in ("LinearOffChipStore", "ResidentStore"):
            spec = TensorSpec(op.tensor_name, tuple(op.tensor_shape), op.inputs[0].stream.dtype.dtype.name,
                              False, True)
        else:
            continue
        old = found.get(spec.name)
        if old is None:
            found[spec.name] = spec
            continue
        if (old.shape, old.dtype) != (spec.shape, spec.dtype):
            raise GraphError(f"{op.name} uses tensor {spec.name!r} as {list(spec.shape)} {spec.dtype}, but another "
                             f"operator uses it as {list(old.shape)} {old.dtype}")
        found[spec.name] = TensorSpec(spec.name, spec.shape, spec.dtype, old.loaded or spec.loaded,
                                      old.stored or spec.stored)
    return found


def seeded_rng(seed: int, what: str, *index: int) -> np.random.Generator:
    """A generator for one logical tensor: the same (seed, what, index) always gives the same stream, so an
    expert's weights do not depend on how the graph lays them out (per expert or per region)."""
    return np.random.default_rng(np.random.SeedSequence([seed, zlib.crc32(what.encode()), *index]))


def seeded_normal(seed, what, shape, std, *index, bf16: bool) -> np.ndarray:
    a = (seeded_rng(seed, what, *index).standard_normal(shape) * std).astype(np.float32)
    return round_to_bf16(a) if bf16 else a


def workload_trace(w: Workload, key: str) -> np.ndarray:
    """The trace array ``key`` the workload was built from (its builder records it in ``Workload.trace``)."""
    try:
        return w.trace[key]
    except KeyError:
        raise ArgumentError(f"workload {w.name!r} (graph {w.graph.name!r}) has no {key!r} trace; build it with "
                            f"stepsim's {w.name} builder") from None


def take_input(inputs: dict, name: str, who: str) -> np.ndarray:
    try:
        return inputs[name]
    except KeyError:
        raise ArgumentError(f"{who}: inputs has no tensor {name!r} (keys: {sorted(inputs)})") from None
