"""Pass 1b: raise patterns exporters decompose back to single ops, so they lower to one STeP function.

* ``Mul(x, Sigmoid(x))`` (PyTorch's SiLU) becomes ``Swish(x)`` (ONNX opset 24, ``alpha = 1``), lowered to
  ``Map(Silu)``: one operator of 8 FLOPs per element instead of a Sigmoid (7) and a Mul (1), the form the
  hand-written FFN layers use. The Sigmoid goes when the Mul is its only reader.
"""

from __future__ import annotations

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
        nodes.append(node)
    model.nodes = [n for n in nodes if n.name not in drop]
    return model
