"""NumPy references of what the shipped workload graphs compute, for checking functional-mode runs.

Each reference is the plain math of one builder in :mod:`stepsim.workloads`, read off its operators:

* :func:`swiglu_reference` — :func:`~stepsim.workloads.swiglu.build_swiglu` stores
  ``y = (silu(x @ w_gate) * (x @ w_up)) @ w_down`` into tensor ``"y"``.
* :func:`moe_reference` — :func:`~stepsim.workloads.moe.build_moe` routes each token to its top-k experts,
  runs each expert's SwiGLU FFN, scales expert ``e``'s row of token ``t`` by the routing weight of the slot
  where ``t`` chose ``e`` (tensor ``"routing_weights"``) and sums the ``k`` scaled rows into tensor ``"y"``.
  Static tiling, dynamic tiling, F tiling and configuration time-multiplexing (``regions``) do not change
  the values (see :func:`moe_reference`).
* :func:`gqa_decode_reference` — :func:`~stepsim.workloads.attention.build_attention` appends the new
  key/value of each request at row ``kv_len`` of its cache block, writes the last tile back, and computes
  ``exp(q K^T) V / rowsum(exp(q K^T))`` over *every row of the KV tiles it reads* (the artifact's plain form;
  no 1/sqrt(d), no running max, and no masking of the rows after the new token in the last tile). The
  FlashAttention-style stable form is available for graphs that will compute it.

:func:`make_inputs` draws seeded arrays for every tensor a built workload loads (keyed by tensor name, with
the graph's shapes), :func:`workload_reference` returns what the workload should store, and
:func:`check_outputs` compares a run's stored tensors against it with :func:`max_rel_error` and
:func:`tolerance_for`.

Numerics
--------
* Every input is first converted to float32: the engine's stream tiles are fp32 (bf16 tensors are widened to
  fp32 on load, as the artifact's ``mock_bf16`` does).
* Every value the graph materialises as an fp32 tile (a matmul result, SiLU, a product, ``exp``, a scaled
  expert row) is rounded to float32 at the same point here, so the reference follows the graph's data path.
* Reductions (matmul inner sums, row sums, the top-k sum, accumulation over tiles) run in float64 on those
  float32 values: a product of two float32 numbers is exact in float64 and a float64 sum of ``n`` terms errs
  by about ``n * 2**-53`` relative, so the reference carries one float32 rounding per materialised tile and
  is, to float32 precision, independent of summation order. The engine's fp32 accumulation errs by up to ``~n * 2**-24``; that is
  what :func:`tolerance_for` budgets for.
* Elementwise functions (SiLU, exp) are evaluated in float64 and rounded to float32 (correctly rounded up to
  rare double-rounding cases), so they are at least as accurate as a float32 libm.

bf16 storage: NumPy has no bf16 type, so bf16 tensors are float32 arrays whose values are bf16-representable
(:func:`round_to_bf16`). :func:`make_inputs` produces such values, which makes loads lossless whether or not
an engine rounds on load; the bf16 rounding of *stored* results is covered by the tolerance.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from stepsim.base.errors import ArgumentError, GraphError, ShapeError
from stepsim.models.presets import MOE_MODELS, MoEModel, canonical_model_name
from stepsim.workloads.attention import kv_metadata, region_assignment
from stepsim.workloads.base import Workload
from stepsim.workloads.routing import check_routing

__all__ = [
    "AttentionReference", "ExpertOutput", "OutputCheck", "TensorSpec", "bf16_bits", "check_outputs",
    "gqa_decode_reference", "graph_tensors", "make_inputs", "max_rel_error", "moe_expert_outputs",
    "moe_reference", "round_to_bf16", "silu", "small_moe_model", "swiglu_reference", "tolerance_for",
    "unit_roundoff", "workload_reference",
]

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
def _f32(a) -> np.ndarray:
    """Round to float32 (a value the graph materialises as an fp32 tile) and widen back to float64."""
    return np.asarray(a, dtype=np.float32).astype(np.float64)


def _array(a, who: str, name: str, ndim: int | tuple[int, ...]) -> np.ndarray:
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


def _expect(who: str, name: str, arr: np.ndarray, shape: tuple, meaning: str) -> None:
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


def _ffn_rows(x: np.ndarray, w_gate: np.ndarray, w_up: np.ndarray, w_down: np.ndarray) -> np.ndarray:
    """SwiGLU rows ``(silu(x @ w_gate) * (x @ w_up)) @ w_down`` (float64 arrays of float32 values), with a
    float32 rounding wherever the graph materialises a tile: the gate and up matmuls, SiLU, the product
    and the down projection (accumulated over all F tiles in float64, rounded once)."""
    gate = _f32(x @ w_gate)
    up = _f32(x @ w_up)
    hidden = _f32(up * _f32(silu(gate)))
    return _f32(hidden @ w_down)


# =========================================================================================================
# SwiGLU
# =========================================================================================================
def swiglu_reference(x, w_gate, w_up, w_down) -> np.ndarray:
    """The SwiGLU validation layer: ``y = (silu(x @ w_gate) * (x @ w_up)) @ w_down``.

    Maps onto :func:`~stepsim.workloads.swiglu.build_swiglu`'s tensors ``"x"``, ``"w_gate"``, ``"w_up"``,
    ``"w_down"`` (all fp32) and its stored tensor ``"y"`` (fp32). The graph's tiling (``tile_m`` rows of x,
    ``tile_n`` columns of F) does not change the values: every output row depends on its input row only, and
    the down projection's sum over F tiles is done here in one float64 reduction.

    Parameters
    ----------
    x : array [B, D]
        Activations (tokens x hidden).
    w_gate, w_up : array [D, F]
        Gate and up projections (``x @ W`` convention, i.e. the transposed ``nn.Linear`` weight).
    w_down : array [F, D]
        Down projection.

    Returns
    -------
    numpy.ndarray
        ``y`` [B, D], float32.

    Raises
    ------
    ShapeError
        Naming the argument whose shape does not fit (``D`` from ``x``, ``F`` from ``w_gate``).

    Examples
    --------
    >>> import numpy as np
    >>> x = np.array([[1.0, 2.0]])
    >>> swiglu_reference(x, 32 * np.eye(2), np.eye(2), np.eye(2) / 32).tolist()  # silu(32 t) = 32 t in fp32
    [[1.0, 4.0]]
    """
    who = "swiglu_reference"
    x = _array(x, who, "x", 2)
    w_gate = _array(w_gate, who, "w_gate", 2)
    w_up = _array(w_up, who, "w_up", 2)
    w_down = _array(w_down, who, "w_down", 2)
    d = x.shape[1]
    if w_gate.shape[0] != d:
        raise ShapeError(f"{who}: w_gate has shape {list(w_gate.shape)}; its rows must equal x's D = {d} "
                         f"(x has shape {list(x.shape)})")
    f = w_gate.shape[1]
    _expect(who, "w_up", w_up, (d, f), "[D, F] (the shape of w_gate)")
    _expect(who, "w_down", w_down, (f, d), "[F, D]")
    return _ffn_rows(x, w_gate, w_up, w_down).astype(np.float32)


# =========================================================================================================
# Mixture of Experts
# =========================================================================================================
class ExpertOutput(NamedTuple):
    """The rows one expert produces: ``rows[i]`` is the expert's FFN output for token ``tokens[i]``."""

    tokens: np.ndarray  #: int64 [c_e], token indices in increasing order
    rows: np.ndarray  #: float32 [c_e, D], unweighted FFN outputs


def _moe_args(who, x, routing, w_gate, w_up, w_down):
    x = _array(x, who, "x", 2)
    w_gate = _array(w_gate, who, "w_gate", 3)
    w_up = _array(w_up, who, "w_up", 3)
    w_down = _array(w_down, who, "w_down", 3)
    b, d = x.shape
    experts, dg, f = w_gate.shape
    if dg != d:
        raise ShapeError(f"{who}: w_gate has shape {list(w_gate.shape)}; expected [E, D, F] with D = {d} from x "
                         f"(x has shape {list(x.shape)})")
    _expect(who, "w_up", w_up, (experts, d, f), "[E, D, F] (the shape of w_gate)")
    _expect(who, "w_down", w_down, (experts, f, d), "[E, F, D]")
    r = np.asarray(routing)
    if r.ndim != 2 or r.shape[0] != b:
        raise ShapeError(f"{who}: routing has shape {list(r.shape)}, expected [B, top_k] with B = {b} tokens of x")
    routing = check_routing(r, experts, r.shape[1], source=f"{who}: routing")
    return x, routing, w_gate, w_up, w_down


def moe_expert_outputs(x, routing, w_gate, w_up, w_down) -> list[ExpertOutput]:
    """Each expert's unweighted FFN rows for the tokens routed to it, in token order.

    These are the values on expert ``e``'s stream of :func:`~stepsim.workloads.moe.build_moe` after
    ``RetileStreamify`` dropped the padding rows (before the routing-weight ``Mul``). The graph does not
    store them; they help locate a mismatch. Shapes as in :func:`moe_reference`.

    Returns
    -------
    list of ExpertOutput
        One per expert (``E`` entries; an expert without tokens has ``tokens`` of length 0 and ``rows``
        of shape [0, D]).
    """
    x, routing, w_gate, w_up, w_down = _moe_args("moe_expert_outputs", x, routing, w_gate, w_up, w_down)
    return _expert_outputs(x, routing, w_gate, w_up, w_down)


def _expert_outputs(x, routing, w_gate, w_up, w_down) -> list[ExpertOutput]:
    out = []
    for e in range(w_gate.shape[0]):
        tokens = np.flatnonzero((routing == e).any(axis=1)).astype(np.int64)
        rows = _ffn_rows(x[tokens], w_gate[e], w_up[e], w_down[e]).astype(np.float32)
        out.append(ExpertOutput(tokens, rows))
    return out


def moe_reference(x, routing, gate_weights, w_gate, w_up, w_down, shared=None) -> np.ndarray:
    """The MoE layer: each token's top-k experts' SwiGLU FFNs, weighted by the routing weights and summed.

    ``y[t] = sum_s gate_weights[t, s] * ffn_{routing[t, s]}(x[t])`` with
    ``ffn_e(v) = (silu(v @ w_gate[e]) * (v @ w_up[e])) @ w_down[e]``.

    Mapping onto :func:`~stepsim.workloads.moe.build_moe`: ``x`` is tensor ``"x"``; ``routing`` is the trace
    the workload was built from (its selector sources); ``gate_weights`` is tensor ``"routing_weights"``
    (slot ``s`` of row ``t`` scales token ``t``'s output from expert ``routing[t, s]``; the graph always
    applies them); ``w_gate[e]``, ``w_up[e]``, ``w_down[e]`` are tensors ``"expert{e:03d}_gate"``, ``_up``,
    ``_down``, or, with ``regions``, rows ``i*D:(i+1)*D`` (gate/up) and ``i*F:(i+1)*F`` (down) of
    ``"region{r:03d}_*"`` for the ``i``-th expert of region ``r``. The result is stored in ``"y"`` (fp32).

    The tiling does not change the values. Static tiling pads an expert's tokens with zero rows up to a
    multiple of ``tile_n``; every output row of the FFN depends on its own input row only, and the padded
    rows are dropped (``RetileStreamify`` with ``filter_mask``) before the weighting. Dynamic tiling packs
    exactly the expert's tokens. Tiling F splits the gate/up columns (elementwise afterwards) and the down
    projection's reduction, which this reference does in one float64 sum. Time-multiplexing reads the same
    expert weights through random loads of the region tensor (``ExpertAddrGen`` addresses
    ``e_local * F/tile_f + j``). So one reference serves every variant; an fp32 engine may differ between
    variants only by summation order (within :func:`tolerance_for`). The top-k sum is done in float64 and
    rounded once, so the reference is also independent of the order in which the graph's ``Reassemble``
    delivers a token's expert rows (arrival order).

    Parameters
    ----------
    x : array [B, D]
        Token activations.
    routing : int array [B, top_k]
        Expert ids chosen for each token (no duplicates within a row).
    gate_weights : array [B, top_k] or None
        Routing weight of each (token, slot); None weighs every slot 1 (a plain sum).
    w_gate, w_up : array [E, D, F]
        Per-expert gate and up projections (``v @ W`` convention).
    w_down : array [E, F, D]
        Per-expert down projections.
    shared : (w_gate [D, Fs], w_up [D, Fs], w_down [Fs, D]) or None
        The shared experts' FFN (tensors ``"shared_gate"``, ``"shared_up"``, ``"shared_down"``), which every
        token visits: its rows are added (in fp32, as the graph's ``Map(Add)``) to the routed sum.

    Returns
    -------
    numpy.ndarray
        ``y`` [B, D], float32.

    Raises
    ------
    ShapeError
        Naming the argument whose shape does not fit.
    ArgumentError
        For expert ids outside ``0..E-1`` or a token naming an expert twice.

    Examples
    --------
    >>> import numpy as np
    >>> eye = np.eye(2)
    >>> wg, wu, wd = np.stack([32 * eye] * 2), np.stack([eye] * 2), np.stack([eye / 32, eye / 16])
    >>> moe_reference([[1.0, 2.0]], [[0, 1]], [[0.25, 0.75]], wg, wu, wd).tolist()  # expert e: x**2 * (e+1)
    [[1.75, 7.0]]
    """
    who = "moe_reference"
    x, routing, w_gate, w_up, w_down = _moe_args(who, x, routing, w_gate, w_up, w_down)
    b, k = routing.shape
    if gate_weights is None:
        weights = np.ones((b, k))
    else:
        weights = _array(gate_weights, who, "gate_weights", 2)
        _expect(who, "gate_weights", weights, (b, k), "[B, top_k] like routing")
    total = np.zeros_like(x)
    for e, (tokens, rows) in enumerate(_expert_outputs(x, routing, w_gate, w_up, w_down)):
        slot = np.argmax(routing[tokens] == e, axis=1)  # the slot where each of these tokens chose e
        # the graph's Map(Mul)(routing weight (1,1), row (1,D)) materialises an fp32 tile
        total[tokens] += _f32(weights[tokens, slot][:, None] * rows.astype(np.float64))
    if shared is not None:
        s_gate, s_up, s_down = (_f32(_array(w, who, f"shared {name}", 2))
                                for w, name in zip(shared, ("w_gate", "w_up", "w_down")))
        total = _f32(_f32(total) + _ffn_rows(x, s_gate, s_up, s_down))
    return total.astype(np.float32)


# =========================================================================================================
# GQA decode attention
# =========================================================================================================
class AttentionReference(NamedTuple):
    """Result of :func:`gqa_decode_reference`, each array in the layout of the corresponding input."""

    out: np.ndarray  #: float32, q's layout: [B, G, D] or [B*G, D]
    k_cache: np.ndarray  #: float32 copy of k_cache with new_k appended at row kv_len of each request
    v_cache: np.ndarray  #: float32 copy of v_cache with new_v appended likewise


SOFTMAX_FORMS = ("stable", "plain")
ORDERS = ("tiled", "direct")


def gqa_decode_reference(q, k_cache, v_cache, kv_lengths, new_k, new_v, *, softmax: str = "stable",
                         order: str = "tiled", tile_n: int = 32,
                         include_tile_padding: bool = False) -> AttentionReference:
    """Grouped-query decode attention of one KV head with KV-cache append.

    For request ``b`` with ``L = kv_lengths[b]`` cached tokens: the new key/value is written at row ``L`` of
    the request's cache block, then its ``G`` query rows attend to rows ``0..L`` (the new token included)::

        stable:  out = softmax(q K^T / sqrt(D)) V          (max-subtracted; never overflows)
        plain:   out = exp(q K^T) V / rowsum(exp(q K^T))  (the artifact's form)

    The two differ in the scale: with exact arithmetic ``plain(q) == stable(q * sqrt(D))``. Subtracting the
    row max changes nothing mathematically; it keeps ``exp`` finite. The plain form's scores are
    exponentiated in fp32 as the graph does, so scores above ~88.7 give ``inf`` (and ``inf/inf = nan``), like
    the graph; those entries are returned as such (see :func:`max_rel_error` for comparing them).

    ``order="tiled"`` walks the cache in tiles of ``tile_n`` rows, as the graph streams them: plain keeps
    running sums of ``exp(S_t) V_t`` and ``rowsum(exp(S_t))`` (the graph's MapAccum and Accum); stable keeps a
    running row max ``m``, rescaling the running sums by ``exp(m_old - m_new)`` whenever it grows
    (FlashAttention). ``order="direct"`` forms all scores at once (a one-shot softmax), for cross-checking.
    Both accumulate in float64 and agree to float32 rounding. Both forms round the score tiles to fp32, as the
    graph materialises them; the plain form also rounds its ``exp`` tiles. The stable form's running state
    stays in float64 here (the graph's ``OnlineSoftmax`` keeps it in fp32), which the tolerance covers.

    ``include_tile_padding=True`` reproduces what :func:`~stepsim.workloads.attention.build_attention`
    computes: it reads ``ceil((L+1)/tile_n)`` whole tiles, and the rows ``L+1 ..`` of the last tile take part
    in the softmax with whatever the cache holds there (the graph has no mask). With a zeroed tail each such
    row adds ``exp(0) = 1`` to the plain denominator and nothing to the numerator. ``False`` (default) is the
    intended attention over rows ``0..L`` only.

    Mapping onto the graph's tensors: ``q`` is ``"q"`` ([B*G, D], request ``b`` in rows ``b*G..``; the coarse
    strategy splits it per region into ``"q_region{r}"``), ``new_k``/``new_v`` are ``"k"``/``"v"`` (or
    ``"k_region{r}"``/``"v_region{r}"``), ``k_cache``/``v_cache`` are ``"k_cache"``/``"v_cache"``
    ([B*max_n, D], request ``b`` in rows ``b*max_n..``; read and written back by the graph), ``out`` is the
    stored ``"out"`` (bf16 storage).

    Parameters
    ----------
    q : array [B, G, D] or [B*G, D]
        Query rows (``G`` query heads share the KV head).
    k_cache, v_cache : array [B, N, D] or [B*N, D]
        KV caches, ``N`` rows (tokens) reserved per request.
    kv_lengths : int array [B]
        Tokens already cached per request (before the append); needs ``L + 1 <= N``.
    new_k, new_v : array [B, D]
        Key and value of the token being generated.
    softmax : {"stable", "plain"}
        See above (``"stable"`` scales by ``1/sqrt(D)``; ``"plain"`` does not).
    order : {"tiled", "direct"}
        Tile-by-tile in the graph's order, or one-shot.
    tile_n : int
        Cache rows per tile (32 in the experiments).
    include_tile_padding : bool
        Let the rows after the new token in the last tile take part (the shipped graph's behaviour); needs
        ``ceil((L+1)/tile_n) * tile_n <= N``.

    Returns
    -------
    AttentionReference
        ``out`` (float32, q's layout) and the appended caches (float32 copies in the input layout).

    Raises
    ------
    ShapeError
        Naming the argument whose shape does not fit (``B`` from ``kv_lengths``, ``D`` from ``q``).
    ArgumentError
        For bad lengths, a cache without room for the new row (or the padded last tile), or unknown options.
    """
    who = "gqa_decode_reference"
    if softmax not in SOFTMAX_FORMS:
        raise ArgumentError(f"{who}: softmax must be one of {SOFTMAX_FORMS}, got {softmax!r}")
    if order not in ORDERS:
        raise ArgumentError(f"{who}: order must be one of {ORDERS}, got {order!r}")
    seq_len_tiled, _ = kv_metadata(kv_lengths, tile_n)  # validates lengths and tile_n (ArgumentError)
    lengths = np.asarray(kv_lengths).astype(np.int64)
    batch = len(lengths)

    q_arr = _array(q, who, "q", (2, 3))
    if q_arr.ndim == 2:
        if q_arr.shape[0] % batch:
            raise ShapeError(f"{who}: q has shape {list(q_arr.shape)}; a flat q needs B*G rows with B = {batch} "
                             f"(len(kv_lengths))")
        q3 = q_arr.reshape(batch, -1, q_arr.shape[1])
    else:
        q3 = q_arr
        if q3.shape[0] != batch:
            raise ShapeError(f"{who}: q has shape {list(q3.shape)}, expected [B, G, D] with B = {batch} "
                             f"(len(kv_lengths))")
    d = q3.shape[2]
    caches = []
    for name, cache in (("k_cache", k_cache), ("v_cache", v_cache)):
        c = _array(cache, who, name, (2, 3))
        if c.ndim == 2:
            if c.shape[0] % batch or c.shape[1] != d:
                raise ShapeError(f"{who}: {name} has shape {list(c.shape)}; a flat cache needs [B*N, D] with "
                                 f"B = {batch} and D = {d} (from q)")
            c3 = c.reshape(batch, -1, d)
        else:
            c3 = c
            if c3.shape[0] != batch or c3.shape[2] != d:
                raise ShapeError(f"{who}: {name} has shape {list(c3.shape)}, expected [B, N, D] with B = {batch}, "
                                 f"D = {d}")
        caches.append((c, c3.copy()))
    (k_in, keys), (v_in, values) = caches
    if keys.shape != values.shape:
        raise ShapeError(f"{who}: k_cache {list(k_in.shape)} and v_cache {list(v_in.shape)} differ in shape")
    max_n = keys.shape[1]
    rows_new = []
    for name, row in (("new_k", new_k), ("new_v", new_v)):
        r = _array(row, who, name, 2)
        _expect(who, name, r, (batch, d), "[B, D]")
        rows_new.append(r)

    # rows each request reads: up to the new token, or whole tiles as the graph does
    limits = seq_len_tiled * tile_n if include_tile_padding else lengths + 1
    too_long = np.flatnonzero(limits > max_n)
    if too_long.size:
        b = int(too_long[0])
        what = f"{int(limits[b])} rows (whole tiles of {tile_n})" if include_tile_padding else \
            f"row {int(lengths[b])} for the new token"
        raise ArgumentError(f"{who}: request {b} has kv_length {int(lengths[b])} and needs {what}, but the caches "
                            f"hold N = {max_n} rows per request")

    # the append: the graph's SetOffset/RowAppend writes row (L mod tile_n) of tile L // tile_n, i.e. row L
    keys[np.arange(batch), lengths] = rows_new[0]
    values[np.arange(batch), lengths] = rows_new[1]

    scale = 1.0 / math.sqrt(d) if softmax == "stable" else 1.0
    out = np.empty_like(q3)
    attend = _attend_tiled if order == "tiled" else _attend_direct
    with np.errstate(over="ignore", invalid="ignore"):  # plain form: fp32 overflow gives inf/nan, as the graph
        for b in range(batch):
            n = int(limits[b])
            out[b] = attend(q3[b], keys[b, :n], values[b, :n], softmax, scale, tile_n)

    out = out.reshape(q_arr.shape).astype(np.float32)
    return AttentionReference(out, keys.reshape(k_in.shape).astype(np.float32),
                              values.reshape(v_in.shape).astype(np.float32))


def _exp_plain(s: np.ndarray) -> np.ndarray:
    """The graph's ``UnaryMap(Exp)`` on an fp32 score tile: an fp32 result (inf past ~88.7)."""
    return _f32(np.exp(s))


def _attend_direct(q, keys, values, softmax, scale, tile_n):
    """One-shot attention of ``q`` [G, D] over ``keys``/``values`` [n, D] (float64 arrays)."""
    s = _f32(q @ keys.T) * scale  # the score tile is materialised in fp32 (the graph's qkt Map)
    if softmax == "plain":
        p = _exp_plain(s)
    else:
        p = np.exp(s - s.max(axis=1, keepdims=True))
    return (p @ values) / p.sum(axis=1, keepdims=True)


def _attend_tiled(q, keys, values, softmax, scale, tile_n):
    """Tile-by-tile attention in the graph's streaming order (running sums; running max when stable)."""
    g, d = q.shape
    acc = np.zeros((g, d))  # running sum of p @ V: the graph's MapAccum(Matmul) over tiles
    row_sum = np.zeros(g)  # running sum of p's rows: the graph's Accum(Add) of tiles, then RowSum
    row_max = np.full(g, -np.inf)  # stable only: the largest score seen so far per query row
    for start in range(0, len(keys), tile_n):
        k_t, v_t = keys[start:start + tile_n], values[start:start + tile_n]
        s = _f32(q @ k_t.T) * scale
        if softmax == "plain":
            p = _exp_plain(s)
        else:
            new_max = np.maximum(row_max, s.max(axis=1))
            rescale = np.exp(row_max - new_max)  # exp(-inf) = 0 before the first tile
            acc *= rescale[:, None]
            row_sum *= rescale
            row_max = new_max
            p = np.exp(s - new_max[:, None])
        acc += p @ v_t
        row_sum += p.sum(axis=1)
    return acc / row_sum[:, None]


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
        if op.kind in ("LinearOffChipLoad", "RandomOffChipLoad", "RandomOffChipStore"):
            spec = TensorSpec(op.tensor.name, tuple(op.tensor.shape), op.tensor.dtype.name,
                              op.kind != "RandomOffChipStore", op.kind == "RandomOffChipStore")
        elif op.kind == "LinearOffChipStore":
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


def small_moe_model(name: str, *, hidden: int = 64, intermediate: int = 128,
                    shared_intermediate: int = 0) -> MoEModel:
    """A preset's expert count and top-k (so its routing traces replay unchanged) with small D and F (and a
    shared-expert FFN of ``shared_intermediate``, 0 for none).

    >>> small_moe_model("mixtral-8x7b", hidden=32, intermediate=64)
    MoEModel(name='mixtral-8x7b-small', hidden=32, intermediate=64, experts=8, top_k=2, shared_intermediate=0)
    """
    canonical = canonical_model_name(name)  # the aliases (mixtral, qwen) name the same presets here too
    if canonical not in MOE_MODELS:
        raise ArgumentError(f"unknown MoE preset {name!r}; expected one of {sorted(MOE_MODELS)}")
    base = MOE_MODELS[canonical]
    return MoEModel(f"{canonical}-small", hidden=hidden, intermediate=intermediate, experts=base.experts,
                    top_k=base.top_k, shared_intermediate=shared_intermediate)


def _rng(seed: int, what: str, *index: int) -> np.random.Generator:
    """A generator for one logical tensor: the same (seed, what, index) always gives the same stream, so an
    expert's weights do not depend on how the graph lays them out (per expert or per region)."""
    return np.random.default_rng(np.random.SeedSequence([seed, zlib.crc32(what.encode()), *index]))


def _normal(seed, what, shape, std, *index, bf16: bool) -> np.ndarray:
    a = (_rng(seed, what, *index).standard_normal(shape) * std).astype(np.float32)
    return round_to_bf16(a) if bf16 else a


def make_inputs(workload: Workload, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded float32 arrays for every tensor the workload's graph loads, keyed by tensor name.

    Shapes are the graph's tensor shapes (:func:`graph_tensors`); dims are whatever the workload was built
    with (use small ones, e.g. :func:`small_moe_model`, ``build_swiglu(hidden=.., intermediate=..)``,
    ``build_attention(.., head_dim=16, query_per_kv_head=4)``). Tensors stored as bf16 hold
    bf16-representable values (:func:`round_to_bf16`), so loading them is exact.

    What is drawn (normal with the given standard deviation, so activations stay O(1)):

    * ``swiglu``: ``x`` [B, D] std 1; ``w_gate``, ``w_up`` [D, F] std ``1/sqrt(D)``; ``w_down`` [F, D] std
      ``1/sqrt(F)``.
    * ``moe``: ``x`` [B, D] std 1; ``routing_weights`` [B, k] the softmax over the k slots of std-1 logits;
      expert ``e``'s weights as for SwiGLU, drawn per expert, so ``"expert{e:03d}_*"`` tensors and the
      ``"region{r:03d}_*"`` tensors of time-multiplexed graphs (member experts' weights stacked: gate/up
      ``[m*D, F]``, down ``[m*F, D]``) hold the same expert weights for the same seed.
    * ``attention``: ``q`` [B*G, D] and keys with std ``D**-0.25`` (scores ``q.k`` of std ~1), values std 1;
      cache rows ``0..L-1`` of request ``b`` (``L = kv_lengths[b]``) are drawn, rows ``L..`` are zero (a
      fresh cache; row ``L`` receives the new token, the rest is the unmasked tail of the last tile). The
      coarse strategy's ``"q_region{r}"``, ``"k_region{r}"``, ``"v_region{r}"`` are the rows of its
      region's requests.

    Parameters
    ----------
    workload : Workload
        Built by ``build_swiglu``, ``build_moe`` or ``build_attention``.
    seed : int
        Non-negative seed; every logical tensor gets its own stream derived from it.

    Returns
    -------
    dict of str to numpy.ndarray
        float32 arrays, one per loaded tensor of the graph (tensors the graph only stores are left out).

    Raises
    ------
    ArgumentError
        For an unknown workload kind or a bad seed.
    GraphError
        When the graph loads a tensor this function does not know how to fill (a builder changed).
    """
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ArgumentError(f"make_inputs: seed must be a non-negative int, got {seed!r}")
    seed = int(seed)
    specs = graph_tensors(workload)
    kind = workload.name
    arrays = _kind_function("make_inputs", kind, "inputs")(workload, seed)
    loaded = {name: spec for name, spec in specs.items() if spec.loaded}
    missing = sorted(set(loaded) - set(arrays))
    if missing:
        raise GraphError(f"make_inputs: the {kind} graph loads tensors {missing} that make_inputs does not fill")
    for name, spec in loaded.items():
        if arrays[name].shape != spec.shape:  # a disagreement with the builder is a bug here, not user error
            raise GraphError(f"make_inputs: drew {name!r} as {list(arrays[name].shape)}, the graph declares "
                             f"{list(spec.shape)}")
    return {name: arrays[name] for name in loaded}


def _swiglu_inputs(w: Workload, seed: int) -> dict:
    b, d, f = w.params["batch"], w.params["hidden"], w.params["intermediate"]
    return {
        "x": _normal(seed, "x", (b, d), 1.0, bf16=False),
        "w_gate": _normal(seed, "w_gate", (d, f), d ** -0.5, bf16=False),
        "w_up": _normal(seed, "w_up", (d, f), d ** -0.5, bf16=False),
        "w_down": _normal(seed, "w_down", (f, d), f ** -0.5, bf16=False),
    }


def _moe_expert_weights(seed: int, experts: int, d: int, f: int):
    """[E, D, F], [E, D, F], [E, F, D] bf16-valued expert weights, each expert from its own stream."""
    gate = np.stack([_normal(seed, "expert_gate", (d, f), d ** -0.5, e, bf16=True) for e in range(experts)])
    up = np.stack([_normal(seed, "expert_up", (d, f), d ** -0.5, e, bf16=True) for e in range(experts)])
    down = np.stack([_normal(seed, "expert_down", (f, d), f ** -0.5, e, bf16=True) for e in range(experts)])
    return gate, up, down


def _moe_inputs(w: Workload, seed: int) -> dict:
    p = w.params
    b, d, f, k, experts, regions = p["batch"], p["hidden"], p["intermediate"], p["top_k"], p["experts"], p["regions"]
    logits = _rng(seed, "routing_logits").standard_normal((b, k))
    soft = np.exp(logits - logits.max(axis=1, keepdims=True))
    arrays = {
        "x": _normal(seed, "x", (b, d), 1.0, bf16=True),
        "routing_weights": round_to_bf16(soft / soft.sum(axis=1, keepdims=True)),
    }
    gate, up, down = _moe_expert_weights(seed, experts, d, f)
    fs = p.get("shared_intermediate", 0)
    if fs:
        arrays.update({"shared_gate": _normal(seed, "shared_gate", (d, fs), d ** -0.5, bf16=True),
                       "shared_up": _normal(seed, "shared_up", (d, fs), d ** -0.5, bf16=True),
                       "shared_down": _normal(seed, "shared_down", (fs, d), fs ** -0.5, bf16=True)})
    if regions == experts:
        for e in range(experts):
            arrays.update({f"expert{e:03d}_gate": gate[e], f"expert{e:03d}_up": up[e],
                           f"expert{e:03d}_down": down[e]})
    else:
        m = experts // regions
        for r in range(regions):
            members = slice(r * m, (r + 1) * m)
            arrays.update({f"region{r:03d}_gate": gate[members].reshape(m * d, f),
                           f"region{r:03d}_up": up[members].reshape(m * d, f),
                           f"region{r:03d}_down": down[members].reshape(m * f, d)})
    return arrays


def _trace(w: Workload, key: str) -> np.ndarray:
    """The trace array ``key`` the workload was built from (its builder records it in ``Workload.trace``)."""
    try:
        return w.trace[key]
    except KeyError:
        raise ArgumentError(f"workload {w.name!r} (graph {w.graph.name!r}) has no {key!r} trace; build it with "
                            f"stepsim's {w.name} builder") from None


def _attention_inputs(w: Workload, seed: int) -> dict:
    p = w.params
    b, g, d, max_n = p["batch"], p["query_per_kv_head"], p["head_dim"], p["max_n"]
    lengths = _trace(w, "kv_lengths")
    qk_std = d ** -0.25  # q.k then has standard deviation ~1: exp stays far from fp32 overflow
    q = _normal(seed, "q", (b * g, d), qk_std, bf16=True)
    new_k = _normal(seed, "k", (b, d), qk_std, bf16=True)
    new_v = _normal(seed, "v", (b, d), 1.0, bf16=True)
    caches = {}
    for name, std in (("k_cache", qk_std), ("v_cache", 1.0)):
        cache = np.zeros((b, max_n, d), np.float32)
        for r in range(b):  # per request, so a request's cache does not depend on the batch around it
            cache[r, :lengths[r]] = _normal(seed, name, (int(lengths[r]), d), std, r, bf16=True)
        caches[name] = cache.reshape(b * max_n, d)
    arrays = dict(caches)
    if p["strategy"] == "coarse":
        for r, reqs in enumerate(region_assignment(b, "coarse", p["regions"])):
            arrays[f"q_region{r}"] = q.reshape(b, g, d)[reqs].reshape(-1, d)
            arrays[f"k_region{r}"] = new_k[reqs]
            arrays[f"v_region{r}"] = new_v[reqs]
    else:
        arrays.update(q=q, k=new_k, v=new_v)
    return arrays



def _decoder_parts(w: Workload):
    """The attention (one per simulated KV head) and MoE views of a decoder workload, as the references of those
    kinds read them: ``(attention proxy, moe proxy or None)``."""
    from types import SimpleNamespace

    p = w.params
    attention = SimpleNamespace(name="attention", graph=w.graph, trace={"kv_lengths": _trace(w, "kv_lengths")},
                                params=dict(batch=p["batch"], query_per_kv_head=p["query_per_kv_head"],
                                            head_dim=p["head_dim"], max_n=p["max_n"], strategy=p["strategy"],
                                            regions=p["attention_regions"], softmax=p["softmax"], tile_n=32))
    moe = None
    if "experts" in p:
        moe = SimpleNamespace(name="moe", graph=w.graph, trace={"routing": _trace(w, "routing")},
                              params=dict(batch=p["batch"], hidden=p["hidden"], intermediate=p["intermediate"],
                                          top_k=p["top_k"], experts=p["experts"], regions=p["ffn_regions"],
                                          shared_intermediate=p["shared_intermediate"]))
    return attention, moe


def _decoder_inputs(w: Workload, seed: int) -> dict:
    """Each head's attention inputs as the attention workload draws them (head h from seed ``seed + 7919 h``), the
    output projection, the token activations, and the FFN's weights as the MoE workload draws them (dense: the
    ``shared_*`` FFN)."""
    p = w.params
    attention, moe = _decoder_parts(w)
    arrays = {}
    for h in range(p["kv_heads"]):
        arrays.update({f"h{h}_{k}": v for k, v in _attention_inputs(attention, seed + 7919 * h).items()})
        for j in range(p["query_per_kv_head"]):
            arrays[f"wo_h{h}_q{j}"] = _normal(seed, "wo", (p["head_dim"], p["hidden"]),
                                              (p["heads"] * p["head_dim"]) ** -0.5, h, j, bf16=True)
    if moe is not None:
        arrays.update(_moe_inputs(moe, seed))
    else:
        d, f = p["hidden"], p["dense_intermediate"]
        arrays.update(shared_gate=_normal(seed, "shared_gate", (d, f), d ** -0.5, bf16=True),
                      shared_up=_normal(seed, "shared_up", (d, f), d ** -0.5, bf16=True),
                      shared_down=_normal(seed, "shared_down", (f, d), f ** -0.5, bf16=True))
    arrays["x"] = _normal(seed, "x", (p["batch"], p["hidden"]), 1.0, bf16=True)
    return arrays


def _decoder_outputs(workload: Workload, inputs: dict) -> dict:
    """``y = h + ffn(h)`` with ``h = x + sum over query heads (attn @ W_o)``, and every head's KV caches after
    the append. Each head's attention output stays fp32 (the graph streams it on); each query head's product
    is rounded to fp32, as the graph's Matmul tiles, and their sum is taken in float64 (rounded once)."""
    who, p = "workload_reference", workload.params
    attention, moe = _decoder_parts(workload)
    b, q, hd = p["batch"], p["query_per_kv_head"], p["head_dim"]
    outputs, o = {}, np.zeros((b, p["hidden"]))
    for h in range(p["kv_heads"]):
        prefix = f"h{h}_"
        res = _attention_outputs(attention, {k[len(prefix):]: v for k, v in inputs.items() if k.startswith(prefix)})
        outputs[f"{prefix}k_cache"], outputs[f"{prefix}v_cache"] = res["k_cache"], res["v_cache"]
        out = res["out"].astype(np.float64).reshape(b, q, hd)
        for j in range(q):
            o += _f32(out[:, j, :] @ _f32(_take(inputs, f"wo_h{h}_q{j}", who)))
    hidden = _f32(_f32(o) + _f32(_take(inputs, "x", who)))
    if moe is not None:
        ffn = _moe_outputs(moe, {**inputs, "x": hidden})["y"].astype(np.float64)
    else:
        ffn = _ffn_rows(hidden, *(_f32(_take(inputs, f"shared_{part}", who)) for part in ("gate", "up", "down")))
    outputs["y"] = _f32(ffn + hidden).astype(np.float32)
    return outputs


def _decoder_reduction_length(workload: Workload, name: str) -> int:
    """The attention's (scores over head_dim, sums over the rows read), the output projection's (every query
    head's head_dim), then the FFN's (D + F [+ top_k]) and the two residual adds."""
    if name.endswith(("_k_cache", "_v_cache")):
        return 0
    p = workload.params
    attention, _ = _decoder_parts(workload)
    ffn = p["hidden"] + max(p.get("intermediate", 0), p.get("shared_intermediate", 0) or 0,
                            p.get("dense_intermediate") or 0) + p.get("top_k", 0)
    return _attention_reduction_length(attention, "out") + p["heads"] * p["head_dim"] + ffn + 2


def _take(inputs: dict, name: str, who: str) -> np.ndarray:
    try:
        return inputs[name]
    except KeyError:
        raise ArgumentError(f"{who}: inputs has no tensor {name!r} (keys: {sorted(inputs)})") from None


def workload_reference(workload: Workload, inputs: dict) -> dict[str, np.ndarray]:
    """What the workload's graph should store, keyed by stored tensor name, computed from ``inputs``.

    * ``swiglu``: ``{"y": swiglu_reference(x, w_gate, w_up, w_down)}``.
    * ``moe``: ``{"y": moe_reference(...)}`` with the routing the graph was built with (``workload.trace``),
      ``"routing_weights"`` as gate weights and the expert weights from ``"expert{e:03d}_*"`` or,
      time-multiplexed, the slices of ``"region{r:03d}_*"``; with shared experts, ``"shared_*"``.
    * ``attention``: ``{"out": ..., "k_cache": ..., "v_cache": ...}`` from :func:`gqa_decode_reference` with
      the graph's own settings: ``softmax`` and ``tile_n`` from the workload,
      ``include_tile_padding=True`` (the graph does not mask the tail of the last tile), in the graph's flat
      layouts, for the KV lengths in ``workload.trace``. The caches are the whole tensors
      after the append.

    ``inputs`` is used as given (e.g. from :func:`make_inputs`); give an engine that rounds bf16 tensors on
    load bf16-representable values, or the same rounding here, for a like-for-like comparison.

    Raises
    ------
    ArgumentError
        For an unknown workload kind or a missing input tensor.
    """
    return _kind_function("workload_reference", workload.name, "reference")(workload, inputs)


def _kind_function(who: str, kind: str, attr: str):
    """The registry's ``attr`` function of workload kind ``kind`` (:mod:`stepsim.workloads.kinds`)."""
    from stepsim.workloads.kinds import KINDS

    if kind not in KINDS or getattr(KINDS[kind], attr) is None:
        known = [k.name for k in KINDS.values() if getattr(k, attr) is not None]
        raise ArgumentError(f"{who}: unknown workload kind {kind!r}; expected {', '.join(map(repr, known[:-1]))} "
                            f"or {known[-1]!r}")
    return KINDS[kind].function(attr)


def _swiglu_outputs(workload: Workload, inputs: dict) -> dict:
    args = [_take(inputs, n, "workload_reference") for n in ("x", "w_gate", "w_up", "w_down")]
    return {"y": swiglu_reference(*args)}


def _moe_outputs(workload: Workload, inputs: dict) -> dict:
    who, p = "workload_reference", workload.params
    experts, regions, d, f = p["experts"], p["regions"], p["hidden"], p["intermediate"]
    if regions == experts:
        stacks = [np.stack([_take(inputs, f"expert{e:03d}_{part}", who) for e in range(experts)])
                  for part in ("gate", "up", "down")]
    else:
        m = experts // regions
        stacks = [np.concatenate([np.asarray(_take(inputs, f"region{r:03d}_{part}", who)).reshape(m, rows, cols)
                                  for r in range(regions)])
                  for part, rows, cols in (("gate", d, f), ("up", d, f), ("down", f, d))]
    shared = ([_take(inputs, f"shared_{part}", who) for part in ("gate", "up", "down")]
              if p.get("shared_intermediate") else None)
    y = moe_reference(_take(inputs, "x", who), _trace(workload, "routing"), _take(inputs, "routing_weights", who),
                      *stacks, shared=shared)
    return {"y": y}


def _attention_outputs(workload: Workload, inputs: dict) -> dict:
    who, p = "workload_reference", workload.params
    b, g, d = p["batch"], p["query_per_kv_head"], p["head_dim"]
    if p["strategy"] == "coarse":
        q = np.zeros((b, g, d), np.float32)
        new_k = np.zeros((b, d), np.float32)
        new_v = np.zeros((b, d), np.float32)
        for r, reqs in enumerate(region_assignment(b, "coarse", p["regions"])):
            q[reqs] = np.asarray(_take(inputs, f"q_region{r}", who)).reshape(len(reqs), g, d)
            new_k[reqs] = _take(inputs, f"k_region{r}", who)
            new_v[reqs] = _take(inputs, f"v_region{r}", who)
        q = q.reshape(b * g, d)
    else:
        q, new_k, new_v = (_take(inputs, n, who) for n in ("q", "k", "v"))
    res = gqa_decode_reference(q, _take(inputs, "k_cache", who), _take(inputs, "v_cache", who),
                               _trace(workload, "kv_lengths"), new_k, new_v, softmax=p["softmax"], order="tiled",
                               tile_n=p["tile_n"], include_tile_padding=True)
    return {"out": res.out, "k_cache": res.k_cache, "v_cache": res.v_cache}


class OutputCheck(NamedTuple):
    """One stored tensor compared with its reference."""

    name: str
    error: float  #: :func:`max_rel_error` of the run's tensor against the reference
    tolerance: float  #: :func:`tolerance_for` its storage dtype and reduction length
    passed: bool  #: ``error <= tolerance``


def _reduction_length(workload: Workload, name: str) -> int:
    """The reduction lengths along the longest path to tensor ``name`` (see :func:`tolerance_for`)."""
    return _kind_function("check_outputs", workload.name, "reduction_length")(workload, name)


def _swiglu_reduction_length(workload: Workload, name: str) -> int:
    return workload.params["hidden"] + workload.params["intermediate"]


def _moe_reduction_length(workload: Workload, name: str) -> int:
    """The routed sum, then the shared experts' rows added (+1)."""
    p = workload.params
    shared = p.get("shared_intermediate", 0)
    return p["hidden"] + max(p["intermediate"], shared) + p["top_k"] + (1 if shared else 0)


def _attention_reduction_length(workload: Workload, name: str) -> int:
    if name in ("k_cache", "v_cache"):
        return 0  # a pure append: no arithmetic
    p = workload.params
    seq_len_tiled, _ = kv_metadata(_trace(workload, "kv_lengths"), p["tile_n"])
    return p["head_dim"] + int(seq_len_tiled.max()) * p["tile_n"]  # scores over D, then sums over rows read


def check_outputs(workload: Workload, inputs: dict, outputs: dict) -> dict[str, OutputCheck]:
    """Compare a run's stored tensors with :func:`workload_reference`.

    Parameters
    ----------
    workload : Workload
        The simulated workload.
    inputs : dict of str to array
        The tensors the run loaded (e.g. :func:`make_inputs`).
    outputs : dict of str to array
        The tensors the run stored, by name (extra keys are ignored).

    Returns
    -------
    dict of str to OutputCheck
        One entry per tensor the graph stores. The tolerance uses the tensor's storage dtype
        (:func:`graph_tensors`) and the workload's reduction lengths: ``D + F`` (SwiGLU), ``D + F + top_k``
        (MoE), ``head_dim + max rows read per request`` (attention output), 0 (KV caches).

    Raises
    ------
    ArgumentError
        When ``outputs`` lacks a stored tensor.
    ShapeError
        When an output's shape differs from the reference.
    """
    expected = workload_reference(workload, inputs)
    specs = graph_tensors(workload)
    checks = {}
    for name, ref in expected.items():
        if name not in outputs:
            raise ArgumentError(f"check_outputs: outputs has no tensor {name!r} (keys: {sorted(outputs)})")
        sim = np.asarray(outputs[name])
        if sim.shape != ref.shape:
            raise ShapeError(f"check_outputs: output {name!r} has shape {list(sim.shape)}, the reference "
                             f"{list(ref.shape)}")
        err = max_rel_error(sim, ref)
        tol = tolerance_for(specs[name].dtype, _reduction_length(workload, name))
        checks[name] = OutputCheck(name, err, tol, err <= tol)
    return checks
