"""A stack of MoE layers, and its pipeline parallelism (``stepsim run moe --layers L --pp N --micro-batches M``).

Layer ``i`` of ``L`` is the MoE layer of :func:`stepsim.workloads.moe.build.moe_stage` with its own routing (trace
batch ``i``, see :func:`layer_routings`) and its own tensors ``layer<i>.expert<e>_gate`` / ``_up`` / ``_down``,
``layer<i>.routing_weights`` (and ``layer<i>.shared_*``); layer 0 loads ``x`` ([B, D], bf16) from HBM, every later
layer consumes the previous layer's output rows (fp32, 1 x D, in token order), the last stores ``y``. There is no
residual: ``y = moe_{L-1}(.. moe_0(x))``.

Micro-batches are not copies of the graph: every layer's experts pack their tiles per micro-batch of ``B / M``
consecutive tokens (``moe_stage(micro_batches=M)``), so a layer's output rows of micro-batch m are complete, and
flow to the next layer, before later micro-batches' tokens arrive; the weights are re-read per tile, as in one
layer. ``--pp N`` places layers ``s L/N .. (s+1) L/N - 1`` (stage s) on chip s of the system; the stage boundary
is an ordinary cross-chip edge routed over the system's link(s) by :func:`stepsim.graph.network.place_on_chips`,
so the values are those of the one-chip stack, bit for bit.
"""

from __future__ import annotations

from stepsim.base.errors import ArgumentError
from stepsim.workloads.chips import check_stack

#: the tilings a stack takes ``--micro-batches M`` > 1 with (``stepsim optimize`` searches M for these only)
MICRO_BATCH_TILINGS = ("static", "dynamic")


def check_pipeline(layers: int, pp: int | None, batch: int, micro_batches: int | None, *, tiling: str,
                   tile_n: int | None, shared: int) -> int:
    """One-line ArgumentError unless L, N and M fit the batch and tiling; returns M (default 1). ``tile_n``: the
    shared experts' tile (tokens; with dynamic tiling their default tile), checked with ``shared`` experts."""
    m = check_stack(layers, pp, batch, micro_batches, "tokens") or 1
    if m > 1 and tiling not in MICRO_BATCH_TILINGS:
        raise ArgumentError(f"--micro-batches {m} needs --tiling {' or '.join(MICRO_BATCH_TILINGS)}")
    if m > 1 and shared and (batch // m) % tile_n:
        what = f"--tile-n {tile_n} tokens" if tiling == "static" else f"{tile_n} tokens (dynamic tiling's default)"
        raise ArgumentError(f"--micro-batches {m}: the shared experts' tiles of {what} must not "
                            f"span micro-batches of {batch // m} tokens (a multiple of {tile_n})")
    return m


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
    from stepsim.workloads.routing import check_routing

    if first < 0 or first + layers > data.shape[1]:
        raise ConfigError(f"{path}: --layers {layers} from layer {first} needs layers {first}..{first + layers - 1} "
                          f"of array 'data' [tokens, layers, top_k], which has shape {list(data.shape)}")
    return [check_routing(data[:, i, :], experts, top_k, source=f"{path} layer {i}")
            for i in range(first, first + layers)]
