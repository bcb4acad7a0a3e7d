"""The MoE layer's NumPy reference, scaled-down models and seeded functional inputs (kind ``moe``)."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from stepsim.base.errors import ArgumentError, ShapeError
from stepsim.models.presets import MOE_MODELS, MoEModel, canonical_model_name
from stepsim.workloads.base import Workload
from stepsim.workloads.numerics import (
    as_f32,
    checked_array,
    expect_shape,
    ffn_rows,
    round_to_bf16,
    seeded_normal,
    seeded_rng,
    take_input,
    workload_trace,
)
from stepsim.workloads.routing import check_routing


# =========================================================================================================
# Mixture of Experts
# =========================================================================================================
class ExpertOutput(NamedTuple):
    """The rows one expert produces: ``rows[i]`` is the expert's FFN output for token ``tokens[i]``."""

    tokens: np.ndarray  #: int64 [c_e], token indices in increasing order
    rows: np.ndarray  #: float32 [c_e, D], unweighted FFN outputs


def _moe_args(who, x, routing, w_gate, w_up, w_down):
    x = checked_array(x, who, "x", 2)
    w_gate = checked_array(w_gate, who, "w_gate", 3)
    w_up = checked_array(w_up, who, "w_up", 3)
    w_down = checked_array(w_down, who, "w_down", 3)
    b, d = x.shape
    experts, dg, f = w_gate.shape
    if dg != d:
        raise ShapeError(f"{who}: w_gate has shape {list(w_gate.shape)}; expected [E, D, F] with D = {d} from x "
                         f"(x has shape {list(x.shape)})")
    expect_shape(who, "w_up", w_up, (experts, d, f), "[E, D, F] (the shape of w_gate)")
    expect_shape(who, "w_down", w_down, (experts, f, d), "[E, F, D]")
    r = np.asarray(routing)
    if r.ndim != 2 or r.shape[0] != b:
        raise ShapeError(f"{who}: routing has shape {list(r.shape)}, expected [B, top_k] with B = {b} tokens of x")
    routing = check_routing(r, experts, r.shape[1], source=f"{who}: routing")
    return x, routing, w_gate, w_up, w_down


def moe_expert_outputs(x, routing, w_gate, w_up, w_down) -> list[ExpertOutput]:
    """Each expert's unweighted FFN rows for the tokens routed to it, in token order.

    These are the values on expert ``e``'s stream of :func:`~stepsim.workloads.moe.build.build_moe` after
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
        rows = ffn_rows(x[tokens], w_gate[e], w_up[e], w_down[e]).astype(np.float32)
        out.append(ExpertOutput(tokens, rows))
    return out


def moe_reference(x, routing, gate_weights, w_gate, w_up, w_down, shared=None) -> np.ndarray:
    """The MoE layer: each token's top-k experts' SwiGLU FFNs, weighted by the routing weights and summed.

    ``y[t] = sum_s gate_weights[t, s] * ffn_{routing[t, s]}(x[t])`` with
    ``ffn_e(v) = (silu(v @ w_gate[e]) * (v @ w_up[e])) @ w_down[e]``.

    Mapping onto :func:`~stepsim.workloads.moe.build.build_moe`: ``x`` is tensor ``"x"``; ``routing`` is the trace
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
        weights = checked_array(gate_weights, who, "gate_weights", 2)
        expect_shape(who, "gate_weights", weights, (b, k), "[B, top_k] like routing")
    total = np.zeros_like(x)
    for e, (tokens, rows) in enumerate(_expert_outputs(x, routing, w_gate, w_up, w_down)):
        slot = np.argmax(routing[tokens] == e, axis=1)  # the slot where each of these tokens chose e
        # the graph's Map(Mul)(routing weight (1,1), row (1,D)) materialises an fp32 tile
        total[tokens] += as_f32(weights[tokens, slot][:, None] * rows.astype(np.float64))
    if shared is not None:
        s_gate, s_up, s_down = (as_f32(checked_array(w, who, f"shared {name}", 2))
                                for w, name in zip(shared, ("w_gate", "w_up", "w_down")))
        total = as_f32(as_f32(total) + ffn_rows(x, s_gate, s_up, s_down))
    return total.astype(np.float32)


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


def _moe_expert_weights(seed: int, experts: int, d: int, f: int):
    """[E, D, F], [E, D, F], [E, F, D] bf16-valued expert weights, each expert from its own stream."""
    gate = np.stack([seeded_normal(seed, "expert_gate", (d, f), d ** -0.5, e, bf16=True) for e in range(experts)])
    up = np.stack([seeded_normal(seed, "expert_up", (d, f), d ** -0.5, e, bf16=True) for e in range(experts)])
    down = np.stack([seeded_normal(seed, "expert_down", (f, d), f ** -0.5, e, bf16=True) for e in range(experts)])
    return gate, up, down


#: tensors sharded over the chips by expert parallelism (chip c holds rows ``shard_bounds[c]..`` as ``<name>.<c>``)
SHARDED = ("x", "routing_weights")


def stack_inputs(p: dict, seed: int) -> dict:
    """A stack's tensors (moe/many_chips.py): ``x``, and per layer i its routing weights, experts (and shared
    experts) as ``layer<i>.<name>``, each drawn from its own seeded stream; with ``--ep`` (sharding.expert_parallel)
    ``x`` and every layer's routing weights sharded over the chips as ``<name>.<c>`` (the same values)."""
    b, d, f, k, experts = p["batch"], p["hidden"], p["intermediate"], p["top_k"], p["experts"]
    fs = p.get("shared_intermediate", 0)
    arrays = {"x": seeded_normal(seed, "x", (b, d), 1.0, bf16=True)}
    for i in range(p["layers"]):
        logits = seeded_rng(seed, f"layer{i}.routing_logits").standard_normal((b, k))
        soft = np.exp(logits - logits.max(axis=1, keepdims=True))
        arrays[f"layer{i}.routing_weights"] = round_to_bf16(soft / soft.sum(axis=1, keepdims=True))
        for part, shape in (("gate", (d, f)), ("up", (d, f)), ("down", (f, d))):
            for e in range(experts):
                arrays[f"layer{i}.expert{e:03d}_{part}"] = seeded_normal(seed, f"layer{i}.expert_{part}", shape,
                                                                         shape[0] ** -0.5, e, bf16=True)
        if fs:
            for part, shape in (("gate", (d, fs)), ("up", (d, fs)), ("down", (fs, d))):
                arrays[f"layer{i}.shared_{part}"] = seeded_normal(seed, f"layer{i}.shared_{part}", shape,
                                                                  shape[0] ** -0.5, bf16=True)
    if "shard_bounds" in p:
        sharded = ["x"] + [f"layer{i}.routing_weights" for i in range(p["layers"])]
        arrays = {name: a for name, a in arrays.items() if name not in sharded} | {
            f"{name}.{c}": arrays[name][lo:hi] for name in sharded
            for c, (lo, hi) in enumerate(zip(p["shard_bounds"], p["shard_bounds"][1:])) if hi > lo}
    tp = p.get("tp")
    if tp is not None:  # --tp (workloads/sharding.py): chip t holds columns t F/T.. of gate / up, those rows of down
        split = {name: a for name, a in arrays.items() if name.endswith(("_gate", "_up", "_down"))}
        for name, a in split.items():
            del arrays[name]
            n = a.shape[0 if name.endswith("_down") else 1] // tp
            arrays.update({f"{name}.{t}": a[t * n:(t + 1) * n] if name.endswith("_down") else a[:, t * n:(t + 1) * n]
                           for t in range(tp)})
    return arrays


def _unsplit(inputs: dict, name: str, tp, who: str):
    """``name`` whole: the tensor itself, or (``tp``: tensor parallelism) its chips' column (down: row) blocks put
    together."""
    if tp is None:
        return take_input(inputs, name, who)
    return np.concatenate([take_input(inputs, f"{name}.{t}", who) for t in range(tp)],
                          axis=0 if name.endswith("_down") else 1)


def _unsharded(inputs: dict, name: str, bounds, who: str):
    """``name`` whole: the tensor itself, or (``bounds``: expert parallelism) its chips' shards put together."""
    if bounds is None:
        return take_input(inputs, name, who)
    return np.concatenate([take_input(inputs, f"{name}.{c}", who) for c in range(len(bounds) - 1)
                           if bounds[c + 1] > bounds[c]])


def _stack_outputs(workload: Workload, inputs: dict) -> dict:
    """``y = moe_{L-1}(.. moe_0(x))``, layer i routed by the trace's layer i; a layer's output rows enter the next
    layer in fp32 (no bf16 store between layers)."""
    who, p = "workload_reference", workload.params
    routing = workload_trace(workload, "routing")  # [layers, tokens, top_k]
    bounds = p.get("shard_bounds")
    y = _unsharded(inputs, "x", bounds, who)
    tp = p.get("tp")
    for i in range(p["layers"]):
        stacks = [np.stack([_unsplit(inputs, f"layer{i}.expert{e:03d}_{part}", tp, who) for e in range(p["experts"])])
                  for part in ("gate", "up", "down")]
        shared = ([_unsplit(inputs, f"layer{i}.shared_{part}", tp, who) for part in ("gate", "up", "down")]
                  if p.get("shared_intermediate") else None)
        y = moe_reference(y, routing[i], _unsharded(inputs, f"layer{i}.routing_weights", bounds, who), *stacks,
                          shared=shared)
    if tp is not None:  # after the last all-reduce chip t holds every chunk k (rows k B/T ..) as y<t>.<k>
        rows = y.shape[0] // tp
        return {f"y{t}.{k}": y[k * rows:(k + 1) * rows] for t in range(tp) for k in range(tp)}
    if bounds is not None:
        return {f"y.{c}": y[lo:hi] for c, (lo, hi) in enumerate(zip(bounds, bounds[1:])) if hi > lo}
    return {"y": y}


def inputs(w: Workload, seed: int) -> dict:
    p = w.params
    if "layers" in p:
        return stack_inputs(p, seed)
    b, d, f, k, experts, regions = p["batch"], p["hidden"], p["intermediate"], p["top_k"], p["experts"], p["regions"]
    logits = seeded_rng(seed, "routing_logits").standard_normal((b, k))
    soft = np.exp(logits - logits.max(axis=1, keepdims=True))
    arrays = {
        "x": seeded_normal(seed, "x", (b, d), 1.0, bf16=True),
        "routing_weights": round_to_bf16(soft / soft.sum(axis=1, keepdims=True)),
    }
    gate, up, down = _moe_expert_weights(seed, experts, d, f)
    fs = p.get("shared_intermediate", 0)
    if fs:
        arrays.update({"shared_gate": seeded_normal(seed, "shared_gate", (d, fs), d ** -0.5, bf16=True),
                       "shared_up": seeded_normal(seed, "shared_up", (d, fs), d ** -0.5, bf16=True),
                       "shared_down": seeded_normal(seed, "shared_down", (fs, d), fs ** -0.5, bf16=True)})
    if "shard_bounds" in p:  # expert parallel: each chip holds its shard of the batch (moe/sharded.py)
        arrays = {f"{name}.{c}": a[lo:hi] for name, a in arrays.items() if name in SHARDED
                  for c, (lo, hi) in enumerate(zip(p["shard_bounds"], p["shard_bounds"][1:])) if hi > lo} | \
            {name: a for name, a in arrays.items() if name not in SHARDED}
    tp = p.get("tp")
    if tp is not None:  # chip c: columns c F/N.. of every gate / up projection, those rows of down (build.py)
        shared = {name: arrays.pop(name) for name in ("shared_gate", "shared_up", "shared_down") if name in arrays}
        for c in range(tp):
            cols, shared_cols = slice(c * f // tp, (c + 1) * f // tp), slice(c * fs // tp, (c + 1) * fs // tp)
            for e in range(experts):
                arrays.update({f"expert{e:03d}_gate.{c}": gate[e][:, cols], f"expert{e:03d}_up.{c}": up[e][:, cols],
                               f"expert{e:03d}_down.{c}": down[e][cols]})
            if shared:
                arrays.update({f"shared_gate.{c}": shared["shared_gate"][:, shared_cols],
                               f"shared_up.{c}": shared["shared_up"][:, shared_cols],
                               f"shared_down.{c}": shared["shared_down"][shared_cols]})
    elif regions == experts:
        for e in range(experts):
            arrays.update({f"expert{e:03d}_gate": gate[e], f"expert{e:03d}_up": up[e],
                           f"expert{e:03d}_down": down[e]})
    else:
        m = experts // regions
        for r, members in enumerate(_region_members(p)):
            arrays.update({f"region{r:03d}_gate": gate[members].reshape(m * d, f),
                           f"region{r:03d}_up": up[members].reshape(m * d, f),
                           f"region{r:03d}_down": down[members].reshape(m * f, d)})
    return _split_lanes(arrays, p)


def _lane_tensors(p) -> list[tuple[str, int]]:
    """``(tensor, members)`` of every expert or region weight a mapped layer splits into lanes (build.py
    ``_expert_ffn``): ``members`` experts stacked in it (1 for an expert's own tensor)."""
    experts, regions = p["experts"], p["regions"]
    if regions == experts:
        return [(f"expert{e:03d}_{part}", 1) for e in range(experts) for part in ("gate", "up", "down")]
    return [(f"region{r:03d}_{part}", experts // regions) for r in range(regions) for part in ("gate", "up", "down")]


def _split_lanes(arrays: dict, p) -> dict:
    """With ``lanes`` L: each weight split into its lanes' tensors ``<name>.lane<j>``: F columns ``j F/L ..`` of
    gate and up, the matching rows of each member's down (build.py ``_expert_ffn``)."""
    lanes, f = p.get("lanes", 1), p["intermediate"]
    if lanes == 1:
        return arrays
    width = f // lanes
    for name, members in _lane_tensors(p):
        whole = arrays.pop(name)
        for j in range(lanes):
            if name.endswith("_down"):  # [members * F, D]: each member's rows j*width..
                lane = whole.reshape(members, f, -1)[:, j * width:(j + 1) * width].reshape(members * width, -1)
            else:
                lane = whole[:, j * width:(j + 1) * width]
            arrays[f"{name}.lane{j}"] = np.ascontiguousarray(lane)
    return arrays


def _join_lanes(inputs: dict, p, who: str) -> dict:
    """:func:`_split_lanes` undone: each weight put back together from its lanes' tensors."""
    lanes, f = p.get("lanes", 1), p["intermediate"]
    if lanes == 1:
        return inputs
    joined = dict(inputs)
    for name, members in _lane_tensors(p):
        parts = [np.asarray(take_input(inputs, f"{name}.lane{j}", who)) for j in range(lanes)]
        if name.endswith("_down"):
            joined[name] = np.concatenate([part.reshape(members, f // lanes, -1) for part in parts],
                                          axis=1).reshape(members * f, -1)
        else:
            joined[name] = np.concatenate(parts, axis=1)
    return joined


def _region_members(p) -> list:
    """Each time-multiplexed region's experts: contiguous blocks, or with ``--ep`` each chip's experts."""
    experts, regions = p["experts"], p["regions"]
    m = experts // regions
    return p.get("region_experts") or [list(range(r * m, (r + 1) * m)) for r in range(regions)]


def outputs(workload: Workload, inputs: dict) -> dict:
    who, p = "workload_reference", workload.params
    if "layers" in p:
        return _stack_outputs(workload, inputs)
    experts, regions, d, f = p["experts"], p["regions"], p["hidden"], p["intermediate"]
    inputs = _join_lanes(inputs, p, who)
    tp = p.get("tp")
    if tp is not None:  # the chips' column shards put back together
        stacks = [np.stack([np.concatenate([take_input(inputs, f"expert{e:03d}_{part}.{c}", who) for c in range(tp)],
                                           axis=0 if part == "down" else 1) for e in range(experts)])
                  for part in ("gate", "up", "down")]
    elif regions == experts:
        stacks = [np.stack([take_input(inputs, f"expert{e:03d}_{part}", who) for e in range(experts)])
                  for part in ("gate", "up", "down")]
    else:
        m = experts // regions
        order = np.argsort(np.concatenate(_region_members(p)), kind="stable")  # region-major rows -> expert order
        stacks = [np.concatenate([np.asarray(take_input(inputs, f"region{r:03d}_{part}", who)).reshape(m, rows, cols)
                                  for r in range(regions)])[order]
                  for part, rows, cols in (("gate", d, f), ("up", d, f), ("down", f, d))]
    shared = None
    if p.get("shared_intermediate") and tp is not None:
        shared = [np.concatenate([take_input(inputs, f"shared_{part}.{c}", who) for c in range(tp)],
                                 axis=0 if part == "down" else 1) for part in ("gate", "up", "down")]
    elif p.get("shared_intermediate"):
        shared = [take_input(inputs, f"shared_{part}", who) for part in ("gate", "up", "down")]
    bounds = p.get("shard_bounds")
    if bounds is None:
        x, gate_weights = take_input(inputs, "x", who), take_input(inputs, "routing_weights", who)
    else:
        x, gate_weights = (np.concatenate([take_input(inputs, f"{name}.{c}", who) for c in range(len(bounds) - 1)
                                           if bounds[c + 1] > bounds[c]])  # an empty shard has no tensors
                           for name in SHARDED)
    y = moe_reference(x, workload_trace(workload, "routing"), gate_weights, *stacks, shared=shared)
    if tp is not None and bounds is not None:  # tp x ep: chip g tp + t holds chunk k of group g's rows
        return {f"y{g * tp + t}.{k}": y[lo + k * (hi - lo) // tp:lo + (k + 1) * (hi - lo) // tp]
                for g, (lo, hi) in enumerate(zip(bounds, bounds[1:])) for t in range(tp) for k in range(tp)}
    if tp is not None:  # after the all-reduce every chip c holds rows k B/N.. of y as y<c>.<k>
        rows = y.shape[0] // tp
        return {f"y{c}.{k}": y[k * rows:(k + 1) * rows] for c in range(tp) for k in range(tp)}
    if bounds is None:
        return {"y": y}
    return {f"y.{c}": y[lo:hi] for c, (lo, hi) in enumerate(zip(bounds, bounds[1:])) if hi > lo}


def reduction_length(workload: Workload, name: str) -> int:
    """The routed sum, then the shared experts' rows added (+1)."""
    p = workload.params
    shared = p.get("shared_intermediate", 0)
    return (p["hidden"] + max(p["intermediate"], shared) + p["top_k"] + (1 if shared else 0)) * p.get("layers", 1)
