"""Pass 1a: two-operand ``Einsum`` nodes as batched MatMuls (issue 43: DeepSeek's absorbed MLA decode, whose
``model.py`` writes every product as an einsum, and ``torch.onnx`` exports each as one ``Einsum`` node).

An equation ``A,B->Y`` of two operands, with no repeated index in one term and every index of ``Y`` in ``A`` or
``B``, is a batched matrix product: its indices are *batch* (in ``A``, ``B`` and ``Y``), *free* on one side (in
that operand and ``Y``) or *contracted* (in both operands, not in ``Y``). It becomes

    Reshape(A) [G, M, K]  (after a Transpose of its leading blocks when its batch and free blocks are swapped)
    MatMul with B as [G, K, N] (a Transpose of its last two blocks read transposed; an initializer permuted)
    Reshape / Transpose of [G, M, N] into Y's order,

with ``G``, ``M``, ``K``, ``N`` the products of the batch, ``A``-free, contracted and ``B``-free sizes. Every
output element is the same dot product over the contracted indices, so FLOPs are the equation's ``2 G M K N``.
An activation times an initializer keeps the activation on the left (the operands swapped when the equation has
the initializer first). The MatMuls are the front end's own: two activations with the same leading dims (scores,
``p v``), an activation times a 2-D weight, or times a 3-D initializer of one weight per group (a per-head
product: :func:`stepsim.frontend.ops_matmul._matmul`'s grouped weights).

The layouts the rewrite needs are the ones the front end streams: an identity, a swap of the two leading blocks
(a ``[1, 0, 2]`` Transpose), and for the right operand a swap of its last two blocks (read transposed). A
per-head product's ``[B, S, H, d]`` result (rows of ``d``, one token's heads after another at tile_m 1) is the
head view a head merge (``Reshape`` to ``[B, S, H * d]``) reads (:func:`stepsim.frontend.ops_layout._same_stream`).
Anything else (an index summed inside one operand, no contracted index, no free index on the right, three
operands, an ellipsis, a layout that would need another permutation) is one line naming the node and the
equation.
"""

from __future__ import annotations

import math

import numpy as np

from stepsim.base.errors import FrontendError
from stepsim.frontend.ir import Model, Node


def lower_einsums(model: Model) -> Model:
    """``model`` with every ``Einsum`` node replaced by the nodes of the module docstring."""
    nodes = []
    for node in model.nodes:
        if node.op_type != "Einsum":
            nodes.append(node)
            continue
        rewrite = _Rewrite(model, node)
        nodes += rewrite.nodes()
        model.patterns[node.name] = rewrite.describe()
    model.nodes = nodes
    return model


class _Rewrite:
    """One Einsum node's batched MatMul (module docstring)."""

    def __init__(self, model: Model, node: Node):
        self.model, self.node = model, node
        equation = node.attrs.get("equation", "")
        equation = (equation.decode() if isinstance(equation, bytes) else str(equation)).replace(" ", "")
        self.equation = equation
        terms, arrow, out = equation.partition("->")
        operands = terms.split(",")
        if not arrow or len(operands) != 2 or len(node.inputs) != 2 or "." in equation:
            self._refuse("supported is an equation of two operands with an explicit output (A,B->Y), no ellipsis")
        a, b = operands
        if any(len(set(t)) != len(t) for t in (a, b, out)) or set(out) - set(a + b):
            self._refuse("an index repeated within one term, or an output index in neither operand")
        if (set(a) ^ set(b)) - set(out):
            self._refuse("an index summed within one operand (not in the other operand or the output)")
        x, w = node.inputs  # not both initializers: such a node was folded (stepsim.frontend.shapes)
        if model.is_const(x):  # the activation on the left
            (a, x), (b, w) = (b, w), (a, x)
        self.a, self.b, self.out, self.x, self.w = a, b, out, x, w
        size = {}
        for term, value in ((a, x), (b, w)):
            for index, dim in zip(term, model.shapes[value]):
                if size.setdefault(index, dim) != dim:
                    self._refuse(f"index {index!r} is {size[index]} in one operand and {dim} in the other "
                                 f"(no broadcasting)")
        self.size = size
        self.batch = [i for i in a if i in b and i in out]
        self.free_a = [i for i in a if i not in b]
        self.contract = [i for i in a if i in b and i not in out]
        self.free_b = [i for i in b if i not in a]
        if not self.contract:
            self._refuse("no index is contracted (an outer product), which is not a MatMul")
        if not self.free_b:
            self._refuse(f"the right operand {b!r} keeps no index of its own (a matrix-vector product); supported: "
                         f"a free index on the right (a matrix product)")
        #: the batched product's sizes: G x [M x K] @ [K x N]
        self.g, self.m, self.k, self.n = (self._dims(s) for s in (self.batch, self.free_a, self.contract, self.free_b))

    def _refuse(self, why: str):
        raise FrontendError(f"{self.node.describe()}: equation {self.equation!r}: {why}")

    def _dims(self, indices) -> int:
        return math.prod(self.size[i] for i in indices)

    def describe(self) -> str:
        return (f"einsum {self.equation!r} as a batched MatMul: {self.g} x [{self.m} x {self.k}] @ "
                f"[{self.k} x {self.n}]")

    # --- nodes ------------------------------------------------------------------------------------------
    def _value(self, suffix: str, shape) -> str:
        name = f"{self.node.name}.{suffix}"
        self.model.shapes[name] = tuple(int(d) for d in shape)
        return name

    def _const(self, suffix: str, array) -> str:
        return self.model.add_const(f"{self.node.name}.{suffix}", np.asarray(array))

    def _reshape(self, x: str, shape, suffix: str, out: str | None = None) -> tuple[str, Node]:
        shape = [int(d) for d in shape]
        y = out or self._value(suffix, shape)
        return y, Node(f"{self.node.name}.{suffix}", "Reshape",
                       [x, self._const(f"{suffix}.shape", np.array(shape, np.int64))], [y])

    def _transpose(self, x: str, perm, shape, suffix: str, out: str | None = None) -> tuple[str, Node]:
        y = out or self._value(suffix, shape)
        return y, Node(f"{self.node.name}.{suffix}", "Transpose", [x], [y], {"perm": list(perm)})

    def nodes(self) -> list:
        made = []
        g, m, k = self.g, self.m, self.k
        # the left operand as [G, M, K]: its blocks (batch)(free)(contracted), or (free)(batch)(contracted)
        left = self._blocks(self.a, [self.batch, self.free_a, self.contract],
                            [self.free_a, self.batch, self.contract], "the left operand")
        v, node = self._reshape(self.x, [self._dims(b) for b in left], "left")
        made.append(node)
        if left[0] is not self.batch and g > 1 and m > 1:
            v, node = self._transpose(v, [1, 0, 2], [g, m, k], "left_t")
            made.append(node)
        right = self._right(made)
        product = self._value("product", [g, m, self.n])
        made.append(Node(f"{self.node.name}.matmul", "MatMul", [v, right], [product]))
        made += self._result(product)
        return made

    def _blocks(self, term: str, *orders_and_what):
        """The first of ``orders`` (lists of index blocks) whose concatenation is ``term`` (empty blocks
        skipped), else a refusal naming ``what``."""
        *orders, what = orders_and_what
        for order in orders:
            if "".join("".join(b) for b in order) == term:
                return order
        self._refuse(f"{what} {term!r} is not (batch)(free)(contracted) nor (free)(batch)(contracted) in that "
                     f"order: batch {''.join(self.batch) or '-'}, free {''.join(self.free_a) or '-'}, contracted "
                     f"{''.join(self.contract) or '-'}")

    def _right(self, made: list) -> str:
        """The right operand as ``[G, K, N]`` (``[K, N]`` when there is no batch index and it is a weight); the
        nodes it takes are appended to ``made``."""
        g, k, n = self.g, self.k, self.n
        if self.model.is_const(self.w):
            order = self.batch + self.contract + self.free_b
            array = np.transpose(self.model.consts[self.w], [self.b.index(i) for i in order])
            return self._const("right", array.reshape([k, n] if g == 1 else [g, k, n]))
        blocks = self._blocks(self.b, [self.batch, self.contract, self.free_b],
                              [self.batch, self.free_b, self.contract], "the right operand")
        v, node = self._reshape(self.w, [self._dims(b) for b in blocks], "right")
        made.append(node)
        if blocks[1] is self.free_b and k > 1 and n > 1:  # [G, N, K] read transposed by the MatMul
            v, node = self._transpose(v, [0, 2, 1], [g, k, n], "right_t")
            made.append(node)
        return v

    def _result(self, product: str) -> list:
        """``[G, M, N]`` into the node's output, in the equation's output order."""
        g, m, n = self.g, self.m, self.n
        y = self.node.outputs[0]
        shape = self.model.shapes[y]
        if self.out == "".join(self.batch + self.free_a + self.free_b):
            return [self._reshape(product, shape, "result", out=y)[1]]
        if self.out != "".join(self.free_a + self.batch + self.free_b):
            self._refuse(f"output {self.out!r} is not (batch)(free left)(free right) nor (free left)(batch)(free "
                         f"right) in that order")
        if g == 1 or m == 1:  # the swap moves no element
            return [self._reshape(product, shape, "result", out=y)[1]]
        v, swap = self._transpose(product, [1, 0, 2], [m, g, n], "result_t")
        return [swap, self._reshape(v, shape, "result", out=y)[1]]
