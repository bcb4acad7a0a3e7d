"""The front end's model representation: ONNX nodes with static shapes and the constants folded out.

Every pass reads and writes this, never an ``onnx`` object, so only :mod:`stepsim.frontend.load` and
:mod:`stepsim.frontend.shapes` import ``onnx`` (lazily).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np


@dataclass
class Node:
    """One ONNX node: ``name`` (the node's name, or ``<op_type>_<index>`` when it has none), ``op_type``,
    input and output value names (``""`` for an omitted optional input) and attributes as Python values."""

    name: str
    op_type: str
    inputs: list
    outputs: list
    attrs: dict = field(default_factory=dict)

    def describe(self) -> str:
        return f"node {self.name!r} ({self.op_type})"


@dataclass
class Model:
    """A model with static shapes: ``nodes`` in topological order (constant subgraphs folded away), ``inputs`` /
    ``outputs`` (value names of the graph's inputs that are not initializers, and of its outputs), ``shapes``
    (value -> tuple of ints, elements), ``consts`` (value -> numpy array: initializers and folded values) and
    ``bound`` (graph input -> the integer values given at lowering, e.g. the token ids a Gather looks up) and
    ``bf16`` (the graph inputs and initializers stored as bfloat16: loaded as 2-byte elements) and ``patterns``."""

    name: str
    nodes: list
    inputs: list
    outputs: list
    shapes: dict
    consts: dict
    bound: dict = field(default_factory=dict)
    bf16: set = field(default_factory=set)
    #: node name -> the pattern recognised there (:mod:`stepsim.frontend.attention`: "sliding-window mask (window
    #: 4)", "attention sinks (8 heads)", ...); the workload's ``params["patterns"]`` when not empty
    patterns: dict = field(default_factory=dict)

    def producer(self) -> dict:
        """Value name -> the node producing it."""
        return {v: n for n in self.nodes for v in n.outputs}

    def consumers(self) -> dict:
        """Value name -> the nodes reading it (in node order, once per node)."""
        out: dict = {}
        for n in self.nodes:
            for v in dict.fromkeys(n.inputs):
                if v:
                    out.setdefault(v, []).append(n)
        return out

    def is_const(self, value: str) -> bool:
        return value in self.consts

    def add_const(self, name: str, array: np.ndarray, like: str | None = None) -> str:
        """Add the constant ``name`` a pass made (its shape with it); returns ``name``. ``like``: the model's value it
        is a piece of (a weight's columns, the sinks), whose storage it keeps: bf16 when ``like`` is (a pass's own
        constants, masks and permutations, are fp32)."""
        self.consts[name] = array
        self.shapes[name] = tuple(int(d) for d in array.shape)
        if like in self.bf16:
            self.bf16.add(name)
        return name

    def size(self, value: str) -> int:
        return math.prod(self.shapes[value])


def scalar(a: np.ndarray) -> float | None:
    """The one value of a constant that holds a single element (any shape), else None."""
    return float(a.reshape(-1)[0]) if a.size == 1 else None
