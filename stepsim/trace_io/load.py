"""Load the batch a workload needs (routing matrix, KV lengths) from any trace format stepsim reads."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.compute as pc

from stepsim.base.errors import ConfigError


def load_routing(path, experts: int, model: str | None = None, iteration: int | None = None,
                 layer: int | None = None) -> np.ndarray:
    """The ``[tokens, top_k]`` expert ids of one (iteration, layer) batch of a routing trace.

    A trace holding several batches needs ``iteration`` and ``layer`` to pick one. A single ``.npz`` file whose
    name is not ``<iteration>_<layer>.npz`` is labelled with ``iteration`` and ``layer`` (0 when not given).
    """
    from stepsim.trace_io.readers import read_trace, routing_matrix

    table = read_trace(path, num_experts=experts, npz_labels=(iteration or 0, layer or 0))
    if iteration is not None:
        table = table.filter(pc.equal(table["iteration"], iteration))
    if layer is not None:
        table = table.filter(pc.equal(table["layer"], layer))
    groups = sorted(set(zip(table["iteration"].to_pylist(), table["layer"].to_pylist())))
    if not groups:
        raise ConfigError(f"{path}: no rows for iteration={iteration} layer={layer}")
    if len(groups) > 1:
        shown = ", ".join(f"({it}, {layer_})" for it, layer_ in groups[:8])
        raise ConfigError(f"{path}: the trace holds {len(groups)} (iteration, layer) batches ({shown}"
                          f"{', ...' if len(groups) > 8 else ''}); choose one with --iteration and --layer")
    return routing_matrix(table)


def load_kv_lengths(path, batch_id: int | None = None) -> np.ndarray:
    """KV-cache lengths (tokens) of one decode batch (``.npy`` artifact file or a batch trace)."""
    from stepsim.trace_io.readers import read_trace

    table = read_trace(Path(path))
    if "kv_lengths" not in table.column_names:
        raise ConfigError(f"{path}: not a decode-batch trace (no kv_lengths column); columns: {table.column_names}")
    if batch_id is not None:
        ids = table["batch_id"].to_pylist()
        table = table.filter(pc.equal(table["batch_id"], batch_id))
        if table.num_rows == 0:
            raise ConfigError(f"{path}: no decode batch with --batch-id {batch_id} (batch ids "
                              f"{min(ids)}..{max(ids)})" if ids else f"{path}: holds no decode batch")
    if table.num_rows != 1:
        raise ConfigError(f"{path}: holds {table.num_rows} decode batches; choose one with --batch-id")
    return np.asarray(table["kv_lengths"][0].as_py(), dtype=np.int64)
