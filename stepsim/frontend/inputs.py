"""Pass 0b: what a model declares, checked before anything of it is evaluated or allocated (issue 44).

Shape inference, constant folding and the teacher routing of a MoE block (:mod:`stepsim.frontend.moe`) run
onnx's reference evaluator, and the seeded token ids and inputs are NumPy arrays of the inputs' full shapes: a
model whose element types stepsim does not lower, or whose dims are negative, zero or absurd, must be refused
here, in one line naming the graph input / initializer / node and its shape, not by a NumPy or evaluator traceback
later.

* Element types (:func:`check_declared`): float graph inputs, outputs and initializers are float32 or bfloat16
  (stepsim's bf16 layers: bf16 storage, fp32 compute); token ids int32 / int64; any other float (float16,
  float64) is refused with what to do. Every fixed dim of a graph input is at least 1.
* Sizes (:func:`check_shapes`, after shape inference): every activation's dims are at least 1 and its bytes at
  most :data:`MAX_VALUE_BYTES`; a Reshape keeps its element count (an invalid head split, e.g. key / value heads
  that do not divide the query heads, names the shape initializer and both shapes).
* An evaluation's memory (:func:`evaluation_bytes`, :func:`check_evaluation`): the bytes of every value it
  computes, against the memory available, before it starts.
"""

from __future__ import annotations

import math
from numbers import Integral

from stepsim.base.display import format_bytes
from stepsim.base.errors import FrontendError

#: ONNX TensorProto element types (onnx.TensorProto.FLOAT ...), named here so the check needs no onnx import
FLOAT, INT32, INT64, FLOAT16, DOUBLE, BFLOAT16 = 1, 6, 7, 10, 11, 16
#: what a graph input may be: float activations (fp32, bf16) or integer token ids
INPUT_TYPES = {FLOAT: "float32", BFLOAT16: "bfloat16", INT32: "int32", INT64: "int64"}
#: float element types stepsim does not lower (the names the refusal gives)
REFUSED_FLOATS = {FLOAT16: "float16", DOUBLE: "float64"}
#: the largest activation a model may declare (bytes as fp32): 2**50, a petabyte, thousands of times any layer
#: the engine can run, so only a wrong dim hits it; beyond it element counts near 2**63 overflow NumPy's int64
MAX_VALUE_BYTES = 2**50


def type_name(elem_type: int) -> str:
    """An ONNX element type's name (``float16``), or its number when ONNX has none."""
    from stepsim.frontend.load import onnx_module

    try:
        return str(onnx_module().helper.tensor_dtype_to_np_dtype(elem_type))
    except Exception:  # an undefined type number: the checker lets some through
        return f"element type {elem_type}"


def _refused_float(what: str, elem_type: int) -> FrontendError:
    return FrontendError(f"{what} is {REFUSED_FLOATS[elem_type]}; stepsim lowers float32 and bfloat16 models "
                         f"(bf16 storage, fp32 compute): convert the model's float tensors to one of those")


def check_declared(proto) -> None:
    """FrontendError (one line) for a graph input, output or initializer of an element type stepsim does not lower,
    or a graph input with a fixed dim below 1; reads only the model's declarations (nothing is evaluated)."""
    initializers = {t.name for t in proto.graph.initializer}
    for vi in proto.graph.input:
        if vi.name in initializers:
            continue
        t = vi.type.tensor_type
        if t.elem_type in REFUSED_FLOATS:
            raise _refused_float(f"graph input {vi.name!r}", t.elem_type)
        if t.elem_type not in INPUT_TYPES:
            raise FrontendError(f"graph input {vi.name!r} is {type_name(t.elem_type)}; supported graph inputs: "
                                f"{', '.join(INPUT_TYPES.values())} (float activations, integer token ids)")
        dims = [d.dim_value if d.HasField("dim_value") else d.dim_param or "?" for d in t.shape.dim]
        if any(isinstance(d, int) and d < 1 for d in dims):
            raise FrontendError(f"graph input {vi.name!r} has shape {dims}: every dim must be at least 1")
    for vi in proto.graph.output:
        if vi.type.tensor_type.elem_type in REFUSED_FLOATS:
            raise _refused_float(f"graph output {vi.name!r}", vi.type.tensor_type.elem_type)
    for t in proto.graph.initializer:
        if t.data_type in REFUSED_FLOATS:
            raise _refused_float(f"initializer {t.name!r} {list(t.dims)}", t.data_type)
        if any(d < 0 for d in t.dims):
            raise FrontendError(f"initializer {t.name!r} has shape {list(t.dims)}: a dim is negative")


def is_count(value, low: int) -> bool:
    """Whether ``value`` is an integer (Python or NumPy; not a bool) of at least ``low``."""
    return isinstance(value, Integral) and not isinstance(value, bool) and value >= low


def check_dims(dims: dict) -> dict:
    """``from_onnx``'s ``dims`` (dim name -> size) checked: each an int (not a bool) of at least 1."""
    for name, size in dims.items():
        if not is_count(size, 1):
            raise FrontendError(f"dims: {name!r} must be an integer of at least 1, got {size!r}")
    return {name: int(size) for name, size in dims.items()}


def check_shapes(model) -> None:
    """FrontendError (one line) for an activation of a dim below 1 or of more than :data:`MAX_VALUE_BYTES`, or a
    Reshape that changes the element count (module docstring); ``model`` is a :class:`~stepsim.frontend.ir.Model`."""
    where = {v: f"graph input {v!r}" for v in model.inputs}
    for n in model.nodes:
        for v in n.outputs:
            where.setdefault(v, f"{n.describe()}: output {v!r}")
    for v, what in where.items():
        shape = model.shapes.get(v)
        if shape is None or model.is_const(v):
            continue
        if any(d < 1 for d in shape):
            raise FrontendError(f"{what} has shape {list(shape)}: every dim must be at least 1")
        if not shape and v in model.inputs:  # a stream has tiles of at least one dim
            raise FrontendError(f"{what} is a scalar (shape []); stepsim streams graph inputs of at least one dim: "
                                f"give it shape [1]")
        if 4 * math.prod(shape) > MAX_VALUE_BYTES:
            raise FrontendError(f"{what} has shape {list(shape)}: {format_bytes(4 * math.prod(shape))} as fp32, "
                                f"more than the {format_bytes(MAX_VALUE_BYTES)} a model's value may hold; a dim is "
                                f"wrong")
    for n in model.nodes:
        if n.op_type == "Reshape" and n.inputs[0] in model.shapes and n.outputs[0] in model.shapes:
            sx, sy = model.shapes[n.inputs[0]], model.shapes[n.outputs[0]]
            if math.prod(sx) != math.prod(sy):
                target = n.inputs[1] if len(n.inputs) > 1 else "?"
                raise FrontendError(f"{n.describe()}: cannot reshape {n.inputs[0]!r} {list(sx)} ({math.prod(sx):,} "
                                    f"elements) into {list(sy)} ({math.prod(sy):,} elements, shape {target!r})")


def evaluation_bytes(model, values) -> int:
    """Bytes an evaluation of ``values`` (value names; graph inputs included) holds at most: every one at once, 8
    bytes an element (int64 ids; fp32 values count 4)."""
    total = 0
    for v in dict.fromkeys(values):
        shape = model.shapes.get(v)
        if shape is not None:
            total += (8 if v in model.bound else 4) * math.prod(shape)
    return total


def check_evaluation(what: str, needed: int, available: int | None, remedy: str) -> None:
    """FrontendError when an evaluation needs more memory than is available (``available`` None: unknown, no
    check), before it allocates anything."""
    if available is not None and needed > available:
        raise FrontendError(f"{what} needs about {format_bytes(needed)} for its values, more than the "
                            f"{format_bytes(available)} of memory available; {remedy}")
