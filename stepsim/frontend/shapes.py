"""Pass 1: bind dynamic input dims, infer every value's static shape, and fold constant subgraphs.

Folding evaluates, with onnx's reference evaluator, every node whose inputs are all constants (initializers,
``Constant`` nodes, folded values), and turns ``Shape`` / ``Size`` of a statically shaped value into a constant.
Shape subgraphs (``Shape -> Gather -> Concat -> Reshape``) thus disappear, as exporters' do.
"""

from __future__ import annotations

import numpy as np

from stepsim.base.errors import FrontendError
from stepsim.frontend.inputs import check_dims, check_evaluation, check_shapes
from stepsim.frontend.ir import Model, Node
from stepsim.frontend.load import onnx_module


def bind_dims(proto, dims: dict | None = None):
    """A copy of a checked ``onnx.ModelProto`` with its inputs' named dynamic dims set from ``dims`` (dim_param
    name -> size); FrontendError naming the first reader of an input whose dim is not given."""
    return _bind_dims(onnx_module(), proto, check_dims(dict(dims or {})))


def to_model(proto, values: dict | None = None) -> Model:
    """The :class:`Model` of a checked, dims-bound ``onnx.ModelProto`` (:func:`bind_dims`): shapes inferred,
    constants folded; ``values`` (graph input -> integer array) are kept as the model's ``bound`` run-time values,
    not folded (``"seeded"``: seeded ids for the inputs that only embedding Gathers read). FrontendError (one line naming the node) when a shape stays unknown."""
    onnx = onnx_module()
    try:
        inferred = onnx.shape_inference.infer_shapes(proto, check_type=True, strict_mode=True, data_prop=True)
    except Exception as exc:  # InferenceError and friends
        raise FrontendError(f"model {proto.graph.name!r}: shape inference failed ({str(exc).strip().splitlines()[0]})"
                            ) from None
    graph = inferred.graph
    shapes = {}
    for vi in list(graph.input) + list(graph.value_info) + list(graph.output):
        dims_ = [d.dim_value if d.HasField("dim_value") else None for d in vi.type.tensor_type.shape.dim]
        if vi.type.tensor_type.HasField("shape") and all(d is not None for d in dims_):
            shapes[vi.name] = tuple(int(d) for d in dims_)
    consts = {t.name: _initializer(onnx, t) for t in graph.initializer}
    for name, a in consts.items():
        shapes[name] = tuple(a.shape)
    nodes = []
    for i, n in enumerate(graph.node):
        node = Node(n.name or f"{n.op_type}_{i}", n.op_type, list(n.input), list(n.output),
                    {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute})
        if n.domain not in ("", "ai.onnx"):
            node.op_type = f"{n.domain}.{n.op_type}"
            nodes.append(node)
            continue
        folded = _fold(onnx, n, node, consts, shapes, inferred)
        if folded is None:
            nodes.append(node)
            continue
        for v, a in zip(n.output, folded):
            consts[v] = np.asarray(a)
            shapes[v] = tuple(np.asarray(a).shape)
    initializers = {t.name for t in graph.initializer}
    inputs = [vi.name for vi in graph.input if vi.name not in initializers]
    # a folded constant still in bfloat16 (a Transpose, Reshape, Slice ... of a bf16 weight) is stored as the model
    # stores that weight: a MatMul by Transpose(W) read it as fp32, twice its bytes
    bf16 = {t.name for t in graph.initializer if t.data_type == onnx.TensorProto.BFLOAT16} | {
        vi.name for vi in graph.input if vi.type.tensor_type.elem_type == onnx.TensorProto.BFLOAT16} | {
        v for v, a in consts.items() if v not in initializers and a.dtype.name == "bfloat16"}
    model = Model(graph.name or "onnx", nodes, inputs, [vi.name for vi in graph.output], shapes, consts, {}, bf16)
    for node in nodes:
        for v in node.inputs + node.outputs:
            if v and v not in shapes:
                raise FrontendError(f"{node.describe()}: the shape of {v!r} is not static after shape inference; "
                                    f"bind the model's dynamic dims with from_onnx(..., dims={{name: size}})")
    check_shapes(model)  # dims and sizes, before the seeded ids are drawn at the inputs' shapes
    if values == "seeded":
        values = _seeded_ids(graph, inputs, shapes, consts)
    model.bound = _bound_values(graph, inputs, shapes, dict(values or {}))
    return model


def _initializer(onnx, t):
    """An initializer's array; FrontendError naming it when its stored data does not fill its shape."""
    try:
        return onnx.numpy_helper.to_array(t)
    except Exception as exc:  # ValueError (reshape), or onnx's own for external data that is missing
        raise FrontendError(f"initializer {t.name!r} {list(t.dims)}: its data cannot be read "
                            f"({str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__})"
                            ) from None


def _seeded_ids(graph, inputs: list, shapes: dict, consts: dict) -> dict:
    """Seeded token ids (seed 0, uniform over the table's rows) for every integer input that only row Gathers of
    constant tables read (``values="seeded"``: ``stepsim run model.onnx`` has no ids to give)."""
    out = {}
    ints = [vi.name for vi in graph.input if vi.name in inputs and vi.type.tensor_type.elem_type in (6, 7)]
    for name in ints:
        readers = [n for n in graph.node if name in n.input]
        tables = [consts.get(n.input[0]) for n in readers if n.op_type == "Gather" and list(n.input).index(name) == 1]
        if readers and len(tables) == len(readers) and all(t is not None and t.ndim == 2 for t in tables):
            rows = min(t.shape[0] for t in tables)
            out[name] = np.random.default_rng(0).integers(0, rows, shapes[name])
    return out


def _bound_values(graph, inputs: list, shapes: dict, values: dict) -> dict:
    """``values`` checked against the graph's integer inputs (name, shape), as int64 arrays."""
    ints = {vi.name for vi in graph.input if vi.type.tensor_type.elem_type in (6, 7)}  # INT32, INT64
    out = {}
    for name, v in values.items():
        a = np.asarray(v)
        if name not in inputs or name not in ints:
            raise FrontendError(f"values: {name!r} is not an integer graph input of model {graph.name!r} (those: "
                                f"{sorted(ints) or 'none'})")
        if tuple(a.shape) != shapes.get(name) or not np.issubdtype(a.dtype, np.integer):
            raise FrontendError(f"values: {name!r} must be integers of shape {list(shapes.get(name, ()))}, got "
                                f"{a.dtype} {list(a.shape)}")
        out[name] = a.astype(np.int64)
    missing = sorted(ints - set(out))
    if missing:
        user = next((n for n in graph.node if missing[0] in n.input), None)
        where = f"node {user.name or user.op_type!r} ({user.op_type})" if user else f"graph input {missing[0]!r}"
        raise FrontendError(f"{where}: the integer input {missing[0]!r} is read at run time; give its values with "
                            f"from_onnx(..., values={{{missing[0]!r}: array}})")
    return out


def _bind_dims(onnx, proto, dims: dict):
    """A copy of ``proto`` whose graph inputs have ``dims`` substituted for their named dynamic dims."""
    proto = onnx.ModelProto.FromString(proto.SerializeToString())
    initializers = {t.name for t in proto.graph.initializer}
    params = {d.dim_param for vi in proto.graph.input if vi.name not in initializers
              for d in vi.type.tensor_type.shape.dim if not d.HasField("dim_value")}
    unknown = sorted(set(dims) - params)
    if unknown:
        raise FrontendError(f"dims: {unknown[0]!r} is no dynamic dim of the inputs of model {proto.graph.name!r} "
                            f"(those: {', '.join(map(repr, sorted(params))) or 'none'})")
    for vi in proto.graph.input:
        if vi.name in initializers:
            continue
        for d in vi.type.tensor_type.shape.dim:
            if d.HasField("dim_value"):
                continue
            param = d.dim_param
            if param not in dims:
                user = next((f"node {n.name or n.op_type!r} ({n.op_type})" for n in proto.graph.node
                             if vi.name in n.input), f"graph input {vi.name!r}")
                raise FrontendError(f"{user}: input {vi.name!r} has the dynamic dimension {param or '?'!r}; bind it "
                                    f"with from_onnx(..., dims={{{param or '?'!r}: size}})")
            d.dim_value = dims[param]
    return proto


def _fold(onnx, proto_node, node: Node, consts: dict, shapes: dict, model):
    """The output arrays of ``node`` if it can be evaluated now (all inputs constant, or a Shape / Size of a
    statically shaped value), else None."""
    if node.op_type in ("Shape", "Size") and node.inputs[0] in shapes:
        shape = np.array(shapes[node.inputs[0]], np.int64)
        if node.op_type == "Size":
            return [np.array(shape.prod(), np.int64)]
        start, end = node.attrs.get("start", 0), node.attrs.get("end", None)
        return [shape[start:end]]
    if not all(v == "" or v in consts for v in node.inputs):
        return None
    if node.op_type in ("RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial"):
        return None
    from onnx.reference import ReferenceEvaluator

    out_shapes = [shapes.get(v) for v in node.outputs if v]
    if all(s is not None for s in out_shapes):  # a ConstantOfShape / Expand of an absurd shape: refused, not allocated
        from stepsim.kernels.run_size import available_memory

        needed = sum(8 * int(np.prod(s, dtype=object)) for s in out_shapes)
        check_evaluation(f"{node.describe()}: folding its constant inputs", needed, available_memory(),
                         "a dim of the model is wrong")
    opsets = {o.domain: o.version for o in model.opset_import}
    graph = onnx.helper.make_graph(
        [proto_node], "fold",
        [onnx.helper.make_tensor_value_info(v, onnx.helper.np_dtype_to_tensor_dtype(consts[v].dtype),
                                            consts[v].shape) for v in dict.fromkeys(node.inputs) if v],
        [onnx.helper.make_empty_tensor_value_info(v) for v in node.outputs])
    one = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid(d, v) for d, v in opsets.items()])
    try:
        return ReferenceEvaluator(one).run(None, {v: consts[v] for v in node.inputs if v})
    except Exception as exc:
        raise FrontendError(f"{node.describe()}: folding its constant inputs failed ({str(exc).splitlines()[0]})"
                            ) from None
