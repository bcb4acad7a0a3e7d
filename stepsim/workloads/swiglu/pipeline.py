"""A stack of SwiGLU layers, and its pipeline parallelism (``--layers L --pp N --micro-batches M``).

Layer ``i`` of ``L`` reads its weights from tensors ``layer<i>.w_gate``, ``layer<i>.w_up`` ([D, F]) and
``layer<i>.w_down`` ([F, D]); layer 0 reads ``x`` ([B, D]) from HBM, every later layer consumes the previous
layer's output stream (its row tiles ``(tile_m, D)``, each repeated once per F tile of the gate / up
projections, a RepeatStatic), and the last layer stores ``y``. There is no residual: ``y = f_{L-1}(..f_0(x))``.

Micro-batches are the stream's outer dimension: a micro-batch is one row tile of ``B / M`` rows
(``--tile-m`` must be ``B / M``), so every operator iterates over the M micro-batches and stage s + 1 works on
micro-batch m while stage s works on m + 1 (one graph, not a copy per micro-batch: copies would be separate
hardware). ``--pp N`` places layers ``s L/N .. (s+1) L/N - 1`` (stage s) on chip s; the stage boundary is an
ordinary cross-chip edge that the sharding pass (:class:`stepsim.workloads.sharding.Sharding`) routes over the
system's link(s).
"""

from __future__ import annotations

from stepsim.base.errors import ArgumentError
from stepsim.graph import Flatten, Graph, LinearOffChipStore, Promote, RepeatStatic
from stepsim.workloads.chips import check_stack


def check_pipeline(layers: int, pp: int | None, batch: int, tile_m: int, micro_batches: int | None) -> int:
    """One-line ArgumentError unless L, N and M fit the batch and tiles; returns M (default ``B / tile_m``)."""
    if check_stack(layers, pp, batch, micro_batches, "rows") is None:
        return batch // tile_m
    if batch // micro_batches != tile_m:
        raise ArgumentError(f"--micro-batches {micro_batches}: a micro-batch is one row tile of {batch} / "
                            f"{micro_batches} = {batch // micro_batches} rows; --tile-m must be "
                            f"{batch // micro_batches}, got {tile_m}")
    return micro_batches


def build_stack(layers: int, *, stage, batch: int, hidden: int, intermediate: int, tile_m: int, tile_n: int,
                par_dispatch: int, pp: int | None = None, system=None):
    """The L-layer stack, on one chip or (``pp``) split into ``pp`` stages on the chips of ``system`` (the sharding
    pass: :func:`stepsim.workloads.sharding.pipeline`).

    ``stage(g, x, prefix)`` adds one layer reading tensors ``<prefix>w_gate`` ... and returns its output row
    tiles (stream ``(1, B / tile_m, 1)``); ``x`` is None for layer 0 (it loads ``x``) or the input row tiles
    repeated over the F tiles, stream ``(B / tile_m, F / tile_n, 1)``. Returns the graph and the sharding pass's
    report of the links (``system``, ``links_used``, ``link_bytes``; None on one chip).
    """
    from stepsim.workloads.sharding import pipeline

    n_tiles = intermediate // tile_n
    g = Graph(f"swiglu-l{layers}" + (f"-pp{pp}" if pp else "") + f"-m{tile_m}-n{tile_n}")

    def layer(i, out):  # (1, B/tile_m, 1) row tiles -> (B/tile_m, F/tile_n, 1): each row tile once per F tile
        x = None if out is None else Promote(g, RepeatStatic(g, Flatten(g, out, 0, 1), n_tiles), 0)
        return stage(g, x, f"layer{i}.")

    return g, pipeline(g, system, layers, pp, layer, lambda out: LinearOffChipStore(
        g, out, tensor_name="y", par_dispatch=par_dispatch), bindings={})
