"""Checking functional-mode runs: seeded inputs, NumPy references and the comparison, for every workload kind.

Each kind's reference lives in its package (``stepsim/workloads/<kind>/reference.py``) and is found through the
kinds' registry (:mod:`stepsim.workloads.kinds`); the shared numerics are in :mod:`stepsim.workloads.numerics`.
The public names below are re-exported here so ``from stepsim.workloads.reference import ...`` keeps working.

Each reference is the plain math of one builder in :mod:`stepsim.workloads`, read off its operators:

* :func:`swiglu_reference` — :func:`~stepsim.workloads.swiglu.build.build_swiglu` stores
  ``y = (silu(x @ w_gate) * (x @ w_up)) @ w_down`` into tensor ``"y"``.
* :func:`moe_reference` — :func:`~stepsim.workloads.moe.build.build_moe` routes each token to its top-k experts,
  runs each expert's SwiGLU FFN, scales expert ``e``'s row of token ``t`` by the routing weight of the slot
  where ``t`` chose ``e`` (tensor ``"routing_weights"``) and sums the ``k`` scaled rows into tensor ``"y"``.
  Static tiling, dynamic tiling, F tiling and configuration time-multiplexing (``regions``) do not change
  the values (see :func:`moe_reference`).
* :func:`gqa_decode_reference` — :func:`~stepsim.workloads.attention.build.build_attention` appends the new
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

from typing import NamedTuple

import numpy as np

from stepsim.base.errors import ArgumentError, GraphError, ShapeError
from stepsim.workloads.attention.reference import AttentionReference, gqa_decode_reference
from stepsim.workloads.base import Workload
from stepsim.workloads.moe.reference import ExpertOutput, moe_expert_outputs, moe_reference, small_moe_model
from stepsim.workloads.numerics import (
    TensorSpec,
    bf16_bits,
    graph_tensors,
    max_rel_error,
    round_to_bf16,
    silu,
    tolerance_for,
    unit_roundoff,
)
from stepsim.workloads.swiglu.reference import swiglu_reference

__all__ = [
    "AttentionReference", "ExpertOutput", "OutputCheck", "TensorSpec", "bf16_bits", "check_outputs",
    "gqa_decode_reference", "graph_tensors", "make_inputs", "max_rel_error", "moe_expert_outputs",
    "moe_reference", "round_to_bf16", "silu", "small_moe_model", "swiglu_reference", "tolerance_for",
    "unit_roundoff", "workload_reference",
]


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


class OutputCheck(NamedTuple):
    """One stored tensor compared with its reference."""

    name: str
    error: float  #: :func:`max_rel_error` of the run's tensor against the reference
    tolerance: float  #: :func:`tolerance_for` its storage dtype and reduction length
    passed: bool  #: ``error <= tolerance``


def _reduction_length(workload: Workload, name: str) -> int:
    """The reduction lengths along the longest path to tensor ``name`` (see :func:`tolerance_for`)."""
    return _kind_function("check_outputs", workload.name, "reduction_length")(workload, name)


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
