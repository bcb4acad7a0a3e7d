"""Pass 1b: raise patterns exporters decompose back to single ops, so they lower to one STeP function.

* ``Mul(x, Sigmoid(x))`` (PyTorch's SiLU) becomes ``Swish(x)`` (ONNX opset 24, ``alpha = 1``), lowered to
  ``Map(Silu)``: one operator of 8 FLOPs per element instead of a Sigmoid (7) and a Mul (1), the form the
  hand-written FFN layers use. The Sigmoid goes when the Mul is its only reader.
* RoPE's ``rotate_half(x) = Concat(Neg(x[..., d/2:]), x[..., :d/2])`` over the last dim (Slice / Neg / Concat)
  becomes ``MatMul(x, R)`` with the constant signed permutation ``R`` (``d x d``): a weight the MatMul lowering
  streams, where slicing a tile's columns has no STeP operator. The Slices and the Neg go when only it reads them.
"""

from __future__ import annotations

import numpy as np

from stepsim.frontend.ir import Model, Node


def raise_patterns(model: Model) -> Model:
    """``model`` with the patterns above rewritten (a new node list; values keep their names)."""
    producers = model.producer()
    readers = model.consumers()
    outputs = set(model.outputs)
    drop = set()
    nodes = []
    for node in model.nodes:
        if node.op_type == "Mul" and len(node.inputs) == 2:
            for x, s in (node.inputs, node.inputs[::-1]):
                sig = producers.get(s)
                if (sig is not None and sig.op_type == "Sigmoid" and sig.inputs[0] == x and s not in outputs
                        and len(readers.get(s, [])) == 1):
                    node = Node(node.name, "Swish", [x], list(node.outputs), {"alpha": 1.0})
                    drop.add(sig.name)
                    break
        if node.op_type == "Concat":
            node = _rotate_half(model, node, producers, readers, outputs, drop)
        nodes.append(node)
    model.nodes = [n for n in nodes if n.name not in drop]
    return model


def _last_dim_slice(model: Model, node, x_dim: int):
    """``(x, start, end)`` of a Slice of the last dim with constant bounds and step 1, else None."""
    if node is None or node.op_type != "Slice" or len(node.inputs) < 4:
        return None
    args = [model.consts.get(v) if v else None for v in node.inputs[1:5]]
    if any(a is None for a in args[:3]) or (len(args) > 3 and args[3] is not None and int(args[3][0]) != 1):
        return None
    starts, ends, axes = (a.reshape(-1) for a in args[:3])
    rank = len(model.shapes[node.inputs[0]])
    if len(axes) != 1 or int(axes[0]) % rank != rank - 1:
        return None
    start, end = (min(max(int(v) + (x_dim if int(v) < 0 else 0), 0), x_dim) for v in (starts[0], ends[0]))
    return node.inputs[0], start, end


def _rotate_half(model: Model, node, producers, readers, outputs, drop):
    """The Concat as ``MatMul(x, R)`` if it is RoPE's rotate_half (module docstring), else the Concat."""
    if len(node.inputs) != 2:
        return node
    out_shape = model.shapes[node.outputs[0]]
    rank, d = len(out_shape), out_shape[-1]
    if node.attrs.get("axis", 0) % rank != rank - 1 or d % 2:
        return node
    neg = producers.get(node.inputs[0])
    if neg is None or neg.op_type != "Neg":
        return node
    hi, lo = producers.get(neg.inputs[0]), producers.get(node.inputs[1])
    hi_s, lo_s = _last_dim_slice(model, hi, d), _last_dim_slice(model, lo, d)
    h = d // 2
    if hi_s is None or lo_s is None or hi_s[0] != lo_s[0] or hi_s[1:] != (h, d) or lo_s[1:] != (0, h):
        return node
    inner = [(neg.outputs[0], neg), (hi.outputs[0], hi), (lo.outputs[0], lo)]
    if any(v in outputs or len(readers.get(v, [])) != 1 for v, _ in inner):
        return node
    r = np.zeros((d, d), np.float32)
    r[np.arange(h) + h, np.arange(h)] = -1.0  # out[:, j] = -x[:, j + h] for j < h
    r[np.arange(h), np.arange(h) + h] = 1.0  # out[:, j + h] = x[:, j]
    name = f"{node.name}.rotate_half"
    model.add_const(name, r)
    drop.update(n.name for _, n in inner)
    return Node(node.name, "MatMul", [hi_s[0], name], list(node.outputs))
