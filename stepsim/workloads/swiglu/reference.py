"""The SwiGLU validation layer's NumPy reference and seeded functional inputs (kind ``swiglu``)."""

from __future__ import annotations

import numpy as np

from stepsim.base.errors import ShapeError
from stepsim.workloads.base import Workload
from stepsim.workloads.numerics import (
    checked_array,
    expect_shape,
    ffn_rows,
    seeded_normal,
    take_input,
)


# =========================================================================================================
# SwiGLU
# =========================================================================================================
def swiglu_reference(x, w_gate, w_up, w_down) -> np.ndarray:
    """The SwiGLU validation layer: ``y = (silu(x @ w_gate) * (x @ w_up)) @ w_down``.

    Maps onto :func:`~stepsim.workloads.swiglu.build.build_swiglu`'s tensors ``"x"``, ``"w_gate"``, ``"w_up"``,
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
    x = checked_array(x, who, "x", 2)
    w_gate = checked_array(w_gate, who, "w_gate", 2)
    w_up = checked_array(w_up, who, "w_up", 2)
    w_down = checked_array(w_down, who, "w_down", 2)
    d = x.shape[1]
    if w_gate.shape[0] != d:
        raise ShapeError(f"{who}: w_gate has shape {list(w_gate.shape)}; its rows must equal x's D = {d} "
                         f"(x has shape {list(x.shape)})")
    f = w_gate.shape[1]
    expect_shape(who, "w_up", w_up, (d, f), "[D, F] (the shape of w_gate)")
    expect_shape(who, "w_down", w_down, (f, d), "[F, D]")
    return ffn_rows(x, w_gate, w_up, w_down).astype(np.float32)


def inputs(w: Workload, seed: int) -> dict:
    b, d, f = w.params["batch"], w.params["hidden"], w.params["intermediate"]
    arrays = {
        "x": seeded_normal(seed, "x", (b, d), 1.0, bf16=False),
        "w_gate": seeded_normal(seed, "w_gate", (d, f), d ** -0.5, bf16=False),
        "w_up": seeded_normal(seed, "w_up", (d, f), d ** -0.5, bf16=False),
        "w_down": seeded_normal(seed, "w_down", (f, d), f ** -0.5, bf16=False),
    }
    tp, layers = w.params.get("tp"), w.params.get("layers")
    if layers is not None:  # a stack (build.py, _stack): layer i's weights as layer<i>.<name>
        return {"x": arrays["x"]} | {f"layer{i}.{name}": seeded_normal(seed, f"layer{i}.{name}", a.shape,
                                                                      a.shape[0] ** -0.5, bf16=False)
                                     for i in range(layers) for name, a in arrays.items() if name != "x"}
    if tp is None:
        return arrays
    cols = f // tp  # chip c: columns c*cols.. of w_gate and w_up, those rows of w_down (build.py, _tp)
    shards = {"x": arrays["x"]}
    for c in range(tp):
        part = slice(c * cols, (c + 1) * cols)
        shards.update({f"w_gate.{c}": arrays["w_gate"][:, part], f"w_up.{c}": arrays["w_up"][:, part],
                       f"w_down.{c}": arrays["w_down"][part]})
    return shards


def _whole(inputs: dict, name: str, tp: int, axis: int, who: str) -> np.ndarray:
    """A tensor-parallel weight put back together from its chips' shards ``<name>.<c>``."""
    return np.concatenate([np.asarray(take_input(inputs, f"{name}.{c}", who)) for c in range(tp)], axis=axis)


def outputs(workload: Workload, inputs: dict) -> dict:
    who, tp, layers = "workload_reference", workload.params.get("tp"), workload.params.get("layers")
    if layers is not None:  # the stack: y = f_{L-1}(.. f_0(x)), every layer's output rounded to fp32 as stored
        y = take_input(inputs, "x", who)
        for i in range(layers):
            y = swiglu_reference(y, *[take_input(inputs, f"layer{i}.{n}", who) for n in ("w_gate", "w_up", "w_down")])
        return {"y": y}
    if tp is None:
        return {"y": swiglu_reference(*[take_input(inputs, n, who) for n in ("x", "w_gate", "w_up", "w_down")])}
    y = swiglu_reference(take_input(inputs, "x", who), _whole(inputs, "w_gate", tp, 1, who),
                         _whole(inputs, "w_up", tp, 1, who), _whole(inputs, "w_down", tp, 0, who))
    rows = y.shape[0] // tp  # after the all-reduce every chip c holds chunk k of y as y<c>.<k>
    return {f"y{c}.{k}": y[k * rows:(k + 1) * rows] for c in range(tp) for k in range(tp)}


def reduction_length(workload: Workload, name: str) -> int:
    """D + F per layer: a stack's rounding errors add up over its layers."""
    return (workload.params["hidden"] + workload.params["intermediate"]) * workload.params.get("layers", 1)
