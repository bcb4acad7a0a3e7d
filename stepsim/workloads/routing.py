"""Expert-routing arrays: validation, the selector tensors the MoE graphs need, and each layer's routing of a
stack from a routing trace (:func:`layer_routings`)."""

from __future__ import annotations

import numpy as np

from stepsim.base.errors import ArgumentError


def check_routing(routing, experts: int, top_k: int, source: str = "routing") -> np.ndarray:
    """Validate a ``[tokens, top_k]`` array of expert ids and return it as int64.

    Raises :class:`ArgumentError` naming the row and value for out-of-range or duplicated expert ids.
    """
    arr = np.asarray(routing)
    if arr.ndim != 2 or arr.shape[0] < 1:
        raise ArgumentError(f"{source}: expected a [tokens, top_k] array of expert ids, got shape {arr.shape}")
    if arr.shape[1] != top_k:
        raise ArgumentError(f"{source}: each token must pick top_k={top_k} experts, got {arr.shape[1]} per row")
    if not np.issubdtype(arr.dtype, np.integer):
        raise ArgumentError(f"{source}: expert ids must be integers, got dtype {arr.dtype}")
    arr = arr.astype(np.int64)
    bad = np.argwhere((arr < 0) | (arr >= experts))
    if len(bad):
        r, c = bad[0]
        raise ArgumentError(f"{source}: row {r} column {c}: expert id {arr[r, c]} outside 0..{experts - 1}")
    srt = np.sort(arr, axis=1)
    dup = np.argwhere(srt[:, 1:] == srt[:, :-1])
    if len(dup):
        r = dup[0][0]
        raise ArgumentError(f"{source}: row {r} names expert {srt[r, dup[0][1]]} twice: {arr[r].tolist()}")
    return arr


def expert_counts(routing: np.ndarray, experts: int) -> np.ndarray:
    """Tokens routed to each expert (int64, length ``experts``)."""
    return np.bincount(routing.ravel(), minlength=experts).astype(np.int64)


def multihot(routing: np.ndarray, experts: int) -> np.ndarray:
    """``[tokens, experts]`` 0/1 array: which experts each token goes to."""
    out = np.zeros((routing.shape[0], experts), np.int8)
    np.put_along_axis(out, routing, 1, axis=1)
    return out


def onehot_per_slot(routing: np.ndarray, experts: int) -> np.ndarray:
    """``[tokens, top_k, experts]`` 0/1 array: the expert of each (token, slot)."""
    tokens, k = routing.shape
    out = np.zeros((tokens, k, experts), np.int8)
    out[np.arange(tokens)[:, None], np.arange(k)[None, :], routing] = 1
    return out


def layer_routings(path, experts: int, top_k: int, layers: int, iteration: int | None, layer: int | None) -> list:
    """Each layer's ``[tokens, top_k]`` routing from a routing trace.

    A single ``.npz`` file whose array ``data`` is ``[tokens, layers, top_k]`` gives layer i of the stack its layer
    ``first + i`` (``first`` = ``--layer``, default 0). A trace holding several layers of the chosen iteration gives layer i of the stack its batch of layer
    ``first + i`` (``first`` = ``--layer``, default the trace's lowest layer); it must hold all L of them. A trace
    of one (iteration, layer) batch (a single ``.npz`` file, like the bundled traces) is reused by every layer.
    """
    import pyarrow.compute as pc

    from stepsim.base.errors import ConfigError
    from stepsim.trace_io.load import load_routing
    from stepsim.trace_io.readers import read_trace

    layered = _layers_array(path)
    if layered is not None:
        return _split_layers(path, layered, experts, top_k, layers, 0 if layer is None else layer)
    table = read_trace(path, num_experts=experts, npz_labels=(iteration or 0, layer or 0))
    if iteration is not None:
        table = table.filter(pc.equal(table["iteration"], iteration))
    present = sorted(set(table["layer"].to_pylist()))
    if len(present) <= 1:
        one = load_routing(path, experts, iteration=iteration, layer=layer)
        return [one] * layers
    first = present[0] if layer is None else layer
    missing = [i for i in range(first, first + layers) if i not in present]
    if missing:
        raise ConfigError(f"{path}: --layers {layers} from layer {first} needs the trace's layers {first}.."
                          f"{first + layers - 1}; it has no layer {missing[0]} (layers {present[0]}..{present[-1]})")
    if iteration is None:
        its = sorted(set(table["iteration"].to_pylist()))
        if len(its) > 1:
            raise ConfigError(f"{path}: the trace holds {len(its)} iterations; choose one with --iteration")
    return [load_routing(path, experts, iteration=iteration, layer=i) for i in range(first, first + layers)]


def _layers_array(path):
    """The ``[tokens, layers, top_k]`` array ``data`` of a single ``.npz`` file, or None (another trace, or a
    ``[tokens, top_k]`` file: the trace readers take those, and their errors)."""
    from pathlib import Path

    import numpy as np

    from stepsim.trace_io.readers import load_numpy_file

    p = Path(path)
    if p.suffix.lower() != ".npz" or not p.is_file():
        return None

    def load():
        with np.load(p, allow_pickle=False) as z:
            return z["data"] if "data" in z.files else None

    data = load_numpy_file(p, load)
    return data if data is not None and data.ndim == 3 else None


def _split_layers(path, data, experts: int, top_k: int, layers: int, first: int) -> list:
    """Layers ``first .. first + layers - 1`` of a ``[tokens, layers, top_k]`` array, each checked (one line naming
    the file, the layer, the row and the column of a bad expert id)."""
    from stepsim.base.errors import ConfigError
    if first < 0 or first + layers > data.shape[1]:
        raise ConfigError(f"{path}: --layers {layers} from layer {first} needs layers {first}..{first + layers - 1} "
                          f"of array 'data' [tokens, layers, top_k], which has shape {list(data.shape)}")
    return [check_routing(data[:, i, :], experts, top_k, source=f"{path} layer {i}")
            for i in range(first, first + layers)]
