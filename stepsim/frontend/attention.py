"""Pass 1c: the attention patterns of gpt-oss-style exports (issue 43): a sliding-window mask and attention sinks.

* **Masks.** ``Where(cond, scores, fill)`` with a constant condition and a constant scalar fill (transformers'
  ``masked_fill`` of a boolean mask built from ``Range`` / ``Less`` / ``Where``, folded to a constant by
  :mod:`stepsim.frontend.shapes`) becomes ``Add(scores, mask)`` with the additive mask ``where(cond, 0, fill)``:
  the same values (``x + 0 == x``; a masked logit's exponential is 0 either way), lowered as the causal mask is.
  Every additive ``[.., Sq, Sk]`` mask that reaches a Softmax is then classified: *causal* (query ``i`` sees keys
  ``j <= i + Sk - Sq``), *sliding window w* (also ``j > i + Sk - Sq - w``: gpt-oss's ``sliding_window``) or
  another mask; a mask that hides every key of a query row is a one-line error (its softmax is 0 / 0).
* **Sinks.** ``Concat([scores, sinks], axis=-1)``, optionally minus its ``ReduceMax`` (gpt-oss subtracts the
  row max itself), ``Softmax``, ``Slice`` keeping the first ``Sk`` columns (transformers' ``GptOssAttention``
  eager path: one learned logit per head joins the softmax's denominator and is dropped) becomes one
  ``SinkSoftmax(scores, sinks)`` node: ``p = exp(z - m) / (sum exp(z - m) + exp(s_h - m))`` with
  ``m = max(max z, s_h)``, no ``Sk + 1``-wide tile ever built.

The recognised patterns go into :attr:`stepsim.frontend.ir.Model.patterns` (node name -> what it is), which
``from_onnx`` puts in the workload's ``params["patterns"]`` and :meth:`FrontendReport.describe` prints.
"""

from __future__ import annotations

import numpy as np

from stepsim.base.errors import FrontendError
from stepsim.frontend.ir import Model, Node, scalar

#: a logit at or below this is masked (exporters fill with -inf, float32's min or -1e9; unmasked entries are 0)
MASKED = -1e4


def raise_attention(model: Model) -> Model:
    """``model`` with the patterns of the module docstring rewritten and recorded in ``model.patterns``."""
    readers = model.consumers()
    model.nodes = [_where_to_add(model, n, readers) for n in model.nodes]
    _raise_sinks(model)
    _classify_masks(model)
    return model


def _where_to_add(model: Model, node: Node, readers: dict) -> Node:
    """The Where as the Add of its additive mask when that equals it: a fill of -inf (``x + -inf == -inf``), or a
    fill at or below :data:`MASKED` read only by Softmax / the sinks' Concat (``exp`` of either is 0)."""
    if node.op_type != "Where" or len(node.inputs) != 3:
        return node
    cond, a, b = node.inputs
    keep_a = model.is_const(b)  # Where(cond, scores, fill) keeps where cond; masked_fill(cond, fill) is the reverse
    x, fill = (a, b) if keep_a else (b, a)
    if not model.is_const(cond) or not model.is_const(fill) or model.is_const(x) or \
            scalar(model.consts[fill]) is None:
        return node
    value = np.float32(scalar(model.consts[fill]))
    softmax_only = all(r.op_type in ("Softmax", "Concat") for r in readers.get(node.outputs[0], [])) and \
        node.outputs[0] not in model.outputs
    if not (value == -np.inf or (value <= MASKED and softmax_only)):
        return node  # a Where that is no attention mask stays (and is refused as unsupported)
    c = model.consts[cond].astype(bool)
    name = f"{node.name}.mask"
    model.add_const(name, np.where(c if keep_a else ~c, np.float32(0), value).astype(np.float32))
    return Node(node.name, "Add", [x, name], list(node.outputs), {"raised_from": "Where"})


def _only(readers, v, outputs, op_type):
    r = readers.get(v, [])
    return r[0] if len(r) == 1 and r[0].op_type == op_type and v not in outputs else None


def _slice_bounds(model: Model, node: Node, dim: int):
    """``(start, end)`` of a last-dim Slice with constant bounds and step 1, else None."""
    args = [model.consts.get(v) if v else None for v in node.inputs[1:5]]
    if len(args) < 3 or any(a is None for a in args[:3]) or (len(args) > 3 and args[3] is not None
                                                             and int(args[3].reshape(-1)[0]) != 1):
        return None
    starts, ends, axes = (a.reshape(-1) for a in args[:3])
    rank = len(model.shapes[node.inputs[0]])
    if len(axes) != 1 or int(axes[0]) % rank != rank - 1:
        return None
    return tuple(min(max(int(v) + (dim if int(v) < 0 else 0), 0), dim) for v in (starts[0], ends[0]))


def _raise_sinks(model: Model) -> None:
    producers, readers, outputs = model.producer(), model.consumers(), set(model.outputs)
    drop, replace = set(), {}
    for cat in model.nodes:
        if cat.op_type != "Concat" or len(cat.inputs) != 2:
            continue
        z, s = cat.inputs
        shape = model.shapes[cat.outputs[0]]
        rank = len(shape)
        if cat.attrs.get("axis", 0) % rank != rank - 1 or model.is_const(z) or not model.is_const(s) or \
                model.shapes[s][-1] != 1:
            continue
        v, chain = cat.outputs[0], [cat]
        sub = next((n for n in readers.get(v, []) if n.op_type == "Sub" and n.inputs[0] == v), None)
        if sub is not None:  # gpt-oss: combined - combined.max(-1, keepdim=True)
            mx = producers.get(sub.inputs[1])
            if mx is None or mx.op_type != "ReduceMax" or mx.inputs[0] != v or \
                    {n.name for n in readers[v]} != {sub.name, mx.name} or sub.inputs[1] in outputs:
                continue
            chain += [mx, sub]
            v = sub.outputs[0]
        soft = _only(readers, v, outputs, "Softmax")
        if soft is None or soft.attrs.get("axis", -1) % rank != rank - 1:
            continue
        sl = _only(readers, soft.outputs[0], outputs, "Slice")
        if sl is None:
            continue
        sk = model.shapes[z][-1]
        bounds = _slice_bounds(model, sl, sk + 1)
        if bounds != (0, sk):
            got = "not a constant last-dim slice" if bounds is None else f"[{bounds[0]}, {bounds[1]})"
            raise FrontendError(f"{sl.describe()}: after the attention sinks' Softmax ({soft.name!r}) the slice must "
                                f"drop exactly the sink column (keep [0, {sk}) of the last dim), got {got}")
        per_head = _per_head(model, cat, s)
        name = f"{cat.name}.sinks"
        model.add_const(name, per_head, like=s)  # the model's sinks: stored as it stores them
        drop.update(n.name for n in chain + [soft])
        replace[sl.name] = Node(sl.name, "SinkSoftmax", [z, name], list(sl.outputs))
        model.patterns[sl.name] = f"attention sinks ({per_head.size} heads)"
    model.nodes = [replace.get(n.name, n) for n in model.nodes if n.name not in drop]


def _per_head(model: Model, cat: Node, s: str) -> np.ndarray:
    """The sinks ``[heads]`` of the constant ``s`` ``[.., H, Sq, 1]``: one logit per head, the same for every
    batch and query row (FrontendError naming the Concat otherwise)."""
    c = model.consts[s].astype(np.float32)
    shape = model.shapes[cat.inputs[0]]
    full = np.broadcast_to(c, tuple(shape[:-1]) + (1,)) if c.ndim <= len(shape) else None
    if full is None or full.ndim < 2:
        raise FrontendError(f"{cat.describe()}: the attention sinks {s!r} {list(c.shape)} do not broadcast against "
                            f"the scores {list(shape)}")
    heads = shape[-3] if len(shape) >= 3 else 1
    rows = full.reshape(-1, heads, shape[-2])  # [batch, heads, Sq]
    if not (rows == rows[:1, :, :1]).all():
        raise FrontendError(f"{cat.describe()}: the attention sinks {s!r} must be one logit per head (the same for "
                            f"every batch and query row); they vary along the batch or the query rows")
    return rows[0, :, 0].copy()


def _classify_masks(model: Model) -> None:
    """Record each additive mask feeding a Softmax (directly or through a SinkSoftmax) in ``model.patterns``."""
    readers = model.consumers()
    for node in model.nodes:
        if node.op_type != "Add" or len(node.inputs) != 2:
            continue
        mask = next((v for v in node.inputs if model.is_const(v)), None)
        y = node.outputs[0]
        if mask is None or not any(r.op_type in ("Softmax", "SinkSoftmax") and r.inputs[0] == y
                                   for r in readers.get(y, [])):
            continue
        shape = model.shapes[y]
        c = model.consts[mask]
        if c.ndim < 2 or c.shape[-2:] != tuple(shape[-2:]):
            continue
        sq, sk = shape[-2:]
        flat = c.reshape(-1, sq, sk)
        if not (flat == flat[:1]).all():
            continue
        keep = flat[0] > MASKED
        if not ((flat[0] == 0) | ~keep).all():
            continue  # an additive bias (ALiBi and friends), not a mask
        empty = np.flatnonzero(~keep.any(axis=1))
        if empty.size:
            raise FrontendError(f"node {node.name!r} ({node.attrs.get('raised_from', 'Add')}): the attention mask hides every key of query row "
                                f"{int(empty[0])} (its softmax is 0 / 0); a causal or sliding-window mask keeps "
                                f"each query's own position")
        i, j = np.arange(sq)[:, None] + (sk - sq), np.arange(sk)[None, :]
        if (keep == (j <= i)).all():
            model.patterns[node.name] = "causal mask"
            continue
        w = int(keep.sum(axis=1).max())
        if (keep == ((j <= i) & (j > i - w))).all():
            model.patterns[node.name] = f"sliding-window mask (window {w})"
