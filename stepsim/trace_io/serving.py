"""Routing traces as serving engines record them: per-token routed-expert arrays ``[tokens, layers, top_k]``.

SGLang's and vLLM's "return routed experts" options give, per request, the expert ids every token was routed
to in every MoE layer as an integer array of shape ``[tokens, layers, top_k]``. Saved as ``.npy``, ``.npz`` or
``.safetensors`` (the ``safetensors`` package, extra ``stepsim[serving]``), :func:`import_routed_experts`
turns such an array into the multi-layer routing schema of :mod:`stepsim.trace_io.schemas`: one record batch
per layer (``iteration`` = the ``iteration`` label, 0 by default), or, when an iteration array ``[tokens]``
is given (``iteration_key``: another array of the same ``.npz`` / ``.safetensors`` file, e.g. the decode step
that produced each token), one batch per (iteration, layer) in ascending iteration order. ``token`` numbers
the tokens of one batch 0, 1, ... in file order. A workload then picks one batch with ``--layer`` (and
``--iteration``).

Everything is checked before anything is written, and each error names the file, the array, and the row
(token, 0-based) and layer (0-based) of the first bad value: rank other than 3, an empty axis, a non-integer
dtype, an expert id outside ``0 .. num_experts-1``, and an expert named twice in one token's top-k.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa

from stepsim.base.errors import ConfigError, TraceError, TraceSchemaError, TraceValueError
from stepsim.trace_io.readers import load_numpy_file
from stepsim.trace_io.schemas import ROUTING, make_schema
from stepsim.trace_io.writers import output_format, write_trace

#: suffixes :func:`load_routed_experts` reads
SUFFIXES = (".npy", ".npz", ".safetensors")
#: array name looked for when a file holds several arrays and no ``key`` is given
DEFAULT_KEY = "routed_experts"
#: largest expert count the routing schema's int16 expert ids hold
MAX_EXPERTS = np.iinfo(np.int16).max + 1


def _read_arrays(path: Path) -> dict[str, np.ndarray]:
    """Every array of a ``.npy`` (named ``"array"``), ``.npz`` or ``.safetensors`` file."""
    suffix = path.suffix.lower()
    if suffix not in SUFFIXES:
        raise TraceError(f"{path}: routed-experts arrays are read from {', '.join(SUFFIXES)} files, "
                         f"not {suffix or 'a file without a suffix'!r}")
    if not path.is_file():
        raise TraceError(f"{path}: no such file")
    if suffix == ".npy":
        return {"array": load_numpy_file(path, lambda: np.load(path, allow_pickle=False))}
    if suffix == ".npz":
        def load():
            with np.load(path, allow_pickle=False) as z:
                return {name: z[name] for name in z.files}

        return load_numpy_file(path, load)
    try:
        from safetensors.numpy import load_file
    except ImportError:
        raise ConfigError(f"{path}: reading .safetensors needs the safetensors package: "
                          "pip install 'stepsim[serving]'") from None
    try:
        return load_file(str(path))
    except Exception as exc:  # the Rust binding raises its own SafetensorError for a corrupt header
        raise TraceError(f"{path}: cannot read safetensors file: {exc}") from exc


def _pick(arrays: dict[str, np.ndarray], key: str | None, path: Path,
          several: str = "name the routed-experts one with --key") -> str:
    names = ", ".join(sorted(arrays)) or "none"
    if key is not None:
        if key not in arrays:
            raise TraceSchemaError(f"{path}: no array {key!r} (arrays: {names})")
        return key
    if len(arrays) == 1:
        return next(iter(arrays))
    if DEFAULT_KEY in arrays:
        return DEFAULT_KEY
    raise TraceSchemaError(f"{path}: holds several arrays ({names}); {several}")


def check_routed_experts(experts: np.ndarray, num_experts: int, where: str) -> None:
    """Check a ``[tokens, layers, top_k]`` expert-id array, naming the row and layer of the first bad value.

    Raises
    ------
    TraceSchemaError
        Rank other than 3, an empty axis, or a non-integer dtype.
    TraceValueError
        An id outside ``0 .. num_experts-1`` or an expert twice in one token's top-k (first in row-major order).
    """
    if experts.ndim != 3:
        raise TraceSchemaError(f"{where} has shape {list(experts.shape)}, expected 3 axes [tokens, layers, top_k]")
    if 0 in experts.shape:
        raise TraceSchemaError(f"{where} has shape {list(experts.shape)}: an empty axis (expected "
                               "[tokens, layers, top_k], each at least 1)")
    if not np.issubdtype(experts.dtype, np.integer):
        raise TraceSchemaError(f"{where} has dtype {experts.dtype}, expected integer expert ids")
    bad = (experts < 0) | (experts >= num_experts)
    if bad.any():
        row, layer, slot = np.argwhere(bad)[0]
        raise TraceValueError(f"{where}: row {row}, layer {layer}: expert id {experts[row, layer, slot]} "
                              f"(slot {slot}) outside 0..{num_experts - 1}")
    ordered = np.sort(experts, axis=2)
    dup = (ordered[:, :, 1:] == ordered[:, :, :-1]).any(axis=2)
    if dup.any():
        row, layer = np.argwhere(dup)[0]
        ids = ordered[row, layer]
        twice = ids[1:][ids[1:] == ids[:-1]][0]
        raise TraceValueError(f"{where}: row {row}, layer {layer}: expert {twice} appears twice in the token's "
                              f"top-k {experts[row, layer].tolist()}")


def _check_iterations(iterations: np.ndarray, tokens: int, where: str) -> np.ndarray:
    if iterations.ndim != 1 or len(iterations) != tokens:
        raise TraceSchemaError(f"{where} has shape {list(iterations.shape)}, expected [{tokens}] (one iteration "
                               "per token row)")
    if not np.issubdtype(iterations.dtype, np.integer):
        raise TraceSchemaError(f"{where} has dtype {iterations.dtype}, expected integer iteration numbers")
    bad = (iterations < 0) | (iterations > np.iinfo(np.int32).max)
    if bad.any():
        row = int(np.argmax(bad))
        raise TraceValueError(f"{where}: row {row}: iteration {iterations[row]} outside 0..{np.iinfo(np.int32).max}")
    return iterations.astype(np.int32)


def _resolve_shape(model: str | None, num_experts: int | None, top_k: int, where: str) -> int:
    """The expert count from ``num_experts`` / ``model``, checking the model's top_k against the array's."""
    from stepsim.models.presets import routing_shape

    if num_experts is not None and (isinstance(num_experts, bool) or num_experts < 1):
        raise ConfigError(f"num_experts must be a positive integer, got {num_experts!r}")
    shape = routing_shape(model) if model is not None else None
    if shape is not None:
        if num_experts is not None and num_experts != shape[0]:
            raise ConfigError(f"num_experts = {num_experts} conflicts with model {model!r} ({shape[0]} experts)")
        if top_k != shape[1]:
            raise TraceSchemaError(f"{where} has top_k = {top_k} (last axis), but model {model!r} routes each token "
                                   f"to {shape[1]} experts")
        num_experts = shape[0]
    if num_experts is None:
        raise ConfigError(f"{where}: the number of experts is unknown; give --num-experts or --model (a preset, "
                          "alias or config.json)")
    if num_experts > MAX_EXPERTS:
        raise ConfigError(f"num_experts = {num_experts} exceeds the {MAX_EXPERTS} expert ids a routing trace holds")
    return num_experts


def routed_experts_batches(experts: np.ndarray, iterations: np.ndarray | None, schema: pa.Schema, *,
                           iteration: int = 0) -> Iterator[pa.RecordBatch]:
    """One record batch per (iteration, layer) of a checked ``[tokens, layers, top_k]`` array.

    Without ``iterations`` every token is in iteration ``iteration``; with it, iterations ascend and each
    batch holds that iteration's tokens in file order.
    """
    _, layers, k = experts.shape
    if iterations is None:
        groups = [(iteration, np.arange(experts.shape[0]))]
    else:
        groups = [(int(it), np.flatnonzero(iterations == it)) for it in np.unique(iterations)]
    for it, rows in groups:
        n = len(rows)
        for layer in range(layers):
            ids = np.ascontiguousarray(experts[rows, layer, :], dtype=np.int16).ravel()
            yield pa.RecordBatch.from_arrays(
                [pa.array(np.full(n, it, dtype=np.int32)), pa.array(np.full(n, layer, dtype=np.int32)),
                 pa.array(np.arange(n, dtype=np.int32)), pa.FixedSizeListArray.from_arrays(pa.array(ids), k)],
                schema=schema)


def load_routed_experts(src: str | Path, *, key: str | None = None, iteration_key: str | None = None,
                        num_experts: int | None = None, model: str | None = None,
                        several: str = "name the routed-experts one with --key"
                        ) -> tuple[np.ndarray, np.ndarray | None, pa.Schema]:
    """Read and check a routed-experts file.

    Parameters
    ----------
    src : str or Path
        ``.npy``, ``.npz`` or ``.safetensors`` file.
    key : str, optional
        Array holding the ``[tokens, layers, top_k]`` ids (default: the only array, else ``routed_experts``).
    iteration_key : str, optional
        Array ``[tokens]`` of iteration numbers (``.npz`` / ``.safetensors`` only).
    num_experts : int, optional
        Experts per layer (or from ``model``).
    model : str, optional
        Preset name, alias or Hugging Face ``config.json``: gives num_experts and checks top_k; stored as the
        trace's ``model`` metadata.
    several : str
        What the error for a file of several arrays (none named ``routed_experts``) tells the caller to do (a
        command without ``--key`` says what it reads instead).

    Returns
    -------
    (experts, iterations or None, schema)
        The checked arrays and the normalized routing schema (with metadata) of the output.
    """
    path = Path(src)
    arrays = _read_arrays(path)
    name = _pick(arrays, key, path, several)
    if iteration_key is not None and path.suffix.lower() == ".npy":
        raise ConfigError(f"{path}: a .npy file holds one array; put the iteration array beside the routed experts "
                          "in a .npz or .safetensors file")
    if iteration_key == name:
        raise ConfigError(f"{path}: --iteration-key {iteration_key!r} names the routed-experts array itself")
    experts = arrays[name]
    where = f"{path}: array {name!r}"
    if experts.ndim != 3 or 0 in experts.shape or not np.issubdtype(experts.dtype, np.integer):
        check_routed_experts(experts, 1, where)  # raises the shape / dtype error
    num_experts = _resolve_shape(model, num_experts, experts.shape[2], where)
    check_routed_experts(experts, num_experts, where)
    iterations = None
    if iteration_key is not None:
        _pick(arrays, iteration_key, path)
        iterations = _check_iterations(arrays[iteration_key], experts.shape[0],
                                       f"{path}: array {iteration_key!r}")
    meta = {"num_experts": num_experts, "model": model, "source": path.name, "array": name,
            "layout": "tokens,layers,top_k"}
    if iteration_key is not None:
        meta["iteration_array"] = iteration_key
    schema = make_schema(ROUTING, top_k=experts.shape[2], **meta)
    return experts, iterations, schema


def import_routed_experts(src: str | Path, out: str | Path, *, key: str | None = None,
                          iteration_key: str | None = None, iteration: int = 0, num_experts: int | None = None,
                          model: str | None = None) -> tuple[int, int, int]:
    """Convert a routed-experts file to a routing trace (``.arrow`` / ``.parquet``), written atomically.

    See :func:`load_routed_experts` for the parameters; ``iteration`` labels every row when there is no
    iteration array.

    Returns
    -------
    (rows, batches, layers)
        Rows written (tokens x layers), record batches ((iteration, layer) groups) and layers.
    """
    output_format(out)  # a bad --out fails before reading
    if isinstance(iteration, bool) or not isinstance(iteration, int) or not 0 <= iteration <= np.iinfo(np.int32).max:
        raise ConfigError(f"--iteration must be an integer in 0..{np.iinfo(np.int32).max}, got {iteration!r}")
    if iteration_key is not None and iteration != 0:
        raise ConfigError("--iteration labels a file without an iteration array; it cannot be combined with "
                          "--iteration-key")
    experts, iterations, schema = load_routed_experts(src, key=key, iteration_key=iteration_key,
                                                      num_experts=num_experts, model=model)
    groups = 1 if iterations is None else len(np.unique(iterations))
    rows = write_trace(routed_experts_batches(experts, iterations, schema, iteration=iteration), out, schema=schema)
    return rows, groups * experts.shape[1], experts.shape[1]


def synthetic_routed_experts(tokens: int, layers: int, num_experts: int, top_k: int, seed: int) -> np.ndarray:
    """A seeded ``[tokens, layers, top_k]`` int32 array of distinct expert ids per token and layer (for tests).

    Each (token, layer) takes the first ``top_k`` experts of an independent uniform random permutation.
    """
    if top_k > num_experts:
        raise ConfigError(f"top_k {top_k} exceeds num_experts {num_experts}")
    rng = np.random.default_rng(seed)
    return np.argsort(rng.random((tokens, layers, num_experts)), axis=2, kind="stable")[:, :, :top_k].astype(np.int32)
