"""Sources fed from arrays or traces, address generators, and sinks (§2.6).

Selector and metadata sources hold their payloads as int64 NumPy arrays (selectors in CSR form: ``ptr`` and
``targets``), which lowering hands to the engine unchanged, so routing follows the real trace.
"""

from __future__ import annotations

import numpy as np

from stepsim.base.errors import ArgumentError, DTypeError, ShapeError
from stepsim.graph.dims import make_symbol, shapes_equal
from stepsim.graph.dtypes import UINT64, Selector, Tile
from stepsim.graph.graph import Op
from stepsim.graph.stream import Stream

ADDRESS = Tile(UINT64, 1, 1)


def _uint64_stream(op: Op, s: Stream, what: str) -> None:
    if s.dtype != ADDRESS:
        raise op._error(DTypeError, f"{what} must carry Tile[uint64](1, 1) scalars, got {s}")


class SelectorSource(Op):
    """Emit selectors from an array (the artifact's SelectGen).

    Parameters
    ----------
    selections : array-like
        Either a multi-hot 0/1 array of shape ``[..., num_targets]`` (one selector per leading index), or a
        sequence of index lists (one selector per entry; may be ragged, e.g. empty).
    num_targets : int
        Number of targets each selector chooses among (up to thousands).
    multihot : bool
        Element type ``MultiHot`` (``num_targets`` bytes) or ``Index`` (2 bytes per index).

    Output shape ``(1,) + leading shape``.
    """

    kind = "SelectorSource"

    def __init__(self, graph, selections, num_targets: int, *, multihot: bool = True, name: str | None = None):
        self._begin(graph, [], name)
        if not isinstance(num_targets, int) or num_targets < 1:
            raise self._error(ArgumentError, f"num_targets must be a positive int, got {num_targets!r}")
        ptr, targets, lead_shape = self._to_csr(selections, num_targets)
        self.num_targets = num_targets
        self.ptr, self.targets = ptr, targets
        self._finish([Stream(Selector(num_targets, multihot), (1,) + lead_shape)])

    def _to_csr(self, selections, n: int):
        if self._is_multihot(selections, n):
            arr = np.asarray(selections)
            if arr.shape[-1] != n:
                raise self._error(ShapeError, f"multi-hot selections end in {arr.shape[-1]} targets, expected {n}")
            if not np.isin(arr, (0, 1)).all():
                bad = np.argwhere(~np.isin(arr, (0, 1)))[0]
                raise self._error(ArgumentError, f"multi-hot selections must be 0/1; found {arr[tuple(bad)]} at {tuple(int(i) for i in bad)}")
            flat = arr.reshape(-1, n).astype(bool)
            counts = flat.sum(axis=1)
            ptr = np.zeros(len(flat) + 1, np.int64)
            np.cumsum(counts, out=ptr[1:])
            targets = np.nonzero(flat)[1].astype(np.int64)
            return ptr, targets, tuple(arr.shape[:-1])
        lists = []
        for i, x in enumerate(selections):
            x = np.asarray(x).ravel()
            if x.size and not np.issubdtype(x.dtype, np.integer):
                raise self._error(DTypeError, f"selection {i} must hold integer target indices, got {x.tolist()}")
            lists.append(x.astype(np.int64))
        ptr = np.zeros(len(lists) + 1, np.int64)
        for i, x in enumerate(lists):
            if x.size and (x.min() < 0 or x.max() >= n):
                raise self._error(ArgumentError, f"selection {i} holds target {x.max() if x.max() >= n else x.min()}, "
                                                 f"outside 0..{n - 1}")
            if len(np.unique(x)) != len(x):
                raise self._error(ArgumentError, f"selection {i} names a target twice: {x.tolist()}")
            ptr[i + 1] = ptr[i] + len(x)
        targets = np.concatenate([np.sort(x) for x in lists]) if lists else np.zeros(0, np.int64)
        return ptr, targets.astype(np.int64), (len(lists),)

    @staticmethod
    def _is_multihot(selections, n) -> bool:
        """An ndarray of rank >= 2 is multi-hot; so is a rectangular nested list of 0/1 rows of length n.
        Anything else (ragged or empty index lists) is a list of index lists."""
        if isinstance(selections, np.ndarray):
            return selections.ndim >= 2
        rows = list(selections)
        if not rows or not all(isinstance(r, (list, tuple, np.ndarray)) and len(r) == n for r in rows):
            return False
        arr = np.asarray(rows)
        return arr.ndim >= 2 and np.isin(arr, (0, 1)).all()

    def selected(self, i: int) -> np.ndarray:
        """Targets chosen by selector element ``i``."""
        return self.targets[self.ptr[i]:self.ptr[i + 1]]

    def target_counts(self) -> np.ndarray:
        """How many elements select each target (int64, length ``num_targets``)."""
        return np.bincount(self.targets, minlength=self.num_targets).astype(np.int64)


SelectGen = SelectorSource


class MetadataSource(Op):
    """Emit non-negative integer scalars from an array as ``Tile[uint64](1,1)`` (the artifact's MetadataGen).

    Output shape ``(1,) + values.shape``.
    """

    kind = "MetadataSource"

    def __init__(self, graph, values, *, name: str | None = None):
        self._begin(graph, [], name)
        arr = np.asarray(values)
        if arr.ndim < 1 or arr.size == 0:
            raise self._error(ArgumentError, f"values must be a non-empty array, got shape {arr.shape}")
        if not np.issubdtype(arr.dtype, np.integer):
            raise self._error(DTypeError, f"values must be integers, got dtype {arr.dtype}")
        if (arr < 0).any():
            i = int(np.argmax(arr.ravel() < 0))
            raise self._error(ArgumentError, f"values must be non-negative; element {i} is {arr.ravel()[i]}")
        too_big = arr.ravel() > np.iinfo(np.int64).max if arr.dtype == np.uint64 else np.zeros(arr.size, bool)
        if too_big.any():
            i = int(np.argmax(too_big))
            raise self._error(ArgumentError, f"values must fit in int64; element {i} is {arr.ravel()[i]}")
        self.values = arr.astype(np.int64)
        self._finish([Stream(ADDRESS, (1,) + arr.shape)])


MetadataGen = MetadataSource


class ExpertAddrGen(Op):
    """For each one-hot selector picking target ``e``, emit ``tiles_per_expert`` tile addresses
    ``base + e*tiles_per_expert + j`` (a coarse FlatMap). Output ``sel.shape + (tiles_per_expert, 1)``.
    """

    kind = "ExpertAddrGen"

    def __init__(self, graph, sel, tiles_per_expert: int, *, base: int = 0, name: str | None = None):
        (s,) = self._begin(graph, [sel], name)
        if not isinstance(s.dtype, Selector):
            raise self._error(DTypeError, f"sel must be a selector stream, got {s}")
        if not isinstance(tiles_per_expert, int) or tiles_per_expert < 1:
            raise self._error(ArgumentError, f"tiles_per_expert must be a positive int, got {tiles_per_expert!r}")
        self.tiles_per_expert = tiles_per_expert
        self.base = int(base)
        self._finish([Stream(ADDRESS, s.shape + (tiles_per_expert, 1))])


class CacheReadAddrGen(Op):
    """For a request with index ``i`` and ``n`` KV tiles, emit tile addresses ``i*row_offset + j``.

    Output ``idx.shape + (<name>,)``, a ragged dim (tiles per request).
    """

    kind = "CacheReadAddrGen"

    def __init__(self, graph, idx, seq_len, row_offset: int, *, name: str | None = None):
        a, b = self._begin(graph, [idx, seq_len], name)
        _uint64_stream(self, a, "idx")
        _uint64_stream(self, b, "seq_len")
        if not shapes_equal(a.shape, b.shape):
            raise self._error(ShapeError, f"idx {a} and seq_len {b} must have the same shape")
        if not isinstance(row_offset, int) or row_offset < 1:
            raise self._error(ArgumentError, f"row_offset must be a positive int, got {row_offset!r}")
        self.row_offset = row_offset
        self.tiles_symbol = make_symbol(self.name, ragged=True)
        self._finish([Stream(ADDRESS, a.shape + (self.tiles_symbol,))])


class FilterLastTile(Op):
    """For a request of ``n`` tiles emit ``n`` two-way selectors: target 1 for the first ``n-1`` tiles and
    target 0 for the last. Output ``seq_len.shape + (<name>,)`` (ragged)."""

    kind = "FilterLastTile"

    def __init__(self, graph, seq_len, *, name: str | None = None):
        (s,) = self._begin(graph, [seq_len], name)
        _uint64_stream(self, s, "seq_len")
        self.tiles_symbol = make_symbol(self.name, ragged=True)
        self._finish([Stream(Selector(2), s.shape + (self.tiles_symbol,))])


class Sink(Op):
    """Consume and discard a stream (the artifact's ConsumerContext)."""

    kind = "Sink"

    def __init__(self, graph, inp, *, name: str | None = None):
        self._begin(graph, [inp], name)
        self._finish([])
